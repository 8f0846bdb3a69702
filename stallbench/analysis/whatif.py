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
    N >= 1: X = min(N / p_wall,                 # the workers' own pace
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
than the cores they share are oversubscribed: stored, marked, and left out of the error. The limits: no contention model beyond a core budget, no memory bandwidth, no
network between nodes except what the trainer-side transfer measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from ..results import (Knee, MachineInfo, Result, VariantResult, WhatIfCheck, WhatIfModel,
                       WhatIfPoint, WhatIfValidation)


# The fitted model is result data (stored with the validation): its fields live in the schema.
Model = WhatIfModel


@dataclass(frozen=True)
class Prediction:
    n: int
    throughput_samples_s: float
    stall_share: float
    bound_by: str
    why: str
    binding: str = ""            # the model term that binds: workers, cores, trainer, storage

    def over_run(self, m: "Model", samples: float) -> float:
        """Throughput of a run of ``samples`` samples: start-up (measured at the fit) plus
        the predicted steady rate, as a measured epoch includes both."""
        x = self.throughput_samples_s
        if not (math.isfinite(x) and x > 0 and samples > 0):
            return x
        startup = m.solo_item_s if self.n == 0 and m.solo_item_s else m.startup_s
        return samples / (startup + samples / x)


def _median(xs: Iterable[float]) -> float:
    vals = sorted(x for x in xs if x is not None and math.isfinite(x))
    if not vals:
        return math.nan
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


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


def fit(v: VariantResult, machine: MachineInfo) -> Model:
    """Per-sample costs from the variant's full runs (medians over repeats)."""
    reps = v.repeats
    s = lambda key: _median(getattr(f.stage_s, key) / max(f.samples, 1) for f in reps)  # noqa: E731
    fetch, prep, xfer = s("fetch"), s("preprocess"), s("transfer_producer")
    cpu = s("fetch_cpu") + s("preprocess_cpu") + s("transfer_producer_cpu")
    # The producer processes' own CPU clocks also see what happens outside the stage timers
    # (pickling a batch on the queue's feeder thread, the DataLoader loop, start-up; Ray's
    # scheduling, object transfer and daemons): the whole cost of producing. Use it when
    # measured.
    whole = _median(f.producer_cpu_s / max(f.samples, 1) for f in reps if f.producer_cpu_s)
    if math.isfinite(whole) and whole > cpu:
        cpu = whole
    trainer_xfer = s("transfer_trainer")
    compute = _median(f.compute_s / max(f.samples, 1) for f in reps)
    ranks = ranks_of(v)
    if ranks > 1:
        # per sample of one rank: each rank unpacks and steps its own share, in parallel
        per = [r for f in reps for r in f.ranks]
        trainer_xfer = _median(r.trainer_transfer_s / max(r.samples, 1) for r in per)
        compute = _median(r.compute_s / max(r.samples, 1) for r in per)
    overhead = 0.0
    if v.attribution is not None and v.executor.has_producers:
        samples = _median(f.samples for f in reps) / ranks
        overhead = max(v.attribution.overhead_s, 0.0) / max(samples, 1)
    # The trainer process's own CPU clock covers everything it does (hand-off, unpacking,
    # a CPU model step, helper threads); older results without it fall back to the parts.
    t_cpu = _median(f.trainer_cpu_s / max(f.samples, 1) for f in reps if f.trainer_cpu_s)
    if not math.isfinite(t_cpu):
        t_cpu = trainer_xfer + overhead + (compute if compute_on_cpu(v, machine) else 0.0)
    elif not v.executor.has_producers:
        # Fitted with no producers, the trainer's clock also holds the data work (``cpu``):
        # counted there, it would be counted twice against the cores.
        t_cpu = max(t_cpu - cpu, 0.0)
    io_bytes = _median(f.bytes.storage_bytes / max(f.samples, 1) for f in reps)
    cpus_per_node = (v.executor.producer_slots // v.executor.producer_nodes
                     if v.executor.producer_nodes else 1)
    raw = Model(
        p_wall=fetch + prep + xfer, p_cpu=cpu, t_trainer=trainer_xfer + overhead + compute,
        t_cpu=t_cpu, cores=machine.cores,
        stage_wall={"fetch": fetch, "preprocess": prep, "transfer": xfer,
                    "transfer_trainer": trainer_xfer, "overhead": overhead},
        io_wait=s("fetch_io_wait"), io_bytes=io_bytes, compute=compute,
        fit_workers=workers_of(v), fit_variant=v.name,
        cpus_per_node=max(cpus_per_node, 1),
        startup_s=_median(f.time_to_first_batch_s for f in reps) if reps else 0.0,
        p_solo=v.trainer_solo.data_s_per_sample if v.trainer_solo else None,
        solo_item_s=v.trainer_solo.item_s if v.trainer_solo else None,
        ranks=ranks, producers_per_rank=v.ranks.producers_per_rank if v.ranks else True,
        producer_cores="shared" if v.executor.producers_share_cores else "own",
    )
    if not math.isfinite(raw.startup_s):
        raw = replace(raw, startup_s=0.0)
    return calibrate(raw, _median(f.steady_throughput_samples_s for f in reps))


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
            f"producers {extra * 1e6:+.1f} us/sample outside the stage timers "
            f"(model {gap:+.0%} vs measured steady rate at the fit)"))
    if p.binding == "trainer":
        extra = max(m.ranks / measured_steady - m.t_trainer, -0.5 * m.t_trainer)
        return replace(m, t_extra=extra, calibration=(
            f"trainer {extra * 1e6:+.1f} us/sample outside its measured parts "
            f"(model {gap:+.0%} vs measured steady rate at the fit)"))
    if p.binding == "cores":
        scale = min(1.0, measured_steady * (m.p_cpu + m.t_cpu) / m.cores)
        return replace(m, cores_scale=scale, calibration=(
            f"the CPU work got {scale:.0%} of the cores (model {gap:+.0%} vs measured steady "
            f"rate at the fit)"))
    return m


def predict(m: Model, workers: int, *, cache: float = 0.0, bandwidth_mb_s: float | None = None,
            storage_cap_mb_s: float | None = None, cores: float | None = None,
            ranks: int | None = None) -> Prediction:
    """``workers``: per rank where each rank has its own (local), else the one pool's size;
    ``ranks``: data-parallel trainer ranks (default: the fit's)."""
    n_ranks = ranks or m.ranks
    fetch_wall = m.stage_wall["fetch"]
    io = m.io_wait
    if bandwidth_mb_s:
        io_new = m.io_bytes / (bandwidth_mb_s * 1e6)
        fetch_wall = fetch_wall - io + io_new
        io = io_new
    fetch_cpu_share = m.p_cpu * (m.stage_wall["fetch"] - m.io_wait) / max(m.p_wall - m.io_wait, 1e-12)
    fetch_wall *= (1.0 - cache)
    p_wall = fetch_wall + m.stage_wall["preprocess"] + m.stage_wall["transfer"]
    p_cpu = m.p_cpu - cache * fetch_cpu_share
    if cores is None:
        # real nodes bring their own cores (one per producer slot); simulated nodes and local
        # workers share the machine's
        cores = m.cores + workers if m.producer_cores == "own" else m.cores
    stages = {"fetch": fetch_wall, "preprocess": m.stage_wall["preprocess"],
              "transfer": m.stage_wall["transfer"]}
    heaviest = max(stages, key=stages.get)
    t_trainer = m.t_trainer + m.t_extra
    binding = "serial"
    if workers == 0:
        # No loader: no hand-off overhead, and the data work runs uncontended in the trainer's
        # own process, at the rate measured there when the model has it (scaled by the same
        # cache/bandwidth changes as the workers' rate). Not calibrated: the fit point's gap
        # is about hand-off, which does not exist here.
        t_trainer -= m.stage_wall["overhead"]
        source = "measured in a worker"
        if m.p_solo and m.p_wall > 0:
            p_wall = m.p_solo * (p_wall / m.p_wall)
            source = "measured in the trainer's process"
        x = n_ranks / (p_wall + t_trainer)
        # the same rule as the attribution's: a stall share under 5% is compute-bound, so
        # the table never says "0% stall" beside "bound by fetch" (per rank: x / n_ranks)
        bound = heaviest if 1.0 - (x / n_ranks) * m.compute >= 0.05 else "compute"
        why = (f"no workers: the trainer does {p_wall * 1e6:.1f} us/sample of data work "
               f"({source}; {heaviest} heaviest) before each {t_trainer * 1e6:.1f} us/sample step")
        if n_ranks > 1:
            why = f"{n_ranks} ranks; " + why
            cpu_cap = cores / (p_cpu + m.t_cpu) if p_cpu + m.t_cpu > 0 else math.inf
            if cpu_cap < x:
                x, binding = cpu_cap, "cores"
                why += f"; CPU-bound on {cores:.3g} cores"
    else:
        p_wall += m.p_extra
        cores *= m.cores_scale
        total = producers(m, workers, n_ranks)
        terms = {
            "workers": total / p_wall if p_wall > 0 else math.inf,
            "cores": cores / (p_cpu + m.t_cpu) if p_cpu + m.t_cpu > 0 else math.inf,
            "trainer": n_ranks / t_trainer if t_trainer > 0 else math.inf,
        }
        if storage_cap_mb_s and m.io_bytes:
            terms["storage"] = storage_cap_mb_s * 1e6 / (m.io_bytes * (1 - cache) or 1e-12)
        binding = min(terms, key=terms.get)
        x = terms[binding]
        if binding == "trainer":
            data_t = m.stage_wall["transfer_trainer"] + m.stage_wall["overhead"]
            bound = "compute" if m.compute >= data_t else "transfer"
            why = (f"the trainer binds: {m.compute * 1e6:.1f} us/sample compute + "
                   f"{data_t * 1e6:.1f} us/sample trainer-side data work")
        elif binding == "workers":
            bound = heaviest
            why = (f"{total} worker(s) at {p_wall * 1e6:.1f} us/sample each "
                   f"({heaviest} {stages[heaviest] * 1e6:.1f} us) cannot keep up")
        elif binding == "cores":
            bound = heaviest
            why = (f"CPU-bound: {p_cpu * 1e6:.1f} + {m.t_cpu * 1e6:.1f} us CPU/sample on "
                   f"{cores:.3g} cores ({heaviest} heaviest)")
        else:
            bound = "fetch"
            why = f"storage bandwidth {storage_cap_mb_s:g} MB/s binds"
    if n_ranks > 1 and binding == "trainer":
        why = f"{n_ranks} ranks in parallel; " + why
    stall = max(0.0, 1.0 - x / n_ranks * m.compute) if math.isfinite(x) else 0.0
    return Prediction(workers, x, stall, bound, why, binding)


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
    for p in preds:
        if p.bound_by == "compute" and p.n > 0:
            n = shown.get(p.n, p.n)
            return Knee(n, "compute", f"{n} {unit}(s) remove the data stall: {p.why}")
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


def _point(p: Prediction) -> WhatIfPoint:
    return WhatIfPoint(n=p.n, predicted_samples_s=p.throughput_samples_s,
                       stall_share=p.stall_share, bound_by=p.bound_by, why=p.why, binding=p.binding)


def validate(result: Result, *, axis_max: int = 16) -> WhatIfValidation | None:
    """Fit on the smallest worker/node count of each group of variants, predict the others,
    and store predicted vs measured with the error; also a predicted curve and its knee."""
    groups: dict[tuple, list[VariantResult]] = {}
    for v in result.variants:
        if v.repeats and v.repeats[0].samples:
            groups.setdefault(_group_key(v), []).append(v)
    best = max(groups.values(), key=len, default=[])
    if len({workers_of(v) for v in best}) >= 2:
        # a worker (or node) sweep: the curve is over workers, at the smallest rank count
        fewest = min(ranks_of(v) for v in best)
        best = [v for v in best if ranks_of(v) == fewest]
    by_ranks = len({ranks_of(v) for v in best}) >= 2      # a sweep over ranks alone
    if len(best) < 2 or (len({workers_of(v) for v in best}) < 2 and not by_ranks):
        return None
    best.sort(key=lambda v: (ranks_of(v), workers_of(v)))
    cores = result.machine.cores
    oversub = {id(v): v.executor.producers_share_cores and workers_of(v) > cores for v in best}
    # fit on the smallest count with producers that is not oversubscribed (if any is not)
    fit_v = next((v for v in best if workers_of(v) >= 1 and not oversub[id(v)]),
                 next((v for v in best if workers_of(v) >= 1), best[0]))
    m = fit(fit_v, result.machine)
    simulated = any(v.executor.nodes_simulated for v in best)
    nodes = any(v.executor.producer_nodes for v in best)
    measured = []
    for v in best:
        p = predict(m, workers_of(v), ranks=ranks_of(v))
        got = v.throughput_samples_s.median
        # The model predicts a steady rate; a run's epoch also holds the time to the first
        # batch, so the epoch comparison adds the start-up measured at the fit. Both
        # comparisons are stored; the epoch one is the headline.
        steady = _median(f.steady_throughput_samples_s for f in v.repeats)
        over_run = p.over_run(m, _median(f.samples for f in v.repeats))
        measured.append(WhatIfCheck(
            n=ranks_of(v) if by_ranks else workers_of(v), variant=v.name, measured_samples_s=got,
            predicted_samples_s=p.throughput_samples_s, predicted_run_samples_s=over_run,
            error=(over_run - got) / got if got else None,
            measured_steady_samples_s=steady,
            steady_error=(p.throughput_samples_s - steady) / steady
            if math.isfinite(steady) and steady else None,
            is_fit=v is fit_v, bound_by=p.bound_by, ranks=ranks_of(v),
            oversubscribed=oversub[id(v)]))
    ns = list(range(0, axis_max + 1))
    checked = [x for x in measured if not x.is_fit and not x.oversubscribed]
    errors = [abs(x.error) for x in checked if x.error is not None]
    steady_errors = [abs(x.steady_error) for x in checked if x.steady_error is not None]
    note = "fitted on one configuration, the rest predicted"
    if by_ranks:      # the curve over ranks, each with the fit's workers per rank (or pool)
        each = "workers per rank" if m.producers_per_rank else "producers"
        axis = f"ranks ({m.fit_workers} {each})"
        preds = [replace(predict(m, m.fit_workers, ranks=r), n=r) for r in ns[1:]]
        points = [_point(p) for p in preds]
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
        points = [_point(predict(m, n)) for n in ns]
        kn = knee(m, ns[1:])
    if any(x.oversubscribed for x in measured):
        note += (f"; points with more producer slots than the {cores:g} cores they share are "
                 f"oversubscribed: shown, left out of the error")
    return WhatIfValidation(
        label="predicted",
        axis=axis,
        fit_variant=fit_v.name,
        model=m,
        points=points,
        measured=measured,
        max_abs_error=max(errors) if errors else None,
        max_abs_steady_error=max(steady_errors) if steady_errors else None,
        knee=kn,
        note=note,
    )
