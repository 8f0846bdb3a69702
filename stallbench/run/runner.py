"""Run a scenario: every variant, every repeat, every ablation -> one Result.

Runs are interleaved per repeat (full, then each ablation, then the next repeat) so slow drift
of a shared machine spreads over all of them instead of biasing one. Nothing is written until
the whole scenario has run; the result file is then written atomically.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import __version__, threads
from ..measure import machine
from ..analysis import advice, differential, rates, summary, whatif
from ..analysis.device import WARNING, device_figures, sequence_note
from ..data.parquet import describe
from ..executors import EXECUTORS
from ..measure import phases as phases_mod
from ..measure.probe import measured_run
from ..outputs import default_cache_dir
from ..pipeline import COMPUTE_ONLY, FULL, Plan, StageCaches, dataset_for
from ..executors.runtimes import RuntimeScope
from ..results import (SCHEMA_VERSION, DatasetInfo, ExecutorFacts, RepeatFigures, Resources, Result,
                       RunSettings, ScenarioInfo, StartupFigures, Summary, ThreadBudget, Timeline,
                       ToolInfo, TrainerSolo, VariantResult, now_utc)
from ..scenario import Scenario, Variant
from ..stages.sizes import ceil_div
from .preflight import check as check_machine
from .preflight import check_scenario


@dataclass
class RunOptions:
    repeats: int | None = None           # None: the scenario's run.repeats
    analyze: bool | None = None          # None: the scenario's analysis.differential
    cache_dir: Path | None = None
    progress: bool = True
    max_batches: int | None = None       # CLI override, e.g. for a quick smoke run


def _progress(desc: str, total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="batch", leave=False, disable=not enabled,
                file=sys.stderr, dynamic_ncols=True)


def _configs(scenario: Scenario, opts: RunOptions) -> list[tuple[Any, bool]]:
    """Each variant's config as it will run (CLI overrides applied) and whether it is analyzed."""
    out = []
    for v in scenario.variants:
        cfg = v.config
        if opts.max_batches is not None:
            cfg = cfg.replace(loader=_replace(cfg.loader, max_batches=opts.max_batches))
        analyze = cfg.analysis.differential if opts.analyze is None else opts.analyze
        out.append((cfg, analyze))
    return out


def preflight(scenario: Scenario, opts: RunOptions) -> None:
    """What can be checked without opening data: registry-backed keys, each executor's needs
    here (e.g. Ray installed), and what each variant implies on this machine (memory, disk:
    ``stallbench.run.preflight``). ``stallbench run`` calls it for every scenario before the first."""
    check_scenario(scenario)
    cache = opts.cache_dir or default_cache_dir()
    for cfg, analyze in _configs(scenario, opts):
        EXECUTORS.get(cfg.executor.kind).check(cfg, scenario.path)
        check_machine(cfg, scenario.path, analyze=analyze, cache_dir=cache)


def prepare(scenario: Scenario, opts: RunOptions) -> list[Plan]:
    """Open datasets and build every variant's plan before anything runs, so a bad transform
    or an unreadable file fails in seconds, not after an hour of measurements."""
    preflight(scenario, opts)
    cache = opts.cache_dir or default_cache_dir()
    plans = []
    for cfg, analyze in _configs(scenario, opts):
        ds = dataset_for(cfg, cache, scenario.path)
        plan = Plan.create(cfg, ds, FULL, scenario.path)
        check_machine(cfg, scenario.path, analyze=analyze, plan=plan)   # the real columns
        plans.append(plan)
    return plans


def _replace(obj: Any, **kw: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **kw)


def prepare_watched(executor: Any, plan: Plan, caches: Any) -> None:
    """``executor.prepare`` under the progress watchdog: a warm-up that streams items (Flight)
    or fills caches waits on producers too, and must end when they stop progressing."""
    from ..measure.probe import stall_line
    from ..measure.watchdog import Watchdog

    if not callable(getattr(executor, "waiting_for", None)):   # not watched (see probe)
        executor.prepare(plan, caches)
        return
    timeout = plan.config.run.progress_timeout_s
    dog = Watchdog(timeout, lambda: stall_line(plan, executor, timeout))
    with dog:
        try:
            with dog.waiting():
                executor.prepare(plan, caches)
        except BaseException:
            abort = getattr(executor, "abort", None)
            if abort is not None:
                abort()
            raise


def run_variant(variant: Variant, plan: Plan, repeats: int, analyze: bool, scenario_file: str,
                progress: bool) -> VariantResult:
    cfg = plan.config
    if cfg.trainers.ranks > 1:
        return run_ranks(variant, plan, repeats, analyze, scenario_file, progress)
    ablations = differential.ablations_for(cfg.analysis.method) if analyze else [FULL]
    extra_runs = [a for a in ablations if a != FULL]
    executor = EXECUTORS.get(cfg.executor.kind)(cfg, scenario_file)
    runs: dict[str, list[RepeatFigures]] = {a.name: [] for a in [FULL, *extra_runs]}
    timeline, resources = Timeline(), Resources()
    est_batches = sum(ceil_div(s.rows, cfg.loader.batch_size) for s in plan.items)
    if cfg.loader.max_batches:
        est_batches = min(est_batches, cfg.loader.max_batches)
    bar = _progress(variant.name, est_batches * repeats * (1 + len(extra_runs)), progress)
    # The trainer's own thread budget (its pyarrow pool), for this variant only.
    trainer_budget = threads.apply(cfg.loader.trainer_threads, torch_too=False) \
        if cfg.loader.trainer_threads else None
    try:
        t0 = time.perf_counter()
        executor.start()
        startup = time.perf_counter() - t0
        caches = in_trainer(plan, executor, "ablation caches", StageCaches.build) \
            if extra_runs else None
        facts = executor_facts(executor)
        budget = thread_budget(executor)
        solo = in_trainer(plan, executor, "solo measurement", solo_probe) \
            if facts.has_producers else None
        prepare_watched(executor, plan, caches)   # e.g. caches into Ray's object store, untimed
        started = startup_figures(startup, executor.startup_figures())
        compute = plan.build_compute(scenario_file)
        budget.trainer_torch_threads = threads.torch_threads()   # as the model set it
        for r in range(repeats):
            for ablation in [FULL, *extra_runs]:
                p = plan.with_ablation(ablation, caches)
                done = [0]

                def on_batch(n: int, samples: int, elapsed: float, done: list[int] = done) -> None:
                    bar.update(n - done[0])
                    done[0] = n
                    if n % 8 == 0 and elapsed > 0:
                        bar.set_postfix_str(f"{ablation.name} {samples / elapsed:,.0f} samples/s",
                                            refresh=False)

                fig, tl, res = measured_run(p, executor, compute,
                                            warmup_batches=cfg.run.warmup_batches,
                                            sample_interval_s=cfg.run.sample_interval_s,
                                            on_batch=on_batch)
                fig.executor_start_s = startup
                fig.workers_reused = executor.workers_reused()
                runs[ablation.name].append(fig)
                if ablation == FULL and r == 0:
                    timeline, resources = tl, res
    finally:
        bar.close()
        executor.stop()
        if trainer_budget is not None:
            threads.restore(trainer_budget)
    vr = _variant_result(variant, cfg, facts, runs, timeline, resources, analyze, plan, solo,
                         notes=executor.notes(plan.transfer.notes()))
    vr.startup = started
    vr.threads = budget
    return vr


def startup_figures(total_s: float, parts: dict[str, Any]) -> StartupFigures:
    """The executor's start-up of one variant, with its own breakdown when it gives one."""
    nums = {k: float(v) for k, v in parts.items() if isinstance(v, (int, float))}
    return StartupFigures(executor_start_s=total_s, runtime=str(parts.get("runtime", "none")),
                          runtime_start_s=nums.get("ray_init_s", 0.0),
                          warm_s=nums.get("warm_workers_s", 0.0) + nums.get("warm_plan_s", 0.0),
                          parts=nums)


def run_order(variants: list[Variant]) -> list[int]:
    """Variants that share a runtime (equal ``runtime_key``) run one after the other, in the
    order their first one appears, so each shape's runtime starts once; the result keeps the
    scenario's order."""
    keys = [EXECUTORS.get(v.config.executor.kind).runtime_key(v.config) for v in variants]
    first: dict[Any, int] = {}
    for i, k in enumerate(keys):
        first.setdefault(("shape", k) if k is not None else ("own", i), i)
    return sorted(range(len(variants)),
                  key=lambda i: (first[("shape", keys[i]) if keys[i] is not None else ("own", i)], i))


def run_ranks(variant: Variant, plan: Plan, repeats: int, analyze: bool, scenario_file: str,
              progress: bool, row_hashes: bool = False) -> VariantResult:
    """A data-parallel variant (``trainers.ranks`` > 1): the same runs, each on all ranks at
    once (``trainers.job``); the variant's figures are the job's, and ``ranks`` holds each
    rank's and the straggler (``analysis.ranks``)."""
    from ..analysis import ranks as rank_analysis
    from ..trainers import LAUNCHERS, job

    cfg = plan.config
    ablations = differential.ablations_for(cfg.analysis.method) if analyze else [FULL]
    executor = EXECUTORS.get(cfg.executor.kind)(cfg, scenario_file)
    est = sum(ceil_div(s.rows, cfg.loader.batch_size) for s in plan.items)
    if cfg.loader.max_batches:
        est = min(est, cfg.loader.max_batches)
    bar = _progress(f"{variant.name} ({cfg.trainers.ranks} ranks)", est * repeats * len(ablations),
                    progress)
    try:
        t0 = time.perf_counter()
        executor.start()
        startup = time.perf_counter() - t0
        facts = executor_facts(executor)
        driver_caches = LAUNCHERS.get(executor.rank_launcher).driver_caches
        caches = in_trainer(plan, executor, "ablation caches", StageCaches.build) \
            if analyze and driver_caches else None
        solo = in_trainer(plan, executor, "solo measurement", solo_probe) \
            if facts.has_producers else None
        prepare_watched(executor, plan, caches)
        jr = job.run_job(plan, executor, ablations, repeats,
                         on_run=lambda name, n: bar.update(n), row_hashes=row_hashes)
    finally:
        bar.close()
        executor.stop()
    for figs in jr.runs.values():
        for f in figs:
            f.executor_start_s = startup
    vr = _variant_result(variant, cfg, facts, jr.runs, jr.timeline, jr.resources, analyze, plan,
                         solo)
    vr.ranks = rank_analysis.summarize(jr, cfg, plan, vr.epoch_s.median,
                                       crowding=_crowding(cfg, facts, jr))
    return vr


def _crowding(cfg: Any, facts: ExecutorFacts, jr: job.JobRuns) -> float:
    """The job's processes per core of this machine: every rank and, where each has its own,
    its producers (loader workers), over the cores this run may use (its affinity). How far
    a CPU second can stretch in wall time, which the straggler's evidence allows for."""
    world = cfg.trainers.ranks
    procs = world * (1 + facts.producer_slots) if jr.producers_per_rank \
        else world + facts.producer_slots
    return procs / threads.machine_cores()


SOLO_ITEMS = 3


def thread_budget(executor: Any) -> ThreadBudget:
    """The thread budgets as the executor resolved them (after ``start``)."""
    return ThreadBudget(producer_threads=executor.producer_threads() if executor.has_producers()
                        else None,
                        trainer_threads=executor.config.loader.trainer_threads,
                        local_producers=executor.local_producers(),
                        cores=threads.machine_cores())


def executor_facts(executor: Any) -> ExecutorFacts:
    """What the executor says about itself, recorded so analysis never reads its config."""
    return ExecutorFacts(kind=executor.name, producer_slots=executor.producer_slots(),
                         has_producers=executor.has_producers(),
                         producer_nodes=executor.producer_nodes(),
                         nodes_simulated=executor.nodes_simulated(),
                         producers_share_cores=executor.producers_share_cores(),
                         scaling_knobs=list(executor.scaling_knobs),
                         workers_kept=executor.workers_kept(executor.config))


def in_trainer(plan: Plan, executor: Any, doing: str, work: Callable[..., Any]) -> Any:
    """``work(plan, on_item=...)``: data work stallbench's own process does before the runs
    (the ablation caches, the solo measurement), under the progress watchdog: a transform or
    reader that never returns there would otherwise be a wait without an end, as it is in a
    producer. Each work item done is progress."""
    from ..measure.watchdog import Watchdog, tick

    timeout = plan.config.run.progress_timeout_s
    done = [0]

    def item() -> None:
        done[0] += 1
        tick()

    dog = Watchdog(timeout, lambda: (
        f"{executor.scenario_file}: run.progress_timeout_s: the trainer's own {doing} (the data "
        f"work of the {executor.name} executor's variant done in stallbench's process before "
        f"the runs) completed no work item for {timeout:g} s; it was on work item "
        f"{done[0] + 1} (the transforms or the reader did not return); no result written"))
    with dog, dog.waiting():
        return work(plan, on_item=item)


def solo_probe(plan: Plan, on_item: Callable[[], None] | None = None) -> TrainerSolo | None:
    """The data work of a few work items done in the trainer's own process, untimed by the
    run and with nothing else going on: what the variant would cost with no workers. A worker's
    rate is the wrong input for that (it competes with the trainer's hand-off for the cores),
    and the ablation caches' build is too (it keeps every table, so it page-faults fresh
    memory throughout). Median over items: the first one pays one-off warm-up."""
    per_row, per_item = [], []
    for i in range(min(SOLO_ITEMS, len(plan.items))):
        out = plan.produce(i, shared=False, local=True)   # as 0 workers run it
        t = out.times
        work = t.fetch_s + t.preprocess_s + t.transfer_s
        if out.rows:
            per_row.append(work / out.rows)
            per_item.append(work)
        if on_item is not None:
            on_item()
    if not per_row:
        return None
    return TrainerSolo(data_s_per_sample=statistics.median(per_row),
                       item_s=statistics.median(per_item))


def _variant_result(variant: Variant, cfg: Any, facts: ExecutorFacts,
                    runs: dict[str, list[RepeatFigures]], timeline: Timeline,
                    resources: Resources, analyze: bool, plan: Plan,
                    solo: TrainerSolo | None = None,
                    notes: dict[str, str] | None = None) -> VariantResult:
    full = runs["full"]
    if facts.kind == "local":       # local producers: this machine's cores bound them
        for f in full:
            phases_mod.refuse_beyond_cores(f)
    vr = VariantResult(
        name=variant.name, knobs=variant.knobs, config=cfg.to_dict(),
        emulated=cfg.emulated() + EXECUTORS.get(cfg.executor.kind).emulated_keys(cfg),
        executor=facts,
        throughput_samples_s=Summary.of([f.throughput_samples_s for f in full]),
        epoch_s=Summary.of([f.epoch_s for f in full]),
        stall_s=Summary.of([f.stall_s for f in full]),
        stall_share=Summary.of([f.stall_s / f.epoch_s if f.epoch_s else 0.0 for f in full]),
        time_to_first_batch_s=Summary.of([f.time_to_first_batch_s for f in full]),
        peak_pss_mb=Summary.of([f.peak_pss_mb for f in full]),
        repeats=full,
        stage_rates=rates.stage_rates(full, runs.get(COMPUTE_ONLY.name)),
        trainer_solo=solo,
        bytes=rates.byte_figures(full),
        ablations={k: v for k, v in runs.items() if k != "full"},
        notes=plan.transfer.notes() if notes is None else notes,
        timeline=timeline, resources=resources,
        device=device_figures(full),
        phases=phases_mod.summarize(
            full, facts.producer_slots,
            phases_mod.full_epoch_samples(sum(s.rows for s in plan.dataset.shards),
                                          cfg.loader.epochs, full)),
    )
    cut = sequence_note(full, cfg.loader.batch_format)
    if cut:
        vr.notes["dataset.sequence_max_len"] = cut
    small = batch_size_note(full, cfg.loader.batch_size, plan.items)
    if small:
        vr.notes["loader.batch_size"] = small
    if analyze:
        vr.attribution = differential.analyze_runs(runs, cfg.analysis.method,
                                                   cfg.analysis.confidence)
    return vr


def batch_size_note(full: list[RepeatFigures], batch_size: int, items) -> str | None:
    """The warning for a ``batch_size`` no batch reached: a batch never spans a work item (a
    row group, the unit of one fetch), so over smaller row groups the trainer took more,
    smaller batches than the scenario asks for, and its step count and compute follow them
    (600 rows in 100-row groups at batch_size 256: 6 batches, not 3). None when a row group
    holds a whole batch, or the measured batches show the executor re-batched across them."""
    largest = max((s.rows for s in items), default=0)
    f = next((f for f in full if f.batches), None)
    if f is None or not 0 < largest < batch_size:
        return None
    if f.batches <= ceil_div(f.samples, batch_size):    # re-batched across row groups (Ray
        return None                                     # Data's iter_torch_batches does)
    return (f"{WARNING}: loader.batch_size = {batch_size} is larger than the largest row group "
            f"({largest:,} rows) and a batch never spans a row group (the unit of one fetch): "
            f"batches had at most {largest:,} rows, {f.batches:,} batches of "
            f"{f.samples / f.batches:,.0f} rows on average where batch_size would make "
            f"{ceil_div(f.samples, batch_size):,}; the step count and compute follow the smaller "
            f"batches. Set dataset.row_group_rows >= {batch_size} (or write the Parquet with "
            f"larger row groups).")


def advise(result: Result) -> None:
    """Each variant's next change to try (its verdict then names it) and the scenario's top
    one; after the what-if, whose model the advice uses."""
    wi = result.analysis.whatif
    for v in result.variants:
        bt = wi.backtest if wi is not None else None
        v.recommendation = advice.recommend(v, result.machine, result.variants, bt,
                                            advice.model_for(v, wi),
                                            advice.alternatives_for(v, result))
        if v.attribution is not None and v.recommendation is not None:
            rec = v.recommendation
            gain = rec.measured_speedup if rec.measured_speedup is not None else (
                rec.predicted_speedup if rec.predicted_from == "what-if model" else None)
            v.attribution.verdict = differential.verdict(
                v.attribution, advice.action_text(rec), gain, rec.knob)
    result.analysis = summary.scenario_analysis(result.variants, result.analysis.whatif)
    result.analysis.recommendation = advice.top(result.variants)


def run_scenario(scenario: Scenario, opts: RunOptions,
                 say: Callable[[str], None] = lambda s: None) -> Result:
    plans = prepare(scenario, opts)
    done: dict[int, VariantResult] = {}
    repeats = opts.repeats or scenario.base.run.repeats
    # One runtime per cluster shape for the whole scenario, closed when it ends (also on an
    # error or Ctrl-C): variants of one shape reuse it instead of starting their own.
    with RuntimeScope():
        for i in run_order(scenario.variants):
            v, plan = scenario.variants[i], plans[i]
            analyze = v.config.analysis.differential if opts.analyze is None else opts.analyze
            say(f"  variant {v.name}: {len(plan.items)} row groups, {repeats} repeat(s)"
                f"{', differential ' + v.config.analysis.method if analyze else ''}")
            done[i] = run_variant(v, plan, repeats, analyze, scenario.path, opts.progress)
    variants = [done[i] for i in range(len(scenario.variants))]
    result = Result(
        schema_version=SCHEMA_VERSION,
        tool=ToolInfo(name="stallbench", version=__version__),
        created_utc=now_utc(),
        scenario=ScenarioInfo(name=scenario.name, path=scenario.path, sha256=scenario.sha256,
                              fingerprint=scenario.fingerprint, text=scenario.text,
                              matrix=scenario.matrix, description=scenario.description),
        machine=machine.metadata(),
        settings=RunSettings(repeats=repeats, argv=sys.argv[1:],
                             max_batches_override=opts.max_batches,
                             cache_dir=str(opts.cache_dir or default_cache_dir())),
        dataset=DatasetInfo(**describe(plans[0].dataset)) if plans else DatasetInfo(),
        variants=variants,
        analysis=summary.scenario_analysis(variants),
    )
    result.analysis.whatif = whatif.validate(result)
    advise(result)
    return result
