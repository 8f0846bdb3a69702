"""One ``stallbench profile``: every variant x repeat of the user's command -> one ``Result``.

The command runs as given, once per variant (the ``--set`` matrix) and repeat; variants torch
would refuse are skipped with one line. The job's own exit code wins: a run that exits
non-zero ends the profile with that code and no result (``JobFailed``), except under a
``--set`` matrix, where a variant whose job failed is recorded as failed (a line, and a note
on every variant kept) and the variants that ran are kept; the profile ends with the job's
code only when every variant failed. Figures that were lost (a part file the hooks could not
write: ``--out`` full or unwritable during the job) end the profile with exit 2
(``PartsLost``), never a result that reads as whole. A job that ends with
0 before its loader finished an epoch (``sys.exit(0)`` mid-loop) keeps what ran, and the
result says so. A job in which no loader iteration was seen gives no result (``NoLoader``).

The recommendation is measured, never predicted: the variant with the highest steady-state
samples/s of the headline loader (median over repeats) against the first variant, by how
much; "keep" when no variant beats it. Decided in ``analysis.loader_search`` (``recommend``),
beside ``stallbench tune``'s search: one decider for the loader settings of the user's job.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import __version__
from ..errors import UserError
from ..analysis.stats import finite_median, finite_summary
from ..analysis import knob_table
from ..analysis.summary import whole_run_speedup
from ..measure import phases as phases_mod
from ..results import (SCHEMA_VERSION, DatasetInfo, ExecutorFacts, ProfileCommand, ProfileVariant,
                       Result, RunSettings, ScenarioAnalysis, ScenarioInfo,
                       Summary, ThreadBudget, ToolInfo, VariantResult, now_utc)
from ..analysis.loader_search import Answer
from . import jobrun
from . import knobs as knobs_mod
from . import orders
from . import merge, nodes as nodes_mod, overtime, record, redact
from .jobrun import JobFailed, NodePartsLeft
from .agent import wire
from .launcher import JobRun, NoProgress, exit_status, progress_limit, run_once


class NoLoader(UserError):
    pass


@dataclass
class Options:
    argv: list[str]
    name: str
    out: Path
    repeats: int = 1
    max_batches: int | None = None
    axes: dict[str, list[Any]] = field(default_factory=dict)
    analyze: bool = False           # the ablation runs of the first variant (issue 28)
    trace: list[dict[str, Any]] | None = None      # filled with trace events when given
    progress_timeout: float | None = None   # --progress-timeout (launcher.NoProgress)
    record_argv: bool = False       # --record-argv: every value of the command kept, redacted
    node_port: int | None = None    # --node-port: the nodes' endpoint (profile/nodes.py)
    node_wait: float = nodes_mod.NODE_WAIT_S    # --node-wait: how long node rank 0 waits
    live: Any = None                # --live: ``live.LiveOptions`` (issue 60); None without


def default_name(argv: list[str]) -> str:
    """The script's stem (``python train.py`` -> ``train``; ``python -m pkg.train`` ->
    ``train``; ``torchrun ... train.py`` -> ``train``; ``bash -c "X=1 python train.py"`` ->
    ``train``), else the program's name, else ``profile``: from the words the allow-list
    records (``record``), so the file name never carries what the result would not show
    (issue 38: the name came from ``HF_TOKEN=hf_x python train.py`` whole)."""
    found = record.found(argv)
    if found.script is not None and Path(found.script).stem:
        return Path(found.script).stem
    if found.module is not None:
        return found.module.rsplit(".", 1)[-1]
    kept = bool(argv) and record.command(argv[:1]) == argv[:1]     # recorded as it is
    return (Path(argv[0]).name if kept else "") or "profile"


def _without_node_rank(argv: list[str]) -> list[str]:
    """The command as every node runs it: torchrun's node rank left out (it is all that
    differs between the nodes' commands, and they must find the same run directory)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--node-rank", "--node_rank"):
            skip = True
            continue
        if a.startswith(("--node-rank=", "--node_rank=")):
            continue
        out.append(a)
    return out


SITE_FLAGS = {"I": "-I (isolated: PYTHONPATH and site ignored)",
              "E": "-E (PYTHONPATH ignored)", "S": "-S (no site, no sitecustomize)"}


def python_flags(argv: list[str]) -> list[str]:
    """The interpreter options of the command's Python (``python -I t.py``, ``python3 -Es``,
    also inside a ``bash -c "..."`` string) that keep the hooks out: ``-I``, ``-E``, ``-S``."""
    words: list[str] = []
    for a in argv:
        try:
            words.extend(shlex.split(a) if " " in a else [a])
        except ValueError:
            words.append(a)
    found: list[str] = []
    i = 0
    while i < len(words):
        if Path(words[i]).name.startswith("python"):
            i += 1
            while i < len(words) and words[i].startswith("-") and words[i] != "-":
                w = words[i]
                if w in ("-c", "-m") or w.startswith("--"):
                    break
                if w in ("-X", "-W", "-Q"):
                    i += 1
                for ch in w[1:]:
                    if ch in SITE_FLAGS and SITE_FLAGS[ch] not in found:
                        found.append(SITE_FLAGS[ch])
                i += 1
            continue
        i += 1
    return found


def why_no_figures(runs: list[JobRun], argv: list[str], variant: str) -> str:
    """The one line for runs that brought back no batch: what happened, from the beat files
    the agent writes (``wire.Beat``), so that "no DataLoader was seen" is said only when the
    hooks ran and saw none (a run directory the job removed is ``check_parts``'s). In order:
    the hooks never ran
    (an interpreter without site or PYTHONPATH); batches ran but their figures were lost
    (``os._exit`` mid-epoch, a part that could not be written); loaders made but no batch
    (an empty loader, or an exit before the first batch); no loader at all."""
    where = f"(variant {variant}); no result written"
    beats = [b for r in runs for b in r.beats]
    if not beats:
        flags = python_flags(argv)
        how = (f"the command's Python runs with {', '.join(flags)}" if flags else
               "no process of the job ran a Python that reads PYTHONPATH and site (python "
               "-I, -E or -S, a program that clears the environment, or no Python at all)")
        return ("profile: the hooks never started in the job: " + how + "; stallbench.watch "
                "cannot help either (it needs the hooks): run the interpreter without -I, -E "
                "and -S (python -s keeps the user site out and is still measured) " + where)
    ran = sum(b.batches for b in beats)
    if ran:
        gone = [b for b in beats if b.batches and not b.exited]
        why = (f"process {gone[0].pid} ended without running its exit handlers "
               "(os._exit, or killed) before its figures were written" if gone else
               "their part files could not be written (the job's stderr says why)")
        from .launcher import last_batch
        return (f"profile: the job ran batches (at least {ran}; the last reported: "
                f"{last_batch(beats)}), but their figures were lost: {why} {where}")
    execed = next((b for b in beats if b.exec_lost and not b.loaders), None)
    if execed is not None:
        return (f"profile: process {execed.pid} of the job replaced itself (os.exec*) with a "
                f"program whose environment drops {execed.exec_lost} (what starts "
                f"stallbench's hooks in a process): nothing after the exec was measured (stallbench.watch "
                f"cannot help there); pass the exec its environment with {execed.exec_lost} "
                f"kept (os.environ, or a copy of it) {where}")
    loaders = [n for b in beats for n in b.loaders]
    if loaders:
        from ..outputs import one_line
        names = ", ".join(one_line(n) for n in dict.fromkeys(loaders))
        if any(b.empty for b in beats):
            return (f"profile: the job's loader ({names}) yielded no batch: it is empty (its "
                    f"dataset or sampler has no items, or drop_last dropped them) {where}")
        own = sorted({c for b in beats for c in b.own_iter})
        if own:
            return (f"profile: the job made a loader ({names}) whose class "
                    f"({', '.join(one_line(c) for c in own)}) defines its own __iter__: no "
                    f"batch came through DataLoader.__iter__, so none was measured; wrap what "
                    f"the loop iterates: `for batch in stallbench.watch(loader):` "
                    f"(docs/profile.md) {where}")
        return (f"profile: the job made a loader ({names}) but exited before its first "
                f"batch {where}")
    early = next((r.pid for r in runs for b in r.beats if b.pid == r.pid
                  and not b.exited), None)
    ended = (f", whose process {early} ended without running its exit handlers (os._exit, "
             "or a signal)" if early is not None else "")
    return ("no DataLoader or Ray Data iteration was seen in the job (variant "
            f"{variant}){ended}; for another loader, wrap what the loop iterates: "
            "`for batch in stallbench.watch(my_loader):` (docs/profile.md); "
            "no result written")


def cut_short(runs: list[JobRun]) -> str | None:
    """What a result must say when a process of the job ran batches and ended without its exit
    handlers (``os._exit``, or killed: a Ray Train worker that Ray ends) in the middle of an
    epoch: its figures are those of its last write (``hooks`` writes at each epoch's end and
    about once a second), so its last batches may be missing. Counted and said, never
    published as a whole epoch; None when every process ended through its exit handlers or
    ended its epochs."""
    gone = [b for r in runs for b in r.beats if b.batches and not b.exited]
    if not gone:
        return None
    streams = [s for r in runs for s in merge.streams(r.parts)]
    if all(s.ended for s in streams):
        return None
    kept = sum(s.batches for s in streams)
    ran = sum(b.batches for r in runs for b in r.beats)
    return (f"process {gone[0].pid} ended without running its exit handlers (os._exit, or "
            f"killed) in the middle of an epoch: the figures hold its batches up to its last "
            f"write ({kept} batch(es) measured; the job's processes reported at least {ran})")


def fingerprint(argv: list[str], axes: dict[str, list[Any]], max_batches: int | None) -> str:
    """What must match for two profiles to be compared: the redacted command, the ``--set``
    matrix and ``--max-batches`` (not the working directory: a clone elsewhere compares)."""
    blob = json.dumps({"argv": _without_node_rank(redact.argv(argv)), "matrix": axes, "max_batches": max_batches},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


_summary = finite_summary     # one rule for a figure over repeats (analysis.stats)


def variant_result(v: knobs_mod.Variant, runs: list[JobRun],
                   max_windows: int = wire.LiveSettings.max_windows) -> VariantResult:
    per_run = [merge.streams(r.parts) for r in runs]
    headline = merge.headline_name([s for run in per_run for s in run])
    reps, notes = [], {}
    timeline_stream = None
    ended_early, capped = "", False
    for run, streams in zip(runs, per_run):
        hs = sorted((s for s in streams if s.name == headline), key=lambda s: s.rank)
        per_rank = [(s, merge.figures(s)) for s in hs]
        f = merge.job_figures(per_rank, run.peak_pss_mb)
        f.peak_pss_mb = run.peak_pss_mb
        # the one rule the scenario runner keeps: profiled producers are this machine's
        # processes (a Ray cluster's other nodes aside; a torchrun's nodes bring their own)
        phases_mod.refuse_beyond_cores(f, nodes_mod.run_cores(run))
        f.load = run.load
        reps.append(f)
        if timeline_stream is None and hs:
            timeline_stream = max(hs, key=lambda s: sum(s.wait))
        for s in hs:
            capped = capped or s.capped
            if not s.ended and not ended_early:
                code = exit_status(run.exit_code) if run.nodes else 0   # a node lost under it
                how = "exited 0" if code == 0 else f"ended with code {code}"
                ended_early = (f"the job {how} before {s.name} (rank {s.rank}) ended its "
                               f"epoch, after {s.batches} batches: the figures cover what ran")
        for s in streams:
            for n in s.notes:
                notes[f"{s.name}"] = n
        for name, why in merge.unmeasured(run.parts):   # said on the job's stderr, kept here
            notes[name] = f"not measured ({why})"
    first = timeline_stream
    producers = first.producers if first else 0
    res = runs[0].resources
    vr = VariantResult(
        name=v.name, knobs=dict(v.knobs), config={"set": dict(v.knobs)}, emulated=[],
        executor=ExecutorFacts(kind="profile", producer_slots=producers,
                               has_producers=producers > 0,
                               scaling_knobs=[knob_table.WORKERS.key]),
        throughput_samples_s=_summary([f.throughput_samples_s for f in reps]),
        epoch_s=_summary([f.epoch_s for f in reps]),
        stall_s=_summary([f.stall_s for f in reps]),
        stall_share=_summary([f.stall_s / f.epoch_s for f in reps if f.epoch_s > 0]),
        time_to_first_batch_s=_summary([f.time_to_first_batch_s for f in reps]),
        peak_pss_mb=_summary([f.peak_pss_mb for f in reps]),
        repeats=reps, notes=notes,
        timeline=merge.timeline(first) if first else merge.Timeline(),
        resources=res,
        phases=phases_mod.summarize(reps, producers, None),
        threads=_thread_budget(first, producers),
        profile=ProfileVariant(loaders=merge.loaders(per_run, headline), exit_code=0,
                               ended_early=ended_early, capped=capped,
                               over_time=overtime.over_time(per_run[0], max_windows)
                               if per_run else None))
    if reps and reps[0].ranks:
        vr.ranks = rank_summary(reps, vr.epoch_s.median, per_run, headline)
    if any(r.nodes for r in runs):
        nodes_mod.annotate(vr, runs, per_run, headline)
    return vr


def _thread_budget(s: merge.StreamRun | None, producers: int) -> ThreadBudget | None:
    """The budget the headline loader's process and its workers ran with, as read inside
    the job (``agent/writer.py``), so that the report shows it beside the throughput it
    explains. None where the hooks read nothing (torch never imported in the job)."""
    if s is None or (s.torch_threads is None and s.worker_torch_threads is None):
        return None
    from .. import threads
    return ThreadBudget(producer_threads=s.worker_torch_threads if producers else None,
                        trainer_threads=None, local_producers=producers,
                        cores=threads.machine_cores(), trainer_torch_threads=s.torch_threads)


def rank_summary(reps, epoch_s: float, per_run, headline):
    """The straggler across ranks (``analysis.ranks``: exposed stall = the rank's wait)."""
    from ..analysis import ranks as ranks_mod
    from ..results import RankStats, RankSummary

    # the runs that measured every rank (a node lost in one run leaves its ranks out of it)
    full = max((tuple(r.rank for r in f.ranks) for f in reps), key=len)
    keep = [i for i, f in enumerate(reps) if tuple(r.rank for r in f.ranks) == full]
    reps, per_run = [reps[i] for i in keep], [per_run[i] for i in keep]
    world = len(reps[0].ranks)
    stalls = [[r.stall_s for r in f.ranks] for f in reps]
    steps, model_steps = [], []
    for streams in per_run:
        hs = sorted((s for s in streams if s.name == headline), key=lambda s: s.rank)
        steps.append([list(s.wait) for s in hs])
        model_steps.append([list(s.step) for s in hs])
    # own time per step = the wait alone: a user's step cannot be split into its compute and
    # the all-reduce where a fast rank waits for the slow one (analysis.ranks.own_steps)
    c, ex, noise, named = ranks_mod.straggler(steps)
    med = finite_median
    gain = med([ranks_mod.gain_if_median_pace(s, c) for s in steps])

    stats = [RankStats(rank=f0.rank, stall_s=med([f.ranks[i].stall_s for f in reps]),
                       wait_s=med([f.ranks[i].wait_s for f in reps]), trainer_transfer_s=0.0,
                       compute_s=med([f.ranks[i].compute_s for f in reps]), sync_s=0.0,
                       steady_throughput_samples_s=med([f.ranks[i].steady_throughput_samples_s
                                                        for f in reps]),
                       time_to_first_batch_s=med([f.ranks[i].time_to_first_batch_s for f in reps]),
                       last_step_share=math.nan, node=f0.node)
             for i, f0 in enumerate(reps[0].ranks)]
    spread = med([max(s) - min(s) for s in stalls])
    s = RankSummary(world=world, launcher="the job's own (torchrun, ...)", backend="",
                    sharding="the job's own", producers_per_rank=True, launch_s=0.0, ranks=stats,
                    max_stall_s=Summary.of([max(x) for x in stalls]),
                    median_stall_s=Summary.of([sorted(x)[len(x) // 2] for x in stalls]),
                    spread_s=spread, noise_s=noise, straggler=reps[0].ranks[c].rank if named is not None else None,
                    candidate=reps[0].ranks[c].rank, straggler_excess_s=ex,
                    gain_if_median_pace_s=gain,
                    gain_speedup=epoch_s / (epoch_s - gain) if epoch_s > gain > 0 else 1.0)
    # the other ranks' wait for the candidate inside their steps (the collective), measured
    s.others_wait_s = med([ranks_mod.others_wait_in_step(m, c) for m in model_steps])
    waited = (f"the other ranks' steps took {s.others_wait_s:.2f} s longer than its own "
              f"(their wait for it in the collective, measured); "
              if math.isfinite(s.others_wait_s) and s.others_wait_s > 0 else "")
    s.verdict = ranks_mod.verdict(s) if named is None else (
        f"rank {s.straggler} is the straggler: {waited}it waited {stats[c].wait_s:.2f} s for "
        f"its batches, {ex:.2f} s above the other ranks' median (noise {noise:.2f} s); at their "
        f"pace the job would wait {gain:.2f} s less ({s.gain_speedup:.2f}x, ESTIMATED)")
    return s


def _versions(runs: list[JobRun]) -> tuple[str | None, str | None]:
    heads = [p.header for r in runs for p in (*r.parts.trainers, *r.parts.workers)]
    torch = next((h.torch for h in heads if h.torch), None)
    ray = next((h.ray for h in heads if h.ray), None)
    return torch, ray


def profile(opts: Options, say: Callable[[str], None]) -> Result:
    """Every run of the job under ``--progress-timeout`` (``launcher.progress_limit``)."""
    with progress_limit(opts.progress_timeout):
        return _profile(opts, say)


@dataclass
class _Matrix:
    """The runs of a profile's variants, kept per variant index as the repeats interleave."""

    todo: list[tuple[int, knobs_mod.Variant]]
    total: int                                      # variants, skipped ones included
    runs: dict[int, list[JobRun]] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)     # a --set variant whose job failed
    failed: list[tuple[str, int]] = field(default_factory=list)   # (variant, exit code)

    @classmethod
    def of(cls, variants: list[knobs_mod.Variant]) -> "_Matrix":
        """The variants to run (numbered from 1 among all, skipped ones left out)."""
        todo = [(i, v) for i, v in enumerate(variants, 1) if not v.skipped]
        return cls(todo, len(variants), {i: [] for i, _ in todo})


def _profile(opts: Options, say: Callable[[str], None]) -> Result:
    """Run the matrix, measure what ran, then decide once (``analysis.loader_search``) and
    assemble: the steps apart so that each says what it owns. A multi-node torchrun's
    launchers each run their own torchrun; node rank 0's gathers the others' figures
    (``nodes.Link``) and writes the result."""
    from ..analysis import loader_search
    from ..measure.machine import metadata
    variants = knobs_mod.matrix(opts.axes) if opts.axes else [knobs_mod.Variant("default", {})]
    topo = nodes_mod.topology(opts.argv, os.environ, opts.node_port)
    fp = fingerprint(opts.argv, opts.axes, opts.max_batches)
    # a directory every node's launcher finds when there are several (a shared --out)
    shared = f"{jobrun.SCRATCH}{opts.name}-{fp}" if topo.count > 1 else None
    # the nodes must agree on the ablation runs as well: another node follows them
    ablates = opts.analyze and not orders.reach(topo)
    nodes_fp = fingerprint(opts.argv, {**opts.axes, "--analyze": [ablates]}, opts.max_batches)
    with jobrun.scratch(opts.out, say, shared, remove=topo.merges) as run_root, \
            nodes_mod.Link(topo, nodes_fp, run_root, opts.node_wait, say) as link, \
            _live(opts, say) as live:
        link.live = live
        machine = metadata()
        created = now_utc()
        for v in variants:
            if v.skipped:
                say(f"variant {v.name}: skipped: {v.skipped}")
        m = _Matrix.of(variants)
        _run_matrix(opts, m, run_root, link, say)
        if not topo.merges and ablates and not link.kept:
            # every run reached node rank 0 over its endpoint: so will the ablation runs
            orders.follow(link, opts.argv, run_root, say, opts.max_batches)
        results, all_runs = _measured(opts, m, run_root, link, say)
    if m.failed and not results:
        raise JobFailed(m.failed[0][1], f"variant {m.failed[0][0]}, and every other variant failed")
    for name, code in m.failed:
        for vr in results:
            vr.notes[f"variant {name}"] = (f"the job exited with code {code} under variant "
                                           f"{name}: not measured")
    if not topo.merges:
        raise NodePartsLeft(*link.left())
    return assemble(opts, results, all_runs, machine, created,
                    loader_search.profile_answer(results), topo.count)


def _live(opts: Options, say: Callable[[str], None]) -> Any:
    """``--live``'s endpoint and terminal view for the whole profile (``live.Live``), or a
    context that does nothing."""
    import contextlib
    if opts.live is None:
        return contextlib.nullcontext()
    from . import live, liveview
    return live.Live(opts.live, say, liveview.View.for_terminal())


def _run_matrix(opts: Options, m: _Matrix, run_root: Path, link: nodes_mod.Link,
                say: Callable[[str], None]) -> None:
    """Every variant's repeats, interleaved (issue 39): A, B, A, B, ..., so that a machine
    whose load drifts during the profile moves every variant alike, not the last one alone."""
    for r in range(opts.repeats):
        for i, v in m.todo:
            if i in m.gone:
                continue
            say(f"variant {v.name} ({i}/{m.total}), repeat {r + 1}/{opts.repeats}: "
                f"{record.shown(opts.argv, opts.record_argv)}")
            run = _run_one(opts, v, run_root / f"v{i}r{r}", f"repeat {r + 1}", link,
                           m.total > 1)
            if isinstance(run, int):
                # one --set value the job cannot run with: that variant failed, the others
                # ran (and run) as measured
                say(f"variant {v.name}: the job exited with code {run} (repeat "
                    f"{r + 1}): recorded as failed, not measured")
                m.failed.append((v.name, run))
                m.runs[i] = []
                m.gone.add(i)
                continue
            m.runs[i].append(run)
            if link.topo.merges:
                jobrun.trace_run(opts.trace, f"{v.name} repeat {r + 1}", run.parts)


def _run_one(opts: Options, v: knobs_mod.Variant, run_dir: Path, repeat: str,
             link: nodes_mod.Link, matrix: bool) -> JobRun | int:
    """One run of one variant, checked: its exit code where a variant of a ``--set`` matrix
    (``matrix``) failed on a single node (a finding: the other variants go on); else
    ``JobFailed`` where the job failed (the job's code wins) and ``PartsLost`` where a
    process could not write its figures. Across nodes, each launcher hands its run on
    (``link.after``) before anything is raised, so node rank 0 names why a node brought
    nothing; node rank 0 merges the other nodes' figures (``_with_nodes``)."""
    where = f"variant {v.name}, {repeat}"
    node_dir = link.node_dir(run_dir)
    shutil.rmtree(node_dir, ignore_errors=True)
    link.before(run_dir)
    live = link.live
    if live is not None:
        live.watch(node_dir)
    try:
        run = run_once(opts.argv, node_dir, v.overrides(), opts.max_batches,
                       live=live.opts.settings if live is not None else None)
    except NoProgress as exc:
        if not link.multi:
            raise
        link.after(run_dir, 2, why=f"{link.topo.label}: {exc}")
        raise NoProgress(f"{link.topo.label}: {exc}") from None
    if live is not None:
        live.ended()
    code = exit_status(run.exit_code)
    if not link.multi:
        if code != 0 and matrix:
            return code
        if code != 0:
            raise JobFailed(code, where)
        jobrun.check_parts(node_dir, where)
        return run
    if not link.topo.merges:
        link.after(run_dir, code)
        if code != 0:
            raise JobFailed(code, f"{where}, {link.topo.label}")
        return run
    return _with_nodes(run, link, run_dir, code, where)


def _with_nodes(run: JobRun, link: nodes_mod.Link, run_dir: Path, code: int,
                where: str) -> JobRun:
    """Node rank 0's run with every other node's share of it: the job failed (its code wins,
    no result) where a node's job exited with an ordinary error code, or node rank 0's own
    failed with every node reporting; a node that is lost (never reported, ended by a
    signal, brought no figures) is kept as named, and node rank 0's own failure beside a
    lost node (its collective lost its peers) does not end the profile."""
    reports = link.after(run_dir, code)
    failed = [r for r in reports if r.failed]
    lost = [r for r in reports if not r.measured and not r.failed]
    if failed:
        raise JobFailed(failed[0].exit_code, f"{where}, node rank {failed[0].node} "
                                             f"({failed[0].host})")
    if code != 0 and (not lost or not run.parts.trainers):
        # node rank 0's job failed with every node there, or before its ranks wrote anything
        # (a rendezvous that never completed): the job failed; the lost nodes said with it
        gone = "".join(f"; node rank {r.node}: {r.why}" for r in lost)
        raise JobFailed(code, f"{where}, {link.topo.label}{gone}")
    node_dir = link.node_dir(run_dir)
    jobrun.check_parts(node_dir, where)
    for r in reports:
        if r.measured and r.folder is not None:
            jobrun.check_parts(r.folder, f"{where}, node rank {r.node}")
    for r in lost:
        link.say(f"{where}: node rank {r.node}{f' ({r.host})' if r.host else ''}: {r.why}")
    nodes_mod.merge_into(run, [link.own(node_dir, code), *reports])
    return run


def _measured(opts: Options, m: _Matrix, run_root: Path, link: nodes_mod.Link,
              say: Callable[[str], None]) -> tuple[list[VariantResult], list[JobRun]]:
    """Each variant that ran, as figures (node rank 0 only: another node's runs are left for
    it), and the first one's ablations under ``--analyze``."""
    results: list[VariantResult] = []
    all_runs: list[JobRun] = []
    for i, v in m.todo:
        runs = m.runs[i]
        if not runs:
            continue
        all_runs.extend(runs)
        if not link.topo.merges:
            continue
        _refuse_unmeasured(runs, opts.argv, v.name)
        results.append(variant_result(v, runs))
        short = cut_short(runs)
        if short:
            say(f"variant {v.name}: {short}")
            results[-1].notes["cut short"] = short
        for line in dict.fromkeys(x for r in runs for x in merge.unreported(r.parts, r.beats)):
            say(f"variant {v.name}: {line}")      # "node X: no figures: ...", kept by node
            where, _, what = line.partition(": ")
            had = results[-1].notes.get(where)
            results[-1].notes[where] = f"{had}; {what}" if had else what
        if opts.analyze and len(results) == 1:
            _analyze_first(opts, v, runs, results[0], run_root, link, say)
    return results, all_runs


def _refuse_unmeasured(runs: list[JobRun], argv: list[str], variant: str) -> None:
    """``NoLoader`` for runs that brought back no loader's figures: the loaders the hooks
    could not measure, named, else what happened (``why_no_figures``)."""
    off = [n for r in runs for n, _ in merge.unmeasured(r.parts)]
    if off and not any(merge.streams(r.parts) for r in runs):
        raise NoLoader(f"no loader of the job was measured (variant {variant}): "
                       f"{', '.join(dict.fromkeys(off))} not measured (the lines "
                       "above say why); no result written")
    if not any(merge.streams(r.parts) for r in runs):
        raise NoLoader(why_no_figures(runs, argv, variant))


def _analyze_first(opts: Options, v: knobs_mod.Variant, runs: list[JobRun],
                   vr: VariantResult, run_root: Path, link: nodes_mod.Link,
                   say: Callable[[str], None]) -> None:
    """``--analyze``: the first variant's ablation runs and its attribution, stored on it; the
    ablations it could not do as notes, which the report shows beside the run table. Across
    nodes, node rank 0 hands each ablation run to the other nodes (``orders``), where it
    can."""
    why = orders.reach(link.topo) if link.multi else ""
    if not why and link.gather is not None and not link.gather.collector.listening:
        why = "node rank 0 is not listening (the line above says why)"
    other = [n for r in runs for n in r.nodes if n.node != 0 and n.via != "endpoint"]
    if not why and other:
        why = (f"node rank {other[0].node}'s figures did not come over it "
               f"({other[0].via or other[0].why}): it cannot be handed the runs either")
    if why:
        line = (f"node rank 0 hands each ablation run to the other nodes over its endpoint, "
                f"signed, and {why}: no attribution for this multi-node job")
        say(f"--analyze: {line}")
        vr.notes["--analyze"] = line
        return
    from . import ablate
    a, an = ablate.analyze(opts.argv, v.overrides(), opts.max_batches, runs,
                           opts.repeats, run_root, say, link=link)
    vr.attribution = a
    if vr.profile is not None:
        vr.profile.analysis = an
    for ab in an.ablations:
        if not ab.done:
            vr.notes[f"--analyze {ab.name}"] = f"cannot ablate: {ab.why}"


def assemble(opts: Options, results: list[VariantResult], all_runs: list[JobRun],
             machine, created: str, answer: Answer, nodes: int = 1) -> Result:
    """The profile ``Result`` of measured variants (``profile``'s and ``tune``'s): the
    command redacted, the per-variant headlines stored, and the caller's ``answer`` (its
    recommendation and best variant, decided once in ``analysis.loader_search``) stored as
    given; the what-if fitted where the answer says the variants differ by a knob that
    reached a loader."""
    from .agent.doors import written_for
    torch_v, ray_v = _versions(all_runs)
    world = max((len(v.repeats[0].ranks) or 1 for v in results if v.repeats), default=1)
    argv = record.command(opts.argv, keep_values=opts.record_argv)
    from ..analysis import waits
    for vr in results:      # decided in analysis, stored, printed from the result (issue 39)
        for key, line in (("measured wait", waits.wait_headline(vr)),
                          ("wait split", waits.library_split_line(vr)),
                          ("interference", waits.interference_line(vr))):
            if line:
                vr.notes[key] = line
    rec = answer.recommendation
    named = [v for v in results if v.name == answer.best_variant]
    analysis = ScenarioAnalysis(
        baseline_variant=results[0].name if results else None,
        best_variant=answer.best_variant,
        best_speedup=whole_run_speedup(named[0], results[0]) if named else None,
        verdict=rec.text if rec else "", recommendation=rec)
    result = Result(
        schema_version=SCHEMA_VERSION, tool=ToolInfo("stallbench", __version__), created_utc=created,
        scenario=_scenario_info(opts, argv), machine=machine,
        settings=RunSettings(repeats=opts.repeats,
                             argv=(redact.argv(sys.argv) if opts.record_argv
                                   else record.own_argv(sys.argv)),
                             max_batches_override=opts.max_batches),
        dataset=DatasetInfo(source="the job's own loaders"),
        variants=results, analysis=analysis,
        profile=ProfileCommand(argv=argv, cwd=record.workdir(),
                               environment=record.environment(os.environ),
                               torch=torch_v, ray=ray_v, hooks_written_for=written_for(),
                               world_size=world, nodes=nodes))
    from . import ablate
    if answer.whatif:                         # a what-if fitted on one job run N times: no
        ablate.whatif_of(result)
    return result


def _scenario_info(opts: Options, argv: list[str]) -> ScenarioInfo:
    """The job as a result's scenario: the script as the allow-list records it (``record``)
    as its path and its bytes as its hash, else the deny-list's redaction of the command (a
    rotated token hashes alike; two data paths do not). ``argv``: the recorded command."""
    found = record.found(opts.argv)
    script = found.script_given if found.script_given and os.path.isfile(found.script_given) \
        else None       # read for its digest; recorded as the allow-list shows it
    # surrogateescape: argv's bytes that are not UTF-8 hash as the bytes they were (class 9)
    sha = hashlib.sha256(Path(script).read_bytes() if script else shlex.join(
        redact.argv(opts.argv)).encode("utf-8", "surrogateescape"))
    shown = record.shown(opts.argv, opts.record_argv)
    return ScenarioInfo(name=opts.name,
                        path=found.script if script and found.script else argv[0],
                        sha256=sha.hexdigest(),
                        fingerprint=fingerprint(opts.argv, opts.axes, opts.max_batches),
                        # one line, as every sink shows it (record.shown); the words as
                        # recorded are profile.argv
                        text=shown, matrix=dict(opts.axes),
                        description=f"stallbench profile -- {shown}")
