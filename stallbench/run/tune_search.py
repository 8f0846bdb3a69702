"""The search of ``stallbench tune`` (see ``run.tune``): one measured step at a time, each
changing one knob of the best configuration so far, chosen by the attribution and the what-if.

The producer count is whatever knob the executor names (``Executor.producer_knob``); a step's
producer slots are what the executor measured (``ExecutorFacts.producer_slots``), never
recomputed from keys here. The foreign load of each step is ``measure.load.LoadMeter``'s.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..analysis import figures, whatif
from ..analysis.stats import COMPUTE_BOUND_SHARE as STALL_FREE
from ..analysis.stats import finite_median
from ..analysis.whatif_models import fit_best
from ..data.parquet import describe
from ..executors import EXECUTORS, ProducerKnob
from ..measure import machine
from ..measure.load import LoadMeter
from ..pipeline import FULL, Plan, dataset_for
from ..results import DatasetInfo, MachineInfo, TuneFigures, TuneStep, VariantResult
from ..scenario import Config, Scenario, Variant, format_value
from ..stages.batch_format import FORMATS
from .preflight import check_config
from .runner import default_cache_dir, run_variant
from .tune_file import knob_diff, variant_name, with_knobs

BETTER = 0.03                # a stalled configuration must be this much faster to count
COST_TIE = 0.02              # costs this close are equal: fewer resources win
GOAL = 0.10                  # the confirmation run within 10% of its prediction
ATTRIBUTION_BUDGET_S = 240.0
MARGIN = 1.15                # estimates of a step's time are padded by this


@dataclass
class TuneOptions:
    budget_s: float = 600.0
    cpu_node_cost: float | None = None
    gpu_node_cost: float | None = None
    out_dir: Path = Path("results")
    cache_dir: Path | None = None
    progress: bool = False

    @property
    def priced(self) -> bool:
        return self.cpu_node_cost is not None or self.gpu_node_cost is not None


@dataclass
class Point:
    """One measured configuration of the search."""

    cfg: Config
    knobs: dict[str, Any]
    name: str
    vr: VariantResult
    figures: TuneFigures
    step: TuneStep
    setup_s: float               # wall time of the step beyond its runs' epochs


@dataclass
class Candidate:
    key: str
    value: Any
    why: str
    predicted_samples_s: float | None = None
    predicted_by: str = ""
    extra: dict[str, Any] = field(default_factory=dict)   # knobs changed together


class Search:
    """The search of ``run.tune`` (its module docstring): measure, rank, ask the attribution
    and the what-if for the next step, stop at the budget."""

    def __init__(self, sc: Scenario, opts: TuneOptions,
                 say: Callable[[str], None] = lambda s: None) -> None:
        self.sc = sc
        self.opts = opts
        self.say = say
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + opts.budget_s
        self.cache = opts.cache_dir or default_cache_dir()
        self.points: list[Point] = []
        self.steps: list[TuneStep] = []
        self.tried: set[str] = set()
        self.skipped: set[str] = set()
        self.machine: MachineInfo = machine.metadata()
        self.dataset: DatasetInfo | None = None
        self.last_foreign: float | None = None

    # ---------------------------------------------------------------------- measuring
    @staticmethod
    def runs_for(cfg: Config) -> int:
        """Runs one step measures: 2 where the executor keeps this config's loader workers
        (``Executor.workers_kept``): its first run forks them, as a forked-every-run config's
        every run does, and only the runs after it show what keeping them saves (a training
        job pays the fork once, not every epoch); ``figures`` then counts the runs that reused
        them (``RepeatFigures.workers_reused``, as the executor reports).
        Every other step is one run."""
        return 2 if EXECUTORS.get(cfg.executor.kind).workers_kept(cfg) else 1

    def _measure(self, cfg: Config, analyze: bool) -> tuple[VariantResult, float]:
        with LoadMeter() as meter:
            vr, wall = self._run(cfg, analyze)
        self.last_foreign = meter.load.foreign_cores if meter.load else None
        return vr, wall

    def _run(self, cfg: Config, analyze: bool) -> tuple[VariantResult, float]:
        path = self.sc.path
        check_config(cfg, path)
        EXECUTORS.get(cfg.executor.kind).check(cfg, path)
        ds = dataset_for(cfg, self.cache, path)
        if self.dataset is None:
            self.dataset = DatasetInfo(**describe(ds))
        knobs = knob_diff(self.sc.base, cfg)
        plan = Plan.create(cfg, ds, FULL, path)
        t = time.perf_counter()
        vr = run_variant(Variant(variant_name(knobs), knobs, cfg), plan, self.runs_for(cfg),
                         analyze, path, self.opts.progress)
        return vr, time.perf_counter() - t

    def figures(self, vr: VariantResult) -> TuneFigures:
        """The step's figures: medians of its runs; where the executor keeps the workers, of
        the runs that reused them (``RepeatFigures.workers_reused``; ``runs_for``: the first
        forked them), when there are any."""
        reused = [f for f in vr.repeats if f.workers_reused]
        reps = reused if vr.executor.workers_kept and reused else vr.repeats
        skip = len(vr.repeats) - len(reps)
        steady = finite_median(f.steady_throughput_samples_s for f in reps)
        compute = finite_median(f.compute_s / f.samples for f in reps if f.samples)
        steady_stall = max(0.0, 1.0 - steady * compute) if math.isfinite(steady) else math.nan
        if skip:
            whole = finite_median(f.throughput_samples_s for f in reps)
            epoch = finite_median(f.epoch_s for f in reps)
            stall = finite_median(f.stall_s / f.epoch_s for f in reps if f.epoch_s > 0)
            first = finite_median(f.time_to_first_batch_s for f in reps)
        else:
            whole, epoch = vr.throughput_samples_s.median, vr.epoch_s.median
            stall, first = vr.stall_share.median, vr.time_to_first_batch_s.median
        nodes = vr.executor.producer_nodes or 0
        cost = None
        if self.opts.priced and whole > 0 and self.dataset is not None:
            ratio = vr.stage_rates.rows_out_per_row_in or 1.0
            hours = self.dataset.rows * ratio / whole / 3600.0
            cost = hours * ((self.opts.gpu_node_cost or 0.0) + (self.opts.cpu_node_cost or 0.0) * nodes)
        bound, source = self.bound(vr, steady_stall)
        return TuneFigures(
            throughput_samples_s=whole, steady_throughput_samples_s=steady,
            epoch_s=epoch, samples=int(finite_median(f.samples for f in reps)),
            stall_share=stall, steady_stall_share=steady_stall,
            time_to_first_batch_s=first,
            producer_slots=vr.executor.producer_slots, cpu_nodes=nodes, bound_by=bound,
            bound_from=source, cost_per_epoch=cost, repeats=len(reps), runs_not_counted=skip)

    def bound(self, vr: VariantResult, steady_stall: float) -> tuple[str, str]:
        """What bounds the run: the attribution's verdict when it ran, else the one-point
        what-if's reading of the run (the term that binds, the heaviest stage)."""
        if vr.attribution is not None:
            return vr.attribution.bound_by, "attribution"
        if math.isfinite(steady_stall) and steady_stall < STALL_FREE:
            return "compute", "what-if"
        m = whatif.fit(vr, self.machine, self.dataset)
        p = whatif.predict(m, vr.executor.producer_slots)
        if p.binding == "trainer":
            return "transfer", "what-if"     # stalled although producers keep up: its own work
        if p.bound_by == "compute":
            heaviest = max(m.stage_wall, key=lambda k: m.stage_wall[k]
                           if k in ("fetch", "preprocess", "transfer") else -1.0)
            return heaviest, "what-if"
        return p.bound_by, "what-if"

    # ------------------------------------------------------------------------ ranking
    @staticmethod
    def stall_free(f: TuneFigures) -> bool:
        return math.isfinite(f.steady_stall_share) and f.steady_stall_share < STALL_FREE

    def better(self, a: TuneFigures, b: TuneFigures) -> bool:
        """Is ``a`` preferable to ``b`` (rule 3 of the module docstring)?"""
        fa, fb = self.stall_free(a), self.stall_free(b)
        if fa != fb:
            return fa
        if fa:
            if self.opts.priced and a.cost_per_epoch and b.cost_per_epoch:
                if a.cost_per_epoch < b.cost_per_epoch * (1 - COST_TIE):
                    return True
                if a.cost_per_epoch > b.cost_per_epoch * (1 + COST_TIE):
                    return False
            ra, rb = (a.cpu_nodes, a.producer_slots), (b.cpu_nodes, b.producer_slots)
            if ra != rb:
                return ra < rb
            return a.throughput_samples_s > b.throughput_samples_s * (1 + BETTER)
        return a.throughput_samples_s > b.throughput_samples_s * (1 + BETTER)

    def best(self) -> Point:
        best = self.points[0]
        for p in self.points[1:]:
            if self.better(p.figures, best.figures):
                best = p
        return best

    # ------------------------------------------------------------------------ the what-if
    @staticmethod
    def knob(cfg: Config) -> ProducerKnob | None:
        """The key that sets the producer count here, as the executor names it."""
        return EXECUTORS.get(cfg.executor.kind).producer_knob(cfg)

    def family(self, cfg: Config) -> list[Point]:
        """Measured configurations that differ from ``cfg`` only in its producer count."""
        knob = self.knob(cfg)
        key = knob.key if knob else None
        strip = lambda c: {k: v for k, v in knob_diff(self.sc.base, c).items() if k != key}  # noqa: E731
        mine = strip(cfg)
        return [p for p in self.points if strip(p.cfg) == mine]

    def model_for(self, cfg: Config) -> whatif.Model | None:
        fam = self.family(cfg)
        return fit_best([p.vr for p in fam], self.machine, self.dataset) if fam else None

    def max_count(self, m: whatif.Model) -> int:
        """Producer counts worth predicting: up to the cores, or twice that when storage waits
        (which use no core) are a fifth of a producer's time; never more than work items."""
        items = self.dataset.shards if self.dataset and self.dataset.shards else 64
        waits = m.p_wall > 0 and m.io_wait / m.p_wall >= 0.2
        return int(max(1, min((2 if waits else 1) * self.machine.cores, items, 64)))

    def failed_count(self, slots: int) -> Point | None:
        """A measured point with this producer count that was slower than a point of its own
        family with fewer producers: evidence that the count does not pay off on this machine,
        whatever the batch format."""
        for p in self.points:
            if p.figures.producer_slots != slots:
                continue
            for q in self.family(p.cfg):
                if q.figures.producer_slots < slots and \
                        q.figures.throughput_samples_s >= p.figures.throughput_samples_s:
                    return p
        return None

    # ------------------------------------------------------------------------ candidates
    def candidates(self, best: Point) -> list[Candidate]:
        f = best.figures
        cfg = best.cfg
        out: list[Candidate] = []
        producers = self._producer_candidates(best)
        formats = self._format_candidates(best)
        keep = self._keep_candidates(best)
        if self.stall_free(f):
            # only cheaper producer counts are worth a run, or the same producers without
            # paying their start every run
            return producers + keep
        if f.bound_by == "transfer":
            out = formats + producers
        else:
            out = producers + formats
        if f.bound_by in ("fetch", "preprocess") and cfg.loader.prefetch_factor < 8 \
                and self._measured_stall_above_predicted(best):
            out.append(Candidate("loader.prefetch_factor", cfg.loader.prefetch_factor * 2,
                                  "the what-if says these producers keep up on average, the run "
                                  "still waited: a deeper queue per producer absorbs bursts"))
        return out + keep

    def _keep_candidates(self, best: Point) -> list[Candidate]:
        """``loader.persistent_workers = true`` where the executor could keep the best's loader
        workers and forks them for every run instead (``Executor.workers_kept`` is False):
        each run then pays every worker's fork, start-up, first item's page faults and exit
        (docs/data-path.md, "What workers still pay"), which a training job with kept
        workers pays once. Last in line: it removes a per-run cost, not the bound."""
        if EXECUTORS.get(best.cfg.executor.kind).workers_kept(best.cfg) is not False:
            return []
        f = best.figures
        return [Candidate("loader.persistent_workers", True,
                          f"{f.producer_slots} loader worker(s) forked every run (time to first "
                          f"batch {f.time_to_first_batch_s:.3f} s of a {f.epoch_s:.3f} s epoch, "
                          f"measured): kept across runs, a run pays none of their start-up, "
                          f"first item's page faults and exit (judged on its 2nd run)")]

    def _measured_stall_above_predicted(self, best: Point) -> bool:
        m = self.model_for(best.cfg)
        if m is None:
            return False
        p = whatif.predict(m, best.figures.producer_slots)
        return p.stall_share < STALL_FREE <= best.figures.steady_stall_share

    def _producer_candidates(self, best: Point) -> list[Candidate]:
        cfg = best.cfg
        knob = self.knob(cfg)
        if knob is None:
            self._skip("producer count: this executor's producer count is not a knob tune "
                       "varies (a real Ray cluster's CPUs)")
            return []
        m = self.model_for(cfg)
        if m is None:
            return []
        key, unit, per = knob.key, knob.unit, knob.slots_per_step
        cur = best.figures.producer_slots
        counts = list(range(knob.lowest, self.max_count(m) + 1))
        preds = {c: whatif.predict(m, c * per) for c in counts}
        samples = best.figures.samples
        free = [c for c in counts if c >= 1 and preds[c].stall_share < STALL_FREE]
        measured = {p.figures.producer_slots // per for p in self.family(cfg)}
        if self.stall_free(best.figures):
            free = [c for c in free if c * per < cur]     # only cheaper is worth a run
            if not free:
                return []
        if free:
            target = free[0]
            if target in measured:
                return []
            if self._refuted(target * per, cur, unit):
                return []
            run = whatif.predict_run(m, target * per, samples)
            verb = "remove" if target * per > cur else "still remove"
            return [Candidate(key, target,
                               f"what-if ({m.kind}): {target} {unit} {verb} the stall "
                               f"({preds[target].why})", run.whole_samples_s, m.kind)]
        top = max(preds[c].throughput_samples_s for c in counts)
        sat = next(c for c in counts if preds[c].throughput_samples_s >= 0.99 * top)
        run = whatif.predict_run(m, sat * per, samples)
        if sat not in measured and self._refuted(sat * per, cur, unit):
            return []
        if sat in measured or run.whole_samples_s < best.figures.throughput_samples_s * (1 + BETTER):
            self._skip(f"more {unit}: the what-if ({m.kind}) sees no count that removes "
                       f"the stall or gains {BETTER:.0%}: {preds[sat].why}")
            return []
        return [Candidate(key, sat,
                           f"what-if ({m.kind}): no count removes the stall; {sat} "
                           f"{unit} give the most ({preds[sat].why})",
                           run.whole_samples_s, m.kind)]

    def _refuted(self, slots: int, cur: int, unit: str) -> bool:
        bad = self.failed_count(slots) if slots > cur else None
        if bad is not None:
            self._skip(f"{slots} {unit}: measured slower than fewer on {bad.name} "
                       f"({bad.figures.throughput_samples_s:,.0f} samples/s): the what-if's "
                       f"prediction did not hold on this machine")
        return bad is not None

    def _format_candidates(self, best: Point) -> list[Candidate]:
        cfg = best.cfg
        ld = cfg.loader
        out = []
        if not FORMATS.get(ld.batch_format).contiguous_buffer:   # jagged already is one
            out.append(Candidate("loader.batch_format", "single_buffer",
                                  "one buffer per batch: fewer bytes copied and pickled between "
                                  "producer and trainer, zero-copy to unpack"))
        if ld.collate == "trainer" and best.figures.producer_slots > 0:
            out.append(Candidate("loader.collate", "producer",
                                  "collate on the producers, off the trainer's critical path"))
        elif ld.collate == "trainer":
            self._skip("collate on the producers: with no workers the trainer is the producer, "
                       "so it would move nothing off the trainer (tried with workers)")
        if ld.prefetch_batches == 0:
            out.append(Candidate("loader.prefetch_batches", 2,
                                  "a trainer-side preload thread unpacks the next batches while "
                                  "the model computes"))
        if (ld.fetch_ahead == 0 and best.figures.producer_slots == 0
                and best.figures.bound_by in ("fetch", "preprocess")
                and EXECUTORS.get(cfg.executor.kind).fetches_ahead):
            out.append(Candidate("loader.fetch_ahead", 1,
                                  "no producers: the trainer decodes the next row group in a "
                                  "background thread while it prepares this one"))
        if ld.compression == "none":
            if ld.wire_bandwidth_mb_s is not None:
                out.append(Candidate("loader.compression", "zstd",
                                      f"the producer->trainer link is limited to "
                                      f"{ld.wire_bandwidth_mb_s:g} MB/s: zstd sends fewer bytes"))
            else:
                self._skip("compression: no bandwidth-limited link between producers and trainer "
                           "here; zstd would cost CPU and save only bytes")
        knob = self.knob(cfg)
        if knob is not None and knob.elsewhere:
            self._skip(knob.elsewhere.format(cores=self.machine.cores))
        return out

    def _skip(self, text: str) -> None:
        if text not in self.skipped:
            self.skipped.add(text)
            self.say(f"  skip: {text}")

    # ------------------------------------------------------------------------ the budget
    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def setup_estimate(self) -> float:
        """Set-up time of one step (executor start, solo probe, dataset open): from the steps
        without ablations once there is one (the baseline's also built the ablation caches)."""
        plain = [p.setup_s for p in self.points if not p.vr.ablations]
        return max(plain) if plain else max(p.setup_s for p in self.points)

    def estimate(self, cfg: Config, predicted: float | None, best: Point) -> float:
        """A step's time: its runs (``runs_for``: 2 where workers are kept) of the predicted
        epoch, else the best one's, plus the measured set-up, padded."""
        samples = best.figures.samples
        epoch = samples / predicted if predicted else best.figures.epoch_s
        return (epoch * self.runs_for(cfg) + self.setup_estimate()) * MARGIN

    # ------------------------------------------------------------------------ the run
    def record(self, cfg: Config, vr: VariantResult, wall: float, change: str, why: str,
               predicted: float | None, predicted_by: str, tried: str) -> Point:
        fig = self.figures(vr)
        prev = self.best() if self.points else None
        err = (predicted / fig.throughput_samples_s - 1.0
               if predicted and fig.throughput_samples_s > 0 else None)
        step = TuneStep(step=len(self.steps) + 1, variant=vr.name, knobs=dict(vr.knobs),
                        change=change, why=why, outcome="baseline" if prev is None else "",
                        predicted_samples_s=predicted, predicted_by=predicted_by,
                        measured=fig, error=err, wall_s=wall, foreign_cores=self.last_foreign)
        epochs = sum(f.epoch_s for f in vr.repeats) + sum(
            f.epoch_s for runs in vr.ablations.values() for f in runs)
        point = Point(cfg, dict(vr.knobs), vr.name, vr, fig, step, max(wall - epochs, 0.0))
        self.points.append(point)
        self.steps.append(step)
        if prev is not None:
            step.outcome = "better" if self.best() is point else "not better"
        self.tried.add(vr.name)
        pred = (f" vs {predicted:,.0f} PREDICTED ({predicted_by}), "
                f"error {figures.signed_percent(err, 0)}"
                if predicted and err is not None else "")
        kept = (f" (run {fig.runs_not_counted + 1} of {fig.runs_not_counted + fig.repeats}: the "
                 f"first forked the workers it keeps)" if fig.runs_not_counted else "")
        self.say(f"  step {step.step}: {tried} => measured {fig.throughput_samples_s:,.0f} "
                 f"samples/s{kept}{pred}, steady stall {fig.steady_stall_share:.0%} ({fig.bound_by}-bound,"
                 f" from the {fig.bound_from})"
                 + (f"; cost/epoch {fig.cost_per_epoch:.4g}" if fig.cost_per_epoch is not None else "")
                 + f" -> {step.outcome} [{wall:.0f} s"
                 + (f"; other processes used {self.last_foreign:.1f} of {self.machine.cores:g} "
                    f"cores]" if self.last_foreign is not None else "]"))
        return point

    def search(self) -> str:
        base = self.sc.base
        analyze = base.analysis.differential and self.opts.budget_s >= ATTRIBUTION_BUDGET_S
        tried = (f"baseline {self.sc.name} (base scenario, no matrix, 1 repeat"
                 + (", with the differential attribution)" if analyze else
                    "; budget under 4 min: the bound read by the what-if, no ablations)"))
        vr, wall = self._measure(base, analyze)
        self.record(base, vr, wall, "baseline", "the base scenario", None, "", tried)
        while True:
            best = self.best()
            cands = [c for c in self.candidates(best)
                     if variant_name(knob_diff(base, with_knobs(best.cfg, {c.key: c.value, **c.extra})))
                     not in self.tried]
            if not cands:
                return ("nothing left that the attribution and the what-if say could pay off"
                        if not self.stall_free(best.figures) else
                        "stall-free, and the what-if sees no cheaper producer count")
            c = cands[0]
            cfg = with_knobs(best.cfg, {c.key: c.value, **c.extra})
            need = self.estimate(cfg, c.predicted_samples_s, best)
            reserve = self.estimate(best.cfg, best.figures.throughput_samples_s, best)
            if need + reserve > self.left():
                return (f"budget: the next step ({c.key} = {format_value(c.value)}, ~{need:.0f} s) and the "
                        f"confirmation (~{reserve:.0f} s) do not fit in the {self.left():.0f} s left")
            old = best.cfg.get(c.key)
            change = f"{c.key}: {format_value(old)} -> {format_value(c.value)}"
            tried = f"{change} on {best.name} ({best.figures.bound_by}-bound; {c.why})"
            try:
                vr, wall = self._measure(cfg, False)
            except Exception as exc:  # noqa: BLE001 - a config that cannot run is a finding
                if isinstance(exc, KeyboardInterrupt):
                    raise
                name = variant_name(knob_diff(base, cfg))
                self.tried.add(name)
                self.steps.append(TuneStep(step=len(self.steps) + 1, variant=name,
                                           knobs=knob_diff(base, cfg), change=change, why=c.why,
                                           outcome=f"skipped: failed ({type(exc).__name__}: {exc})"))
                self.say(f"  step {len(self.steps)}: {tried} => failed: {type(exc).__name__}: {exc}")
                continue
            self.record(cfg, vr, wall, change, c.why, c.predicted_samples_s, c.predicted_by, tried)
