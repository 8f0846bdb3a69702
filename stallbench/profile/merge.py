"""Part files of one profiled run -> typed figures (``results`` schema, executor ``"profile"``).

Per process, the hooks wrote its loader streams (per-batch request time, wait, step, rows;
``wire.Epoch``) and the stages it timed; each loader worker wrote its stages, keyed by the
stream it served. Here, per run:

- a stream is named by its dataset class and creation order in its process
  (``ParquetDataset#0``), the same name on every rank and in every repeat;
- the **headline** loader is the name with the most batches over the ranks; its figures are
  the run's ``RepeatFigures`` (the others keep their own ``ProfileLoader`` figures: a
  validation loader's waits are its own, not stall of the training loop);
- per batch i of a stream: ``wait[i]`` (blocked in ``__next__``), ``step[i]`` (until the next
  request), so ``epoch_s`` = sum(wait) + sum(step) over its epochs and ``stall_s`` = ``wait_s``
  (the loader's own data work, collate and pinning with 0 workers, happens inside the wait);
  ``compute_s`` = sum(step);
- start-up vs steady state by ``measure.phases`` with each batch its own work item and
  S = num_workers producers (steady once every worker delivered its first batch);
- several ranks: one ``RankFigures`` each, the job's figures as ``RankFigures`` documents
  (epoch the max, counts summed, stall the max's), the straggler by ``analysis.ranks``.
  ``sync_s`` is 0: a user's step cannot be split into compute and all-reduce from outside,
  so a rank waiting for a slow peer shows it in its step, not its stall.

Stage seconds map onto the scenario stages as: ``fetch`` = the dataset's ``__getitem__``
or ``__iter__`` (reading *and* the user's transform inside it: they cannot be told apart without
``stallbench.stage``), ``preprocess`` = ``collate_fn``, ``transfer_producer`` / trainer =
``pin_memory`` where it ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..analysis.stats import finite_median
from ..measure import phases as phases_mod
from . import overtime
from .agent import doors
from .agent.wire import Beat, Header, LoaderSettings, Parts, Rest, Windows, Worker
from ..results import (ProfileLoader, ProfileStage, RankFigures, RepeatFigures, StageSeconds,
                       Timeline)


@dataclass
class StreamRun:
    """One stream of one process in one run, its epochs concatenated."""

    name: str
    kind: str
    rank: int
    key: str
    settings: LoaderSettings
    notes: list[str]
    epochs: int = 0
    t_start: list[float] = field(default_factory=list)   # from the stream's own start, gaps cut
    wait: list[float] = field(default_factory=list)
    step: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    epoch_s: float = 0.0
    ended: bool = True
    capped: bool = False
    stages: dict[str, list[Any]] = field(default_factory=dict)   # name -> [calls, wall, cpu, where]
    gpu_wait: list[float] = field(default_factory=list)
    gpu_step: list[float] = field(default_factory=list)
    t_wall: list[float] = field(default_factory=list)    # each request, Unix time (the trace)
    host: str = ""
    pid: int = 0
    node: str = ""          # the Ray node of its process (``wire.Header.node``), "" outside Ray;
                            # a multi-node torchrun's: its node rank and host (``nodes``)
    node_rank: int | None = None    # a multi-node torchrun's node its figures came from
    trainer_cpu_s: float = 0.0
    producer_cpu_s: float | None = None
    producer_processes: int = 0
    role: str = ""          # "producer": a loader thread feeding the loop a queue (hooks)
    torch_threads: int | None = None          # torch's threads in the stream's process, read
    worker_torch_threads: int | None = None   # the most read in one of its loader workers
    # per epoch in order: (iter() and end, Unix time; its batches, rows; whether it ended):
    # the tune's rate from the second epoch on, each epoch's start-up included
    spans: list[tuple[float, float, int, int, bool]] = field(default_factory=list)
    # --live (issue 60): the batches past the per-batch cap (summed, in no list above) and
    # the stream's windows; None in a plain profile
    rest: Rest | None = None
    windows: Windows | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.settings, LoaderSettings):     # a mapping as given
            self.settings = LoaderSettings(self.settings)

    @property
    def batches(self) -> int:
        return len(self.wait)

    @property
    def total_batches(self) -> int:
        """Every batch, those past ``--live``'s per-batch cap included."""
        return len(self.wait) + (self.rest.batches if self.rest else 0)

    @property
    def producers(self) -> int:
        return self.settings.num_workers


def _add_stages(into: dict[str, list[Any]], stages: dict[str, list[Any]]) -> None:
    """Sum stage records [calls, wall, cpu, where, cpu_calls, cold_cpu, cold_calls]; the CPU
    of calls whose clock was not read (the DataLoader door's ``_patch_fetch`` samples it) is
    scaled from those whose was: cpu x calls / cpu_calls per process, before summing. The process's
    first (cold) fetch stands for the rest only where no warm fetch was read: its one-off
    costs are not the per-call cost (``doors/torch_dataloader._patch_fetch``)."""
    for name, rec_in in stages.items():
        calls, wall, cpu, where = rec_in[:4]
        cpu_calls = rec_in[4] if len(rec_in) > 4 else calls
        cold_cpu, cold_calls = (rec_in[5], rec_in[6]) if len(rec_in) > 6 else (0.0, 0)
        if cpu_calls:
            cpu = cpu * calls / cpu_calls
        elif cold_calls:
            cpu = cold_cpu * calls / cold_calls
        else:
            cpu = 0.0
        rec = into.setdefault(name, [0, 0.0, 0.0, where])
        rec[0] += calls
        rec[1] += wall
        rec[2] += cpu


def _label(text: Any) -> str:
    """A name the job made (its Dataset class's name, a stage's file, a note quoting either)
    as every sink shows it: controls escaped, a leading ``::`` defused (``errors.escape_controls``,
    the rule result names follow), lone surrogates of non-UTF-8 bytes as ``\\udcNN``. Done once,
    here, where the names enter from the part files: the terminal's tables, the result, the
    trace and the report all take them from here (issue 38, class 10: a class named
    ``"X\\n::error title=pwned::..."`` printed a line a CI runner would execute)."""
    from ..errors import escape_controls
    return escape_controls(str(text))


def process_roles(parts: Parts) -> dict[tuple[str, int], tuple[int, int]]:
    """(host, pid) of each trainer process -> (rank, helper number; 0 for the rank itself).

    Ranks are processes of a launcher, not any process that iterates a loader: per rank
    (the launched processes' RANK; without a launcher, the one job, rank 0) the process
    that started first is the rank, every other one is a helper (a process the job spawned
    that iterates its own loader, with or without the parent's RANK in its environment),
    numbered 1, 2, ... by start. The images of one process (``os.execv``) are one process."""
    first: dict[tuple[str, int], Header] = {}
    for p in parts.trainers:
        h = p.header
        k = (h.host, h.pid)
        if k not in first or h.t0_wall < first[k].t0_wall:
            first[k] = h
    any_launched = any(h.launched for h in first.values())
    by_rank: dict[int, list[tuple[str, int]]] = {}
    # by host, then by start: the start times of two machines' clocks are never compared
    for k, h in sorted(first.items(), key=lambda kv: (kv[1].host, kv[1].t0_wall)):
        rank = h.rank if h.launched or not any_launched else -1
        by_rank.setdefault(rank, []).append(k)
    roles: dict[tuple[str, int], tuple[int, int]] = {}
    helpers = 0
    for rank in sorted(by_rank):
        procs = by_rank[rank]
        if rank >= 0:
            roles[procs[0]] = (rank, 0)
            procs = procs[1:]
        for k in procs:
            helpers += 1
            roles[k] = (max(rank, 0), helpers)
    return roles


def _node_label(node: int | None, host: str) -> str:
    """A multi-node torchrun's node as the tables show it: ``1 (gpu-b)`` (node rank, host);
    "" on one machine."""
    return "" if node is None else f"{node} ({_label(host)})"


def unmeasured(parts: Parts) -> list[tuple[str, str]]:
    """(loader name, why) for each stream whose hooks switched off (``wire.Stream``)."""
    return [(s.name, s.unmeasured) for p in parts.trainers for s in p.streams if s.unmeasured]


def streams(parts: Parts) -> list[StreamRun]:
    """Every measured stream of a run, with the stages its workers (or its own process)
    timed; merged once per run (kept in ``parts.cache``: merge, ablate, session and tune all
    ask). The streams of a process's images (an ``os.execv`` into a second training) with
    the same name are one stream, their epochs in order; a helper process's loaders are
    named for it (``X#0 (helper process 1)``), never a rank of their own."""
    got = parts.cache.get("streams")
    if got is None:
        got = parts.cache["streams"] = _streams(parts)
    return list(got)


def _streams(parts: Parts) -> list[StreamRun]:
    workers: dict[str, list[Worker]] = {}
    for w in parts.workers:
        workers.setdefault(w.loader, []).append(w)
    roles = process_roles(parts)
    node_of = parts.cache.get("node_of") or {}      # a multi-node job's (``nodes.merge_into``)
    trainers = sorted(parts.trainers,
                      key=lambda p: (p.header.host, p.header.pid, p.header.t0_wall))
    runs: dict[tuple[str, int, str], StreamRun] = {}
    offsets: dict[tuple[str, int, str], float] = {}
    for p in trainers:
        h = p.header
        proc = (h.host, h.pid)
        rank, helper = roles.get(proc, (h.rank, 0))
        for s in p.streams:
            if s.unmeasured:
                continue
            name = _label(s.name)
            name = name if not helper else f"{name} (helper process {helper})"
            rk = (*proc, name)
            sr = runs.get(rk)
            if sr is None:
                sr = runs[rk] = StreamRun(
                    name=name, kind=_label(s.kind), rank=rank, key=s.key,
                    settings=LoaderSettings({k: _label(v) if isinstance(v, str) else v
                                             for k, v in s.settings.items()}),
                    notes=[_label(n) for n in s.notes],
                    trainer_cpu_s=0.0, host=proc[0], pid=proc[1], role=s.role,
                    node=_label(h.node) or _node_label(node_of.get(proc), proc[0]),
                    node_rank=node_of.get(proc))
                offsets[rk] = 0.0
            sr.torch_threads = h.torch_threads or sr.torch_threads      # the latest flush
            # with the epochs its process had not finished (or not written) at its last
            # flush: it ended without atexit (killed by Ray, os._exit); they end early
            mine_eps = parts.stream_epochs(p, s.key)
            if all(ep.cpu_s is not None for ep in mine_eps):
                # the process's CPU over this stream's epochs, not its start-up (imports)
                sr.trainer_cpu_s += sum(float(ep.cpu_s or 0.0) for ep in mine_eps)
            else:
                sr.trainer_cpu_s += h.cpu_s
            offset = offsets[rk]
            for ep in mine_eps:
                for t in ep.t_req:
                    sr.t_start.append(offset + (t - ep.t_iter))
                    sr.t_wall.append(h.t0_wall + t)
                n = len(ep.wait)
                sr.spans.append((h.t0_wall + ep.t_iter, h.t0_wall + ep.t_end, n,
                                 int(sum(ep.rows)), ep.ended))
                steps = list(ep.step)[:n] + [0.0] * max(0, n - len(ep.step))
                sr.wait.extend(ep.wait)
                sr.step.extend(steps)
                sr.rows.extend(ep.rows)
                dur = sum(ep.wait) + sum(steps)
                offset += dur
                sr.epoch_s += dur
                sr.epochs += 1
                sr.ended = sr.ended and ep.ended
                sr.capped = sr.capped or ep.capped
                sr.gpu_wait.extend(ep.gpu_wait)
                sr.gpu_step.extend(ep.gpu_step)
            offsets[rk] = offset
            _add_stages(sr.stages, p.stages.get(s.key, {}))
            overtime.attach(sr, parts, h.image_key, s.key)
            _add_workers(sr, workers.get(s.key, []), s.key)
            # pin time lands in the loader's own bucket (its pin thread is tagged with the
            # loader's key in the DataLoader door), so nothing from the process's "trainer"
            # bucket is added here: it would count one loader's pinning on every loader
    return [sr for sr in runs.values() if sr.total_batches]


def _add_workers(sr: StreamRun, ws: list[Worker], key: str) -> None:
    """The stages, CPU and torch threads of the loader workers that served stream ``key``."""
    for w in ws:
        _add_stages(sr.stages, w.stages.get(key, {}))
    if ws:
        sr.producer_cpu_s = (sr.producer_cpu_s or 0.0) + sum(w.header.cpu_s for w in ws)
        sr.producer_processes += len(ws)
        read = [w.header.torch_threads for w in ws if w.header.torch_threads]
        if read:
            sr.worker_torch_threads = max(read + [sr.worker_torch_threads or 0])


def headline_name(runs: list[StreamRun]) -> str | None:
    """The loader with the most batches over the ranks. A loader iterated by a producer
    thread (``role`` "producer") is never it while another stream exists: its waits are
    production, the loop's are its queue's stream's (``doors/thread_queue._Feed``)."""
    totals: dict[str, int] = {}
    loop = [s for s in runs if s.role != "producer"]
    for s in loop or runs:
        totals[s.name] = totals.get(s.name, 0) + s.total_batches
    return max(totals, key=lambda n: (totals[n], -min(s.rank for s in runs if s.name == n)),
               default=None)


def _stage_seconds(stages: dict[str, list[Any]]) -> StageSeconds:
    ss = StageSeconds()
    for name, (calls, wall, cpu, where) in stages.items():   # already scaled by _add_stages
        if name.startswith("dataset."):
            ss.fetch += wall
            ss.fetch_cpu += cpu
        elif name == "collate_fn":
            ss.preprocess += wall
            ss.preprocess_cpu += cpu
        elif name == "pin_memory":
            if where == "trainer":
                ss.transfer_trainer += wall
            else:
                ss.transfer_producer += wall
                ss.transfer_producer_cpu += cpu
    ss.transfer = ss.transfer_producer + ss.transfer_trainer
    return ss


def phases_of(s: StreamRun):
    items = list(range(s.batches))
    return phases_mod.split(s.t_start, s.step, s.wait, s.rows, items, s.epoch_s, s.producers)


def figures(s: StreamRun, peak_pss_mb: float = 0.0) -> RepeatFigures:
    """A stream's figures; under ``--live`` its batches past the per-batch cap added
    (``overtime``: the totals and the steady state take them, the start-up is the kept
    batches')."""
    rest = s.rest or Rest()
    epoch_s = s.epoch_s + rest.wait + rest.step
    ph = overtime.with_rest(phases_of(s), rest, epoch_s, s.total_batches)
    samples = int(sum(s.rows)) + rest.rows
    # no steady window: no steady rate (NaN), never the whole-run rate under a steady name
    steady = (ph.steady_samples / ph.steady_s if ph.has_steady and ph.steady_s > 0
              else math.nan)
    wait = float(sum(s.wait)) + rest.wait
    return RepeatFigures(
        epoch_s=epoch_s, samples=samples, batches=s.total_batches,
        throughput_samples_s=samples / epoch_s if epoch_s > 0 else math.nan,
        steady_throughput_samples_s=steady, stall_s=wait, wait_s=wait, trainer_transfer_s=0.0,
        compute_s=float(sum(s.step)) + rest.step,
        time_to_first_batch_s=s.wait[0] if s.wait else math.nan,
        peak_pss_mb=peak_pss_mb, trainer_cpu_s=s.trainer_cpu_s, producer_cpu_s=s.producer_cpu_s,
        stage_s=_stage_seconds(s.stages), producer_processes=s.producer_processes, phases=ph)


def rank_figures(s: StreamRun, f: RepeatFigures) -> RankFigures:
    return RankFigures(rank=s.rank, epoch_s=f.epoch_s, samples=f.samples, batches=f.batches,
                       steady_throughput_samples_s=f.steady_throughput_samples_s,
                       stall_s=f.stall_s, wait_s=f.wait_s, trainer_transfer_s=0.0,
                       compute_s=f.compute_s, sync_s=0.0,
                       time_to_first_batch_s=f.time_to_first_batch_s, peak_pss_mb=0.0,
                       trainer_cpu_s=f.trainer_cpu_s, producer_cpu_s=f.producer_cpu_s,
                       node=s.node)


def job_figures(per_rank: list[tuple[StreamRun, RepeatFigures]], peak_pss_mb: float) -> RepeatFigures:
    """The run's figures: one rank's own, or the job's over ranks (``RankFigures`` doc)."""
    if len(per_rank) == 1:
        return per_rank[0][1]
    figs = [f for _, f in per_rank]
    worst = max(figs, key=lambda f: f.stall_s)
    epoch = max(f.epoch_s for f in figs)
    samples = sum(f.samples for f in figs)
    prod = [f.producer_cpu_s for f in figs if f.producer_cpu_s is not None]
    stage = StageSeconds()
    for f in figs:
        for k in vars(stage):
            setattr(stage, k, getattr(stage, k) + getattr(f.stage_s, k))
    return RepeatFigures(
        epoch_s=epoch, samples=samples, batches=sum(f.batches for f in figs),
        throughput_samples_s=samples / epoch if epoch > 0 else math.nan,
        steady_throughput_samples_s=sum(f.steady_throughput_samples_s for f in figs),
        stall_s=worst.stall_s, wait_s=worst.wait_s, trainer_transfer_s=0.0,
        compute_s=worst.compute_s,
        time_to_first_batch_s=max(f.time_to_first_batch_s for f in figs),
        peak_pss_mb=peak_pss_mb, trainer_cpu_s=sum(f.trainer_cpu_s for f in figs),
        producer_cpu_s=sum(prod) if prod else None, stage_s=stage,
        producer_processes=sum(f.producer_processes for f in figs),
        ranks=[rank_figures(s, f) for s, f in per_rank], phases=worst.phases)


def timeline(s: StreamRun) -> Timeline:
    return Timeline(t_start_s=list(s.t_start), wait_s=list(s.wait),
                    transfer_s=[0.0] * s.batches, compute_s=list(s.step), rows=list(s.rows),
                    gpu_step_ms=[x * 1e3 for x in s.gpu_step] or None)


_med = finite_median     # the one median of figures that may be missing


def loaders(runs: list[list[StreamRun]], headline: str | None) -> list[ProfileLoader]:
    """Per (loader name, rank): medians over the repeats that saw it."""
    keyed: dict[tuple[str, int], list[StreamRun]] = {}
    for run in runs:
        for s in run:
            keyed.setdefault((s.name, s.rank), []).append(s)
    out = []
    for (name, rank), ss in sorted(keyed.items(), key=lambda kv: (kv[0][1], kv[1][0].key)):
        figs = [figures(s) for s in ss]
        first = ss[0]
        stages = [ProfileStage(name=_label(n), where=_label(str(v[3])), calls=int(v[0]),
                               wall_s=float(v[1]),
                               cpu_s=float(v[2])) for n, v in first.stages.items()]
        ph_w = [f.phases.steady_wait_s / f.phases.steady_s for f in figs
                if f.phases is not None and f.phases.has_steady and f.phases.steady_s > 0]
        # a producer thread's waits are not the loop's: no wait share (null, its note says
        # why), never its own time under the loop's name
        producer = first.role == "producer"
        share = None if producer else _med([f.wait_s / f.epoch_s for f in figs
                                            if f.epoch_s > 0])
        if producer:
            ph_w = []
        out.append(ProfileLoader(
            name=name, kind=first.kind, rank=rank, headline=name == headline,
            settings=dict(first.settings),
            epochs=first.epochs + (first.rest.passes if first.rest else 0), batches=int(_med([f.batches for f in figs])),
            samples=int(_med([f.samples for f in figs])), epoch_s=_med([f.epoch_s for f in figs]),
            wait_s=_med([f.wait_s for f in figs]), step_s=_med([f.compute_s for f in figs]),
            wait_share=share,
            time_to_first_batch_s=_med([f.time_to_first_batch_s for f in figs]),
            batches_s=_med([f.batches / f.epoch_s for f in figs if f.epoch_s > 0]),
            samples_s=_med([f.throughput_samples_s for f in figs]),
            steady_samples_s=_med([f.steady_throughput_samples_s for f in figs]),
            steady_wait_share=_med(ph_w) if ph_w else None, stages=stages,
            notes=list(dict.fromkeys([n for s in ss for n in s.notes] + [
                overtime.rest_note(s.rest, s.batches) for s in ss[:1]
                if s.rest and s.rest.batches])),
            gpu_wait_s=sum(first.gpu_wait) if first.gpu_wait else None,
            gpu_step_s=sum(first.gpu_step) if first.gpu_step else None,
            set_keys=list(doors.of(first.kind).set_keys), node=first.node))
    return out


def unreported(parts: Parts, beats: list[Beat]) -> list[str]:
    """One line per process whose figures never came home, by its node (issue 56): its
    beat says it made a loader or ran batches, it did not end through its exit handlers,
    and no part of it arrived (a Ray worker killed, its node lost, before its first write);
    and per launched rank that no part names (the world its ranks' parts declare), never a
    table that reads as complete without it."""
    wrote = {(p.header.host, p.header.pid) for p in (*parts.trainers, *parts.workers)}
    out = []
    for b in sorted(beats, key=lambda b: (b.node, b.host, b.pid)):
        if (b.loaders or b.batches) and not b.exited and (b.host, b.pid) not in wrote:
            where = f"node {_label(b.node)}" if b.node else f"host {_label(b.host)}"
            what = (f"it ran {b.batches} batch(es)" if b.batches else
                    f"it made {', '.join(_label(n) for n in b.loaders)} and ran no batch")
            out.append(f"{where}: no figures: its processes ended without writing (pid {b.pid}: "
                       f"{what})")
    launched = [p.header for p in parts.trainers if p.header.launched]
    seen = {h.rank for h in launched}
    for rank in range(max((h.world_size for h in launched), default=0)):
        if rank not in seen:
            out.append(f"rank {rank}: no figures: its process wrote none that came home (its "
                       f"node lost, or killed before its first write)")
    return out
