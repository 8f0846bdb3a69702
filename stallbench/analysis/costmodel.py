"""The what-if from measured costs (issue 58): each producer's service, the trainer's own work
and the cores, combined by a small simulation; not a curve fitted to points.

Why: the bottleneck formulas of ``whatif`` are calibrated on one or two points, and the gap to
the measured rate goes into a free term (``p_extra``, ``t_extra``, ``cores_scale``). On shapes
they were not developed on they missed by 40-60% (issue 58: 8 us/row of CPU at a 6 ms step,
1 worker predicted 60% too fast while the result's own figures bound one worker at ~92k
samples/s; 4 ms CPU decode at 4 workers on 2 cores predicted 3.75x, measured 1.44x; a sleep
fetch taken for CPU at load). Here nothing is calibrated: every input is a measured figure of
one run (the *fit*), and the prediction is what those costs give when they are replayed.

Inputs (per sample the trainer consumes, medians over the fit's repeats):

- ``cpu``: the producers' CPU inside the stage timers (fetch + preprocess + producer-side
  transfer, thread CPU clocks); ``handoff``: the workers' process CPU outside the stage timers
  (pickling, the DataLoader loop), per sample, once their start-up is set apart;
- ``wait``: the producers' wall inside the stages that is not CPU and not a wait for a core
  (storage latency, a sleep): stage wall - stage CPU x the fit's core stretch, where the
  stretch is (cores our run kept busy + cores other processes took, measured) / cores, at
  least 1 (issue 58: a fetch's wall stretched by CPU contention was taken for work a worker
  overlaps, 1.90x predicted, 1.10x measured);
- the trainer per batch: its CPU (``trainer_cpu``: its process clock, less the stage CPU it
  did itself at 0 workers) and its busy wall (model step + trainer-side data work);
- ``start_s``: each forked worker's start (the fit's time to first batch less its first item);
- the cores (the run's affinity) and the cores other processes took (``foreign``, measured by
  ``measure.load`` in every repeat).

The simulation (``simulate``): N workers take work items (row groups) in turn (item i to
worker i mod N), each at most ``prefetch`` items ahead of the trainer per worker (the
DataLoader's outstanding tasks: a finite queue); an item is a wait (``wait`` x rows, no core)
then a CPU burst (``cpu + handoff``); the trainer takes items in order and runs each batch for
its busy wall as measured, holding its CPU share of it (``trainer_cpu`` / ``trainer_wall``)
of a core. Every CPU burst in progress shares the cores with
the foreign load as the kernel's fair scheduler does (processor sharing): each runs at
min(1, cores / (bursts + foreign)). With 0 workers the trainer does it all in turn. Epoch,
first batch and the steady figure are read from the replayed run as a run measures them.

Interval: the simulation at the repeats' least and most costly inputs (and the least and most
foreign load), never narrower than ``MIN_LOG_HALF_WIDTH`` (timer resolution, scheduling) nor
than the fit run's own sampling noise (``run_noise``: the standard error of its mean batch
time, from the per-batch record, as a 90% band on the difference of two such runs: the
prediction is built on one and checked against another); a
fit under heavy foreign load widens it by the share of the cores others took (the load will
move). Withheld, with the reason, where the inputs contradict the prediction: the costs do
not reproduce the fit's own measured rate (``SELF_MISS``: a cost the timers do not see, or the
load moved within the fit), more ranks than one (the ranks' collective is not simulated), or
more producers than the cores carry by the one cores rule (``whatif_models.producer_budget``
x ``BEYOND_BUDGET``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

from ..results import DatasetInfo, Knee, MachineInfo, VariantResult, WhatIfPoint
from . import figures
from .stats import finite_median

MIN_LOG_HALF_WIDTH = 0.04    # +-4%: one run's scheduling noise on a quiet machine
SELF_MISS = 0.15             # costs that miss their own run by more: not a basis
BEYOND_BUDGET = 2.0          # producers beyond twice what the cores carry: not predicted
MAX_EVENTS = 400_000
# a forked worker's start where the fit ran none (0 workers): fork to its first item, 60-120
# ms of CPU per worker measured on this project's 2-core VM (docs/data-path.md, "What workers
# still pay"); the low end, since the fit's own figures say nothing of it
WORKER_START_S = 0.06
CONTENTION_PER_CORE = 0.01   # interval widening per busy core beyond the fit's
Z90 = 1.645                  # a two-sided 90% band: the what-if's coverage goal (issue 58)


@dataclass(frozen=True)
class Costs:
    """The measured inputs of one fit (see the module docstring); seconds per sample unless
    named per batch or per item."""

    cpu: float
    handoff: float
    wait: float
    trainer_cpu: float           # per batch
    trainer_wall: float          # per batch: model step + trainer-side data work
    start_s: float               # per forked worker
    cores: float
    foreign: float
    item_rows: float
    batch_rows: float
    prefetch: int
    fit_workers: int
    fit_variant: str = ""
    fit_samples: float = 0.0
    fit_whole_samples_s: float = math.nan
    ranks: int = 1
    epochs: int = 1              # passes over the data in one run
    persistent: bool = False     # workers kept across epochs (forked once)
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Run:
    """A replayed run (PREDICTED)."""

    epoch_s: float
    first_batch_s: float
    samples: float
    steady_samples_s: float
    trainer_busy_share: float    # trainer's share of the epoch not waiting for a batch
    cpu_busy_cores: float        # the run's own CPU work over the epoch

    @property
    def whole_samples_s(self) -> float:
        return self.samples / self.epoch_s if self.epoch_s > 0 else math.nan


@dataclass(frozen=True)
class Point:
    """One PREDICTED configuration from the measured costs, or why it is not given."""

    n: int
    predicted_samples_s: float           # whole run (samples / epoch), PREDICTED
    predicted_steady_samples_s: float
    low_samples_s: float
    high_samples_s: float
    bound_by: str                        # "compute", "workers", "cores"
    why: str
    not_predicted: str = ""


# --------------------------------------------------------------------- the measured inputs
def _stage(f, name: str) -> float:
    return float(getattr(f.stage_s, name, 0.0) or 0.0)


def _foreign(f) -> float:
    ld = getattr(f, "load", None)
    if ld is None:
        return 0.0
    return max(float(ld.foreign_cores or 0.0) + float(ld.steal_cores or 0.0), 0.0)


SATURATED = 0.85            # our cores + others' above this share of the cores: a full machine


def core_stretch(f, own: float, cores: float) -> tuple[float, float]:
    """(how much longer a CPU burst took than its CPU, foreign runnable load) of one run.

    A machine with room (our busy cores + others' under ``SATURATED`` of them) stretches no
    burst: 1, and the foreign load is the cores others took. A full machine says only that
    the cores were shared, not with how many: the preprocess stage (CPU work, no waits of its
    own unless a transform sleeps) gives the stretch, its wall over its CPU, and the foreign
    load is the runnable count that explains it under fair sharing, stretch x (cores - ours)
    (a burst runs at cores / (ours + foreign) when ``own`` cores are ours)."""
    foreign = _foreign(f)
    if own + foreign < SATURATED * cores:
        return 1.0, foreign
    pre, pre_cpu = _stage(f, "preprocess"), _stage(f, "preprocess_cpu")
    stretch = max(1.0, pre / pre_cpu) if pre_cpu > 0 and pre > 0 else \
        max(1.0, (own + foreign) / max(cores, 1e-9))
    return stretch, max(foreign, stretch * max(cores - own, 0.0))


def repeat_costs(f, workers: int, cores: float) -> dict[str, float] | None:
    """One repeat's inputs, or None where the run has no samples."""
    s, b = float(f.samples), float(f.batches)
    if s <= 0 or b <= 0 or not f.epoch_s > 0:
        return None
    cpu = _stage(f, "fetch_cpu") + _stage(f, "preprocess_cpu") + _stage(f, "transfer_producer_cpu")
    wall = _stage(f, "fetch") + _stage(f, "preprocess") + _stage(f, "transfer_producer")
    own = (float(f.trainer_cpu_s or 0.0) + float(f.producer_cpu_s or 0.0)) / f.epoch_s
    stretch, foreign = core_stretch(f, own, cores)
    wait = max(wall - cpu * stretch, 0.0)
    t_cpu = float(f.trainer_cpu_s or 0.0) - (cpu if workers == 0 else 0.0)
    out = {"cpu": cpu / s, "wait": wait / s, "foreign": foreign,
           "trainer_cpu": max(t_cpu, 0.0) / b,
           "trainer_wall": (float(f.compute_s) + float(f.trainer_transfer_s)) / b,
           "ttfb": float(f.time_to_first_batch_s or 0.0),
           "handoff_total": max(float(f.producer_cpu_s or 0.0) - cpu, 0.0) if workers else 0.0,
           "samples": s, "batches": b, "whole": s / f.epoch_s}
    return out


def _median(rows: Sequence[dict[str, float]], key: str) -> float:
    v = finite_median([r[key] for r in rows])
    return v if math.isfinite(v) else 0.0


def fit(v: VariantResult, machine: MachineInfo, dataset: DatasetInfo | None = None,
        *, prefetch: int = 2) -> Costs | None:
    """The measured inputs of variant ``v`` (medians over its repeats), or None where it has
    no measured run."""
    workers = v.executor.producer_slots
    cores = float(machine.cores)
    rows = [r for r in (repeat_costs(f, workers, cores) for f in v.repeats) if r]
    if not rows:
        return None
    loader = (v.config or {}).get("loader") or {}
    prefetch = int(loader.get("prefetch_factor") or prefetch)
    samples = _median(rows, "samples")
    batch_rows = samples / max(_median(rows, "batches"), 1.0)
    item = _item_rows(v, dataset, batch_rows)
    c = Costs(cpu=_median(rows, "cpu"), handoff=0.0, wait=_median(rows, "wait"),
              trainer_cpu=_median(rows, "trainer_cpu"), trainer_wall=_median(rows, "trainer_wall"),
              start_s=0.0, cores=cores, foreign=_median(rows, "foreign"), item_rows=item,
              batch_rows=batch_rows, prefetch=max(int(prefetch), 1), fit_workers=workers,
              fit_variant=v.name, fit_samples=samples,
              fit_whole_samples_s=_median(rows, "whole"),
              ranks=v.ranks.world if v.ranks is not None else 1,
              epochs=max(int(loader.get("epochs") or 1), 1),
              persistent=bool(loader.get("persistent_workers")))
    if workers >= 1:
        return _worker_start(c, _median(rows, "ttfb"), _median(rows, "handoff_total"))
    return replace(c, start_s=WORKER_START_S)


def _item_rows(v: VariantResult, dataset: DatasetInfo | None, batch_rows: float) -> float:
    """Samples per work item: a row group of the result's dataset, else one batch (a
    DataLoader's workers take batches of indices)."""
    if dataset is None or not dataset.shards or not dataset.rows:
        return batch_rows
    ratio = v.stage_rates.rows_out_per_row_in
    rows = dataset.rows / dataset.shards * (ratio if ratio and math.isfinite(ratio) else 1.0)
    return rows if rows > 0 else batch_rows


def _worker_start(c: Costs, ttfb: float, handoff_total: float) -> Costs:
    """Each forked worker's start: the time to first batch less the first item's own work
    (its wait and CPU at the fit); the workers' CPU outside the stages, less what their starts
    took, is the hand-off per sample."""
    first_item = c.item_rows * (c.wait + c.cpu)
    start = max(ttfb - first_item, 0.0)
    handoff = max(handoff_total - c.fit_workers * start, 0.0) / max(c.fit_samples, 1.0)
    return replace(c, start_s=start, handoff=min(handoff, 4 * c.cpu + 20e-6))


# --------------------------------------------------------------------- the simulation
@dataclass
class _Actor:
    """A worker or the trainer: its current phase (kind, amount left) and what it holds."""

    phase: str = "idle"          # "cpu" (shares the cores), "wait", "busy" (trainer), "idle"
    left: float = 0.0
    item: int = -1
    todo: list = field(default_factory=list)


class _Sim:
    """The event loop of ``simulate``: processor sharing of CPU bursts, waits in parallel."""

    def __init__(self, c: Costs, workers: int, samples: float, foreign: float) -> None:
        self.c, self.n, self.foreign = c, workers, foreign
        self.items = max(1, math.ceil(samples / c.item_rows - 1e-9)) if c.item_rows > 0 else 1
        self.rows = [min(c.item_rows, samples - i * c.item_rows) for i in range(self.items)]
        self.samples = samples
        self.ready: set[int] = set()
        self.next_item = 0          # next item a worker takes
        self.consumed = 0           # items the trainer has taken
        self.t = 0.0
        self.cpu_s = 0.0
        self.trainer_idle = 0.0
        self.first_batch_done = math.nan
        self.first_batch = math.nan
        self.workers = [_Actor(todo=[("cpu", c.start_s)] if c.start_s > 0 else [])
                        for _ in range(workers)]
        self.trainer = _Actor()
        # the trainer's busy wall is replayed as measured (its own contention inside), and
        # its CPU share of it takes that much of a core from the producers' bursts
        self.trainer_share = min(1.0, c.trainer_cpu / c.trainer_wall) if c.trainer_wall > 0 \
            else 0.0

    def _take(self, w: _Actor) -> None:
        limit = self.consumed + max(self.n, 1) * self.c.prefetch
        if self.next_item < self.items and self.next_item < limit:
            i, self.next_item = self.next_item, self.next_item + 1
            r = self.rows[i]
            w.item = i
            w.todo = [("wait", self.c.wait * r), ("cpu", (self.c.cpu + self.c.handoff) * r),
                      ("done", 0.0)]

    def _trainer_batches(self, i: int, solo: bool) -> list:
        r = self.rows[i]
        todo = [("wait", self.c.wait * r), ("cpu", self.c.cpu * r)] if solo else []
        nb = max(1, round(r / max(self.c.batch_rows, 1e-9)))
        for k in range(nb):
            todo += [("busy", max(self.c.trainer_wall, 0.0)), ("batch", k)]
        return todo + [("consumed", 0.0)]

    def _advance_phase(self, a: _Actor, is_trainer: bool) -> None:
        """Move ``a`` through zero-length steps until it is in a timed phase or idle."""
        while a.phase == "idle" or a.left <= 1e-15:
            if not a.todo:
                if is_trainer:
                    if not self._trainer_next():
                        a.phase = "idle"
                        return
                else:
                    self._take(a)
                    if not a.todo:
                        a.phase = "idle"
                        return
            kind, amount = a.todo.pop(0)
            if kind in ("cpu", "wait", "busy"):
                a.phase, a.left = kind, amount
            elif kind == "done":
                self.ready.add(a.item)
                a.phase, a.left = "idle", 0.0
            elif kind == "batch":
                if math.isnan(self.first_batch_done):
                    self.first_batch_done = self.t
                a.phase, a.left = "idle", 0.0
            elif kind == "consumed":
                self.consumed += 1
                a.phase, a.left = "idle", 0.0

    def _trainer_next(self) -> bool:
        i = self.consumed
        if i >= self.items:
            return False
        if self.n == 0:
            self.trainer.todo = self._trainer_batches(i, solo=True)
            return True
        if i in self.ready:
            if math.isnan(self.first_batch):
                self.first_batch = self.t
            self.trainer.todo = self._trainer_batches(i, solo=False)
            return True
        return False

    def run(self) -> Run | None:
        actors = [(w, False) for w in self.workers] + [(self.trainer, True)]
        for _ in range(MAX_EVENTS):
            for a, tr in actors:
                self._advance_phase(a, tr)
            if self.consumed >= self.items:
                break
            busy = [a for a, _ in actors if a.phase != "idle"]
            if not busy:
                return None                       # nothing can move: a deadlock in the inputs
            cpu = [a for a in busy if a.phase == "cpu"]
            load = len(cpu) + self.foreign + (self.trainer_share if self.trainer.phase == "busy"
                                               else 0.0)
            rate = min(1.0, self.c.cores / load) if cpu else 1.0
            dt = min(a.left / (rate if a.phase == "cpu" else 1.0) for a in busy)
            for a in busy:
                a.left -= dt * (rate if a.phase == "cpu" else 1.0)
            self.cpu_s += dt * (rate * len(cpu) + (self.trainer_share if
                                                    self.trainer.phase == "busy" else 0.0))
            if self.trainer.phase == "idle":
                self.trainer_idle += dt
            self.t += dt
        else:
            return None
        return self._result()

    def _result(self) -> Run:
        epoch = self.t
        first_done = self.first_batch_done if math.isfinite(self.first_batch_done) else epoch
        rest = epoch - first_done
        b = min(self.c.batch_rows, self.samples)
        steady = (self.samples - b) / rest if rest > 0 and self.samples > b else \
            self.samples / epoch
        return Run(epoch, self.first_batch if self.n else first_done, self.samples, steady,
                   1.0 - self.trainer_idle / epoch if epoch > 0 else math.nan,
                   self.cpu_s / epoch if epoch > 0 else math.nan)


def simulate(c: Costs, workers: int, samples: float | None = None,
             foreign: float | None = None) -> Run | None:
    """The run ``c``'s costs give at ``workers`` workers over ``samples`` samples (default
    the fit's), under ``foreign`` cores taken by other processes (default the fit's). A run
    of several epochs is replayed one epoch after another: each drains the pipeline at its
    end (the loader's next iterator sends its first indices only then), and workers not kept
    pay their start again."""
    samples = c.fit_samples if samples is None else samples
    if not samples > 0:
        return None
    load = c.foreign if foreign is None else max(foreign, 0.0)
    per = float(samples) / c.epochs
    runs = []
    for e in range(c.epochs):
        ce = c if e == 0 or not c.persistent else replace(c, start_s=0.0)
        r = _Sim(ce, max(int(workers), 0), per, load).run()
        if r is None:
            return None
        runs.append(r)
    return runs[0] if len(runs) == 1 else _joined(runs, c)


def _joined(runs: Sequence[Run], c: Costs) -> Run:
    """Epochs replayed one after another, as one run measures them."""
    epoch = sum(r.epoch_s for r in runs)
    samples = sum(r.samples for r in runs)
    first = runs[0]
    b = min(c.batch_rows, first.samples)
    first_done = first.epoch_s - (first.samples - b) / first.steady_samples_s \
        if first.steady_samples_s > 0 else first.first_batch_s
    rest = epoch - first_done
    steady = (samples - b) / rest if rest > 0 else samples / epoch
    w = [r.epoch_s / epoch for r in runs]
    return Run(epoch, first.first_batch_s, samples, steady,
               sum(x * r.trainer_busy_share for x, r in zip(w, runs)),
               sum(x * r.cpu_busy_cores for x, r in zip(w, runs)))


# --------------------------------------------------------------------- points and reasons
def consistency(c: Costs) -> str:
    """Why these costs are no basis for a prediction ("" when they are): they must replay
    their own run within ``SELF_MISS``."""
    if c.ranks > 1:
        return (f"{c.ranks} ranks: the ranks' collective and their shared cores are not "
                f"simulated by the measured-cost what-if")
    run = simulate(c, c.fit_workers)
    if run is None:
        return "the measured costs do not make a run (no items, or a deadlock in the inputs)"
    got, want = run.whole_samples_s, c.fit_whole_samples_s
    if not (math.isfinite(want) and want > 0):
        return "the fit run has no measured rate"
    miss = got / want - 1.0
    if abs(miss) > SELF_MISS:
        return (f"the measured costs replay the fit run ({c.fit_variant}) at {got:,.0f} "
                f"samples/s against {want:,.0f} measured ({miss:+.0%}): a cost the stage "
                f"timers do not see, or the load moved within the fit")
    return ""


def budget_reason(c: Costs, workers: int, budget: float) -> str:
    """A count beyond what the cores carry (``BEYOND_BUDGET`` x the cores rule's budget)."""
    if workers > BEYOND_BUDGET * budget and workers > c.fit_workers:
        return (f"{workers} workers exceed {BEYOND_BUDGET:g}x the {budget:g} the "
                f"{c.cores:g} cores carry: the run would rest on the scheduler, not on a "
                f"measured cost")
    return ""


def _bound(c: Costs, run: Run) -> tuple[str, str]:
    """What binds the replayed run, and why, in words (PREDICTED)."""
    if run.trainer_busy_share >= 0.95:
        return "compute", (f"the trainer binds: {c.trainer_wall * 1e3:.2f} ms per batch "
                           f"(measured)")
    avail = c.cores * c.cores / (c.cores + c.foreign) if c.foreign > 0 else c.cores
    per = (c.cpu + c.handoff) * 1e6
    if run.cpu_busy_cores >= 0.9 * avail:
        return "cores", (f"CPU-bound: {per:.1f} us CPU/sample in the producers on "
                         f"{c.cores:g} cores ({c.foreign:.2f} taken by other processes)")
    return "workers", (f"{per:.1f} us CPU + {c.wait * 1e6:.1f} us wait per sample each "
                       f"(measured)")


def _scaled(c: Costs, k: float) -> Costs:
    return replace(c, cpu=c.cpu * k, handoff=c.handoff * k, wait=c.wait * k,
                   trainer_cpu=c.trainer_cpu * k, trainer_wall=c.trainer_wall * k,
                   start_s=c.start_s * k)


def spread(v: VariantResult, machine: MachineInfo) -> float:
    """Relative half-range of the fit's per-sample producer and trainer costs over its
    repeats (0 with one repeat)."""
    workers = v.executor.producer_slots
    rows = [r for r in (repeat_costs(f, workers, float(machine.cores)) for f in v.repeats) if r]
    if len(rows) < 2:
        return 0.0
    tot = [r["cpu"] + r["wait"] + r["trainer_wall"] / max(r["samples"] / r["batches"], 1)
           for r in rows]
    mid = finite_median(tot)
    return (max(tot) - min(tot)) / 2 / mid if mid > 0 else 0.0


def run_noise(v: VariantResult) -> float:
    """Relative standard error of the fit run's mean batch time (the trainer's wait, its data
    work and its step per batch, the first full repeat's timeline, start-up left out), from
    means of blocks of about sqrt(n) batches: a run of 24 batches whose items arrive in bursts
    measures its own rate to +-15%, a run of 2,000 even ones to +-0.5%, and an interval
    narrower than that claims what the run cannot know (issue 58: 30% of the points inside
    their intervals on a draw of 40 shapes). 0 where the record is too short to say."""
    tl = v.timeline
    tot = [a + b + c for a, b, c in zip(tl.wait_s, tl.transfer_s, tl.compute_s)]
    ph = v.repeats[0].phases if v.repeats else None
    skip = ph.startup_batches if ph is not None else 0
    if len(tot) - skip >= 8:
        tot = tot[skip:]
    k = max(1, round(math.sqrt(len(tot))))
    means = [sum(tot[i * k:(i + 1) * k]) / k for i in range(len(tot) // k)]
    if len(means) < 3:
        return 0.0
    mid = sum(means) / len(means)
    var = sum((m - mid) ** 2 for m in means) / (len(means) - 1)
    return math.sqrt(var / len(means)) / mid if mid > 0 else 0.0


def point(c: Costs, workers: int, *, samples: float | None = None, rel_spread: float = 0.0,
          budget: float | None = None, reason: str = "", noise: float = 0.0) -> Point:
    """The PREDICTED point at ``workers``, with its interval, or not predicted and why
    (``noise``: the fit run's ``run_noise``)."""
    reason = reason or (budget_reason(c, workers, budget) if budget else "")
    run = simulate(c, workers, samples)
    if reason or run is None:
        return Point(workers, math.nan, math.nan, math.nan, math.nan, "", "",
                     reason or "the measured costs do not make a run")
    width = max(MIN_LOG_HALF_WIDTH, math.log1p(rel_spread), Z90 * math.sqrt(2) * noise)
    width += (c.foreign / c.cores) * 0.5 if c.foreign > 0.25 else 0.0
    # cores busy beyond the fit's: each may slow every other's work (memory, caches), a
    # contention no single run measures (1% per core: ~0.6% measured on 16 cores, issue 17)
    width += CONTENTION_PER_CORE * abs(min(workers, c.cores) - min(c.fit_workers, c.cores))
    lo_run = simulate(_scaled(c, 1 + rel_spread), workers, samples)
    hi_run = simulate(_scaled(c, max(1 - rel_spread, 0.5)), workers, samples)
    x = run.whole_samples_s
    contradicts = contradiction(c, workers, run.steady_samples_s)
    if contradicts:
        # issue 58: a point its own inputs contradict is withheld, with the reason
        return Point(workers, math.nan, math.nan, math.nan, math.nan, "", "",
                     f"the replay contradicts its inputs: {contradicts}")
    lo = min(x * math.exp(-width), lo_run.whole_samples_s if lo_run else x)
    hi = max(x * math.exp(width), hi_run.whole_samples_s if hi_run else x)
    bound, why = _bound(c, run)
    return Point(workers, x, run.steady_samples_s, lo, hi, bound, why)


def predict_points(v: VariantResult, machine: MachineInfo, dataset: DatasetInfo | None,
                   counts: Sequence[int], *, budget: float | None = None,
                   prefetch: int = 2, samples: float | None = None) -> list[Point]:
    """Every count of ``counts`` PREDICTED from ``v``'s measured costs (withheld together,
    with the reason, where those costs do not replay ``v`` itself)."""
    c = fit(v, machine, dataset, prefetch=prefetch)
    if c is None:
        return [Point(n, math.nan, math.nan, math.nan, math.nan, "", "",
                      "the fit variant has no measured run") for n in counts]
    reason = consistency(c)
    rel = spread(v, machine)
    noise = run_noise(v)
    return [point(c, n, samples=samples, rel_spread=rel, budget=budget, reason=reason,
                  noise=noise) for n in counts]


# --------------------------------------------------------------------- the what-if's points
def nearest(variants: Sequence[VariantResult], n: int) -> VariantResult | None:
    """The measured variant whose producer count is nearest ``n`` (fewer on a tie): its costs
    are the ones measured closest to the configuration asked about."""
    pts = [v for v in variants if v.repeats and v.repeats[0].samples]
    return min(pts, key=lambda v: (abs(v.executor.producer_slots - n),
                                   v.executor.producer_slots), default=None)


def contradiction(c: Costs, n: int, x: float) -> str:
    """Why a PREDICTED rate ``x`` at ``n`` workers contradicts the run's own figures ("" when
    it does not): more than ``n`` workers' CPU can deliver, or more CPU than the cores hold
    (issue 58: "10.1 + 0.8 us CPU/sample" beside a 1-worker prediction above 92k samples/s)."""
    per = c.cpu + c.handoff
    if n >= 1 and per > 0 and x > 1.05 * n / per:
        return (f"{x:,.0f} samples/s exceeds what {n} worker(s) can deliver by the run's own "
                f"figures ({per * 1e6:.1f} us CPU/sample each: at most {n / per:,.0f})")
    need = per + (c.trainer_cpu / c.batch_rows if c.batch_rows > 0 else 0.0)
    if n >= 1 and need > 0 and x * need > 1.05 * c.cores:
        return (f"{x:,.0f} samples/s needs {x * need:.2f} cores of CPU by the run's own "
                f"figures ({need * 1e6:.1f} us/sample); the machine has {c.cores:g}")
    return ""


def as_whatif_point(p: Point) -> WhatIfPoint:
    """A measured-cost point in the what-if's stored form (model "measured"): the steady
    rate, as the curve's points give it, its interval in the same proportion as the whole
    run's."""
    ok = not p.not_predicted
    x = p.predicted_steady_samples_s
    k = x / p.predicted_samples_s if ok and p.predicted_samples_s > 0 else math.nan
    return WhatIfPoint(n=p.n, predicted_samples_s=x if ok else math.nan,
                       stall_share=math.nan, bound_by=p.bound_by, why=p.why,
                       binding=p.bound_by, model=MODEL,
                       low_samples_s=p.low_samples_s * k if ok else None,
                       high_samples_s=p.high_samples_s * k if ok else None,
                       not_predicted=p.not_predicted)


MODEL = "measured"


def reconcile(points: Sequence[WhatIfPoint], variants: Sequence[VariantResult],
              machine: MachineInfo, dataset: DatasetInfo | None, budget: float,
              words_from: VariantResult | None = None) -> list[WhatIfPoint]:
    """The what-if's points from the measured costs (issue 58): each count PREDICTED from the
    nearest measured variant's costs; where those costs do not replay their own run, the
    fitted curve's point stays, unless it contradicts the run's own figures (then it is
    withheld with both reasons). ``words_from``: the variant whose figures the explanations
    quote (the what-if's fit variant: one compute figure on every surface)."""
    out = []
    missed = loo_reason(variants, machine, dataset, budget)
    for p in points:
        far = missed or beyond_reach(variants, p.n)
        if far:
            out.append(p if p.not_predicted else replace(p, not_predicted=far))
            continue
        v = nearest(variants, p.n)
        c = fit(v, machine, dataset) if v is not None else None
        if c is None:
            out.append(p)
            continue
        cp = point(c, p.n, rel_spread=spread(v, machine), budget=budget, reason=consistency(c),
                   noise=run_noise(v))
        if not cp.not_predicted:
            out.append(replace(as_whatif_point(cp), stall_share=_stall(c, cp),
                               why=_words(words_from or v, v, cp)))
            continue
        why = contradiction(c, p.n, p.predicted_samples_s) if not p.not_predicted else ""
        out.append(replace(p, not_predicted=f"{why}; and {cp.not_predicted}") if why else p)
    return out


def _words(v: VariantResult, src: VariantResult, p: Point) -> str:
    """The point's explanation in the figures every surface prints for ``v`` (the what-if's
    fit variant: ``figures.measured_line``'s one compute figure, the named stage's cost);
    ``src``: the variant whose costs made it."""
    said = f"(PREDICTED from {src.name}'s measured costs)"
    if p.bound_by == "compute":
        comp = figures.compute_s_per_sample(v)
        return f"the trainer binds: {figures.us(comp.value)} compute ({comp.source}) {said}"
    named = figures.named_stage(v)
    stage = f" ({named[0]} {figures.us(figures.stage_s_per_sample(v, named[0]))})" \
        if named is not None and v.executor.has_producers else ""
    if p.bound_by == "cores":
        return f"{p.why}{stage} {said}"
    return f"{p.n} worker(s){stage} cannot keep up: {p.why} {said}"


MAX_ERROR = 0.25     # the one threshold of ``backtest.MAX_ERROR``: a miss above it gives no figure


def loo_reason(variants: Sequence[VariantResult], machine: MachineInfo,
               dataset: DatasetInfo | None, budget: float) -> str:
    """The measured-cost what-if's own back-test: each measured count PREDICTED from the
    nearest other count's costs; where one missed by more than ``MAX_ERROR``, why no figure
    is given ("" when none did, or none could be predicted)."""
    pts = [v for v in variants if v.repeats and v.repeats[0].samples]
    worst, said = 0.0, ""
    for v in pts:
        n = v.executor.producer_slots
        ref = nearest([o for o in pts if o is not v], n)
        c = fit(ref, machine, dataset) if ref is not None else None
        if c is None or consistency(c):
            continue
        p = point(c, n, samples=v.repeats[0].samples, budget=budget)
        meas = v.throughput_samples_s.median
        if p.not_predicted or not meas > 0:
            continue
        err = p.predicted_samples_s / meas - 1.0
        if abs(err) > worst:
            worst, said = abs(err), f"{n} from {ref.executor.producer_slots} workers' costs"
    if worst > MAX_ERROR:
        return (f"the measured-cost what-if's back-test missed a measured count by "
                f"{worst:.0%} ({said}), above {MAX_ERROR:.0%}")
    return ""


def beyond_reach(variants: Sequence[VariantResult], n: int) -> str:
    """Why ``n`` lies beyond what the measured-cost back-test reached ("" when it does not):
    the farthest a measured count lay from the nearest other, each way, and one count beyond
    the measured range always (a single run predicts its neighbours)."""
    counts = sorted({v.executor.producer_slots for v in variants
                     if v.repeats and v.repeats[0].samples})
    if not counts:
        return ""
    gaps = [b - a for a, b in zip(counts, counts[1:])]
    reach = max([1, *gaps])
    if n > counts[-1] + reach:
        return (f"not back-tested this far above the measured counts ({counts[-1]} + "
                f"{reach}): the measured-cost what-if's back-test reached {reach} above")
    if n < counts[0] - reach:
        return (f"not back-tested this far below the measured counts ({counts[0]} - "
                f"{reach})")
    return ""


def _stall(c: Costs, p: Point) -> float:
    """The PREDICTED steady stall share: 1 - steady rate x the trainer's busy wall per
    sample."""
    per = c.trainer_wall / c.batch_rows if c.batch_rows > 0 else math.nan
    x = p.predicted_steady_samples_s
    return max(0.0, 1.0 - x * per) if math.isfinite(per) else math.nan


def knee_of(points: Sequence[WhatIfPoint], unit: str = "worker") -> Knee:
    """The fewest counts >= 1 PREDICTED to remove the stall (bound by compute), or where the
    predicted rate stops growing."""
    given = [p for p in points if p.n >= 1 and not p.not_predicted
             and math.isfinite(p.predicted_samples_s)]
    for p in given:
        if p.bound_by == "compute":
            return Knee(p.n, "compute", f"{p.n} {unit}(s) remove the data stall (PREDICTED "
                                        f"from measured costs): {p.why}")
    if not given:
        return Knee(None, None, "no count predicted")
    top = max(p.predicted_samples_s for p in given)
    first = next(p for p in given if p.predicted_samples_s >= 0.99 * top)
    return Knee(None, first.bound_by, f"no {unit} count removes the stall; from {first.n} "
                                      f"{unit}(s) on, {first.why}", saturates_at=first.n)
