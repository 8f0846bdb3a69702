"""A data-parallel variant's measured runs: repeats x ablations, each on all ranks together.

The runner calls ``run_job`` instead of its in-process loop when ``trainers.ranks`` > 1. The
order of runs is the runner's (per repeat: full, then each ablation), every rank's figures are
kept (``RepeatFigures.ranks``), and the job's figures of each run are combined from them by
``job_figures`` (definitions in ``results.schema.RankFigures``). stallbench's own process
samples the resources of the whole job (every rank, its loader workers, Ray's workers) while
the ranks run.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..measure.sampler import Sampler
from ..pipeline import FULL, Ablation, Plan
from ..results import (ByteCounts, RankFigures, RepeatFigures, Resources, SequenceCut, StageRows,
                       StageSeconds, Timeline)
from .base import LAUNCHERS, RankRun


@dataclass
class JobRuns:
    """Everything the runner needs from a data-parallel variant's runs."""

    runs: dict[str, list[RepeatFigures]]          # job figures per ablation, per repeat
    rank_runs: dict[str, list[list[RankRun]]]     # the ranks' raw runs, same keys
    timeline: Timeline = field(default_factory=Timeline)
    resources: Resources = field(default_factory=Resources)
    launcher: str = ""
    backend: str = "gloo"
    sharding: str = ""
    producers_per_rank: bool = True
    launch_s: float = 0.0
    timeline_rank: int = 0                        # whose timeline ``timeline`` is


def run_job(plan: Plan, executor: Any, ablations: Sequence[Ablation], repeats: int, *,
            on_run: Callable[[str, int], None] | None = None,
            row_hashes: bool = False) -> JobRuns:
    """Start the ranks (the executor names its launcher), run every repeat of every ablation
    on all of them, stop them (also on errors and interrupts)."""
    cfg = plan.config
    world = cfg.trainers.ranks
    cls = LAUNCHERS.get(executor.rank_launcher)
    launcher = cls(executor, plan, world, ablations=any(a != FULL for a in ablations),
                   sample_interval_s=cfg.run.sample_interval_s)
    out = JobRuns(runs={a.name: [] for a in ablations}, rank_runs={a.name: [] for a in ablations},
                  launcher=cls.name, sharding=launcher.sharding,
                  producers_per_rank=launcher.producers_per_rank)
    try:
        t0 = time.perf_counter()
        launcher.start()
        out.launch_s = time.perf_counter() - t0
        out.backend = launcher.backend
        for r in range(repeats):
            for ablation in ablations:
                first = ablation == FULL and r == 0
                sampler = Sampler(cfg.run.sample_interval_s, executor.worker_pids,
                                  executor.sample_object_store_mb)
                with sampler:
                    ranks = launcher.run(ablation, keep_timeline=first, row_hashes=row_hashes)
                fig = job_figures(ranks, sampler.peak_pss_mb, launcher.producer_cpu_s(),
                                  launcher.job_figures())
                out.runs[ablation.name].append(fig)
                out.rank_runs[ablation.name].append(ranks)
                if first:
                    out.resources = sampler.resources()
                    top = max(ranks, key=lambda x: x.figures.stall_s)
                    out.timeline = top.timeline or Timeline()
                    out.timeline_rank = top.rank
                if on_run:
                    on_run(ablation.name, sum(x.figures.batches for x in ranks))
    finally:
        launcher.stop()
    return out


def rank_figures(run: RankRun, last_steps: int = 0) -> RankFigures:
    f = run.figures
    return RankFigures(
        rank=run.rank, epoch_s=f.epoch_s, samples=f.samples, batches=f.batches,
        steady_throughput_samples_s=f.steady_throughput_samples_s, stall_s=f.stall_s,
        wait_s=f.wait_s, trainer_transfer_s=f.trainer_transfer_s, compute_s=f.compute_s,
        sync_s=run.sync_s, time_to_first_batch_s=f.time_to_first_batch_s,
        peak_pss_mb=f.peak_pss_mb, trainer_cpu_s=f.trainer_cpu_s, producer_cpu_s=f.producer_cpu_s,
        work_items=len(run.deliveries), last_steps=last_steps,
        straggler_delay_s=run.straggler_delay_s)


def last_rank_per_step(ranks: Sequence[RankRun]) -> list[int]:
    """Per step, the rank whose batch arrived last among the ranks that took that step
    (arrival clocks are CLOCK_MONOTONIC, one clock for every process on this machine)."""
    steps = max((len(r.arrivals) for r in ranks), default=0)
    out = []
    for k in range(steps):
        here = [(r.arrivals[k], r.rank) for r in ranks if k < len(r.arrivals)]
        out.append(max(here)[1])
    return out


def _sum(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) if vals else None


def job_figures(ranks: Sequence[RankRun], peak_pss_mb: float, shared_producer_cpu_s: float | None,
                extra: dict[str, Any]) -> RepeatFigures:
    """The job's figures of one run from its ranks' (see ``results.schema.RankFigures``)."""
    last = last_rank_per_step(ranks)
    per = [rank_figures(r, last.count(r.rank)) for r in ranks]
    figs = [r.figures for r in ranks]
    epoch = max(f.epoch_s for f in figs)
    samples = sum(f.samples for f in figs)
    top = max(range(len(figs)), key=lambda i: figs[i].stall_s)
    t = figs[top]

    def stage(name: str) -> float:
        return sum(getattr(f.stage_s, name) for f in figs)

    producer_cpu = (shared_producer_cpu_s if shared_producer_cpu_s is not None
                    else _sum([f.producer_cpu_s for f in figs]))
    pids = {p for r in ranks for p in r.producer_pids}   # a rank with no workers produces itself
    return RepeatFigures(
        epoch_s=epoch, samples=samples, batches=sum(f.batches for f in figs),
        throughput_samples_s=samples / epoch if epoch > 0 else math.nan,
        steady_throughput_samples_s=sum(f.steady_throughput_samples_s for f in figs
                                        if math.isfinite(f.steady_throughput_samples_s)),
        stall_s=t.stall_s, wait_s=t.wait_s, trainer_transfer_s=t.trainer_transfer_s,
        compute_s=t.compute_s,
        time_to_first_batch_s=max(f.time_to_first_batch_s for f in figs),
        peak_pss_mb=peak_pss_mb,
        trainer_cpu_s=sum(f.trainer_cpu_s for f in figs),
        producer_cpu_s=producer_cpu,
        stage_s=StageSeconds(**{k.name: stage(k.name) for k in dataclasses.fields(StageSeconds)}),
        stage_rows=StageRows(**{k.name: sum(getattr(f.stage_rows, k.name) for f in figs)
                                for k in dataclasses.fields(StageRows)}),
        bytes=ByteCounts(**{k.name: sum(getattr(f.bytes, k.name) for f in figs)
                            for k in dataclasses.fields(ByteCounts)}),
        producer_processes=len(pids) if pids else sum(f.producer_processes for f in figs),
        executor_figures={**extra, "ranks": [f.executor_figures for f in figs]},
        ranks=per,
        # The device figures are those of the rank whose stall/compute the job reports, with
        # AU over the job's epoch; ids cut by padding are counted over every rank.
        device=(dataclasses.replace(t.device, au=t.device.compute_s / epoch if epoch > 0 else 0.0)
                if t.device is not None else None),
        sequence_cut=_sequence_cut([f.sequence_cut for f in figs]),
    )


def _sequence_cut(cuts: Sequence[SequenceCut | None]) -> SequenceCut | None:
    have = [c for c in cuts if c is not None]
    if not have:
        return None
    return SequenceCut(seq_len=have[0].seq_len, sequences=sum(c.sequences for c in have),
                       sequences_cut=sum(c.sequences_cut for c in have),
                       ids=sum(c.ids for c in have), ids_cut=sum(c.ids_cut for c in have),
                       longest=max(c.longest for c in have))
