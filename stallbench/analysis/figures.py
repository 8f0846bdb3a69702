"""One figure per quantity (issue 25): the figures that the verdict, ``stallbench whatif`` and
the report all print, each computed here once, so that the three surfaces cannot disagree.

Before, each surface computed its own: one run's verdict said "the trainer binds: 12.6
us/sample compute" (the step timer of that variant's full runs, slowed beside its loader
workers), its compute-only ablation worked out to 5.2 us/sample, and ``whatif`` said 7.1 (a
what-if fitted on another variant); "1 worker predicted 1.58x" was printed beside "ideal fetch
would give 1.53x". The quantities and the measurement each one comes from:

- **compute per sample** (``compute_s_per_sample``): the model step alone, from the
  compute-only run (the ablation without a loader: the trainer steps on batches made before
  it starts) where the variant has an attribution: ``Attribution.compute_s`` (its steady
  window scaled to all batches on a steady basis, else its whole run) over one rank's
  samples. It is the one measurement of the step with nothing of the data pipeline running
  beside it, and the attribution's stalls are measured above that same run. What the step
  costs more in a configuration (contention with producers for the cores, a sleep waking late
  on a busy machine) belongs to the configuration, not to the step: the what-if names it apart
  ("beside the producers"). Without an attribution: the step timer of the full runs.
- **the bound stage's cost** (``stage_s_per_sample``): one producer's wall seconds in the
  stage per sample the trainer consumes, the median over the full runs' repeats of
  stage seconds / samples: the what-if's ``stage_wall`` (its input) and the report's
  per-sample stage figures. (``StageRates`` keeps rows per producer-second, the inverse per
  row *entering* the stage; with ``max_batches`` a producer makes rows the trainer never
  takes, so the two are not the same figure and are labelled apart.)
- **the ideal bound** (``ideal_bound``): what removing data stalls at most gives, from the
  ablations (measured): for a change that removes one stage (a cache, storage bandwidth, a
  transfer setting) that stage's ideal, ``Attribution.ideal_speedup``; for more producers,
  which take *all* data work off the trainer, the ideal of every data stage and the loader's
  hand-off together: the (steady) epoch over the compute-only run's. A single stage's ideal is
  no bound on more producers (with no workers one worker takes fetch *and* preprocess off the
  trainer), which is how "1 worker predicted 1.58x; ideal fetch would give 1.53x" was printed;
  the data ideal is, and a prediction above it contradicts the ablations (see ``advice``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ..results import Attribution, VariantResult
from .stats import finite_median

COMPUTE_ONLY_SOURCE = "compute-only run"
STAGE_KEYS = {"fetch": "fetch", "preprocess": "preprocess", "transfer": "transfer_producer"}


@dataclass(frozen=True)
class Figure:
    """A figure and the measurement it comes from, in words (printed beside it)."""

    value: float
    source: str


def samples_per_rank(v: VariantResult) -> float:
    """The samples one rank consumed in a full run (median over repeats)."""
    ranks = v.ranks.world if v.ranks is not None else 1
    return finite_median(f.samples for f in v.repeats) / max(ranks, 1)


def compute_s_per_sample(v: VariantResult) -> Figure:
    """The model step alone, seconds per sample of one rank (see the module docstring for
    why the compute-only run)."""
    a = v.attribution
    n = samples_per_rank(v)
    if a is not None and math.isfinite(a.compute_s) and a.compute_s > 0 and n > 0:
        return Figure(a.compute_s / n, COMPUTE_ONLY_SOURCE)
    if v.ranks is not None and v.ranks.world > 1:
        per = [r for f in v.repeats for r in f.ranks]
        return Figure(finite_median(r.compute_s / max(r.samples, 1) for r in per),
                      "step timer")
    return Figure(finite_median(f.compute_s / max(f.samples, 1) for f in v.repeats),
                  "step timer")


def stage_s_per_sample(v: VariantResult, stage: str) -> float:
    """One producer's wall seconds in ``stage`` (fetch, preprocess, transfer, or a
    ``StageSeconds`` field) per sample the trainer consumes: median over the full runs."""
    key = STAGE_KEYS.get(stage, stage)
    return finite_median(getattr(f.stage_s, key) / max(f.samples, 1) for f in v.repeats)


def wait_bound(whole_share: float, steady_share: float | None = None) -> float:
    """What removing every wait (issue 39) gives at most: 1 / (1 - the larger stall share). Infinite
    where the loop did nothing but wait; NaN where neither share is known."""
    shares = [s for s in (whole_share, steady_share)
              if s is not None and math.isfinite(s)]
    if not shares:
        return math.nan
    s = min(max(max(shares), 0.0), 1.0)
    return math.inf if s >= 1.0 else 1.0 / (1.0 - s)


def data_ideal_speedup(a: Attribution) -> float:
    """The (steady) epoch over the compute-only run's: what taking every data stage and the
    loader's hand-off off the trainer gives at most (the parts sum to the epoch)."""
    total = a.steady_epoch_s if a.steady_epoch_s is not None else a.epoch_s
    if not (math.isfinite(total) and a.compute_s > 0):
        return math.nan
    ideal = max(total / a.compute_s, a.ideal_speedup)
    # the epoch over the compute-only run's also holds the step's slowdown beside the loader
    # (interference, its own figure): removing the waits gives at most the wait's bound
    bound = a.wait_bound_speedup
    return min(ideal, bound) if bound is not None and math.isfinite(bound) else ideal


def ideal_bound(a: Attribution, knob: str | None) -> Figure:
    """The ablations' bound on the gain of a change to ``knob`` (None: a change that removes
    the bound stage's own cost, e.g. a cache): the stage's ideal, or for more producers
    (a ``num_workers``/nodes/concurrency knob) the ideal of all data work."""
    if knob in PRODUCER_KNOBS:
        return Figure(data_ideal_speedup(a), "no data stall")
    return Figure(a.ideal_speedup, f"ideal {a.bound_by}")


PRODUCER_KNOBS = ("loader.num_workers", "executor.simulated_nodes", "executor.concurrency")


def spans_zero(iv: object) -> bool:
    """An interval whose ends lie on both sides of 0: its figure is not distinguishable from
    0 and is printed "~0" (``ZERO_NOTE``) on every surface, never as a negative stall."""
    low, high = getattr(iv, "low"), getattr(iv, "high")
    return math.isfinite(low) and math.isfinite(high) and low < 0 < high


ZERO_NOTE = "~0: not distinguishable from 0 (its interval spans 0)"


# ------------------------------------------------------------------ how a figure is written
# One rule for writing a share, a duration and a speed-up on every surface (terminal tables,
# verdict lines, the report), so one field reads the same wherever it appears (issue 42: a
# stall share of "-1%" beside "0%", "-0% of the epoch", 158 ms in one table and 0.00 in
# another). A figure that is not distinguishable from 0 is written "~0": its interval spans 0,
# or it is a share (or a part of the epoch) below 0, which only noise makes, or it rounds to 0
# at the precision shown without being 0. Exactly 0 stays "0". Missing figures are ``missing``.
# A signed figure (a change, an error: ``signed``, ``signed_percent``, ``signed_points``) keeps
# its sign where its digits show one, and has none where they read 0 ("0.0 pt", never "-0.0").

ZERO = "~0"


def _finite(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def is_zero(x: float, interval: object = None, text: str | None = None) -> bool:
    """``x`` is not distinguishable from 0 (written ``ZERO``): its interval spans 0, it is
    below 0, or ``text`` (its digits as written) reads 0 while ``x`` is not 0."""
    if interval is not None and spans_zero(interval):
        return True
    return x < 0 or (x != 0 and text is not None and float(text) == 0)


def share(x: object, digits: int = 0, interval: object = None, missing: str = "-") -> str:
    """A share of a whole (stall of the epoch, data stages of steady state): ``"12%"``; never
    negative and never ``"-0%"`` (``is_zero``: ``"~0%"``)."""
    v = _finite(x)
    if v is None:
        return missing
    text = f"{v * 100:.{digits}f}"
    return ZERO + "%" if is_zero(v, interval, text) else text + "%"


def _duration_is_zero(v: float, interval: object, signed: bool) -> bool:
    """The one "~0" rule of ``seconds`` and ``seconds_cell``: an interval spanning 0, a
    negative duration unless ``signed``, or less than 5 us."""
    return ((interval is not None and spans_zero(interval)) or (v < 0 and not signed)
            or abs(v) < 0.5e-5)


def seconds(x: object, interval: object = None, missing: str = "-", signed: bool = False) -> str:
    """A duration: ``"1.23 s"`` from 1 s up, ``"158 ms"`` below, ``"4.20 ms"`` below 10 ms,
    ``"0 s"`` for exactly 0, ``"~0 s"`` when ``is_zero`` (an interval spanning 0; a negative
    duration unless ``signed``: a part of the epoch that may come out below 0, such as a
    negative ablation part, is written with its minus sign)."""
    v = _finite(x)
    if v is None:
        return missing
    if v == 0:
        return "0 s"
    if _duration_is_zero(v, interval, signed):
        return ZERO + " s"
    if abs(v) < 0.01:
        return f"{v * 1e3:.2f} ms"
    if abs(v) < 1:
        return f"{v * 1e3:.0f} ms"
    return f"{v:.2f} s"


def seconds_cell(x: object, interval: object = None, missing: str = "-",
                 signed: bool = False) -> str:
    """A duration in a table column headed "s": the digits of ``seconds`` in seconds (158 ms
    is ``"0.158"``, never ``"0.00"``; from 1 s up two decimals), ``"~0"`` as there."""
    v = _finite(x)
    if v is None:
        return missing
    if v == 0:
        return "0"
    if _duration_is_zero(v, interval, signed):
        return ZERO
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}" if abs(v) >= 0.01 else f"{v:.5f}".rstrip("0")


# The attribution's parts by the names of what ran (issue 42): a scenario defines fetch,
# preprocess and transfer; on a user's job (``stallbench profile``) they are what the job's
# loader did, and "fetch" read as storage I/O when it was a hashing loop in ``__getitem__``.
# The inconclusive kinds whose parts are withheld (never printed or drawn as figures, issue
# 57): the parts do not sum to the stall ("closure"), the machine moved the step
# ("busy_machine"), a stage not served moved in a served run ("stage_moved"), a served run
# waited longer than the full run ("serving"). "interval" keeps its figures: its parts
# stand, only the bound's interval includes zero.
WITHHOLDS = ("closure", "busy_machine", "stage_moved", "serving")


def withheld(a) -> bool:
    """Whether an ``Attribution``'s parts are withheld: printed and drawn as "withheld",
    never as figures, by the terminal and the report alike."""
    return a is not None and not a.conclusive and a.inconclusive_because in WITHHOLDS


JOB_PART_NAMES = {"fetch": "dataset __getitem__", "preprocess": "collate_fn",
                  "transfer": "pin_memory", "overhead": "loader hand-off"}
SCENARIO_PART_NAMES = {"fetch": "fetch", "preprocess": "preprocess", "transfer": "transfer",
                       "overhead": "loader overhead"}


def part_name(part: str, on_job: bool, stage_map: Mapping[str, str] | None = None) -> str:
    """The name a surface gives an attribution part: the job's own stage on a profiled job
    (``on_job``), the scenario's word otherwise. ``stage_map`` (``ProfileAnalysis.stage_map``:
    each stage the job's loaders ran -> its part) names the part after what the job ran: an
    iterable dataset's items come from ``__iter__``, not ``__getitem__``; without it, or for a
    part no stage of the job maps to, the usual name of a map-style DataLoader job."""
    if not on_job:
        return SCENARIO_PART_NAMES.get(part, part)
    ran = [name for name, p in (stage_map or {}).items() if p == part]
    if {"dataset.__getitem__", "dataset.__iter__"} <= set(ran):
        # both kinds: a result written before the map held only what ran (it listed every
        # automatic stage), so which one ran is not known
        ran = [n for n in ran if not n.startswith("dataset.")] + ["dataset.__getitem__/__iter__"]
    return " + ".join(n.replace(".", " ", 1) for n in ran) if ran else JOB_PART_NAMES.get(part, part)


def speedup(x: object, missing: str = "-") -> str:
    """A speed-up factor: ``"1.52x"``."""
    v = _finite(x)
    return missing if v is None else f"{v:.2f}x"


def signed(x: object, digits: int = 1, missing: str = "-") -> str:
    """A signed number (a change, an error, an interval's end): ``"+8.0"``, ``"-9.1"``. One
    that reads 0 at ``digits`` has no sign (``"0.0"``, never ``"-0.0"`` or ``"+0.0"``): a
    sign on a zero claims a direction the digits do not show (issue 42)."""
    v = _finite(x)
    if v is None:
        return missing
    text = f"{v:+.{digits}f}"
    return text[1:] if float(text) == 0 else text


def signed_percent(x: object, digits: int = 1, missing: str = "-") -> str:
    """A relative change or a prediction's error (a fraction: 0.05 is ``"+5.0%"``), signed by
    ``signed``'s rule: a change that rounds to 0 is ``"0.0%"``."""
    v = _finite(x)
    return missing if v is None else signed(v * 100, digits) + "%"


def signed_points(x: object, digits: int = 1, missing: str = "-") -> str:
    """A change of a share in percentage points (a fraction of the whole: 0.08 is
    ``"+8.0 pt"``), by ``signed``'s rule: no change is ``"0.0 pt"``."""
    v = _finite(x)
    return missing if v is None else signed(v * 100, digits) + " pt"


def us(seconds: float) -> str:
    """Seconds per sample as every surface prints them."""
    return f"{seconds * 1e6:.1f} us/sample"


def named_stage(v: VariantResult) -> tuple[str, bool] | None:
    """The data stage every surface names for ``v`` and whether it is the bound one: the
    stage a conclusive attribution names bound, else the heaviest by the stage timers (where
    producers ran or the attribution leans on one); None where no stage cost was measured.
    One rule, so the what-if's "cannot keep up" and the verdict never name two stages."""
    a = v.attribution
    bound = a.bound_by if a is not None and a.conclusive and a.bound_by in STAGE_KEYS else None
    costs = {s: stage_s_per_sample(v, s) for s in STAGE_KEYS}
    leaning = a is not None and a.bound_by in STAGE_KEYS
    if not (v.executor.has_producers or leaning):
        return None
    named = bound or max(costs, key=lambda s: costs[s] if math.isfinite(costs[s]) else -1.0)
    return (named, bound is not None) if math.isfinite(costs[named]) else None


def measured_line(v: VariantResult) -> str:
    """The three figures of ``v`` in the words every surface uses (``stallbench whatif`` and
    the report print this line; the verdict and the what-if's explanations quote the same
    figures): compute per sample, the bound stage's cost (the heaviest producer stage where
    the attribution names no data stage) and the ablations' bounds."""
    compute = compute_s_per_sample(v)
    parts = [f"compute {us(compute.value)} ({compute.source})"]
    a = v.attribution
    named = named_stage(v)
    if named is not None:
        stage, bound = named
        what = "bound stage" if bound else "heaviest stage"
        where = "per producer" if v.executor.has_producers else "in the trainer's loop"
        parts.append(f"{stage} {us(stage_s_per_sample(v, stage))} {where} ({what})")
    stage = named[0] if named is not None and named[1] else None
    if a is not None and stage is not None:
        parts.append(f"ideal {stage} would give {a.ideal_speedup:.2f}x, no data stall "
                     f"{data_ideal_speedup(a):.2f}x (ablations)")
    return f"{v.name}: " + "; ".join(parts)
