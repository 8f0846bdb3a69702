"""What-if: predict throughput for more CPU workers or nodes, cache and storage bandwidth.

A small, explainable bottleneck model in the spirit of DS-Analyzer (predict from measured
fetch/prep rates) and Plumber (per-stage per-core rates against a core budget). Everything is
per *sample* the trainer consumes, measured in ONE configuration (the fit point):

- ``p_wall``: producer seconds per sample for fetch + preprocess + producer-side transfer, as a
  producer worker lives it (includes storage waits, which use no CPU);
- ``p_cpu``: the CPU seconds of the same work: the producer processes' own CPU clocks where
  they run on this machine (forked loader workers, a local Ray cluster with its daemons:
  everything they do, hand-off included), else the stage timers' CPU clocks;
- ``t_trainer``: trainer seconds per sample outside the producers: trainer-side transfer,
  the loader's hand-off overhead (measured by the differential run) and the compute step;
- ``t_cpu``: the trainer process's CPU seconds per sample (its own CPU clock: hand-off,
  unpacking, and compute when the model runs on the CPU).

Predicted throughput with N producer workers (N = 0: the trainer does everything in turn):

    N = 0:  X = 1 / (p_solo + t_trainer - overhead)   # no loader; p_solo: the data work
                                                       # measured in the trainer's process
                                                       # (p_wall where not measured)
    N >= 1: X = min(N / p_wall,                 # the workers' own pace (less their
                                                #   waits for a core: ``queueing``)
                    cores / (p_cpu + t_cpu),    # all CPU work shares the cores
                    1 / t_trainer,              # the trainer: compute + its share of data work
                    storage_MB_s / MB_per_sample)   # optional aggregate storage cap

With R data-parallel ranks (``trainers.ranks``) the trainers work in parallel and the
producers are R x N (a loader per rank, local) or N (one pool for all ranks, Ray):

    N >= 1: X = min(producers / p_wall, cores / (p_cpu + t_cpu), R / t_trainer[, storage])
    N = 0:  X = min(R / (p_solo + t_trainer - overhead), cores / (p_cpu + t_cpu))   (R > 1)

with ``t_trainer`` per sample of one rank (fitted from the ranks' own figures) and the stall
share that of one rank, 1 - X / R x compute. It assumes the ranks keep pace with each other:
a straggler and the all-reduce itself are not modelled (the variant's ``ranks`` figures show
them).

The binding term names the bound; the knee is the fewest workers (or nodes) with no stall,
i.e. where the trainer term binds. ``cache`` removes that share of the fetch cost;
``bandwidth_mb_s`` replaces the measured storage wait by bytes / bandwidth. Nodes add
``cpus_per_node`` cores and workers each when they are real machines (``producer_cores =
"own"``: the core budget at N producer slots is cores + N); simulated nodes, and `ray start`
nodes on the trainer's own host, share its cores. Validation points with more producer slots
than the cores they share are oversubscribed: stored and marked, but left out of the error
and of the fit (while other points remain to fit on).

Contention (issue 17; fitted by the "contention" model of ``whatif_models`` from two or more
measured producer counts, zero for the "one-point" model): each producer's CPU cost per sample,
and the trainer's time per sample, grow with the cores that are busy, as in the contention term
of the universal scalability law (Gunther), relative to the fit point N_fit:

    b(N) = min(P(N) * s, cores)      # busy producer cores; P(N): the producers (R x N with
                                     # a loader per rank); s: the share of its wall a producer
                                     # is on a core (p_cpu / p_wall, at most 1: ``on_cpu_share``);
                                     # real nodes ("own"): min(P * s, cpus_per_node)
    f(N) = (1 + sigma * (b(N) - 1)) / (1 + sigma * (b(N_fit) - 1))
    p_wall(N) = io_wait + (p_wall - io_wait + p_extra) * f_p(N);  p_cpu(N) = p_cpu * f_p(N)
    t_trainer(N) = (t_trainer + t_extra) * f_t(N)

so per-producer throughput is 1 / (1 + sigma (b - 1)) of a lone producer's: sigma = 0 is the
one-point model, sigma = 0.01 loses 1% per extra busy core. Storage waits use no core and do
not grow. What a whole run measures (start-up, rounds of work items, the steady figure after
the first batch) is replayed item by item by ``schedule.simulate`` (``predict_run``); the
formulas above give its per-sample costs (R ranks are replayed as one trainer R times as fast:
they are assumed to keep pace). The limits: no memory bandwidth model beyond what sigma
absorbs, no network between nodes except what the trainer-side transfer measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from ..results import (DatasetInfo, Knee, MachineInfo, Result, VariantResult, WhatIfCheck,
                       WhatIfModel, WhatIfPoint, WhatIfValidation)
from . import backtest, costmodel, figures, queueing, schedule
from .stats import COMPUTE_BOUND_SHARE, finite_median
from .whatif_models import (MODELS, ScalingModel, fit_best, fit_points, oversubscribed,
                            producer_budget, reference, stage_cpu_share)


# The fitted model is result data (stored with the validation): its fields live in the schema.
Model = WhatIfModel
# ``stage_wall`` key of the model step alone per sample (``figures.compute_s_per_sample``)
COMPUTE_ONLY = "compute_only"
COMPUTE_ONLY_SOURCE = figures.COMPUTE_ONLY_SOURCE


@dataclass(frozen=True)
class Prediction:
    n: int
    throughput_samples_s: float
    stall_share: float
    bound_by: str
    why: str
    binding: str = ""            # the model term that binds: workers, cores, trainer, storage
    model: str = "one-point"     # the what-if model that made it

    def over_run(self, m: "Model", samples: float) -> float:
        """Throughput of a run of ``samples`` samples: start-up (measured at the fit) plus
        the predicted steady rate, as a measured epoch includes both."""
        x = self.throughput_samples_s
        if not (math.isfinite(x) and x > 0 and samples > 0):
            return x
        startup = m.solo_item_s if self.n == 0 and m.solo_item_s else m.startup_s
        return samples / (startup + samples / x)


def workers_of(v: VariantResult) -> int:
    """Producers working in parallel outside the trainer, as the executor reported them."""
    return v.executor.producer_slots


def ranks_of(v: VariantResult) -> int:
    """Data-parallel trainer ranks of the variant (1: one trainer in stallbench's process)."""
    return v.ranks.world if v.ranks is not None else 1


def producers(m: Model, workers: int, ranks: int) -> int:
    """Producers working in parallel: ``workers`` per rank, or one pool of ``workers``."""
    return workers * ranks if m.producers_per_rank else workers


def compute_on_cpu(v: VariantResult, machine: MachineInfo) -> bool:
    return "model.step_ms" not in v.emulated and not machine.gpu


def _bound_stage(v: VariantResult) -> str:
    named = figures.named_stage(v)
    return named[0] if named is not None and named[1] else ""


def fit(v: VariantResult, machine: MachineInfo, dataset: DatasetInfo | None = None) -> Model:
    """Per-sample costs from the variant's full runs (medians over repeats). ``dataset`` (the
    result's) gives the work items' size, so whole runs are replayed item by item and the fit
    is calibrated against the measured epoch; without it, the steady formula alone."""
    reps = v.repeats
    s = lambda key: figures.stage_s_per_sample(v, key)  # noqa: E731
    fetch, prep, xfer = s("fetch"), s("preprocess"), s("transfer_producer")
    cpu = s("fetch_cpu") + s("preprocess_cpu") + s("transfer_producer_cpu")
    # The producer processes' own CPU clocks also see what happens outside the stage timers
    # (pickling a batch on the queue's feeder thread, the DataLoader loop, start-up; Ray's
    # scheduling, object transfer and daemons): the whole cost of producing. Use it when
    # measured.
    whole = finite_median(f.producer_cpu_s / max(f.samples, 1) for f in reps if f.producer_cpu_s)
    if math.isfinite(whole) and whole > cpu:
        cpu = whole
    trainer_xfer = s("transfer_trainer")
    compute = finite_median(f.compute_s / max(f.samples, 1) for f in reps)
    ranks = ranks_of(v)
    if ranks > 1:
        # per sample of one rank: each rank unpacks and steps its own share, in parallel
        per = [r for f in reps for r in f.ranks]
        trainer_xfer = finite_median(r.trainer_transfer_s / max(r.samples, 1) for r in per)
        compute = finite_median(r.compute_s / max(r.samples, 1) for r in per)
    overhead = 0.0
    if v.attribution is not None and v.executor.has_producers:
        samples = finite_median(f.samples for f in reps) / ranks
        overhead = max(v.attribution.overhead_s, 0.0) / max(samples, 1)
    # The trainer process's own CPU clock covers everything it does (hand-off, unpacking,
    # a CPU model step, helper threads); older results without it fall back to the parts.
    t_cpu = finite_median(f.trainer_cpu_s / max(f.samples, 1) for f in reps if f.trainer_cpu_s)
    if not math.isfinite(t_cpu):
        t_cpu = trainer_xfer + overhead + (compute if compute_on_cpu(v, machine) else 0.0)
    elif not v.executor.has_producers:
        # Fitted with no producers, the trainer's clock also holds the data work (``cpu``):
        # counted there, it would be counted twice against the cores.
        t_cpu = max(t_cpu - cpu, 0.0)
    io_bytes = finite_median(f.bytes.storage_bytes / max(f.samples, 1) for f in reps)
    alone = figures.compute_s_per_sample(v)
    cpus_per_node = (v.executor.producer_slots // v.executor.producer_nodes
                     if v.executor.producer_nodes else 1)
    raw = Model(
        p_wall=fetch + prep + xfer, p_cpu=cpu, t_trainer=trainer_xfer + overhead + compute,
        t_cpu=t_cpu, cores=machine.cores,
        stage_wall={"fetch": fetch, "preprocess": prep, "transfer": xfer,
                    "transfer_trainer": trainer_xfer, "overhead": overhead,
                    # the one compute figure (printed; the terms use ``compute``, the step
                    # as the fit's runs timed it), where a compute-only run measured it
                    **({COMPUTE_ONLY: alone.value} if alone.source == COMPUTE_ONLY_SOURCE
                       and math.isfinite(alone.value) else {})},
        io_wait=s("fetch_io_wait"), io_bytes=io_bytes, compute=compute,
        fit_workers=workers_of(v), fit_variant=v.name,
        bound_stage=_bound_stage(v),
        cpus_per_node=max(cpus_per_node, 1),
        startup_s=finite_median(f.time_to_first_batch_s for f in reps) if reps else 0.0,
        p_solo=v.trainer_solo.data_s_per_sample if v.trainer_solo else None,
        solo_item_s=v.trainer_solo.item_s if v.trainer_solo else None,
        ranks=ranks, producers_per_rank=v.ranks.producers_per_rank if v.ranks else True,
        producer_cores="shared" if v.executor.producers_share_cores else "own",
        fit_variants=[v.name],
        item_rows=item_rows(v, dataset),
        batch_rows=finite_median(f.samples / f.batches for f in reps if f.batches) if reps else 0.0,
    )
    if not math.isfinite(raw.startup_s):
        raw = replace(raw, startup_s=0.0)
    if not math.isfinite(raw.batch_rows):
        raw = replace(raw, batch_rows=0.0)
    samples = finite_median(f.samples for f in reps)
    epoch = finite_median(f.epoch_s for f in reps)
    if raw.item_rows and raw.fit_workers >= 1 and math.isfinite(epoch) and epoch > 0:
        return calibrate_run(raw, epoch, samples)
    return calibrate(raw, finite_median(f.steady_throughput_samples_s for f in reps))


def item_rows(v: VariantResult, dataset: DatasetInfo | None) -> float:
    """Samples the trainer gets from one work item (a row group, after filters)."""
    if dataset is None or not dataset.shards or not dataset.rows:
        return 0.0
    ratio = v.stage_rates.rows_out_per_row_in
    return dataset.rows / dataset.shards * (ratio if ratio and math.isfinite(ratio) else 1.0)


def calibrate(m: Model, measured_steady: float) -> Model:
    """Make the model reproduce its own fit point. Stage timers see the work inside a
    producer, not the hand-off around it (Ray scheduling and object transfer, queueing), so
    the measured steady rate at the fit is compared with the model's, and the gap is given to
    the term that binds there: extra seconds per sample for the workers or the trainer, or
    the share of the cores the CPU work really got. The gap is stored and printed, so a large
    calibration is visible rather than hidden."""
    if m.fit_workers < 1 or not (math.isfinite(measured_steady) and measured_steady > 0):
        return m
    p = predict(m, m.fit_workers)
    gap = p.throughput_samples_s / measured_steady - 1.0
    if p.binding == "workers":
        total = producers(m, m.fit_workers, m.ranks)
        extra = max(total / measured_steady - m.p_wall, -0.5 * m.p_wall)
        return replace(m, p_extra=extra, calibration=(
            f"producers {figures.signed(extra * 1e6)} us/sample outside the stage timers "
            f"(model {figures.signed_percent(gap, 0)} vs measured steady rate at the fit)"))
    if p.binding == "trainer":
        extra = max(m.ranks / measured_steady - m.t_trainer, -0.5 * m.t_trainer)
        return replace(m, t_extra=extra, calibration=(
            f"trainer {figures.signed(extra * 1e6)} us/sample outside its measured parts "
            f"(model {figures.signed_percent(gap, 0)} vs measured steady rate at the fit)"))
    if p.binding == "cores":
        budget = core_budget(m, m.fit_workers)
        scale = min(1.0, measured_steady * (m.p_cpu + m.t_cpu) / budget)
        return replace(m, cores_scale=scale, calibration=(
            f"the CPU work got {scale:.0%} of the cores (model "
            f"{figures.signed_percent(gap, 0)} vs measured steady rate at the fit)"))
    return m


def core_budget(m: Model, workers: int) -> float:
    """Cores the CPU work shares at ``workers`` producer slots: real nodes bring their own
    (one per producer slot); simulated nodes and local workers share the machine's."""
    return m.cores + workers if m.producer_cores == "own" else m.cores


def on_cpu_share(m: Model) -> float:
    """The share of its wall a producer spends on a core at the fit: its CPU over its wall per
    sample, at most 1 (1 where either is unknown: the rule before issue 39)."""
    wall = m.p_wall + m.p_extra
    if not (wall > 0 and m.p_cpu > 0 and math.isfinite(m.p_cpu)):
        return 1.0
    return min(m.p_cpu / wall, 1.0)


def busy_of(m: Model, workers: float, ranks: int | None = None,
            cap: float | None = None) -> float:
    """Busy producer cores that contend, b(N) of the module docstring: the cores the producers
    at ``workers`` (per rank with a loader per rank) keep busy, each its ``on_cpu_share``,
    capped by the cores they share (``cap``; default: the machine's, or a real node's own).
    Producers that mostly wait keep fewer cores busy than they are: on 2 cores, 8 workers at
    25% CPU keep 2 busy, not 2 from the second worker on, so their contention grows with N
    (issue 39: the trainer's time grew 6-8% from 4 to 8 such workers)."""
    total = producers(m, workers, ranks or m.ranks) * on_cpu_share(m)
    if cap is None:
        cap = m.cpus_per_node if m.producer_cores == "own" else m.cores
    return min(total, cap)


def contention_factor(m: Model, sigma: float, workers: float, busy: float | None = None,
                      ranks: int | None = None) -> float:
    """f(N) of the module docstring: per-sample cost at N busy producers relative to the fit's.
    ``busy``: the busy cores that contend (default ``busy_of``)."""
    if not sigma:
        return 1.0
    b = busy_of(m, workers, ranks) if busy is None else busy
    ref = busy_of(m, m.fit_workers, m.ranks)
    return (1.0 + sigma * (max(b, 0.0) - 1.0)) / (1.0 + sigma * (max(ref, 0.0) - 1.0))


@dataclass(frozen=True)
class _Costs:
    """Per-sample costs at one configuration, and the steady terms they give."""

    x: float                     # predicted steady throughput (the job's, all ranks)
    terms: dict[str, float]      # each bound's rate (N >= 1)
    binding: str
    p_serial: float              # N = 0: one rank's data work per sample
    t: float                     # one rank's trainer seconds per sample
    p_wall: float
    p_cpu: float
    stages: dict[str, float]
    heaviest: str
    f_p: float
    cores: float
    ranks: int = 1
    total: int = 0               # producers working in parallel (all ranks)
    waiting: float = 0.0         # share longer per sample a producer takes waiting for a core


def _costs(m: Model, workers: int, *, cache: float = 0.0, bandwidth_mb_s: float | None = None,
           storage_cap_mb_s: float | None = None, cores: float | None = None,
           busy_cores: float | None = None, ranks: int | None = None) -> _Costs:
    n_ranks = ranks or m.ranks
    fetch_wall = m.stage_wall["fetch"]
    io = m.io_wait
    if bandwidth_mb_s:
        io_new = m.io_bytes / (bandwidth_mb_s * 1e6)
        fetch_wall = fetch_wall - io + io_new
        io = io_new
    fetch_cpu_share = m.p_cpu * (m.stage_wall["fetch"] - m.io_wait) / max(m.p_wall - m.io_wait, 1e-12)
    fetch_wall *= (1.0 - cache)
    io *= (1.0 - cache)
    p_wall = fetch_wall + m.stage_wall["preprocess"] + m.stage_wall["transfer"]
    p_cpu = m.p_cpu - cache * fetch_cpu_share
    if cores is None:
        cores = core_budget(m, workers)
    stages = {"fetch": fetch_wall, "preprocess": m.stage_wall["preprocess"],
              "transfer": m.stage_wall["transfer"]}
    heaviest = max(stages, key=stages.get)
    t_trainer = m.t_trainer + m.t_extra
    if workers == 0:
        # No loader: no hand-off overhead, and the data work runs uncontended in the trainer's
        # own process, at the rate measured there when the model has it (scaled by the same
        # cache/bandwidth changes as the workers' rate). Not calibrated: the fit point's gap
        # is about hand-off, which does not exist here. R ranks each do their own, in
        # parallel, within the cores.
        t = t_trainer - m.stage_wall["overhead"]
        if m.p_solo and m.p_wall > 0:
            p_wall = m.p_solo * (p_wall / m.p_wall)
        x, binding = n_ranks / (p_wall + t), "serial"
        if n_ranks > 1:
            cpu_cap = cores / (p_cpu + m.t_cpu) if p_cpu + m.t_cpu > 0 else math.inf
            if cpu_cap < x:
                x, binding = cpu_cap, "cores"
        return _Costs(x, {}, binding, p_wall, t, p_wall, p_cpu, stages, heaviest, 1.0, cores,
                      n_ranks, 0)
    f_p = contention_factor(m, m.contention_producer, workers, busy_cores, n_ranks)
    f_t = contention_factor(m, m.contention_trainer, workers, busy_cores, n_ranks)
    p_wall = io + (p_wall - io + m.p_extra) * f_p
    p_cpu *= f_p
    t = t_trainer * f_t
    cores *= m.cores_scale
    total = producers(m, workers, n_ranks)
    terms = {
        "workers": total / p_wall if p_wall > 0 else math.inf,
        "cores": cores / (p_cpu + m.t_cpu * f_t) if p_cpu + m.t_cpu > 0 else math.inf,
        "trainer": n_ranks / t if t > 0 else math.inf,
    }
    if storage_cap_mb_s and m.io_bytes:
        terms["storage"] = storage_cap_mb_s * 1e6 / (m.io_bytes * (1 - cache) or 1e-12)
    waiting = 0.0
    if m.producer_cores == "shared" and math.isfinite(terms["workers"]):
        cap = min(v for k, v in terms.items() if k != "workers")
        queued = _queued_workers(total, p_wall, p_cpu, cores, m.t_cpu * f_t, cap)
        if queued >= terms["cores"] * (1 - 1e-6):
            # producers that never leave the CPU: the cores term's own case, it binds there
            queued = max(queued, terms["cores"] * (1 + 1e-9))
        if queued < terms["workers"]:
            waiting = terms["workers"] / queued - 1.0 if queued > 0 else math.inf
            terms["workers"] = queued
    binding = min(terms, key=terms.get)
    return _Costs(terms[binding], terms, binding, math.nan, t, p_wall, p_cpu, stages, heaviest,
                  f_p, cores, n_ranks, total, waiting)


def _queued_workers(total: int, p_wall: float, p_cpu: float, cores: float, t_cpu: float,
                    cap: float) -> float:
    """The workers term with producers waiting for a core (``queueing``): each producer's
    wall per sample is its CPU burst (``p_cpu``, at most its wall) and the rest off the CPU;
    the cores they share are the machine's less what the trainer's own CPU work takes at the
    rate the run goes, ``X * t_cpu``: X is the fixed point of X = min(rate(X), cap), where
    ``cap`` is the other terms' bound (a trainer-bound run keeps the trainer's share)."""
    service = min(p_cpu, p_wall)
    if not (total >= 1 and service > 0 and p_wall > 0):
        return total / p_wall if p_wall > 0 else math.inf

    def rate(x: float) -> float:
        left = max(cores - x * t_cpu, 0.02 * cores)
        return queueing.queued_rate(total, p_wall - service, service, left)

    top = min(total / p_wall, cap)
    at_top = rate(top)
    if at_top >= top:
        return at_top
    lo, hi = 0.0, top              # rate(x) - x falls as x grows: bisect its zero
    for _ in range(60):
        mid = (lo + hi) / 2
        if rate(mid) >= mid:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def predict(m: Model, workers: int, *, cache: float = 0.0, bandwidth_mb_s: float | None = None,
            storage_cap_mb_s: float | None = None, cores: float | None = None,
            busy_cores: float | None = None, ranks: int | None = None) -> Prediction:
    """``workers``: per rank where each rank has its own (local), else the one pool's size;
    ``ranks``: data-parallel trainer ranks (default: the fit's)."""
    c = _costs(m, workers, cache=cache, bandwidth_mb_s=bandwidth_mb_s,
               storage_cap_mb_s=storage_cap_mb_s, cores=cores, busy_cores=busy_cores,
               ranks=ranks)
    x, heaviest, stages, n_ranks = c.x, c.heaviest, c.stages, c.ranks
    contended = (f" ({figures.signed_percent(c.f_p - 1, 0)} contention)"
                 if abs(c.f_p - 1) >= 0.005 else "")
    if workers == 0:
        source = ("measured in the trainer's process" if m.p_solo and m.p_wall > 0
                  else "measured in a worker")
        # the same rule as the attribution's: a stall share under 5% is compute-bound, so
        # the table never says "0% stall" beside "bound by fetch" (per rank: x / n_ranks)
        bound = heaviest if 1.0 - (x / n_ranks) * m.compute >= COMPUTE_BOUND_SHARE else "compute"
        why = (f"no workers: the trainer does {c.p_serial * 1e6:.1f} us/sample of data work "
               f"({source}; {heaviest} heaviest) beside "
               f"{trainer_words(m, c.t, m.stage_wall['transfer_trainer'])}")
        if n_ranks > 1:
            why = f"{n_ranks} ranks; " + why
            if c.binding == "cores":
                why += f"; CPU-bound on {c.cores:.3g} cores"
    elif c.binding == "trainer":
        data_t = m.stage_wall["transfer_trainer"] + m.stage_wall["overhead"]
        bound = "compute" if m.compute >= data_t else "transfer"
        why = f"the trainer binds: {trainer_words(m, c.t, data_t)}"
        if n_ranks > 1:
            why = f"{n_ranks} ranks in parallel; " + why
    elif c.binding == "workers":
        # the stage the fit's ablations name bound where they name one and the stages are
        # as measured (one story with the verdict); else the heaviest by the stage timers
        if m.bound_stage in stages and not cache and not bandwidth_mb_s:
            heaviest = m.bound_stage
        bound = heaviest
        queued = (f", {figures.signed_percent(c.waiting, 0)} waiting for a core (PREDICTED)"
                  if c.waiting >= 0.005 else "")
        why = (f"{c.total} worker(s) at {c.p_wall * 1e6:.1f} us/sample each{contended}{queued} "
               f"({heaviest} {figures.us(stages[heaviest])}) cannot keep up")
    elif c.binding == "cores":
        bound = heaviest
        why = (f"CPU-bound: {c.p_cpu * 1e6:.1f} + {m.t_cpu * 1e6:.1f} us CPU/sample on "
               f"{c.cores:.3g} cores{contended} ({heaviest} heaviest)")
    else:
        bound = "fetch"
        why = f"storage bandwidth {storage_cap_mb_s:g} MB/s binds"
    stall = max(0.0, 1.0 - x / n_ranks * m.compute) if math.isfinite(x) else 0.0
    return Prediction(workers, x, stall, bound, why, c.binding, m.kind)


def trainer_words(m: Model, t: float, data_t: float | None = None) -> str:
    """The trainer's ``t`` seconds per sample, split into the model step alone (the one
    compute figure: ``figures.compute_s_per_sample``, as the verdict and the report print
    it), its trainer-side data work (``data_t``, where it is said) and the rest: what the
    trainer took more in the fit's full runs than the step alone (the step slowed beside its
    producers, a sleep waking late on a busy machine, the calibration)."""
    alone = m.stage_wall.get(COMPUTE_ONLY)
    source = COMPUTE_ONLY_SOURCE if alone is not None else "step timer"
    alone = m.compute if alone is None else alone
    words = f"{figures.us(alone)} compute ({source})"
    rest = t - alone
    if data_t is not None:
        words += f" + {figures.us(data_t)} trainer-side data work"
        rest -= data_t
    if abs(rest) >= 0.05e-6:
        more = "more" if rest > 0 else "less"
        words += (f" {'+' if rest > 0 else '-'} {figures.us(abs(rest))} {more} in the fit's "
                  f"full runs than alone")
    return words


@dataclass(frozen=True)
class RunPrediction:
    """What a whole run of ``samples`` samples would measure (PREDICTED)."""

    n: int
    whole_samples_s: float       # samples / epoch
    steady_samples_s: float      # after the first batch, as a run measures it
    first_batch_s: float
    model: str
    replayed: bool               # item by item (schedule) or the steady formula + start-up


def start_s(m: Model, workers: int) -> float:
    """Start-up before the first item begins at ``workers`` producers (grows per worker when
    the contention fit measured it grow)."""
    return max(m.start_fixed_s + m.startup_per_worker_s * (workers - m.fit_workers), 0.0)


def _producer_rate(c: _Costs) -> float:
    """The producers' aggregate rate: the smallest bound that is not the trainer's."""
    return min(v for k, v in c.terms.items() if k != "trainer")


def predict_run(m: Model, workers: int, samples: float, **kw: Any) -> RunPrediction:
    """A whole run: replayed item by item (``schedule``) when the model knows the items, else
    the steady rate plus the start-up measured at the fit. R ranks are replayed as one trainer
    R times as fast, fed by all their producers (the ranks are assumed to keep pace)."""
    c = _costs(m, workers, **kw)
    r = c.ranks
    if workers == 0:
        # R ranks each make and consume their own items, in parallel (slowed when the
        # cores bind): as one trainer R times as fast
        slow = (r / (c.p_serial + c.t)) / c.x if c.x > 0 else 1.0
        p, t = c.p_serial * slow / r, c.t * slow / r
        start, slots = 0.0, 0
    else:
        rate = _producer_rate(c)
        p = c.total / rate if rate > 0 else math.inf
        t = c.t / r
        start, slots = start_s(m, workers), c.total
    sch = schedule.simulate(workers=slots, samples=samples, item_rows=m.item_rows, p=p,
                            t=t, start_s=start) if m.item_rows else None
    if sch is not None:
        return RunPrediction(workers, sch.throughput_samples_s,
                             sch.steady_samples_s(m.batch_rows or m.item_rows, t),
                             sch.first_batch_s, m.kind, True)
    x = c.x
    if workers == 0:
        first = m.solo_item_s or m.startup_s
    else:
        first = max(m.startup_s + m.startup_per_worker_s * (workers - m.fit_workers), 0.0)
    whole = samples / (first + samples / x) if math.isfinite(x) and x > 0 and samples > 0 else x
    return RunPrediction(workers, whole, x, first, m.kind, False)


def calibrate_run(m: Model, epoch_s: float, samples: float) -> Model:
    """``calibrate`` for a model that knows its work items: the gap between the replayed run
    and the measured epoch at the fit (the cleanest figure a run has: no definition of "steady"
    in it) goes to the term that binds there. The start-up before the first item is what the
    measured time to the first batch leaves after the first item's (calibrated) production."""
    n = m.fit_workers
    binding = predict(m, n).binding

    def derive(mm: Model) -> Model:
        c = _costs(mm, n)
        rate = _producer_rate(c)
        first_item = mm.item_rows * c.total / rate if rate > 0 else 0.0
        return replace(mm, start_fixed_s=max(mm.startup_s - first_item, 0.0))

    def epoch_of(mm: Model) -> float:
        r = predict_run(mm, n, samples)
        return samples / r.whole_samples_s if r.whole_samples_s > 0 else math.inf

    if binding == "workers":
        field_, lo, hi, scale = "p_extra", -0.5 * m.p_wall, 20 * m.p_wall, 1e6
    elif binding == "trainer":
        field_, lo, hi, scale = "t_extra", -0.5 * m.t_trainer, 20 * m.t_trainer, 1e6
    elif binding == "cores":
        field_, lo, hi, scale = "cores_scale", 1.0, 0.02, 1.0   # a smaller share is slower
    else:
        return derive(m)
    at = lambda x: derive(replace(m, **{field_: x}))  # noqa: E731
    before = epoch_of(at(0.0 if field_ != "cores_scale" else 1.0))
    e_lo, e_hi = epoch_of(at(lo)), epoch_of(at(hi))
    if not (math.isfinite(e_lo) and math.isfinite(e_hi)) or abs(e_hi - e_lo) <= 1e-9 * epoch_s:
        return at(0.0 if field_ != "cores_scale" else 1.0)       # the run does not depend on it
    if epoch_s <= e_lo:
        x = lo
    elif epoch_s >= e_hi:
        x = hi
    else:
        a, b = lo, hi
        for _ in range(80):
            mid = (a + b) / 2
            if epoch_of(at(mid)) < epoch_s:
                a = mid
            else:
                b = mid
        x = (a + b) / 2
    out = at(x)
    gap = epoch_s / before - 1.0 if before > 0 else math.nan   # replayed rate vs measured
    said = f"(replayed run {figures.signed_percent(gap, 0)} vs the measured run at the fit)"
    if field_ == "p_extra":
        text = f"producers {figures.signed(x * scale)} us/sample outside the stage timers {said}"
    elif field_ == "t_extra":
        text = f"trainer {figures.signed(x * scale)} us/sample outside its measured parts {said}"
    else:
        text = f"the CPU work got {x:.0%} of the cores {said}"
    return replace(out, calibration=text)


def knee(m: Model, candidates: Sequence[int], *,
         cores_for: Callable[[int], float] | None = None, unit: str = "worker",
         shown: dict[int, int] | None = None, **kw: Any) -> Knee:
    """The fewest producers with no data stall, or what bounds once more stop helping.
    ``cores_for``: the cores available at each count (real nodes bring their own);
    ``unit``/``shown``: how a count reads on the axis the user asked about (with nodes, the
    model counts node CPUs, the user nodes), so the wording follows the axis."""
    shown = shown or {}
    preds = [predict(m, n, **kw, **({"cores": cores_for(n)} if cores_for else {}))
             for n in candidates]
    # a loader per rank (torchrun, local ranks): the count is each rank's, and said so
    each = " per rank" if unit == "worker" and m.ranks > 1 and m.producers_per_rank else ""
    for p in preds:
        if p.bound_by == "compute" and p.n > 0:
            n = shown.get(p.n, p.n)
            return Knee(n, "compute", f"{n} {unit}(s){each} remove the data stall: {p.why}")
    best = max(preds, key=lambda p: p.throughput_samples_s) if preds else None
    if best is None:
        return Knee(None, None, "no candidates")
    first_best = next(p for p in preds if p.throughput_samples_s >= 0.99 * best.throughput_samples_s)
    n = shown.get(first_best.n, first_best.n)
    return Knee(None, first_best.bound_by,
                f"no {unit} count removes the stall; from {n} {unit}(s) on, {first_best.why}",
                saturates_at=n)


def _group_key(v: VariantResult) -> tuple:
    """Variants that differ only in the knobs that set their producer count (the executor
    names them) form one scaling curve, also when the matrix varies a whole section, e.g.
    ``executor = [{kind = "ray", simulated_nodes = 2}]``."""
    scaling = set(v.executor.scaling_knobs) | {"trainers.ranks"}
    items = [(k, repr(x)) for k, x in v.knobs.items() if k not in scaling]
    items.append(("executor.kind", v.executor.kind))
    return tuple(sorted(items))


@MODELS.register("one-point")
class OnePoint(ScalingModel):
    """The bottleneck model above, fitted on one configuration: the fewest ranks, then the
    fewest producers >= 1, that is not oversubscribed (if any is not)."""

    name = "one-point"
    min_counts = 1
    predict_run = staticmethod(predict_run)

    @classmethod
    def fit(cls, variants: Sequence[VariantResult], machine: MachineInfo,
            dataset: DatasetInfo | None = None) -> Model | None:
        ref = reference(fit_points(variants, machine))
        return fit(ref, machine, dataset) if ref is not None else None


def _point(p: Prediction, log_half_width: float | None = None,
           not_predicted: str = "") -> WhatIfPoint:
    x = p.throughput_samples_s
    band = log_half_width is not None and math.isfinite(x) and not not_predicted
    return WhatIfPoint(n=p.n, predicted_samples_s=x,
                       stall_share=p.stall_share, bound_by=p.bound_by, why=p.why, binding=p.binding,
                       model=p.model,
                       low_samples_s=x * math.exp(-log_half_width) if band else None,
                       high_samples_s=x * math.exp(log_half_width) if band else None,
                       not_predicted=not_predicted)


def vouched_point(p: Prediction, bt: Any, m: Model, fit_counts: Sequence[int],
                  at: int | None = None) -> WhatIfPoint:
    """A predicted point with the interval of the back-test rows that vouch for it
    (``backtest.vouch``: as far outside the fit, the same way), or not predicted with the
    reason. ``at``: the producer count the prediction extrapolates to (default ``p.n``)."""
    v = backtest.vouch(bt, m.kind, p.n if at is None else at, fit_counts)
    return _point(p, v.log_half_width, v.not_predicted)


def points_at(preds: Sequence[Prediction], bt: Any, m: Model,
              fit_counts: Sequence[int]) -> list[WhatIfPoint]:
    """Predicted points, each vouched for by the back-test ``bt`` (``vouched_point``), or,
    without a back-test (one variant fitted, a model the user chose), plain predictions with
    no interval: there is nothing to withhold them by."""
    if bt is None:
        return [_point(p) for p in preds]
    return [vouched_point(p, bt, m, fit_counts) for p in preds]


def cheapest(points: Sequence[WhatIfPoint], costs: Sequence[float]) -> int | None:
    """Index of the cheapest configuration PREDICTED without a data stall (stall share under
    ``COMPUTE_BOUND_SHARE``, the one rule for "compute-bound") whose figure is given; None
    when no configuration qualifies. ``costs``: each point's price per run."""
    ok = [i for i, (p, c) in enumerate(zip(points, costs))
          if not p.not_predicted and p.stall_share < COMPUTE_BOUND_SHARE and math.isfinite(c)]
    return min(ok, key=lambda i: costs[i], default=None)


def knee_withheld(kn: Knee, points: Sequence[WhatIfPoint], measured_counts: Iterable[int]) -> Knee:
    """The knee with ``not_predicted`` set where its count was not measured and its point's
    prediction is not given: no advice is made from a figure the back-test does not vouch for."""
    n = kn.n if kn.n is not None else kn.saturates_at
    if n is None or n in set(measured_counts):
        return kn
    point = next((x for x in points if x.n == n), None)
    if point is None or not point.not_predicted:
        return kn
    return replace(kn, not_predicted=point.not_predicted)


def scaling_group(result: Result) -> list[VariantResult]:
    """The largest set of measured variants that differ only in their producer count (one
    scaling curve), or only in their data-parallel ranks; sorted by (ranks, producers). A
    worker (or node) sweep is the curve at its smallest rank count. Empty when there is no
    curve (fewer than two counts)."""
    groups: dict[tuple, list[VariantResult]] = {}
    for v in result.variants:
        if v.repeats and v.repeats[0].samples:
            groups.setdefault(_group_key(v), []).append(v)
    best = max(groups.values(), key=len, default=[])
    if len({workers_of(v) for v in best}) >= 2:
        # a worker (or node) sweep: the curve is over workers, at the smallest rank count
        fewest = min(ranks_of(v) for v in best)
        best = [v for v in best if ranks_of(v) == fewest]
    if len(best) < 2 or (len({workers_of(v) for v in best}) < 2 and not by_ranks(best)):
        return []
    return sorted(best, key=lambda v: (ranks_of(v), workers_of(v)))


def by_ranks(group: Sequence[VariantResult]) -> bool:
    """A curve over ranks alone (one producer count, several rank counts)."""
    return len({ranks_of(v) for v in group}) >= 2


def check(m: Model, v: VariantResult, *, rank_axis: bool = False,
          cores: float | None = None, cpu_share: float | None = None) -> WhatIfCheck:
    """A measured variant against the model's prediction of its whole run and steady figure.
    ``rank_axis``: the curve's axis is ranks (``n`` is then the variant's ranks); ``cores``:
    the machine's, to mark an oversubscribed point (default the model's); ``cpu_share``: the
    curve's ``stage_cpu_share`` (producers that mostly wait carry more per core)."""
    n, r = workers_of(v), ranks_of(v)
    p = predict(m, n, ranks=r)
    run = predict_run(m, n, finite_median(f.samples for f in v.repeats), ranks=r)
    got = v.throughput_samples_s.median
    # The model predicts a steady rate; a run's epoch also holds the time to the first batch
    # and rounds of work items, so the run is replayed (``predict_run``) for the whole-run
    # comparison (the headline) and for the steady figure as the run measured it.
    steady = finite_median(f.steady_throughput_samples_s for f in v.repeats)
    return WhatIfCheck(
        n=r if rank_axis else n, variant=v.name, measured_samples_s=got,
        predicted_samples_s=p.throughput_samples_s,
        predicted_run_samples_s=run.whole_samples_s,
        error=(run.whole_samples_s - got) / got if got else None,
        measured_steady_samples_s=steady,
        steady_error=(run.steady_samples_s - steady) / steady
        if math.isfinite(steady) and steady else None,
        is_fit=v.name in m.fit_variants, bound_by=p.bound_by, ranks=r,
        oversubscribed=oversubscribed(v, m.cores if cores is None else cores, cpu_share),
        model=m.kind, predicted_steady_samples_s=run.steady_samples_s)


IN_SAMPLE_WARN = 0.15     # a fit point missed by more than this is said in the note


def validate(result: Result, *, axis_max: int = 16) -> WhatIfValidation | None:
    """Fit the richest what-if model the scaling curve allows (``whatif_models.fit_best``:
    contention from two or more producer counts, else one-point; oversubscribed points are
    not fitted on while others remain), store predicted vs measured for every point, back-test
    each point with a fit that leaves it out (``backtest``), and draw the predicted curve, its
    interval and its knee (over workers or nodes, or over ranks for a sweep of ranks alone).
    Each point's interval comes from the back-test rows that extrapolated as far from their
    fit the same way (``backtest.vouch``); where those missed by more than
    ``backtest.MAX_ERROR`` or none reach that far, the point is not predicted (its reason
    stored), and so is a knee at an unmeasured count whose point is not (issue 39)."""
    best = scaling_group(result)
    if not best:
        return None
    m = fit_best(best, result.machine, result.dataset)
    if m is None:
        return None
    rank_axis = by_ranks(best)
    cores = result.machine.cores
    simulated = any(v.executor.nodes_simulated for v in best)
    nodes = any(v.executor.producer_nodes for v in best)
    share = stage_cpu_share(best)
    measured = [check(m, v, rank_axis=rank_axis, cores=cores, cpu_share=share) for v in best]
    bt = backtest.backtest(best, result.machine, result.dataset)
    named = {v.name: v for v in best}
    fit_counts = [workers_of(named[f]) for f in m.fit_variants if f in named]
    ns = list(range(0, axis_max + 1))
    checked = [x for x in measured if not x.is_fit and not x.oversubscribed]
    errors = [abs(x.error) for x in checked if x.error is not None]
    steady_errors = [abs(x.steady_error) for x in checked if x.steady_error is not None]
    fitted = (f"{m.kind} model fitted on {len(m.fit_variants)} configuration(s) "
              f"({', '.join(m.fit_variants)})")
    rest = "the rest predicted" if len(m.fit_variants) < len(best) else "every point was fitted"
    note = f"{fitted}, {rest}; back-tested by leaving each point out"
    inside = [abs(x.error) for x in measured if x.is_fit and x.error is not None]
    if inside and max(inside) > IN_SAMPLE_WARN:
        note += (f"; the model misses its own fit points by up to {max(inside):.0%}: their "
                 f"per-sample costs do not explain their rates (other processes taking the "
                 f"cores the model assumes free?)")
    if rank_axis:      # the curve over ranks, each with the fit's workers per rank (or pool)
        each = "workers per rank" if m.producers_per_rank else "producers"
        axis = f"ranks ({m.fit_workers} {each})"
        preds = [replace(predict(m, m.fit_workers, ranks=r), n=r) for r in ns[1:]]
        # over ranks the producers per rank stay the fit's: no extrapolation in producers
        points = [vouched_point(p, bt, m, fit_counts, at=m.fit_workers) for p in preds]
        top = max(p.throughput_samples_s for p in preds)
        first = next(p for p in preds if p.throughput_samples_s >= 0.99 * top)
        kn = Knee(None, first.bound_by, f"from {first.n} ranks on, more ranks add nothing: "
                                        f"{first.why}", saturates_at=first.n)
    else:
        if simulated:
            axis, where = "simulated node CPUs", "simulated nodes share this machine's cores"
        elif nodes and m.producer_cores == "own":
            axis, where = "node CPUs", "each node brings its own cores"
        elif nodes:
            axis, where = "node CPUs", "the nodes run on this machine and share its cores"
        else:
            axis, where = "workers", ""
        note += f"; {where}" if where else ""
        points = [vouched_point(predict(m, n), bt, m, fit_counts) for n in ns]
        kn = knee(m, ns[1:])
        if axis == "workers" and m.ranks == 1:
            # issue 58: the points from the measured costs, the curve's only where those
            # costs do not replay their own run and it contradicts no figure of the run
            points = costmodel.reconcile(points, best, result.machine, result.dataset,
                                         producer_budget(cores, share),
                                         words_from=next((v for v in best
                                                          if v.name == m.fit_variant), None))
            if any(p.model == costmodel.MODEL for p in points):
                kn = costmodel.knee_of(points)
    kn = knee_withheld(kn, points, [x.n for x in measured])
    if any(x.oversubscribed for x in measured):
        budget = producer_budget(cores, share)
        carried = (f"the {cores:g} cores they share" if budget == cores else
                   f"the {budget:g} the {cores:g} cores they share carry (their stages mostly "
                   f"wait: {share:.0%} CPU)")
        note += (f"; points with more producer slots than {carried} are "
                 f"oversubscribed: shown, left out of the fit and the error")
    return WhatIfValidation(
        label="predicted",
        axis=axis,
        fit_variant=m.fit_variant,
        model=m,
        points=points,
        measured=measured,
        max_abs_error=max(errors) if errors else None,
        max_abs_steady_error=max(steady_errors) if steady_errors else None,
        knee=kn,
        note=note,
        backtest=bt,
    )
