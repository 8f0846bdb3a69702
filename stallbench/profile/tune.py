"""``stallbench tune -- CMD``: from the measured stall to a confirmed fix on the user's own job
(issue 41).

The order of runs: the job as written (trial 1); its compute-only ceiling (the same job with
its loader served from memory by ``replay``: the most any loader setting can buy); then one
trial at a time, each chosen by ``analysis.loader_search`` from the trials measured so far;
then the best measured again, interleaved with the job as written (the confirmation). Every
rate is the job's own clocks (the hooks), from its second epoch on with each epoch's start-up
included; a trial ends the job once that rate is known within +-5% (``Enough``), or at
``--trial-batches``, and says so. A setting the job fails under is recorded as a finding and
the search goes on. The result is a profile ``Result`` with a ``tune`` object.

**Across nodes** (``tune -- torchrun --nnodes N``, one tune per node, issue 56): node rank 0
chooses every run and hands it to the other nodes (``orders``): every rank runs each trial's
settings, the ranks' rendezvous meets the same job on every node, each trial ends on every
node when it ends on node rank 0, and node rank 0's result holds every node's ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..analysis import knob_table
from ..analysis import loader_search as search
from ..analysis import trials as rules
from ..errors import UserError
from ..results import JobTrial, JobTune, JobTuneBest, Result, VariantResult, now_utc
from . import budget, jobrun, knobs, merge, session
from . import nodes as nodes_mod
from . import orders
from .agent import doors
from .launcher import (JobRun, NoProgress, exit_status, progress_limit, read_beats, read_parts,
                       run_once)
from .agent.wire import LoaderSettings, Parts, ReplayPlan

KEEP_BATCHES = 8            # batches a compute-only run serves from memory (ablate's)


@dataclass
class Options:
    argv: list[str]
    name: str
    out: Path
    budget_s: float = 600.0
    repeats: int = 1              # confirmation rounds (the best and the job, interleaved)
    trial_batches: int | None = None
    keys: list[str] = field(default_factory=list)    # dotted keys; [] = every key it knows
    progress_timeout: float | None = None
    trace: list[dict[str, Any]] | None = None
    record_argv: bool = False     # --record-argv (profile.record)
    node_port: int | None = None  # a torchrun across nodes: --node-port (profile's)
    node_wait: float = nodes_mod.NODE_WAIT_S


@dataclass
class Measured:
    """One run's rate and the evidence the decider reads (``loader_search.Trial``)."""

    trial: search.Trial
    basis: str
    batches: int
    epochs: int
    kind: str
    name: str
    settings: LoaderSettings


def _base(name: str) -> str:
    return name.rsplit("#", 1)[0]


def _headline(parts: Parts) -> merge.StreamRun | None:
    """The loop the tune judges: the headline loader of the lowest rank. A Ray Data loop
    calls ``ds.iter_torch_batches()`` each epoch (one iterator, so one stream, per epoch):
    the Ray iterators of the same process, class and settings, one after another, with
    about as many batches each (a validation iterator between them has its own count), are
    its epochs, in time order. Torch DataLoaders are never joined (a train and a test loader
    share a class name)."""
    streams = merge.streams(parts)
    name = merge.headline_name(streams)
    hs = sorted((s for s in streams if s.name == name), key=lambda s: s.rank)
    if not hs:
        return None
    head = hs[0]
    if not doors.of(head.kind).pass_per_call or not head.spans:
        return head
    per = head.batches / max(1, len(head.spans))
    kin = sorted((s for s in streams if s.rank == head.rank and s.host == head.host
                  and s.kind == head.kind and _base(s.name) == _base(head.name)
                  and s.spans and s.role == head.role and s.settings == head.settings
                  and abs(s.batches / len(s.spans) - per) <= 0.1 * per + 1),
                 key=lambda s: s.spans[0][0])
    if len(kin) < 2:
        return head
    for x, y in zip(kin, kin[1:]):
        if y.spans[0][0] < x.spans[-1][1]:
            return head                 # overlapping passes: not one loop's epochs
    out = dataclasses.replace(head, spans=[], wait=[], step=[], rows=[], gpu_wait=[], epochs=0)
    for k in kin:
        out.spans.extend(k.spans)
        out.wait.extend(k.wait)
        out.step.extend(k.step)
        out.rows.extend(k.rows)
        out.gpu_wait.extend(k.gpu_wait)
        out.epochs += k.epochs
    return out


class Enough:
    """``run_once``'s ``stop`` for a trial: the job's beat and part files read here, the rule
    decided in ``analysis.trials`` (``stop_by_count``, ``stop_by_rate``):

    - the headline loop's per-epoch rate after its first epoch known within
      ``trials.KNOWN_WITHIN`` (90% t interval of their mean, at least two epochs after it);
    - a job still in its first epoch after ``window_after_s`` (one long epoch): its steady
      window's rate known as well (``trials.window_rates``);
    - ``trial_batches`` batches of one process (a rank), or the tune's ``deadline``.

    The part files are read when the beats show a new epoch or a new loader, else at most
    every ``READ_S`` (or ten times the last read's cost), so that the reading stays small
    beside the job it times."""

    READ_S = 2.0

    def __init__(self, trial_batches: int | None, deadline: float | None = None,
                 window_after_s: float = math.inf) -> None:
        self.trial_batches = trial_batches
        self.deadline = deadline
        self.window_after_s = window_after_s
        self.t0 = time.monotonic()
        self.last = ("", 0)
        self.next_read = 0.0

    def __call__(self, run_dir: Path) -> str:
        beats = read_beats(run_dir)
        batches = max((b.batches for b in beats), default=0)
        now = time.monotonic()
        why = rules.stop_by_count(batches, self.trial_batches,
                                  self.deadline is not None and now >= self.deadline)
        if why:
            return why
        where = max((b.last[:2] for b in beats if b.last is not None),
                    key=lambda x: x[1], default=("", 0))
        if where == self.last and now < self.next_read:
            return ""
        self.last = where
        s = _headline(read_parts(run_dir))
        self.next_read = now + max(self.READ_S, 10 * (time.monotonic() - now))
        if s is None:
            return ""
        return rules.stop_by_rate(s.spans, s.wait, s.step, s.rows, s.batches, now - self.t0,
                                  self.window_after_s)


@dataclass
class _Window:
    """The batches a trial's rate is taken over and that rate (``measure``'s module rule)."""

    rate: float
    basis: str              # in words, for the trial's record
    lo: int                 # its batches: [lo, hi) of the stream's
    hi: int
    t: float                # its span, seconds
    rows: int
    starts: list[int]       # each epoch's first batch (its start-up wait is not steady)
    use: list               # the epochs' spans it covers ([] for one long epoch)


def _window(s: merge.StreamRun, spans: list) -> _Window:
    """With two epochs or more: from the start of the second to the end of the last that
    ended (an epoch the tune cut short adds its start-up and only its first batches: it is
    left out where an ended one follows the first); else the steady window of the one long
    epoch, from the end of its start-up to the trial's last batch."""
    if len(spans) >= 2:
        last = max((i for i, sp in enumerate(spans) if sp[4]), default=0)
        use = spans[1:last + 1] if last >= 1 else spans[1:]
        first = spans[0][2]
        t = use[-1][1] - use[0][0]
        rows = sum(sp[3] for sp in use)
        n = sum(sp[2] for sp in use)
        starts, i = [], first
        for sp in use:
            starts.append(i)
            i += sp[2]
        return _Window(rows / t if t > 0 else math.nan,
                       f"epochs 2-{len(use) + 1} ({n} batches; each epoch's start-up included)",
                       first, first + n, t, rows, starts, use)
    f = merge.figures(s)
    k = f.phases.startup_batches if f.phases is not None else 0
    lo = k if 0 < k < s.batches - 1 else s.batches // 2
    t = sum(s.wait[lo:]) + sum(s.step[lo:])
    rows = sum(s.rows[lo:])
    return _Window(rows / t if t > 0 else math.nan,
                   f"the steady window of its one epoch (batches {lo + 1}-{s.batches})",
                   lo, s.batches, t, rows, [], [])


def measure(run: JobRun, settings: dict[str, Any]) -> Measured | None:
    """The trial's rate (module doc; ``_window``) and its evidence; None when no batch was
    measured."""
    s = _headline(run.parts)
    if s is None or not s.batches:
        return None
    spans = [sp for sp in s.spans if sp[2]]
    w = _window(s, spans)
    rate, basis, lo, hi, t, rows, starts, use = (w.rate, w.basis, w.lo, w.hi, w.t, w.rows,
                                                 w.starts, w.use)
    n = hi - lo
    waits = s.wait[lo:hi]
    first_set = set(starts)
    steady = [w for j, w in enumerate(waits) if lo + j not in first_set] or waits
    wait_s = statistics.fmean(steady) if steady else 0.0
    p90 = sorted(steady)[int(0.9 * (len(steady) - 1))] if steady else 0.0
    steps = [x for x in s.step[lo:hi] if x > 0]
    step_med = statistics.median(steps) if steps else 0.0
    # each epoch's start-up: its span beyond its batches at the steady pace (the fork at
    # iter(), the first batch's wait beyond the steady wait, the workers' shutdown)
    startup = sum(max(0.0, (t1 - t0) - nb * (wait_s + step_med))
                  for (t0, t1, nb, _, _) in use)
    st = s.settings
    pf = _recorded(st, knob_table.PREFETCH_FACTOR)
    stage_wall = sum(float(r[1]) for r in s.stages.values())
    stage_cpu = sum(float(r[2]) for r in s.stages.values())
    trial = search.Trial(
        settings=dict(settings), rate=rate,
        wait_share=(sum(waits) / t) if t > 0 else math.nan,
        step_s=step_med if steps else math.nan,
        wait_s=wait_s, wait_p90_s=p90, startup_share=startup / t if t > 0 else 0.0,
        rows=rows / n if n else math.nan, workers=int(_recorded(st, knob_table.WORKERS) or 0),
        persistent=bool(_recorded(st, knob_table.PERSISTENT_WORKERS)),
        prefetch_factor=pf if isinstance(pf, int) else None,
        pin_memory=bool(_recorded(st, knob_table.PIN_MEMORY)), cuda=bool(s.gpu_wait),
        threads=s.torch_threads, epochs=len(spans),
        producer_cpu_share=stage_cpu / stage_wall if stage_wall > 0 else math.nan,
        foreign_cores=run.load.foreign_cores if run.load is not None else math.nan)
    return Measured(trial, basis, s.batches, sum(1 for sp in spans if sp[4]), s.kind, s.name,
                    st)


def _recorded(settings: LoaderSettings, k: knob_table.Knob) -> Any:
    """A loader's recorded value of knob ``k`` (None where its loader records none)."""
    return settings.get(k.recorded) if k.recorded else None


class _Budget:
    def __init__(self, seconds: float) -> None:
        self.t0 = time.monotonic()
        self.seconds = seconds
        self.longest = 0.0

    def ran(self, wall: float) -> None:
        self.longest = max(self.longest, wall)

    def fits(self, runs: int) -> bool:
        return time.monotonic() - self.t0 + runs * self.longest * 1.15 <= self.seconds

    @property
    def spent(self) -> float:
        return time.monotonic() - self.t0


def _keys(opts: Options, groups: frozenset[str]) -> frozenset[str]:
    """The keys searched on a loader whose door honours ``groups`` (``--keys`` limits them)."""
    known = [k.key for k in knob_table.searched_for(groups)]
    if not opts.keys:
        return frozenset(known)
    return frozenset(k for k in opts.keys if k in known)


def tune(opts: Options, say: Callable[[str], None]) -> Result:
    with progress_limit(opts.progress_timeout):
        return _tune(opts, say)


def fingerprint(opts: Options) -> str:
    """What every node's tune must share: the redacted command, the keys it may change and
    the trials' batch cap (not the budget: node rank 0's alone decides when to stop)."""
    return session.fingerprint(opts.argv, {"tune --keys": sorted(opts.keys)},
                               opts.trial_batches)


def _tune(opts: Options, say: Callable[[str], None]) -> Result:
    """The module's order of runs, one named step each (``_Tuner``), in the job-run layer's
    scratch directory (``jobrun.scratch``), then the answer decided once and assembled.
    Across nodes (module doc): node rank 0 does all of it and orders each run; another node
    follows (``orders.follow``) and ends with its line (``jobrun.NodePartsLeft``)."""
    from ..measure.machine import metadata

    machine = metadata()
    created = now_utc()
    clock = _Budget(opts.budget_s)
    topo = nodes_of(opts.argv, opts.node_port)
    fp = fingerprint(opts)
    shared = f"{jobrun.SCRATCH}{opts.name}-{fp}" if topo.count > 1 else None
    with jobrun.scratch(opts.out, say, shared, remove=topo.merges) as run_root, \
            nodes_mod.Link(topo, fp, run_root, opts.node_wait, say) as link:
        if not topo.merges:
            orders.follow(link, opts.argv, run_root, say)
            raise jobrun.NodePartsLeft(*link.left())
        if link.gather is not None and not link.gather.collector.listening:
            raise UserError(f"tune: {topo.label} cannot listen on {topo.host}:{topo.port}: "
                            "the other nodes could not be told each trial's settings (the "
                            "line above says why; --node-port sets another port)")
        t = _Tuner(opts, say, run_root, clock, link)
        base_run, base = t.as_written()
        groups, keys = _loader_groups(opts, base, say)
        t.trials.append((_record("default", {}, "the job as written", base_run, base),
                         base.trial, [base_run]))
        ceiling, ceiling_note = _ceiling(base_run, base, t.run, clock)
        say(f"ceiling: {ceiling_note}")
        ctx = search.Context(cores=machine.cores, ceiling=ceiling, keys=keys,
                             as_written=dict(base.settings), ranks=ranks_here(base_run.parts))
        stop = t.search(ctx, groups, base, _hang_limit(base_run, opts.progress_timeout))
        best = t.confirm(ctx, groups, base, stop)
        variants = t.variants(groups)
        result = session.assemble(
            session.Options(argv=opts.argv, name=opts.name, out=opts.out, repeats=1, axes={},
                            trace=opts.trace, record_argv=opts.record_argv),
            variants, t.every, machine, created,
            search.tune_answer(best, _dotted(best.settings, groups), variants), topo.count)
        result.tune = JobTune(
            budget_s=opts.budget_s, wall_s=clock.spent, loader_kind=base.kind,
            loader_name=base.name, as_written=_plain(base.settings), cores=machine.cores,
            ceiling_samples_s=ceiling, ceiling_note=ceiling_note,
            trials=[jt for jt, _, _ in t.trials], best=best, runs=t.runs,
            trial_batches=opts.trial_batches, keys=sorted(keys))
        return result


def nodes_of(argv: list[str], node_port: int | None) -> nodes_mod.Topology:
    """The job's nodes (``nodes.topology``), where a tune can run across them: it hands
    each trial to the other nodes over node rank 0's endpoint (``orders.reach``). Refused
    before anything runs, on every node alike."""
    topo = nodes_mod.topology(argv, os.environ, node_port)
    why = orders.reach(topo)
    if why:
        raise UserError(f"tune: across nodes node rank 0 hands each trial's settings to the "
                        f"other nodes over its endpoint, signed, and {why} (docs/profile.md, "
                        "Across machines)")
    return topo


def ranks_here(parts: Parts) -> int:
    """The job's ranks on this machine (its launched processes with a world: torchrun's
    ranks, Ray Train's workers here), whose loaders and trainers share its cores; 1 for a
    job of one process. A rank on another machine (another node's, a Ray worker elsewhere)
    has its own."""
    import socket
    here = socket.gethostname()
    ranks = {p.header.rank for p in parts.trainers
             if p.header.launched and p.header.world_size > 1 and p.header.host == here}
    return max(1, len(ranks))


def _loader_groups(opts: Options, base: Measured, say: Callable[[str], None]
                   ) -> tuple[frozenset[str], frozenset[str]]:
    """Which ``--set`` groups reach the headline loader as written (its door says), and the
    keys the search may change; a loader none reaches leaves the trainer's threads alone,
    said."""
    groups = frozenset(doors.of(base.kind).set_keys)
    keys = _keys(opts, groups)
    if not knob_table.reaches_a_loader(groups):
        say(f"the headline loader {base.name} is a {base.kind}: no loader setting of "
            "tune reaches it (--set dataloader.* reaches torch's DataLoader, ray.* Ray "
            "Data's iterators); only the trainer's threads can be searched, where they "
            "oversubscribe the cores")
    return groups, keys


# a trial as recorded, the evidence the decider reads (None: a finding, no rate), its runs
Measurement = tuple[JobTrial, "search.Trial | None", list[JobRun]]


class _Tuner:
    """One tune's runs and what they measured, shared by its steps: the job as written, the
    search, the confirmation. Each run is numbered, traced and ended by ``Enough``."""

    def __init__(self, opts: Options, say: Callable[[str], None], run_root: Path,
                 clock: _Budget, link: nodes_mod.Link) -> None:
        self.opts, self.say, self.run_root, self.clock = opts, say, run_root, clock
        self.link = link
        self.runs = 0
        self.every: list[JobRun] = []           # the runs whose figures the result holds
        self.trials: list[Measurement] = []     # the job as written first
        self.again: list[search.Trial] = []     # trials measured again (the load moved)

    def run(self, settings: dict[str, Any], label: str, replay: ReplayPlan | None = None
            ) -> JobRun:
        """One run of the job with ``settings`` (dotted keys), said, traced as profile's.
        Across nodes, ordered on every node, ended on every node when it ends here, every
        node's figures in it (``orders.lead``)."""
        opts, link = self.opts, self.link
        self.runs += 1
        self.say(f"run {self.runs}: {label}")
        v = knobs.Variant(knobs.name_of(settings), settings)
        enough = Enough(opts.trial_batches, self.clock.t0 + opts.budget_s, opts.budget_s / 8)
        run = orders.lead(link, opts.argv, self.run_root, self.run_root / f"t{self.runs}",
                          v.overrides(), None, replay, f"run {self.runs}", self.say,
                          stop=enough, said=f"run {self.runs}: {label}")
        self.clock.ran(run.wall_s)
        jobrun.trace_run(opts.trace, f"run {self.runs} ({label.split(':')[0]})", run.parts)
        if run.stopped:
            self.say(f"run {self.runs}: ended by tune: {run.stopped}")
        return run

    @staticmethod
    def ok(run: JobRun) -> bool:
        """The job ended well (by itself with 0, or ended by the tune: its rate known) and
        every figure of it was written: a run whose parts were lost (a full ``--out``) is
        never compared (issue 59: a full disk once made "keep the job as written")."""
        return (run.exit_code == 0 or bool(run.stopped)) and not _lost(run)

    def as_written(self) -> tuple[JobRun, Measured]:
        """Trial 1, the job as written: the tune fails with it (its exit code, the parts it
        lost, no loader measured), since every later rate is compared with it."""
        base_run = self.run({}, "the job as written")
        if not self.ok(base_run):
            raise jobrun.JobFailed(exit_status(base_run.exit_code), "the job as written")
        jobrun.check_parts(base_run.run_dir or self.run_root, "the job as written")
        base = measure(base_run, {})
        if base is None:
            raise session.NoLoader(session.why_no_figures([base_run], self.opts.argv,
                                                          "default"))
        self.every.append(base_run)
        return base_run, base

    def search(self, ctx: search.Context, groups: frozenset[str], base: Measured,
               hang: tuple[float, str] | None) -> tuple[str, str]:
        """One trial at a time as ``loader_search.decide`` chooses from every trial so far,
        until it stops or the budget leaves no room for a trial and the confirmation:
        (stop reason, stop text)."""
        while True:
            done = [t for _, t, _ in self.trials if t is not None] + self.again
            failed = [t for t, tt, _ in self.trials if tt is None]
            tried = [_dotted(t.settings, groups) for t, _, _ in self.trials]
            d = search.decide(ctx, done + [_failed_trial(f, groups) for f in failed], tried)
            if d.choice is None:
                return d.stop_reason, d.stop_text
            if not self.clock.fits(1 + 2 * max(1, self.opts.repeats)):
                return "budget", (f"the budget ({self.opts.budget_s / 60:g} min) leaves no "
                                  f"room for another trial and the confirmation (runs take "
                                  f"up to {self.clock.longest:.0f} s); next would have been "
                                  f"{d.choice.change}")
            self.trial(d.choice, base, hang)

    def trial(self, c: search.Choice, base: Measured, hang: tuple[float, str] | None) -> None:
        """One trial, recorded whatever it showed: a rate, or a finding (a setting that hangs
        the job, fails it, runs no batch, or that the job overrides) the search goes on from."""
        name = knobs.name_of(c.settings)
        try:
            with (progress_limit(*hang) if hang else contextlib.nullcontext()):
                run = self.run(c.settings, f"trial {len(self.trials) + 1}: {c.change} ({c.why})")
        except NoProgress as exc:       # this setting hangs the job: a finding
            self.say(f"trial {name}: {exc}: recorded, the search goes on")
            self.trials.append((JobTrial(name=name, settings=search.bare(c.settings),
                                         why=c.why + f"; {exc}", outcome="failed",
                                         exit_code=2, predicted_samples_s=c.predicted),
                                None, []))
            return
        m = measure(run, c.settings) if self.ok(run) else None
        if m is None:
            code = exit_status(run.exit_code)
            what = (f"the job exited with code {code}" if code else _lost(run) or
                    "the job ran no batch of its loader under it")
            self.say(f"trial {name}: {what}: recorded, the search goes on")
            jt = JobTrial(name=name, settings=search.bare(c.settings),
                          why=c.why + f"; {what}", outcome="failed", exit_code=code,
                          wall_s=run.wall_s, predicted_samples_s=c.predicted)
            self.trials.append((jt, None, [run]))
            return
        self.every.append(run)
        jt = _record(name, c.settings, c.why, run, m, c.predicted)
        want = c.settings.get(knob_table.THREADS.key)
        if want is not None and m.trial.threads is not None and m.trial.threads != want:
            # the job set its own threads after importing torch: the same job again
            jt.outcome = "not_applied"
            jt.why += (f"; not applied: the trainer ran with {m.trial.threads} torch "
                       "threads (the job sets its own)")
            self.say(f"trial {name}: not applied (the job sets its own threads)")
            self.trials.append((jt, None, [run]))
            return
        self.say(f"trial {name}: {m.trial.rate:,.0f} steady samples/s "
                 f"({m.trial.rate / base.trial.rate:.2f}x as written)")
        prior = next((x for x in self.trials if x[0].name == name and x[1] is not None), None)
        if prior is not None:
            # measured again (the load moved, issue 58): one trial with both runs, the new
            # rate its evidence beside the first
            prior[2].append(run)
            prior[0].why += (f"; measured again: {m.trial.rate:,.0f} steady samples/s "
                             f"(others took {m.trial.foreign_cores:.2f} cores)")
            self.again.append(m.trial)
            return
        self.trials.append((jt, m.trial, [run]))

    def confirm(self, ctx: search.Context, groups: frozenset[str], base: Measured,
                stop: tuple[str, str]) -> JobTuneBest:
        """The best trial measured again, interleaved with the job as written, and the
        answer as ``analysis.trials.confirm`` decides it (the job as written where the best
        is not confirmed, said)."""
        bj, bt, bruns = max(((jt, t, rs) for jt, t, rs in self.trials if t is not None),
                            key=lambda x: x[1].rate)
        searched = bj is not self.trials[0][0]
        base_rates, best_rates = [base.trial.rate], [bt.rate]
        pairs: list[float] = [bt.rate / base.trial.rate] if searched else []
        lost: list[str] = []            # the best failing where it ran before: a finding
        for r in range(max(1, self.opts.repeats) if searched else 0):
            a = self.run({}, f"confirmation {r + 1}: the job as written")
            b = self.run(_dotted(bj.settings, groups), f"confirmation {r + 1}: {bj.name}")
            ma = measure(a, {}) if self.ok(a) else None
            mb = measure(b, _dotted(bj.settings, groups)) if self.ok(b) else None
            if ma is not None:
                base_rates.append(ma.trial.rate)
                self.trials[0][2].append(a)
            if mb is not None:
                best_rates.append(mb.trial.rate)
                bruns.append(b)
            if ma is not None and mb is not None:
                pairs.append(mb.trial.rate / ma.trial.rate)
            if mb is None:
                code = exit_status(b.exit_code)
                lost.append(f"confirmation {r + 1}: " + (
                    f"the job exited with code {code} under {bj.name}" if code else
                    _lost(b) or f"no batch of its loader was measured under {bj.name}"))
        c = rules.confirm(bj.name, base_rates, best_rates, pairs, lost, searched)
        stop_reason, stop_text = stop
        if c.why_not:
            self.say(f"confirmation: {c.why_not}; the answer is the job as written")
            stop_text += f"; {c.why_not}"
            bj, bt = self.trials[0][0], base.trial
        whole, whole_how = self.whole_job(bruns if bj is not self.trials[0][0] else [])
        answered = len(self.trials) > 1 or stop_reason in ("at_ceiling", "no_gain_predicted")
        if not answered:
            stop_text += ("; no loader setting was measured, so keeping the job as written "
                          "is not an answer (give the tune more --budget-minutes)")
        return JobTuneBest(
            name=bj.name, settings=dict(bj.settings), steady_samples_s=c.steady_samples_s,
            speedup=c.speedup,
            ceiling_share=(c.steady_samples_s / ctx.ceiling) if ctx.ceiling else None,
            stop_reason=stop_reason, stop_text=stop_text, speedup_low=c.low,
            speedup_high=c.high, confirm_runs=c.rounds, still_binds=search.still_binds(ctx, bt),
            apply=search.apply_text(_dotted(bj.settings, groups)), answered=answered,
            basis=base.basis, whole_job_speedup=whole, whole_job_basis=whole_how)

    def whole_job(self, best_runs: list[JobRun]) -> tuple[float | None, str]:
        """What the answer gains over the whole job, its first epoch included (issue 58),
        between the job as written's first run and the best's last (``trials.whole_job``)."""
        if not best_runs:
            return 1.0, "the answer is the job as written"
        spans = lambda run: [sp for sp in (_headline(run.parts).spans  # noqa: E731
                                           if _headline(run.parts) else []) if sp[2]]
        base_run = self.trials[0][2][0]
        runs = self.trials[0][2]
        whole = next((r for r in runs if not r.stopped), None)
        epochs = len(spans(whole)) if whole is not None else None
        b = best_runs[-1]
        return rules.whole_job((spans(base_run), bool(base_run.stopped)),
                               (spans(b), bool(b.stopped)), epochs)

    def variants(self, groups: frozenset[str]) -> list[VariantResult]:
        """The result's variants: one per measured trial, the job as written first, each
        with its runs (the confirmation's too); a run the tune ended is said, not taken for
        a job that ended early."""
        out: list[VariantResult] = []
        for jt, t, rs in self.trials:
            if t is None:
                continue
            vr = session.variant_result(knobs.Variant(jt.name, _dotted(jt.settings, groups)),
                                        rs)
            if any(r.stopped for r in rs) and vr.profile is not None:
                vr.profile.ended_early = ""
                vr.notes["ended by tune"] = "; ".join(dict.fromkeys(
                    r.stopped for r in rs if r.stopped))
            out.append(vr)
        return out


def _plain(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if isinstance(v, (int, float, str, bool))
            or v is None}


HANG_FACTOR = 10.0     # a trial with no batch for this many times the job's longest gap ...
HANG_MIN_S = 60.0      # ... and at least this long hangs (without --progress-timeout)


def hang_seconds(parts: Parts) -> float | None:
    """The job as written's longest time without a batch of any loader (from its first
    process's start: its start-up too), in seconds; None where it made no batch."""
    starts = [p.header.t0_wall for p in parts.trainers]
    got = sorted(t + w for s in merge.streams(parts) for t, w in zip(s.t_wall, s.wait))
    if not got or not starts:
        return None
    times = [min(starts), *got]
    return max(b - a for a, b in zip(times, times[1:]))


def _hang_limit(base_run: JobRun, given: float | None) -> tuple[float, str] | None:
    """Where ``--progress-timeout`` was not given, a trial still cannot block the tune: a
    setting that deadlocks the job (a worker count its dataset cannot fork with, a prefetch
    that exhausts memory) makes no batch for ``HANG_FACTOR`` times the longest gap the job
    as written had (start-up included), at least ``HANG_MIN_S``: it is stopped and recorded
    as a finding, the search goes on. Given, ``--progress-timeout`` rules every run."""
    gap = hang_seconds(base_run.parts)
    if given is not None or gap is None:
        return None
    limit = max(HANG_MIN_S, HANG_FACTOR * gap)
    return limit, (f"tune's hang limit for a trial: {HANG_FACTOR:g}x the job's longest time "
                   f"without a batch as written, {gap:.1f} s, at least {HANG_MIN_S:g} s")


def _dotted(settings: dict[str, Any], groups: frozenset[str]) -> dict[str, Any]:
    """A trial's bare settings back as ``--set`` keys (its loader's door honours ``groups``)."""
    return search.dotted(settings, groups)


def _failed_trial(jt: JobTrial, groups: frozenset[str]) -> search.Trial:
    return search.Trial(settings=_dotted(jt.settings, groups), rate=0.0, wait_share=math.nan,
                        step_s=math.nan, wait_s=0.0, wait_p90_s=0.0, startup_share=0.0,
                        rows=math.nan, workers=0, persistent=False, prefetch_factor=None,
                        pin_memory=False, cuda=False, threads=None, epochs=0, ok=False)


def _record(name: str, settings: dict[str, Any], why: str, run: JobRun, m: Measured,
            predicted: float | None = None) -> JobTrial:
    return JobTrial(name=name, settings=search.bare(settings), why=why, outcome="measured",
                    steady_samples_s=m.trial.rate, rate_basis=m.basis,
                    steady_wait_share=m.trial.wait_share, step_s=m.trial.step_s,
                    batches=m.batches, epochs=m.epochs, ended_by_tune=run.stopped,
                    exit_code=exit_status(run.exit_code) if not run.stopped else 0,
                    wall_s=run.wall_s, predicted_samples_s=predicted,
                    foreign_cores=run.load.foreign_cores if run.load is not None else None)


def _lost(run: JobRun) -> str:
    """Why a run's figures are not whole ("" when they are: ``jobrun.parts_lost``)."""
    return jobrun.parts_lost(run.run_dir) if run.run_dir is not None else ""


def _ceiling(base_run: JobRun, base: Measured, one, clock: _Budget
             ) -> tuple[float | None, str]:
    """The compute-only steady rate: the job with its headline loader served from memory
    (its first batches kept, then served again: ``replay``), per batch the loop's own wait
    + step over the served batches (``ablate.compute_only``)."""
    from .ablate import batch_counts, compute_only
    why = doors.of(base.kind).served
    if why:
        return None, f"not measured: {why}"
    counts = batch_counts(base_run.parts)
    # the first epoch's batches; where the tune stopped the job inside it (one long epoch),
    # none ended: the batches it ran (the served run then serves to the loader's own end)
    first = (counts.get(base.name) or [base.batches])[0]
    keep = max(1, min(KEEP_BATCHES, first // 4))
    rule = budget.machine_budget(max(base.trial.workers, 1))
    run = one({}, "the compute-only ceiling (the loader served from memory)",
              ReplayPlan(mode="compute_only", keep=keep, budget_mb=rule.mb, counts=counts))
    if run.exit_code != 0 and not run.stopped:
        return None, (f"not measured: the job exited with code {exit_status(run.exit_code)} "
                      "with its loader served from memory")
    if _lost(run):
        return None, f"not measured: {_lost(run)}"
    got = compute_only(run, base.name, 1)
    if got is None or not (got[0] > 0 and base.trial.rows > 0):
        return None, ("not measured: the compute-only run served fewer than 2 batches from "
                      "memory")
    m = measure(run, {})
    if m is not None and m.epochs >= 2 and not doors.of(base.kind).pass_per_call \
            and math.isfinite(m.trial.rate):
        # the trials' own basis: from the second epoch on, the job's time between epochs
        # (validation, checkpoints) included, every batch of those epochs served
        return m.trial.rate, (f"{m.trial.rate:,.0f} samples/s compute-only, {m.basis} "
                              f"with every batch served from memory (the loop's wait + step "
                              f"{got[0] * 1e3:.2f} ms per batch); measured")
    rate = base.trial.rows / got[0]
    return rate, (f"{rate:,.0f} samples/s compute-only (the loop's wait + step per batch "
                  f"with batches served from memory: {got[0] * 1e3:.2f} ms; measured)")
