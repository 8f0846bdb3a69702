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

import math
import shutil
import statistics
from pathlib import Path
from typing import Any, Callable

from ..analysis import differential, figures, knee, waits
from ..analysis.stats import bootstrap_medians, finite_summary, percentile_interval
# not ..pipeline: that imports torch and pyarrow.compute (~4 s), which the launcher never needs
from ..stages.ablation import COMPUTE_ONLY, Ablation
from ..results import Attribution, Interval, ProfileAblation, ProfileAnalysis, RepeatFigures
from . import budget, merge
from .agent import doors
from .launcher import JobRun, exit_status, run_once
from .agent.wire import LoaderSettings, Parts, Replay, ReplayPlan, StageServe

KEEP_BATCHES = 8
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
    return f


_rank_batches = waits.rank_batches


def _replay_parts(run: JobRun) -> tuple[Replay, ...]:
    return run.parts.replays


def _served_problem(runs: list[JobRun], stage: str) -> str:
    """Why these serve runs are not an ablation of ``stage`` ("" when every call was served)."""
    for r in runs:
        for p in _replay_parts(r):
            if p.mismatch:
                m = p.mismatch
                return (f"the loader asked for other items than in the recording run (worker "
                        f"{m.worker}, epoch {m.epoch}, call {m.call}: recorded "
                        f"{m.recorded}, asked {m.asked}), so {stage}'s outputs cannot be "
                        f"matched between runs: a sampler that shuffles without a seed does "
                        f"this (seed it: torch.manual_seed, or DataLoader(generator=...))")
            if p.missing:
                n = p.missing
                return (f"the recording holds {n.recorded} calls of worker {n.worker}, "
                        f"epoch {n.epoch}; the run made more (the memory budget ended "
                        f"the recording, or calls differ between runs)")
        if not any(p.served for p in _replay_parts(r)):
            return f"no fetch call was served ({stage}: the loader's fetchers were not reached)"
    return ""


def compute_only(run: JobRun, headline: str, batches: float) -> tuple[float, float, float] | None:
    """(epoch, step per batch, compute) of a compute-only run, extrapolated to ``batches``
    from the batches it served from memory (the worst rank's)."""
    served_from: dict[int, dict] = {}
    for p in _replay_parts(run):
        served_from[p.pid] = p.served_from
    best = None
    eps = run.parts.epochs_by_image()
    for p in run.parts.trainers:
        served = served_from.get(p.header.pid, {})
        mine = eps.get(p.header.image_key, {})
        for s in p.streams:
            if s.name != headline:
                continue
            # a loop fed through a queue (doors/thread_queue): its batches are its producer's
            # loader served, in order
            marks = served.get(s.fed_by or headline) or []
            per, steps = [], []
            for e, ep in enumerate(mine.get(s.key, [])):
                k = marks[e] if e < len(marks) else None
                if k is None:
                    continue
                n = len(ep.wait)
                for i in range(k, n):
                    st = ep.step[i] if i < len(ep.step) else None
                    if st is None:
                        continue
                    per.append(ep.wait[i] + st)
                    steps.append(st)
            if len(per) >= 2:
                cand = (statistics.fmean(per) * batches, statistics.fmean(steps),
                        statistics.fmean(steps) * batches)
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


class _Skip(Exception):
    """No recording run for this job (``_no_recording`` says why)."""


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


def _marked(an: ProfileAnalysis, rec: list[JobRun], full: list[RepeatFigures],
            streams0: list, headline: str | None, runs_of, rec_dir: Path, budget_mb: float,
            repeats: int) -> None:
    """Each ``stallbench.stage`` of the headline loader served alone from the recording (by
    its hashable arguments): its stall = full - that run, with its interval."""
    seen: dict[str, StageServe] = {}
    for r in rec:
        for p in _replay_parts(r):
            for name, d in p.stages.items():
                seen[name] = seen.get(name, StageServe()) + d
    marked = sorted({n for s in streams0 if s.name == headline for n in s.stages
                     if n not in AUTOMATIC} | set(seen))
    steady_ok = all(f.phases is not None and f.phases.has_steady for f in full)
    for name in marked:
        d = seen.get(name, StageServe())
        removes = f"stallbench.stage({name!r})"
        why = ""
        if not d:
            why = ("a `with stallbench.stage(...)` block has no return value to serve; "
                   "decorate the function that computes it instead")
        elif d.unkeyed:
            why = ("its calls have no hashable argument (a number, a string) to match them "
                   "between runs by")
        elif d.unpicklable or d.unwritable:
            why = "its outputs could not be kept (not picklable, or the disk refused them)"
        elif not d.recorded:
            why = f"the memory budget ({budget_mb:g} MB) ran out before its calls were kept"
        if why:
            an.ablations.append(ProfileAblation(f"stage:{name}", removes, False, why,
                                                part=part_of(name)))
            continue
        try:
            rs = runs_of(f"{removes} served from the recording",
                         ReplayPlan(mode="serve", serve=f"stage:{name}", dir=str(rec_dir),
                                    budget_mb=budget_mb), repeats)
        except Failed as exc:
            an.ablations.append(ProfileAblation(f"stage:{name}", removes, False, str(exc),
                                                part=part_of(name)))
            continue
        computed = sum(p.stage(name).computed for r in rs for p in _replay_parts(r))
        if computed:
            an.ablations.append(ProfileAblation(
                f"stage:{name}", removes, False,
                f"{computed} call(s) asked for arguments the recording run never saw (its "
                f"inputs differ between runs: a sampler that shuffles without a seed?)",
                runs=len(rs), part=part_of(name)))
            continue
        figs = [f for f in (_figures(r, headline) for r in rs) if f is not None]
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
            budget_mb: float | None = None) -> tuple[Attribution | None, ProfileAnalysis]:
    """The ablation runs of one variant and its attribution (None where the chain is not
    whole: the ``ProfileAnalysis`` then says which ablation is missing and why).
    ``budget_mb``: bytes of outputs one process may keep; None: from the machine's free
    memory shared by the headline loader's workers (``budget.machine_budget``, stated)."""
    streams0 = [s for r in full_runs for s in merge.streams(r.parts)]
    headline = merge.headline_name(streams0)
    counts = batch_counts(full_runs[0].parts)
    hs = [s for s in streams0 if s.name == headline]
    settings = hs[0].settings if hs else LoaderSettings()
    if budget_mb is None:
        rule = budget.machine_budget(max(hs[0].producers if hs else 0, 1))
        budget_mb, budget_basis = rule.mb, rule.basis
    else:
        budget_basis = f"{budget_mb:g} MB per process, as given"
    first_epoch = (counts.get(headline) or [0])[0]
    keep = max(1, min(keep, first_epoch // 4))
    an = ProfileAnalysis(
        method=("DS-Analyzer's chain by replay: full -> dataset served -> dataset+collate "
                "served -> pin served -> compute-only, each served from memory; stall parts "
                "from differences of the runs' measured (steady) waits, each run's step "
                "compared with the full run's apart; bootstrap intervals over repeats"),
        keep_batches=keep, budget_mb=budget_mb, budget_basis=budget_basis,
        transfer_note=TRANSFER_NOTE,
        stage_map=job_stage_map(hs))
    items_fn = figures.part_name("fetch", True, an.stage_map)     # e.g. "dataset __iter__"
    full = [f for f in (_figures(r, headline) for r in full_runs) if f is not None]
    # one rank's batches (the rank whose figures the job's stall and compute are), not the
    # job's summed over ranks: the compute-only epoch is one rank's per-batch time x these
    batches = statistics.median(_rank_batches(f) for f in full) if full else 0
    rec_dir = run_root / "replay-record"
    tag = [0]

    def runs_of(label: str, replay: ReplayPlan, n: int) -> list[JobRun]:
        out = []
        for r in range(n):
            say(f"analyze: {label} ({r + 1}/{n})")
            tag[0] += 1
            run = run_once(argv, run_root / f"a{tag[0]}", overrides, max_batches, replay)
            if run.exit_code != 0:
                raise Failed(f"the job exited with code {exit_status(run.exit_code)} under "
                             "this ablation")
            out.append(run)
        return out

    # compute-only
    done: dict[str, list[tuple[float, float, float]]] = {}
    only_runs: list[JobRun] = []
    try:
        only_runs = runs_of("compute-only, loader replaced by its first batches from memory",
                            ReplayPlan(mode="compute_only", keep=keep, budget_mb=budget_mb,
                                       counts=counts), repeats)
        vals = [compute_only(r, headline, batches) for r in only_runs]
        if any(v is None for v in vals):
            why = (f"the epoch ({first_epoch} batches) left fewer than 2 batches to serve "
                   f"after the {keep} kept")
            if hs and doors.of(hs[0].kind).served:     # replay.source asks the door
                why = doors.of(hs[0].kind).served
            an.ablations.append(ProfileAblation(
                ONLY, "the whole data path", False, why, runs=len(only_runs)))
        else:
            done[ONLY] = vals       # type: ignore[assignment]
            an.ablations.append(ProfileAblation(
                ONLY, "the whole data path", True, runs=len(vals),
                epoch_s=_summary([v[0] for v in vals]),
                steady_epoch_s=_summary([v[0] for v in vals])))
            an.compute_only_step_s = statistics.median(v[1] for v in vals)
    except Failed as exc:
        an.ablations.append(ProfileAblation(ONLY, "the whole data path", False, str(exc)))

    # stage ablations: a warm recording run, then the served runs
    served: dict[str, list[RepeatFigures]] = {}
    no_rec_why = _no_recording(hs[0] if hs else None, streams0, headline)
    if no_rec_why:
        # issue 39: a Ray Data iterator's stages run in Ray's tasks, outside torch's
        # fetchers: a recording run would record nothing, and costs a whole run of the job
        for name, removes in ((ITEMS, items_fn),
                              (BATCH, "the dataset and collate_fn")):
            an.ablations.append(ProfileAblation(name, removes, False, no_rec_why))
    try:
        if no_rec_why:
            raise _Skip
        rec_dir.mkdir(parents=True, exist_ok=True)
        rec = runs_of("recording every fetch call's items and batch", ReplayPlan(
            mode="record", dir=str(rec_dir), budget_mb=budget_mb), 1)
        stop = next((p.budget_stop for r in rec for p in _replay_parts(r)
                     if p.budget_stop), None)
        recorded = sum(p.recorded for r in rec for p in _replay_parts(r))
        if stop is not None and stop.error:
            why = f"the recording run could not keep the outputs: {stop.error}"
        elif stop is not None:
            why = (f"the outputs of the first {stop.bytes / 2**20:.0f} MB of calls filled "
                   f"the memory budget of one process before the run ended ({budget_basis})")
        elif not recorded:
            why = "no fetch call was recorded (the job's loaders do not use torch's fetchers)"
        else:
            why = ""
        for name, serve, removes in ((ITEMS, "items", items_fn),
                                     (BATCH, "batch", "the dataset and collate_fn")):
            if why:
                an.ablations.append(ProfileAblation(name, removes, False, why))
                continue
            try:
                rs = runs_of(f"{removes} served from the recording",
                             ReplayPlan(mode="serve", serve=serve, dir=str(rec_dir),
                                        budget_mb=budget_mb), repeats)
            except Failed as exc:
                an.ablations.append(ProfileAblation(name, removes, False, str(exc)))
                continue
            problem = _served_problem(rs, removes)
            if problem:
                an.ablations.append(ProfileAblation(name, removes, False, problem, runs=len(rs)))
                why = problem       # the next stage's runs would not match either
                continue
            figs = [f for f in (_figures(r, headline) for r in rs) if f is not None]
            served[name] = figs
            an.ablations.append(ProfileAblation(
                name, removes, True, runs=len(figs),
                epoch_s=_summary([f.epoch_s for f in figs]),
                steady_epoch_s=_summary([f.phases.steady_epoch_s for f in figs
                                         if f.phases is not None])))
        if stop is None:
            _marked(an, rec, full, streams0, headline, runs_of, rec_dir, budget_mb, repeats)
    except _Skip:
        pass
    except Failed as exc:
        an.ablations.append(ProfileAblation(ITEMS, items_fn, False,
                                            f"recording run: {exc}"))
    finally:
        shutil.rmtree(rec_dir, ignore_errors=True)
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

    # data stall = full - compute-only, with its interval over repeats
    steady_ok = full and all(f.phases is not None and f.phases.has_steady for f in full)
    full_t = [f.phases.steady_epoch_s if steady_ok else f.epoch_s for f in full]
    if ONLY in done and full_t:
        only_t = [v[0] for v in done[ONLY]]
        an.data_stall_s = statistics.median(full_t) - statistics.median(only_t)
        an.data_stall_interval = _difference_interval(full_t, only_t)
    if ONLY not in done or any(k not in served for k in (ITEMS, BATCH, FREE)):
        return None, an
    # parts from the measured waits of each run, steps compared apart (issue 39)
    a = waits.attribute(full, served[ITEMS], served[BATCH], served[FREE],
                        [v[0] for v in done[ONLY]], [v[2] for v in done[ONLY]],
                        [v[1] for v in done[ONLY]], (FULL, ITEMS, BATCH, FREE, ONLY))
    a.verdict = differential.verdict(a, on_job=True, stage_map=an.stage_map)   # its stages' names
    return a, an


def lines(a: Attribution | None, an: ProfileAnalysis) -> list[str]:
    """The attribution as printed at the end of a profile (and by ``report`` for profiles)."""
    out = []
    iv = an.data_stall_interval
    if an.data_stall_s is not None and iv is not None:
        # the epochs' difference holds the wait AND any change of the step between the two
        # runs (issue 39): said as such, never as the data stall
        out.append(f"full - compute-only epochs: {an.data_stall_s:.2f} s "
                   f"[{iv.low:.2f}, {iv.high:.2f}] (the wait and any change of the step between "
                   f"the runs); the loop's own step served from memory: "
                   f"{(an.compute_only_step_s or math.nan) * 1e3:.1f} ms/batch "
                   f"(compute-only, kept {an.keep_batches} batches per loader)")
    if a is not None:
        ivs = a.intervals
        basis = a.basis
        out.append(f"attribution ({basis}, {a.interval}):")
        if "(1 per run)" in a.interval:
            out.append("  (one repeat per run: each interval is its point; --repeats 2 or more "
                       "gives intervals)")
        zero = False
        # the parts by the job's own stages, the names the report and the verdict give them
        # (figures.part_name: "dataset __getitem__", not "fetch", on a user's job)
        for label, part, i in (("compute", a.compute_s, ivs.compute_s),
                               (figures.part_name("fetch", True, an.stage_map), a.fetch_stall_s,
                                ivs.fetch_stall_s),
                               (figures.part_name("preprocess", True, an.stage_map), a.preprocess_stall_s,
                                ivs.preprocess_stall_s),
                               (figures.part_name("transfer", True, an.stage_map), a.transfer_stall_s,
                                ivs.transfer_stall_s),
                               (figures.part_name("overhead", True, an.stage_map), a.overhead_s,
                                ivs.overhead_s)):
            # an interval spanning 0: not distinguishable from 0, never a negative stall
            head = f"{figures.seconds_cell(part, i, signed=True):>8}"
            zero = zero or figures.spans_zero(i)
            out.append(f"  {label:<28} {head} s  [{i.low:.2f}, {i.high:.2f}]")
        if zero:
            out.append(f"  {figures.ZERO_NOTE}")
        if a.startup_cost_s:
            out.append(f"  {'start-up (apart)':<28} {figures.seconds_cell(a.startup_cost_s):>8} s")
        if a.interference_s is not None:
            out.append(f"  {'interference (own line)':<28} {figures.seconds_cell(a.interference_s):>8} s  the model "
                       f"step took longer beside the data path than served from memory "
                       f"(not a wait: not in the parts above)")
        if a.wait_bound_speedup is not None and math.isfinite(a.wait_bound_speedup):
            out.append(f"  removing every wait gives at most {a.wait_bound_speedup:.2f}x "
                       f"(1 / (1 - the measured wait share))")
        moved = {k: r for k, r in a.step_ratio.items()
                 if a.step_noise_share is not None and abs(r - 1) > a.step_noise_share}
        if moved:
            out.append("  step per batch vs the full run's: "
                       + ", ".join(f"{k} {r:.2f}x" for k, r in moved.items())
                       + f" (noise {a.step_noise_share:.0%})")
        out.append(f"  verdict: {a.verdict}")
    marked = [ab for ab in an.ablations
              if ab.done and ab.stall_s is not None and ab.stall_interval is not None]
    if marked:
        out.append("your stallbench.stage functions, each served alone (full - that run; "
                   "inside the parts above, not beside them):")
    for ab in marked:
        part = f" ({ab.part})" if ab.part != ab.name.split(":", 1)[-1] else ""
        lo, hi = ab.stall_interval.low, ab.stall_interval.high  # type: ignore[union-attr]
        head = f"{figures.seconds_cell(ab.stall_s, ab.stall_interval, signed=True):>8}"
        out.append(f"  {ab.removes + part:<28} {head} s  [{lo:.2f}, {hi:.2f}]")
    for ab in an.ablations:
        if not ab.done:
            out.append(f"cannot ablate {ab.removes} ({ab.name}): {ab.why}")
    for n in an.notes:
        out.append(f"  note: {n}")
    out.append(f"  note: {an.transfer_note}")
    if getattr(an, "budget_basis", ""):
        out.append(f"  note: recording budget {an.budget_basis}")
    return out


# ------------------------------------------------------------------ what-if and the knee

def whatif_of(result) -> None:
    """The scenario what-if on the profile's measured ``dataloader.num_workers`` variants
    (same models, same leave-one-out back-test: ``analysis.whatif.validate``); nothing
    without two or more worker counts."""
    from ..analysis import whatif

    result.analysis.whatif = whatif.validate(result)
    if result.analysis.whatif is not None:
        result.analysis.whatif.advice = knee.decide(result.analysis.whatif)


def knee_lines(result) -> list[str]:
    """The knee and what to do, as ``analysis.knee`` decided it (stored in
    ``whatif.advice``; decided here only for results written before it was stored): measured
    where a variant measured it, PREDICTED (with the back-test's interval) only where none did."""
    wi = result.analysis.whatif
    if wi is None:
        return []
    adv = getattr(wi, "advice", None) or knee.decide(wi)
    said = wi.note if wi.note.startswith(f"{wi.model.kind} model") else f"{wi.model.kind} model, {wi.note}"
    out = [f"what-if ({said}):"]
    bt = wi.backtest
    if bt is not None and bt.max_abs_steady_error is not None:
        out.append(f"  back-test: leave-one-out steady error up to {bt.max_abs_steady_error:.0%}"
                   f" over {len(bt.points)} point(s)")
    if adv.action == "none":
        out.append(f"  knee: {adv.reason}")
        return out
    n = adv.n
    point = next((p for p in wi.points if p.n == n), None)
    unpredicted = point is not None and getattr(point, "not_predicted", "")
    if adv.knee_variant:
        kv = next((v for v in getattr(result, "variants", ()) if v.name == adv.knee_variant),
                  None)
        ph = getattr(kv, "phases", None)
        share = ph.steady_stall_share.median if ph is not None else None
        out.append(f"  knee: {n} worker(s), MEASURED ({adv.knee_variant}): {adv.knee_rate:,.0f} "
                   f"{knee.measured_rate(next(c for c in wi.measured if c.n == n))[1]};"
                   f" {knee.measured_knee_explanation(wi.knee.explanation, share)}")
    elif unpredicted:
        out.append(f"  knee: {n} worker(s), not predicted ({point.not_predicted})")
    elif point is not None:
        band = (f" [{point.low_samples_s:,.0f}, {point.high_samples_s:,.0f}]"
                if point.low_samples_s is not None else " (no back-test interval: one point)")
        out.append(f"  knee: {n} worker(s), PREDICTED {point.predicted_samples_s:,.0f} steady "
                   f"samples/s{band}; {wi.knee.explanation}")
    rate, what = adv.best_rate, adv.rate_basis
    if adv.action == "measure" and unpredicted:
        out.append(f"  recommendation: none predicted; measure num_workers={n} with "
                   f"--set dataloader.num_workers={','.join(str(c.n) for c in wi.measured)},{n}")
    elif adv.action == "measure" and point is not None:
        out.append(f"  recommendation: none predicted: no variant had a steady rate to "
                   f"compare the knee's with (best measured {adv.best_variant}: {rate:,.0f} "
                   f"{what}); measure num_workers={n} over more batches with "
                   f"--set dataloader.num_workers={adv.best_n},{n}")
    elif adv.action == "keep" and adv.knee_variant:
        out.append(f"  recommendation: keep {adv.best_variant} (MEASURED {rate:,.0f} {what}): "
                   f"the knee's num_workers={n} MEASURED {adv.knee_rate / rate:.2f}x of it")
    elif adv.action == "keep":
        out.append(f"  recommendation: keep {adv.best_variant} (MEASURED {rate:,.0f} {what}): "
                   f"the knee's num_workers={n} is PREDICTED {adv.predicted_gain:.2f}x of it")
    elif adv.action == "set":
        out.append(f"  recommendation: num_workers={adv.best_n} on your DataLoader (MEASURED "
                   f"{rate:,.0f} {what}, variant {adv.best_variant})")
    elif adv.action == "try":
        band = (f" [{adv.predicted_gain_low:.2f}x, {adv.predicted_gain_high:.2f}x]"
                if math.isfinite(adv.predicted_gain_low) else "")
        out.append(f"  recommendation: try num_workers={n} on your DataLoader: PREDICTED "
                   f"{adv.predicted_gain:.2f}x{band} the best measured ({adv.best_variant}); "
                   f"measure it with --set dataloader.num_workers={adv.best_n},{n}")
    return out
