"""``stallbench tune``: the cheapest configuration without a data stall, confirmed by a run.

It measures, so it lives beside the runner (it drives ``runner.run_variant``), and it reads its
own measurements with the analysis: the attribution says what bounds, the what-if says which
producer count would remove it and what cannot pay off.

The search, one measured step at a time, each changing one knob of the best configuration so
far (the base scenario, no matrix, to start):

1. Baseline: the base scenario, with the differential attribution when the budget is at least
   ``ATTRIBUTION_BUDGET_S`` (its five runs are the costliest step), else read from the run's own
   figures by the one-point what-if (which term binds, which stage is heaviest).
2. Remove the bounding stage first. Fetch or preprocess (the producers): the producer count
   the what-if (contention model once two counts are measured, else one-point) predicts to be
   the fewest without a stall, or, when none is, the count where it saturates, skipped when it
   predicts no gain over what was measured. Transfer (the trainer's own data work): the batch
   format (one buffer per batch), collate on the producers, a trainer-side preload thread, zstd
   (only where a link's bandwidth is the limit: it costs CPU and saves only bytes). Compute
   bound (stall-free): fewer producers, if the what-if says fewer still keep up (cheaper).
3. A step "is better" when it becomes the best: stall-free beats stalled; among stall-free, the
   cheaper (cost per epoch with prices, else fewer producer nodes, then fewer producers);
   among stalled, the faster by more than ``BETTER`` (one run's noise on a shared machine).
4. Time-boxed: before each step its time is estimated (predicted epoch, else the best one's,
   plus the measured set-up); the search stops when that step and the confirmation would not
   fit in the budget, and recommends what it has.
5. The recommendation (the best, or the fastest when nothing removes the stall) is written as a
   scenario file (the base scenario's keys plus the chosen knobs, no matrix), loaded back and
   run again: the confirmation, printed beside its prediction (the what-if's for that producer
   count, fitted on the search's runs).

"Stall-free" is judged on the steady state: 1 - steady rate x compute seconds per sample below
5% (a short run's start-up alone can be 5% of its epoch). Every step is one repeat.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import __version__, results
from ..measure import machine
from ..analysis import whatif
from ..analysis.whatif_models import fit_best
from ..data.parquet import describe
from ..executors import EXECUTORS
from ..pipeline import FULL, Plan, dataset_for
from ..results import (SCHEMA_VERSION, DatasetInfo, MachineInfo, ScenarioInfo, ToolInfo,
                       TuneConfirmation, TuneFigures, TuneRecommendation, TuneResult, TuneStep,
                       VariantResult, now_utc)
from .runner import RunOptions, default_cache_dir, run_scenario, run_variant
from ..stages.batch_format import FORMATS
from ..scenario import Config, Scenario, Variant, format_value
from ..scenario import load as load_scenario
from ..scenario import parse as parse_scenario
from .preflight import check_config, check_scenario

STALL_FREE = 0.05            # steady stall share below this: the stall is removed
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
class _Point:
    """One measured configuration of the search."""

    cfg: Config
    knobs: dict[str, Any]
    name: str
    vr: VariantResult
    figures: TuneFigures
    step: TuneStep
    setup_s: float               # wall time of the step beyond its runs' epochs


@dataclass
class _Candidate:
    key: str
    value: Any
    why: str
    predicted_samples_s: float | None = None
    predicted_by: str = ""
    extra: dict[str, Any] = field(default_factory=dict)   # knobs changed together


def _median(xs: Any) -> float:
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(vals) if vals else math.nan


def with_knobs(cfg: Config, knobs: dict[str, Any]) -> Config:
    """``cfg`` with dotted keys set (``{"loader.num_workers": 2}``)."""
    sections: dict[str, dict[str, Any]] = {}
    for dotted, value in knobs.items():
        section, key = dotted.split(".", 1)
        sections.setdefault(section, {})[key] = value
    return cfg.replace(**{s: dataclasses.replace(getattr(cfg, s), **kv) for s, kv in sections.items()})


def knob_diff(base: Config, cfg: Config) -> dict[str, Any]:
    """Every dotted key whose value differs from the base config."""
    out: dict[str, Any] = {}
    b, c = base.to_dict(), cfg.to_dict()
    for section, values in c.items():
        for key, value in values.items():
            if b[section][key] != value:
                out[f"{section}.{key}"] = value
    return out


def variant_name(knobs: dict[str, Any]) -> str:
    if not knobs:
        return "base"
    return ",".join(f"{k.split('.', 1)[1]}={format_value(v)}" for k, v in sorted(knobs.items()))


# ------------------------------------------------------------------------ scenario file

def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"not a TOML number: {v}")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)          # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise ValueError(f"no TOML form for {v!r}")


def _toml_key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def scenario_text(sc: Scenario, knobs: dict[str, Any], note: str) -> str:
    """The base scenario's own keys plus ``knobs``, no matrix, named ``<name>-tuned``."""
    raw = tomllib.loads(sc.text)
    raw.pop("matrix", None)
    raw["name"] = f"{sc.name}-tuned"
    raw["description"] = note
    for dotted, value in knobs.items():
        section, key = dotted.split(".", 1)
        raw.setdefault(section, {})[key] = value
    lines = [f"# Written by stallbench tune from {sc.path} ({now_utc()}): the base scenario's keys",
             "# plus the recommended knobs, without its matrix. Run it with `stallbench run`.",
             f"name = {_toml_value(raw.pop('name'))}",
             f"description = {_toml_value(raw.pop('description'))}"]
    for section, table in raw.items():
        if not isinstance(table, dict):
            lines.append(f"{_toml_key(section)} = {_toml_value(table)}")
            continue
        lines.append("")
        lines.append(f"[{section}]")
        lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ the search

class Tuner:
    def __init__(self, sc: Scenario, opts: TuneOptions,
                 say: Callable[[str], None] = lambda s: None) -> None:
        self.sc = sc
        self.opts = opts
        self.say = say
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + opts.budget_s
        self.cache = opts.cache_dir or default_cache_dir()
        self.points: list[_Point] = []
        self.steps: list[TuneStep] = []
        self.tried: set[str] = set()
        self.skipped: set[str] = set()
        self.machine: MachineInfo = machine.metadata()
        self.dataset: DatasetInfo | None = None
        self.last_foreign: float | None = None

    # ---------------------------------------------------------------------- measuring
    def _measure(self, cfg: Config, analyze: bool) -> tuple[VariantResult, float]:
        with ForeignLoad() as load:
            vr, wall = self._run(cfg, analyze)
        self.last_foreign = load.cores
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
        vr = run_variant(Variant(variant_name(knobs), knobs, cfg), plan, 1, analyze, path,
                         self.opts.progress)
        return vr, time.perf_counter() - t

    def figures(self, vr: VariantResult) -> TuneFigures:
        reps = vr.repeats
        steady = _median(f.steady_throughput_samples_s for f in reps)
        compute = _median(f.compute_s / f.samples for f in reps if f.samples)
        steady_stall = max(0.0, 1.0 - steady * compute) if math.isfinite(steady) else math.nan
        whole = vr.throughput_samples_s.median
        nodes = vr.executor.producer_nodes or 0
        cost = None
        if self.opts.priced and whole > 0 and self.dataset is not None:
            ratio = vr.stage_rates.rows_out_per_row_in or 1.0
            hours = self.dataset.rows * ratio / whole / 3600.0
            cost = hours * ((self.opts.gpu_node_cost or 0.0) + (self.opts.cpu_node_cost or 0.0) * nodes)
        bound, source = self.bound(vr, steady_stall)
        return TuneFigures(
            throughput_samples_s=whole, steady_throughput_samples_s=steady,
            epoch_s=vr.epoch_s.median, samples=int(_median(f.samples for f in reps)),
            stall_share=vr.stall_share.median, steady_stall_share=steady_stall,
            time_to_first_batch_s=vr.time_to_first_batch_s.median,
            producer_slots=vr.executor.producer_slots, cpu_nodes=nodes, bound_by=bound,
            bound_from=source, cost_per_epoch=cost, repeats=len(reps))

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

    def best(self) -> _Point:
        best = self.points[0]
        for p in self.points[1:]:
            if self.better(p.figures, best.figures):
                best = p
        return best

    # ------------------------------------------------------------------------ the what-if
    def scaling_key(self, cfg: Config) -> str | None:
        """The key that sets the producer count here: loader workers, or simulated nodes."""
        if cfg.executor.kind == "local":
            return "loader.num_workers"
        if cfg.executor.kind == "ray" and cfg.executor.simulated_nodes:
            return "executor.simulated_nodes"
        return None

    def family(self, cfg: Config) -> list[_Point]:
        """Measured configurations that differ from ``cfg`` only in its producer count."""
        key = self.scaling_key(cfg)
        strip = lambda c: {k: v for k, v in knob_diff(self.sc.base, c).items() if k != key}  # noqa: E731
        mine = strip(cfg)
        return [p for p in self.points if strip(p.cfg) == mine]

    def model_for(self, cfg: Config) -> whatif.Model | None:
        fam = self.family(cfg)
        return fit_best([p.vr for p in fam], self.machine, self.dataset) if fam else None

    def slots(self, cfg: Config) -> int:
        if cfg.executor.kind == "ray" and cfg.executor.simulated_nodes:
            return cfg.executor.simulated_nodes * cfg.executor.cpus_per_node
        return cfg.loader.num_workers

    def max_count(self, m: whatif.Model) -> int:
        """Producer counts worth predicting: up to the cores, or twice that when storage waits
        (which use no core) are a fifth of a producer's time; never more than work items."""
        items = self.dataset.shards if self.dataset and self.dataset.shards else 64
        waits = m.p_wall > 0 and m.io_wait / m.p_wall >= 0.2
        return int(max(1, min((2 if waits else 1) * self.machine.cores, items, 64)))

    def failed_count(self, slots: int) -> _Point | None:
        """A measured point with this producer count that was slower than a point of its own
        family with fewer producers: evidence that the count does not pay off on this machine,
        whatever the batch format."""
        for p in self.points:
            if self.slots(p.cfg) != slots:
                continue
            for q in self.family(p.cfg):
                if self.slots(q.cfg) < slots and \
                        q.figures.throughput_samples_s >= p.figures.throughput_samples_s:
                    return p
        return None

    # ------------------------------------------------------------------------ candidates
    def candidates(self, best: _Point) -> list[_Candidate]:
        f = best.figures
        cfg = best.cfg
        out: list[_Candidate] = []
        producers = self._producer_candidates(best)
        formats = self._format_candidates(best)
        if self.stall_free(f):
            return producers            # only cheaper producer counts are worth a run
        if f.bound_by == "transfer":
            out = formats + producers
        else:
            out = producers + formats
        if f.bound_by in ("fetch", "preprocess") and cfg.loader.prefetch_factor < 8 \
                and self._measured_stall_above_predicted(best):
            out.append(_Candidate("loader.prefetch_factor", cfg.loader.prefetch_factor * 2,
                                  "the what-if says these producers keep up on average, the run "
                                  "still waited: a deeper queue per producer absorbs bursts"))
        return out

    def _measured_stall_above_predicted(self, best: _Point) -> bool:
        m = self.model_for(best.cfg)
        if m is None:
            return False
        p = whatif.predict(m, self.slots(best.cfg))
        return p.stall_share < STALL_FREE <= best.figures.steady_stall_share

    def _producer_candidates(self, best: _Point) -> list[_Candidate]:
        cfg = best.cfg
        key = self.scaling_key(cfg)
        if key is None:
            self._skip("producer count: this executor's producer count is not a knob tune "
                       "varies (a real Ray cluster's CPUs)")
            return []
        m = self.model_for(cfg)
        if m is None:
            return []
        cur = self.slots(cfg)
        per = cfg.executor.cpus_per_node if key == "executor.simulated_nodes" else 1
        counts = list(range(1 if key == "executor.simulated_nodes" else 0, self.max_count(m) + 1))
        preds = {c: whatif.predict(m, c * per) for c in counts}
        samples = best.figures.samples
        free = [c for c in counts if c >= 1 and preds[c].stall_share < STALL_FREE]
        measured = {self.slots(p.cfg) // per for p in self.family(cfg)}
        if self.stall_free(best.figures):
            free = [c for c in free if c * per < cur]     # only cheaper is worth a run
            if not free:
                return []
        if free:
            target = free[0]
            if target in measured:
                return []
            if self._refuted(target * per, cur, key):
                return []
            run = whatif.predict_run(m, target * per, samples)
            verb = "remove" if target * per > cur else "still remove"
            return [_Candidate(key, target,
                               f"what-if ({m.kind}): {target} {self._unit(key)} {verb} the stall "
                               f"({preds[target].why})", run.whole_samples_s, m.kind)]
        top = max(preds[c].throughput_samples_s for c in counts)
        sat = next(c for c in counts if preds[c].throughput_samples_s >= 0.99 * top)
        run = whatif.predict_run(m, sat * per, samples)
        if sat not in measured and self._refuted(sat * per, cur, key):
            return []
        if sat in measured or run.whole_samples_s < best.figures.throughput_samples_s * (1 + BETTER):
            self._skip(f"more {self._unit(key)}: the what-if ({m.kind}) sees no count that removes "
                       f"the stall or gains {BETTER:.0%}: {preds[sat].why}")
            return []
        return [_Candidate(key, sat,
                           f"what-if ({m.kind}): no count removes the stall; {sat} "
                           f"{self._unit(key)} give the most ({preds[sat].why})",
                           run.whole_samples_s, m.kind)]

    def _refuted(self, slots: int, cur: int, key: str) -> bool:
        bad = self.failed_count(slots) if slots > cur else None
        if bad is not None:
            self._skip(f"{slots} {self._unit(key)}: measured slower than fewer on {bad.name} "
                       f"({bad.figures.throughput_samples_s:,.0f} samples/s): the what-if's "
                       f"prediction did not hold on this machine")
        return bad is not None

    @staticmethod
    def _unit(key: str) -> str:
        return "simulated node(s)" if key == "executor.simulated_nodes" else "worker(s)"

    def _format_candidates(self, best: _Point) -> list[_Candidate]:
        cfg = best.cfg
        ld = cfg.loader
        out = []
        if not FORMATS.get(ld.batch_format).contiguous_buffer:   # jagged already is one
            out.append(_Candidate("loader.batch_format", "single_buffer",
                                  "one buffer per batch: fewer bytes copied and pickled between "
                                  "producer and trainer, zero-copy to unpack"))
        if ld.collate == "trainer" and best.figures.producer_slots > 0:
            out.append(_Candidate("loader.collate", "producer",
                                  "collate on the producers, off the trainer's critical path"))
        elif ld.collate == "trainer":
            self._skip("collate on the producers: with no workers the trainer is the producer, "
                       "so it would move nothing off the trainer (tried with workers)")
        if ld.prefetch_batches == 0:
            out.append(_Candidate("loader.prefetch_batches", 2,
                                  "a trainer-side preload thread unpacks the next batches while "
                                  "the model computes"))
        if ld.compression == "none":
            if ld.wire_bandwidth_mb_s is not None:
                out.append(_Candidate("loader.compression", "zstd",
                                      f"the producer->trainer link is limited to "
                                      f"{ld.wire_bandwidth_mb_s:g} MB/s: zstd sends fewer bytes"))
            else:
                self._skip("compression: no bandwidth-limited link between producers and trainer "
                           "here; zstd would cost CPU and save only bytes")
        if cfg.executor.kind == "local":
            self._skip("executor ray / more nodes: nodes simulated on this machine share its "
                       f"{self.machine.cores:g} cores (the what-if's cores bound), so they cannot "
                       "beat local workers here; a real cluster needs executor.ray_address")
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

    def estimate(self, cfg: Config, predicted: float | None, best: _Point) -> float:
        samples = best.figures.samples
        epoch = samples / predicted if predicted else best.figures.epoch_s
        return (epoch + self.setup_estimate()) * MARGIN

    # ------------------------------------------------------------------------ the run
    def record(self, cfg: Config, vr: VariantResult, wall: float, change: str, why: str,
               predicted: float | None, predicted_by: str, tried: str) -> _Point:
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
        point = _Point(cfg, dict(vr.knobs), vr.name, vr, fig, step, max(wall - epochs, 0.0))
        self.points.append(point)
        self.steps.append(step)
        if prev is not None:
            step.outcome = "better" if self.best() is point else "not better"
        self.tried.add(vr.name)
        pred = (f" vs {predicted:,.0f} PREDICTED ({predicted_by}), error {err:+.0%}"
                if predicted and err is not None else "")
        self.say(f"  step {step.step}: {tried} => measured {fig.throughput_samples_s:,.0f} "
                 f"samples/s{pred}, steady stall {fig.steady_stall_share:.0%} ({fig.bound_by}-bound,"
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

    def predict_point(self, point: _Point) -> tuple[float, str]:
        """What a fresh run of a measured configuration should give: the what-if fitted on the
        search's runs of its family (every producer count of it when the contention model
        applies), run over the same samples; with no producers, the point's own search run."""
        if point.figures.producer_slots == 0:
            # no producers: nothing to scale, and a no-worker fit is not calibrated (its gap
            # would be hand-off, which it has none of): its own search run is the prediction
            return point.figures.throughput_samples_s, "search run (no producers to scale)"
        fam = [p.vr for p in self.family(point.cfg)]
        m = fit_best(fam, self.machine, self.dataset)
        if m is None:
            return point.figures.throughput_samples_s, "search run"
        run = whatif.predict_run(m, point.figures.producer_slots, point.figures.samples)
        return run.whole_samples_s, f"what-if, {m.kind} model fitted on {', '.join(m.fit_variants)}"

    def recommend(self) -> tuple[_Point, TuneRecommendation, Path]:
        best = self.best()
        free = self.stall_free(best.figures)
        pred, by = self.predict_point(best)
        cost = ("the cheapest stall-free configuration measured" if free else
                "no configuration measured removed the stall: the fastest")
        why = (f"{cost}: steady stall {best.figures.steady_stall_share:.1%}, "
               f"{best.figures.throughput_samples_s:,.0f} samples/s")
        text = scenario_text(self.sc, best.knobs,
                             f"{self.sc.description or self.sc.name} (tuned: "
                             f"{variant_name(best.knobs)})")
        parsed = parse_scenario(text, "<tuned>")
        if parsed.base != best.cfg:      # the file must say exactly what was measured
            raise AssertionError("tune: the written scenario does not resolve to the recommended "
                                 "configuration")
        out = self.opts.out_dir / results.store.TUNE_DIR
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{results.result_stem(self.sc.name + '-tuned')}.toml"
        n = 0
        while path.exists():
            n += 1
            path = out / f"{results.result_stem(self.sc.name + '-tuned')}-{n}.toml"
        results.write_atomic(path, text)
        return best, TuneRecommendation(variant=best.name, knobs=best.knobs,
                                        scenario_path=str(path), stall_free=free, why=why,
                                        measured=best.figures, predicted_samples_s=pred,
                                        predicted_by=by), path

    def confirm(self, rec: TuneRecommendation, path: Path) -> TuneConfirmation:
        sc = load_scenario(path)            # the file as written: valid and loadable
        check_scenario(sc)
        est = rec.measured.epoch_s + self.setup_estimate()
        repeats = max(1, min(sc.base.run.repeats, int(self.left() // max(est, 1e-9))))
        self.say(f"  confirm: stallbench run {path} ({repeats} repeat(s), no ablations)")
        with ForeignLoad() as load:
            r = run_scenario(sc, RunOptions(repeats=repeats, analyze=False, cache_dir=self.cache,
                                            progress=self.opts.progress))
        self.confirm_foreign = load.cores
        saved = results.save(r, self.opts.out_dir)
        fig = self.figures(r.variants[0])
        pred = rec.predicted_samples_s
        err = pred / fig.throughput_samples_s - 1.0 if pred and fig.throughput_samples_s > 0 else None
        return TuneConfirmation(result_path=str(saved), measured=fig, predicted_samples_s=pred,
                                error=err, within_goal=None if err is None else abs(err) <= GOAL,
                                foreign_cores=load.cores)

    def run(self) -> TuneResult:
        with ForeignLoad() as load:
            return self._run_all(load)

    def _run_all(self, load: "ForeignLoad") -> TuneResult:
        stopped = self.search()
        self.say(f"  search stopped: {stopped}")
        best, rec, path = self.recommend()
        conf = self.confirm(rec, path)
        return TuneResult(
            schema_version=SCHEMA_VERSION, kind="tune",
            tool=ToolInfo(name="stallbench", version=__version__), created_utc=now_utc(),
            scenario=ScenarioInfo(name=self.sc.name, path=self.sc.path, sha256=self.sc.sha256,
                                  fingerprint=self.sc.fingerprint, text=self.sc.text,
                                  matrix=self.sc.matrix, description=self.sc.description),
            machine=self.machine, budget_s=self.opts.budget_s,
            wall_s=time.perf_counter() - self.t0,
            cpu_node_cost=self.opts.cpu_node_cost, gpu_node_cost=self.opts.gpu_node_cost,
            steps=self.steps, stopped_because=stopped, recommendation=rec, confirmation=conf,
            foreign_cores=load.sample())


class ForeignLoad:
    """Cores other processes kept busy while a block ran: the machine's busy CPU time minus
    this process's and its waited-for children's, over the wall time. The what-if assumes the
    machine's cores are the run's; on a shared machine this says how far from true that was."""

    def __enter__(self) -> "ForeignLoad":
        self.cores: float | None = None
        self._t, self._busy, self._own = time.perf_counter(), _busy_cpu(), _own_cpu()
        return self

    def sample(self) -> float | None:
        wall = time.perf_counter() - self._t
        if wall <= 0 or self._busy is None:
            return None
        busy = _busy_cpu()
        if busy is None:
            return None
        return max(0.0, (busy - self._busy) - (_own_cpu() - self._own)) / wall

    def __exit__(self, *exc: object) -> None:
        self.cores = self.sample()


def _busy_cpu() -> float | None:
    try:
        import psutil

        t = psutil.cpu_times()
    except Exception:  # noqa: BLE001 - no reading on this platform
        return None
    return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "steal", 0.0)


def _own_cpu() -> float:
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def tune(sc: Scenario, opts: TuneOptions, say: Callable[[str], None] = lambda s: None) -> TuneResult:
    """Search, recommend, write the scenario file and confirm it (module docstring)."""
    check_scenario(sc)
    return Tuner(sc, opts, say).run()

