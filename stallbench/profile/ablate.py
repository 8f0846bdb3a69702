"""``stallbench profile --analyze``: prove the split on the user's own job by ablation (issue 28).

The first variant (the job as written, with the first ``--set`` values) is run again with
parts of its data path served from memory instead of computed (``replay.py`` does the serving
inside the job's processes), in DS-Analyzer's chain, and ``analysis.waits`` attributes the
stall from the waits each run measured (each run's step compared with the full run's apart:
interference; issue 39):

    full (the variant's own runs)
    -> dataset served        (``fetch``: the dataset's ``__getitem__`` or ``__iter__``, the user's transform
                              inside it included, replayed from a warm recording run)
    -> dataset+collate served (``preprocess``: ``collate_fn`` as well)
    -> + pin served          (``transfer``: only where the job pins; otherwise the previous run
                              is already "all three free" and the transfer part is 0 by
                              construction: there is no pin stage to remove)
    -> compute-only          (no loader at all: the trainer's stream serves its first batches
                              again; ``replay.py`` says how)

Recorded outputs are matched to the calls of the served run by (loader, worker, epoch, call
number) and checked against the indices the sampler asked for; a run in which any call was
not served (a sampler that shuffles without a seed, the memory budget) is not an ablation of
that stage, and the result says so instead of giving a number (``ProfileAblation.why``).

The compute-only run keeps its first ``keep`` batches (the loader's real start-up happens
there and is left out) and serves them for the rest of each epoch, as many batches as the full
run had; its epoch is the served batches' mean wait + step x the full run's batches: a
steady figure by construction, EXTRAPOLATED over batches it served rather than one that ran
whole. A GPU job copies the served batches to the device in its own step as it did in the full
run, so the host-to-device copy stays in compute, not in transfer (``transfer_note``).
"""

from __future__ import annotations

import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..analysis import differential, figures, knee, waits
from ..analysis.stats import bootstrap_medians, finite_summary, percentile_interval
# not ..pipeline: that imports torch and pyarrow.compute (~4 s), which the launcher never needs
from ..stages.ablation import COMPUTE_ONLY, Ablation
from ..results import Attribution, Interval, ProfileAblation, ProfileAnalysis, RepeatFigures
from . import budget, merge, orders
from .agent import doors
from .launcher import JobRun, exit_status
from .agent.wire import BudgetStop, LoaderSettings, Parts, Replay, ReplayPlan, StageServe

KEEP_BATCHES = 8
# variable-length batches (the full run's sizes vary): more kept batches, so the compute-only
# run serves several lengths and its step is fitted over them (``waits.size_scaled``)
KEEP_VARIED = 32
FULL = "full"
ITEMS = Ablation(fetch=True).name
BATCH = Ablation(fetch=True, preprocess=True).name
FREE = Ablation(True, True, True).name
ONLY = COMPUTE_ONLY.name
# Said as a condition: the profile does not see whether the job uses a device (a CPU-only job
# was told it "copies its batches to the device", issue 39).
TRANSFER_NOTE = ("transfer is pin_memory alone: a copy to a device that the job makes in its "
                 "own step (if it makes one) is counted in compute, in every run alike "
                 "(served batches are host batches, copied again as in the full run)")


class Failed(Exception):
    """The job failed under an ablation: the ablation is void, the profile goes on."""


def batch_counts(parts: Parts) -> dict[str, list[int]]:
    """Batches per epoch per stream name, as the full run's trainer (lowest rank) saw them."""
    out: dict[str, list[int]] = {}
    eps = parts.epochs_by_image()
    for p in sorted(parts.trainers, key=lambda p: p.header.rank):
        mine = eps.get(p.header.image_key, {})
        for s in p.streams:
            out.setdefault(s.name, [len(e.wait) for e in mine.get(s.key, [])])
    return out


def _figures(run: JobRun, headline: str) -> RepeatFigures | None:
    hs = sorted((s for s in merge.streams(run.parts) if s.name == headline), key=lambda s: s.rank)
    if not hs:
        return None
    f = merge.job_figures([(s, merge.figures(s)) for s in hs], run.peak_pss_mb)
    f.load = run.load       # a step that moved on a busy machine is withheld (analysis.waits)
    worst = max(hs, key=lambda s: sum(s.wait))      # the rank whose stall is the job's
    ph = f.phases
    f.stall_se_s = waits.stall_se(worst.wait, ph.startup_batches if ph is not None and
                                  ph.has_steady else None)
    return f


_rank_batches = waits.rank_batches


def _replay_parts(run: JobRun) -> tuple[Replay, ...]:
    return run.parts.replays


def _where(p) -> str:
    """Where a replay problem happened, in words: a loader worker, or the loop's own
    process (worker -1), and the epoch."""
    who = f"worker {p.worker}" if p.worker not in (None, -1) else "the loop's process"
    return f"{who}, epoch {p.epoch}"


def _served_problem(runs: list[JobRun], stage: str) -> str:
    """Why these serve runs are not an ablation of ``stage`` ("" when every call was
    served), the fix first: the one line the user reads."""
    for r in runs:
        for p in _replay_parts(r):
            if p.unreadable:
                return (f"give the batch's class a __setstate__ to ablate {stage}: the "
                        f"recording could not be read back ({p.unreadable})")
            if p.missing:
                n = p.missing
                return (f"make the epochs the same length in every run (seed what decides "
                        f"it) to ablate {stage}: a served run asked for more batches than the "
                        f"recording run made ({_where(n)}: {n.recorded} recorded)")
        if not any(p.served for p in _replay_parts(r)):
            return f"no fetch call was served ({stage}: the loader's fetchers were not reached)"
    return ""


def _serving_notes(runs: list[JobRun]) -> list[str]:
    """What the served runs did that the user should know, though it voids nothing (issue
    57): a sampler that asked for other items than the recording run (served in the
    recording's order), spawned workers that read their recording inside the measured
    window (forked ones read it before they fork)."""
    parts = [p for r in runs for p in _replay_parts(r)]
    out = []
    moved = sum(p.reordered for p in parts)
    if moved:
        out.append(f"the loader's order is not seeded: the served runs were given the "
                   f"recording run's batches in its order ({moved} of "
                   f"{sum(p.served for p in parts)} calls asked for other items)")
    late = sum(p.late_read_s for p in parts) / max(len(runs), 1)
    if late > 0.001:
        out.append(f"spawned loader workers read their recording inside the measured window "
                   f"({late:.3f} s per run, summed over workers; not subtracted): workers "
                   f"that fork read it before they start")
    return out


def full_sizes(parts: Parts, headline: str) -> list[int]:
    """The size (``rows.elements``) of every batch of the headline loader, in order, as the
    full run's trainer of the lowest rank saw them; [] where a batch has none recorded."""
    eps = parts.epochs_by_image()
    for p in sorted(parts.trainers, key=lambda p: p.header.rank):
        mine = eps.get(p.header.image_key, {})
        for s in p.streams:
            if s.name == headline:
                got = [z for e in mine.get(s.key, []) for z in
                       (e.size if len(e.size) == len(e.wait) else [0] * len(e.wait))]
                return got if got and min(got) > 0 else []
    return []


def compute_only(run: JobRun, headline: str, batches: float,
                 sizes: list[int] | None = None) -> tuple[float, float, float] | None:
    """(epoch, step per batch, compute) of a compute-only run, extrapolated to ``batches``
    from the batches it served from memory (the worst rank's); with the full run's batch
    ``sizes``, each served batch's time is scaled to them (``waits.size_scaled``:
    variable-length batches). An epoch's first batch, served, counts the wait of the epoch's
    other served batches, not its own: that wait ran from ``iter()``, where a DataLoader with
    non-persistent workers forks them again every epoch (issue 57: the floor within 3% of
    the job's own step)."""
    served_from: dict[int, dict] = {}
    for p in _replay_parts(run):
        served_from[p.pid] = p.served_from
    best = None
    for p in run.parts.trainers:
        served = served_from.get(p.header.pid, {})
        for s in p.streams:
            if s.name != headline:
                continue
            # a loop fed through a queue (doors/thread_queue): its batches are its producer's
            # loader served, in order
            marks = served.get(s.fed_by or headline) or []
            per, steps, zs = [], [], []
            # the epoch a tune's trial stopped in as well (open at the stop: ``Trainer.open``)
            for e, ep in enumerate(run.parts.stream_epochs(p, s.key)):
                k = marks[e] if e < len(marks) else None
                if k is None:
                    continue
                others = sorted(ep.wait[max(k, 1):]) or [0.0]
                for i in range(k, len(ep.wait)):
                    st = ep.step[i] if i < len(ep.step) else None
                    if st is None:
                        continue
                    # an epoch's first batch waits from iter(): the loader's start-up of that
                    # epoch (torch forks its non-persistent workers there), not the loop's:
                    # served from memory, it waits as the epoch's other served batches
                    per.append((ep.wait[i] if i else others[len(others) // 2]) + st)
                    steps.append(st)
                    zs.append(ep.size[i] if len(ep.size) == len(ep.wait) else 0)
            if len(per) >= 2:
                each = waits.size_scaled(per, zs, sizes or []) or statistics.fmean(per)
                step = waits.size_scaled(steps, zs, sizes or []) or statistics.fmean(steps)
                cand = (each * batches, step, step * batches)
                if best is None or cand[0] > best[0]:
                    best = cand
    return best


def _difference_interval(a: list[float], b: list[float], confidence: float = 0.9,
                         n_boot: int = 2000) -> Interval:
    """Percentile bootstrap of median(a) - median(b), each resampled on its own (as
    ``differential`` does for its parts); the point itself with one repeat each."""
    d = bootstrap_medians({"a": a, "b": b}, n_boot, seed=0)
    return Interval(*percentile_interval(d["a"] - d["b"], confidence))


AUTOMATIC = doors.own_stages()     # the doors' own stages: never a job's marks
PART_WORDS = {"fetch": ("read", "load", "fetch", "decode", "open", "download", "io"),
              "preprocess": ("transform", "augment", "preprocess", "tokeni", "resize", "crop",
                             "normali", "collate", "encode"),
              "transfer": ("pin", "copy", "transfer", "to_device", "h2d")}


# What each automatic stage of a DataLoader job is charged to (``ProfileAnalysis.stage_map``).
STAGE_PARTS = {"dataset.__getitem__": "fetch", "dataset.__iter__": "fetch",
               "collate_fn": "preprocess", "pin_memory": "transfer"}


def job_stage_map(streams: list[merge.StreamRun]) -> dict[str, str]:
    """The automatic stages the headline loader's runs timed, each with its part: the job's
    own names for the parts (``figures.part_name``), so an iterable dataset's part is
    "dataset __iter__". Empty where none was timed (a Ray Data iterator, a watched iterable):
    the parts then keep the usual names."""
    ran = {name for s in streams for name in s.stages}
    return {name: part for name, part in STAGE_PARTS.items() if name in ran}


def part_of(name: str) -> str:
    """The scenario part a user's stage name maps to, or the name itself."""
    low = name.lower()
    for part, words in PART_WORDS.items():
        if any(w in low for w in words):
            return part
    return name


def _no_recording(head, streams0: list, headline: str | None) -> str:
    """Why the headline loader gets no recording run ("" where it does): its door says its
    stages are not recorded (``STAGES``: a Ray Data iterator's run in Ray's tasks, outside
    torch's fetchers) and no ``stallbench.stage`` is marked in the loop's process (those the
    recording would still keep)."""
    why = doors.of(head.kind).stages if head is not None else ""
    if not why:
        return ""
    marked = {n for st in streams0 if st.name == headline for n in st.stages
              if n not in AUTOMATIC}
    return "" if marked else why


def _recorded_stages(rec: list[JobRun]) -> dict[str, StageServe]:
    """What the recording run kept of each ``stallbench.stage``, counted over its processes
    (calls recorded, unkeyed, unpicklable, unwritable)."""
    seen: dict[str, StageServe] = {}
    for r in rec:
        for p in _replay_parts(r):
            for name, d in p.stages.items():
                seen[name] = seen.get(name, StageServe()) + d
    return seen


def _unservable(d: StageServe, budget_mb: float) -> str:
    """Why a marked stage's recording cannot be served ("" when it can)."""
    if not d:
        return ("a `with stallbench.stage(...)` block has no return value to serve; "
                "decorate the function that computes it instead")
    if d.unkeyed:
        return ("its calls have no hashable argument (a number, a string) to match them "
                "between runs by")
    if d.unpicklable or d.unwritable:
        return "its outputs could not be kept (not picklable, or the disk refused them)"
    if not d.recorded:
        return f"the memory budget ({budget_mb:g} MB) ran out before its calls were kept"
    return ""


def _marked(p: _Plan, rec: list[JobRun], runs_of: _Runs, repeats: int) -> None:
    """Each ``stallbench.stage`` of the headline loader served alone from the recording (by
    its hashable arguments): its stall = full - that run, with its interval."""
    an, full = p.an, p.full
    seen = _recorded_stages(rec)
    marked = sorted({n for s in p.streams0 if s.name == p.headline for n in s.stages
                     if n not in AUTOMATIC} | set(seen))
    steady_ok = all(f.phases is not None and f.phases.has_steady for f in full)
    for name in marked:
        removes = f"stallbench.stage({name!r})"
        why = _unservable(seen.get(name, StageServe()), p.budget_mb)
        if why:
            an.ablations.append(ProfileAblation(f"stage:{name}", removes, False, why,
                                                part=part_of(name)))
            continue
        try:
            rs = runs_of(f"{removes} served from the recording",
                         ReplayPlan(mode="serve", serve=f"stage:{name}", dir=str(p.rec_dir),
                                    budget_mb=p.budget_mb), repeats)
        except Failed as exc:
            an.ablations.append(ProfileAblation(f"stage:{name}", removes, False, str(exc),
                                                part=part_of(name)))
            continue
        computed = sum(rp.stage(name).computed for r in rs for rp in _replay_parts(r))
        if computed:
            an.ablations.append(ProfileAblation(
                f"stage:{name}", removes, False,
                f"{computed} call(s) asked for arguments the recording run never saw (its "
                f"inputs differ between runs: a sampler that shuffles without a seed?)",
                runs=len(rs), part=part_of(name)))
            continue
        figs = [f for f in (_figures(r, p.headline) for r in rs) if f is not None]
        ok = steady_ok and all(f.phases is not None and f.phases.has_steady for f in figs)
        # the stage's part from the measured waits (issue 39): full's stall - that run's
        full_t = [waits.stall_of(f, ok) for f in full]
        got = [waits.stall_of(f, ok) for f in figs]
        an.ablations.append(ProfileAblation(
            f"stage:{name}", removes, True, runs=len(figs),
            epoch_s=_summary([f.epoch_s for f in figs]),
            steady_epoch_s=_summary([f.phases.steady_epoch_s for f in figs  # type: ignore[union-attr]
                                     ]) if ok else None,
            stall_s=max(statistics.median(full_t) - statistics.median(got), 0.0),
            stall_interval=_difference_interval(full_t, got), part=part_of(name)))


_summary = finite_summary     # one rule for a figure over repeats (analysis.stats)


def analyze(argv: list[str], overrides: dict[str, Any], max_batches: int | None,
            full_runs: list[JobRun], repeats: int, run_root: Path,
            say: Callable[[str], None], keep: int = KEEP_BATCHES,
            budget_mb: float | None = None, link: Any = None
            ) -> tuple[Attribution | None, ProfileAnalysis]:
    """The ablation runs of one variant and its attribution (None where the chain is not
    whole: the ``ProfileAnalysis`` then says which ablation is missing and why).
    ``budget_mb``: bytes of outputs one process may keep; None: from the machine's free
    memory shared by the headline loader's workers (``budget.machine_budget``, stated).
    ``link``: a multi-node job's (``nodes.Link``): every ablation run runs on every node
    (``orders.lead``), each node recording and serving its own ranks' batches."""
    p = _plan(full_runs, run_root, keep, budget_mb)
    runs_of = _Runs(argv, run_root, overrides, max_batches, say, link)
    only = _compute_only(p, runs_of, repeats)
    served = _served(p, runs_of, repeats)
    _transfer(p, served)
    return _attribute(p, only, served)


@dataclass
class _Plan:
    """What every ablation run of one variant is planned and judged from: the full runs'
    headline loader, its batches and settings, the recording budget, and the analysis the
    runs fill in."""

    streams0: list[merge.StreamRun]        # every stream of the full runs
    headline: str | None
    hs: list[merge.StreamRun]              # the headline loader's streams
    counts: dict[str, list[int]]           # batches per epoch per stream (``batch_counts``)
    first_epoch: int
    budget_mb: float
    an: ProfileAnalysis
    full: list[RepeatFigures]              # the full runs' figures
    batches: float                         # one rank's batches per full run
    rec_dir: Path
    sizes: list[int]                       # the full run's batch sizes (``full_sizes``)

    @property
    def items_fn(self) -> str:
        """The dataset's part by the job's own stage name, e.g. "dataset __iter__"."""
        return figures.part_name("fetch", True, self.an.stage_map)


def _plan(full_runs: list[JobRun], run_root: Path, keep: int,
          budget_mb: float | None) -> _Plan:
    """The plan from the full runs: ``keep`` bounded by a quarter of the first epoch, the
    recording budget given or from the machine (stated either way)."""
    streams0 = [s for r in full_runs for s in merge.streams(r.parts)]
    headline = merge.headline_name(streams0)
    counts = batch_counts(full_runs[0].parts)
    hs = [s for s in streams0 if s.name == headline]
    if budget_mb is None:
        rule = budget.machine_budget(max(hs[0].producers if hs else 0, 1))
        budget_mb, budget_basis = rule.mb, rule.basis
    else:
        budget_basis = f"{budget_mb:g} MB per process, as given"
    first_epoch = (counts.get(headline) or [0])[0]
    sizes = full_sizes(full_runs[0].parts, headline) if headline else []
    if sizes and max(sizes) > waits.SIZE_VARIES * min(sizes):
        keep = max(keep, KEEP_VARIED)       # variable-length batches: more kept lengths
    keep = max(1, min(keep, first_epoch // 4))
    an = ProfileAnalysis(
        method=("DS-Analyzer's chain by replay: full -> dataset served -> dataset+collate "
                "served -> pin served -> compute-only, each served from memory; stall parts "
                "from differences of the runs' measured (steady) waits, each run's step "
                "compared with the full run's apart; bootstrap intervals over repeats"),
        keep_batches=keep, budget_mb=budget_mb, budget_basis=budget_basis,
        transfer_note=TRANSFER_NOTE,
        stage_map=job_stage_map(hs))
    full = [f for f in (_figures(r, headline) for r in full_runs) if f is not None]
    # one rank's batches (the rank whose figures the job's stall and compute are), not the
    # job's summed over ranks: the compute-only epoch is one rank's per-batch time x these
    batches = statistics.median(_rank_batches(f) for f in full) if full else 0
    return _Plan(streams0, headline, hs, counts, first_epoch, budget_mb, an, full, batches,
                 run_root / "replay-record", sizes)


class _Runs:
    """The ablation runs of the job, numbered under the scratch directory and said; a run
    the job failed under voids its ablation (``Failed``), never the profile."""

    def __init__(self, argv: list[str], run_root: Path, overrides: dict[str, Any],
                 max_batches: int | None, say: Callable[[str], None], link: Any = None
                 ) -> None:
        self.argv, self.run_root, self.overrides = argv, run_root, overrides
        self.max_batches, self.say, self.tag, self.link = max_batches, say, 0, link

    def __call__(self, label: str, replay: ReplayPlan, n: int,
                 void: Callable[[JobRun], str] | None = None) -> list[JobRun]:
        """``n`` runs of the job under ``replay``; ``void``: why a run is no ablation ("" when
        it is): the first such run ends the repeats (the rest could not help either)."""
        out: list[JobRun] = []
        for r in range(n):
            self.say(f"analyze: {label} ({r + 1}/{n})")
            self.tag += 1
            run = orders.lead(self.link, self.argv, self.run_root,
                              self.run_root / f"a{self.tag}", self.overrides, self.max_batches,
                              replay, f"analyze: {label}", self.say)
            if run.exit_code != 0:
                raise Failed(f"the job exited with code {exit_status(run.exit_code)} under "
                             "this ablation")
            out.append(run)
            if void is not None and void(run):
                break
        return out


def _compute_only(p: _Plan, runs_of: _Runs, repeats: int
                  ) -> list[tuple[float, float, float]] | None:
    """The compute-only runs (the loader replaced by its first batches from memory): each
    run's (epoch, step per batch, compute), extrapolated to the full run's batches; None
    where they could not serve (said in the analysis)."""
    an = p.an
    try:
        only_runs = runs_of("compute-only, loader replaced by its first batches from memory",
                            ReplayPlan(mode="compute_only", keep=an.keep_batches,
                                       budget_mb=p.budget_mb, counts=p.counts), repeats)
    except Failed as exc:
        an.ablations.append(ProfileAblation(ONLY, "the whole data path", False, str(exc)))
        return None
    vals = [compute_only(r, p.headline, p.batches, p.sizes) for r in only_runs]
    if any(v is None for v in vals):
        why = (f"the epoch ({p.first_epoch} batches) left fewer than 2 batches to serve "
               f"after the {an.keep_batches} kept")
        if p.hs and doors.of(p.hs[0].kind).served:     # replay.source asks the door
            why = doors.of(p.hs[0].kind).served
        an.ablations.append(ProfileAblation(
            ONLY, "the whole data path", False, why, runs=len(only_runs)))
        return None
    got = [v for v in vals if v is not None]
    an.ablations.append(ProfileAblation(
        ONLY, "the whole data path", True, runs=len(got),
        epoch_s=_summary([v[0] for v in got]), steady_epoch_s=_summary([v[0] for v in got])))
    an.compute_only_step_s = statistics.median(v[1] for v in got)
    return got


def _served(p: _Plan, runs_of: _Runs, repeats: int) -> dict[str, list[RepeatFigures]]:
    """The stage ablations: a warm recording run, then the runs with the dataset (and then
    collate_fn as well) served from it, then each ``stallbench.stage`` served alone; the
    figures of each stage served, by ablation name."""
    an, items_fn = p.an, p.items_fn
    served: dict[str, list[RepeatFigures]] = {}
    no_rec_why = _no_recording(p.hs[0] if p.hs else None, p.streams0, p.headline)
    if no_rec_why:
        # issue 39: a Ray Data iterator's stages run in Ray's tasks, outside torch's
        # fetchers: a recording run would record nothing, and costs a whole run of the job
        for name, removes in ((ITEMS, items_fn),
                              (BATCH, "the dataset and collate_fn")):
            an.ablations.append(ProfileAblation(name, removes, False, no_rec_why))
        return served
    try:
        p.rec_dir.mkdir(parents=True, exist_ok=True)
        rec = runs_of("recording every fetch call's items and batch", ReplayPlan(
            mode="record", dir=str(p.rec_dir), budget_mb=p.budget_mb), 1)
        stop, why = _recording_problem(rec, an.budget_basis)
        for name, serve, removes in ((ITEMS, "items", items_fn),
                                     (BATCH, "batch", "the dataset and collate_fn")):
            why = _serve_stage(p, runs_of, repeats, (name, serve, removes), served, why)
        if stop is None:
            _marked(p, rec, runs_of, repeats)
    except Failed as exc:
        an.ablations.append(ProfileAblation(ITEMS, items_fn, False,
                                            f"recording run: {exc}"))
    finally:
        shutil.rmtree(p.rec_dir, ignore_errors=True)
    return served


def _recording_problem(rec: list[JobRun], budget_basis: str) -> tuple[BudgetStop | None, str]:
    """The recording run's budget stop (None: it kept every call) and why its outputs cannot
    be served ("" when they can)."""
    stop = next((p.budget_stop for r in rec for p in _replay_parts(r)
                 if p.budget_stop), None)
    recorded = sum(p.recorded for r in rec for p in _replay_parts(r))
    if stop is not None and stop.error:
        return stop, f"the recording run could not keep the outputs: {stop.error}"
    if stop is not None:
        return stop, (f"the outputs of the first {stop.bytes / 2**20:.0f} MB of calls "
                      f"filled the memory budget of one process before the run ended "
                      f"({budget_basis})")
    if not recorded:
        return stop, "no fetch call was recorded (the job's loaders do not use torch's fetchers)"
    return stop, ""


def _serve_stage(p: _Plan, runs_of: _Runs, repeats: int, stage: tuple[str, str, str],
                 served: dict[str, list[RepeatFigures]], void: str) -> str:
    """The runs with ``stage`` (its ablation name, what the recording serves: "items" or
    "batch", what that removes) served from the recording, into ``served``; ``void``: why
    no run of it can be an ablation (the recording's problem, or the previous stage's:
    these runs would not match either), recorded instead. Returns why the next stage's runs
    would not match ("" when they may)."""
    an = p.an
    name, serve, removes = stage
    if void:
        an.ablations.append(ProfileAblation(name, removes, False, void))
        return void
    try:
        rs = runs_of(f"{removes} served from the recording",
                     ReplayPlan(mode="serve", serve=serve, dir=str(p.rec_dir),
                                budget_mb=p.budget_mb), repeats,
                     void=lambda r: _served_problem([r], removes))
    except Failed as exc:
        an.ablations.append(ProfileAblation(name, removes, False, str(exc)))
        return ""
    problem = _served_problem(rs, removes)
    for note in _serving_notes(rs):
        if note.split(" (", 1)[0] not in " ".join(an.notes):
            an.notes.append(note)
    if problem:
        an.ablations.append(ProfileAblation(name, removes, False, problem, runs=len(rs)))
        return problem       # the next stage's runs would not match either
    figs = [f for f in (_figures(r, p.headline) for r in rs) if f is not None]
    served[name] = figs
    an.ablations.append(ProfileAblation(
        name, removes, True, runs=len(figs),
        epoch_s=_summary([f.epoch_s for f in figs]),
        steady_epoch_s=_summary([f.phases.steady_epoch_s for f in figs
                                 if f.phases is not None])))
    return ""


def _transfer(p: _Plan, served: dict[str, list[RepeatFigures]]) -> None:
    """The transfer part: pin_memory served is not built, so where the job pins its cost
    stays in the loader hand-off and the chain's pin step is the batch step; where it does
    not pin there is no pin stage, and the part is 0 by construction. Said either way."""
    an = p.an
    settings = p.hs[0].settings if p.hs else LoaderSettings()
    if settings.pin_memory:
        an.ablations.append(ProfileAblation(
            FREE, "pin_memory", False,
            "serving pinned batches is not built: pin_memory's cost stays in the loader "
            "hand-off part (overhead)"))
        if BATCH in served:
            served[FREE] = served[BATCH]
            an.notes.append("transfer 0 by construction: pin_memory not ablated (its cost is "
                            "in overhead)")
    elif BATCH in served:
        served[FREE] = served[BATCH]
        an.notes.append("transfer 0 by construction: the job does not pin (no pin stage)")


def _attribute(p: _Plan, only: list[tuple[float, float, float]] | None,
               served: dict[str, list[RepeatFigures]]
               ) -> tuple[Attribution | None, ProfileAnalysis]:
    """The data stall (full - compute-only, with its interval over repeats) and, where the
    chain is whole, the parts from the measured waits of each run, steps compared apart
    (issue 39), with the verdict in the job's own stage names."""
    an, full = p.an, p.full
    steady_ok = full and all(f.phases is not None and f.phases.has_steady for f in full)
    full_t = [f.phases.steady_epoch_s if steady_ok else f.epoch_s for f in full]
    if only is not None and full_t:
        only_t = [v[0] for v in only]
        an.data_stall_s = statistics.median(full_t) - statistics.median(only_t)
        an.data_stall_interval = _difference_interval(full_t, only_t)
    if only is None or any(k not in served for k in (ITEMS, BATCH, FREE)):
        return None, an
    a = waits.attribute(full, served[ITEMS], served[BATCH], served[FREE],
                        [v[0] for v in only], [v[2] for v in only],
                        [v[1] for v in only], (FULL, ITEMS, BATCH, FREE, ONLY),
                        part_names={k: figures.part_name(k, True, an.stage_map)
                                    for k in waits.PARTS},
                        producers=p.hs[0].settings.num_workers if p.hs else 1)
    a.verdict = differential.verdict(a, on_job=True, stage_map=an.stage_map)   # its stages' names
    return a, an


# ------------------------------------------------------------------ the what-if

def whatif_of(result) -> None:
    """The scenario what-if on the profile's measured ``dataloader.num_workers`` variants
    (same models, same leave-one-out back-test: ``analysis.whatif.validate``); nothing
    without two or more worker counts."""
    import dataclasses

    from ..analysis import whatif

    # a multi-node job's ranks run on their own nodes' cores: the model's core budget is
    # theirs together (each node's as its launcher read it), not node rank 0's alone
    rows = result.variants[0].profile.nodes if result.variants and \
        result.variants[0].profile is not None else []
    seen = result
    if len(rows) > 1 and all(n.cores > 0 for n in rows):
        seen = dataclasses.replace(result, machine=dataclasses.replace(
            result.machine, cpu_affinity=int(sum(n.cores for n in rows))))
    result.analysis.whatif = whatif.validate(seen)
    if result.analysis.whatif is not None:
        result.analysis.whatif.advice = knee.decide(result.analysis.whatif)
