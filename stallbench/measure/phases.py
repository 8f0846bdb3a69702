"""Start-up vs steady state: where a run's pipeline is full, from its per-batch timeline.

A measured run is short next to a real epoch of hours, so what it pays once (forking loader
workers, importing in them, opening files, the first work item each producer makes before the
trainer can have anything) weighs far more in it than in the epoch a user cares about. A stage
that merely looks slow because the run started is not the stage to fix. So every run is split:

**The rule.** With S = max(producers, 1) producers (loader workers, Ray producer slots; the
trainer itself when there are none), work items go out in order and the first S of them are
each producer's first. The steady window starts when the trainer *asks for* the first batch of
work item S (the first item some producer makes as its second): by then every producer has
delivered its first item, so the pipeline has filled, and from there on the run repeats whole
production/consumption cycles. Formally, with batches 0..n-1, ``item[i]`` the work item batch i
came from and ``t_start[i]`` when the trainer asked for it (seconds from the run's start):

    k = max(first i with item[i] >= S, warmup_batches)

Start-up is [0, t_start[k]); steady state is [t_start[k], epoch_s). ``Phases`` (the schema)
holds the formulas of every figure; the two that analysis uses are

    steady_epoch_s = steady_s * n / (n - k)     # the run as if every batch were steady
    startup_cost_s = epoch_s - steady_epoch_s   # what start-up cost beyond the steady rate

Why this rule and not "the first batch after which the wait stays at its steady level": waits
come in bursts of one work item (a row group gives several batches at once), so a per-batch
level is noisy exactly where the boundary would sit; the item rule needs no threshold, is the
same for every ablation of a variant (they share the executor), and for one producer it puts
the boundary mid-cycle at both ends, so the window holds whole cycles: with one worker slower
than the trainer (P seconds per item, C of compute), steady_s / (items in it) = P exactly.
With 0 workers (S = 1) the start-up is the first item made and consumed in the trainer: its
one-off costs (first file open, first use of each code path) are start-up, and the rest of
it is one steady cycle, which ``startup_cost_s`` subtracts.

**Tiny runs.** When fewer than ``MIN_STEADY_BATCHES`` batches fall after the boundary (the
run ended before a producer made its second item), the run has no steady window:
``steady_batches`` is 0, the steady figures are NaN, and the attribution uses whole runs and
says so (``Attribution.basis``).

**Too short for its figures (issue 25).** A window of part of a cycle is not a steady state:
a ``--max-batches 20`` look at a transform-bound loop with 0 workers and 8 batches per row
group put 1.5 items' batches but 2 items' preprocessing in its window, so its "steady" rate
was below the whole run's and its start-up cost negative; with 2 workers 4 batches fell in the
window, half of one item, and the steady rate came out above what two cores can do. So a
window must hold ``MIN_STEADY_CYCLES`` whole production cycles (S producers x the batches of
one item: the median over the run's items but its last, which a cap may cut), and a window
whose batches come slower than the whole run's by more than half a work item's steady time
(``SLOWER_TOLERANCE_ITEMS``; less is where the boundary's placement and machine noise reach)
makes the start-up cost negative, and start-up cannot make a run faster: refused, not clamped
(beyond that half item, the start-up's items may be as much cheaper as the window's own
items spread: ``item_spread``, variable-length batches).
A start-up cost negative within that tolerance is printed as "~0" (not distinguishable
from 0). Either
way the run has no steady window and ``Phases.no_steady_reason`` says why; the printed
tables and verdicts then give whole-run figures and say the run was too short.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

from ..results import Phases, RepeatFigures, Summary
from ..results import PhaseSummary

MIN_STEADY_BATCHES = 2
MIN_STEADY_CYCLES = 2       # whole production cycles (S items) a steady window must hold
SLOWER_TOLERANCE_ITEMS = 0.5   # a steady window slower than the run by more than half an item: refused


def batches_per_item(items: Sequence[int]) -> int:
    """Median batches of one work item, over the run's items but its last (a cap may cut it)."""
    counts: dict[int, int] = {}
    for it in items:
        counts[it] = counts.get(it, 0) + 1
    whole = [c for it, c in counts.items() if it != items[-1]] if len(counts) > 1 else []
    if not whole:
        return 1
    whole.sort()
    return whole[len(whole) // 2]


def window(items: Sequence[int], producers: int, warmup_batches: int = 0
           ) -> tuple[int | None, str]:
    """(k, "") or (None, why there is no steady window): the rule and the length check of the
    module docstring."""
    s = max(producers, 1)
    k = next((i for i, it in enumerate(items) if it >= s), None)
    if k is None:
        return None, ("too short for a steady state: the run ended before a producer made "
                      "its second work item")
    k = max(k, warmup_batches)
    if len(items) - k < MIN_STEADY_BATCHES:
        return None, "too short for a steady state: fewer than 2 batches after start-up"
    need = MIN_STEADY_CYCLES * s * batches_per_item(items)
    if len(items) - k < need:
        return None, (f"too short for a steady state: {len(items) - k} batches after start-up, "
                      f"fewer than {MIN_STEADY_CYCLES} whole cycles of {s} producer"
                      f"{'s' if s > 1 else ''} ({need} batches)")
    return k, ""


def boundary(items: Sequence[int], producers: int, warmup_batches: int = 0) -> int | None:
    """k: the first steady batch (see the module docstring), or None without a steady window."""
    return window(items, producers, warmup_batches)[0]


def split(t_start: Sequence[float], compute: Sequence[float], wait: Sequence[float],
          rows: Sequence[int], items: Sequence[int], epoch_s: float, producers: int,
          warmup_batches: int = 0) -> Phases:
    """Start-up and steady state of one run from its per-batch timeline."""
    n = len(t_start)
    s = max(producers, 1)
    k, why = window(items, producers, warmup_batches) if n else (None, "no batches")
    nan = math.nan

    def none(reason: str) -> Phases:
        comp = sum(compute)
        return Phases(startup_items=s, startup_batches=n, startup_samples=int(sum(rows)),
                      startup_s=epoch_s, startup_stall_s=epoch_s - comp, steady_batches=0,
                      steady_samples=0, steady_s=nan, steady_stall_s=nan, steady_wait_s=nan,
                      steady_compute_s=nan, steady_stall_share=nan, steady_epoch_s=nan,
                      startup_cost_s=nan, no_steady_reason=reason)

    if k is None:
        return none(why)
    startup = t_start[k]
    steady = epoch_s - startup
    comp_steady = sum(compute[k:])
    steady_epoch = steady * n / (n - k)
    per_item = steady / max((n - k) / batches_per_item(items), 1.0)
    allowed = SLOWER_TOLERANCE_ITEMS * per_item + item_spread(t_start, items, k)
    if epoch_s - steady_epoch < -allowed:
        return none(f"refused a steady window slower per batch than the whole run (start-up "
                    f"would cost {epoch_s - steady_epoch:.2f} s, and start-up cannot make a "
                    f"run faster): not a steady state")
    return Phases(
        startup_items=s, startup_batches=k, startup_samples=int(sum(rows[:k])),
        startup_s=startup, startup_stall_s=startup - sum(compute[:k]),
        steady_batches=n - k, steady_samples=int(sum(rows[k:])), steady_s=steady,
        steady_stall_s=steady - comp_steady, steady_wait_s=sum(wait[k:]),
        steady_compute_s=comp_steady,
        steady_stall_share=(steady - comp_steady) / steady if steady > 0 else nan,
        steady_epoch_s=steady_epoch, startup_cost_s=epoch_s - steady_epoch)


def item_spread(t_start: Sequence[float], items: Sequence[int], k: int) -> float:
    """How much cheaper the start-up's items may be than the steady window's mean by their
    own size, not by the run being faster: two robust standard deviations (the 10th to 90th
    percentile of the window's whole items' times / 2.56) per start-up item's square root.
    Items of one size spread by noise alone, and the rule stands as it was; variable-length
    batches (dynamic padding: the transformers tutorial's 810 batches, issue 57) spread by
    their lengths, and one short first batch refused the whole run's steady window
    ("0.00 s in steady state"). 0 with fewer than 10 whole items in the window."""
    starts = [t for i, (t, it) in enumerate(zip(t_start, items))
              if i >= k and (i == k or it != items[i - 1])]
    per = sorted(b - a for a, b in zip(starts, starts[1:]))    # the last (cut) item left out
    if len(per) < 10:
        return 0.0
    sigma = (per[int(0.9 * (len(per) - 1))] - per[int(0.1 * (len(per) - 1))]) / 2.56
    startup_items = len({it for it in items[:k]})
    return 2.0 * sigma * math.sqrt(max(startup_items, 1))


CPU_LIMIT_TOLERANCE = 1.10   # a steady rate above the CPU limit by more: refused


def cpu_limit_reason(f: RepeatFigures, cores: float) -> str:
    """Why this run's steady rate is impossible, or "": the data work measured in CPU seconds
    per sample (fetch + preprocess + the producer's transfer, thread CPU clocks) cannot run on
    ``cores`` cores faster than ``cores / cpu_per_sample``; a steady window that claims more
    (a window too short for its work: issue 25's 161k samples/s where 2 cores at 20 us/row
    allow ~100k) is refused with the figures, never clamped. Local producers only: real Ray
    nodes bring cores this machine does not have."""
    p = f.phases
    if p is None or not p.has_steady or p.steady_s <= 0 or f.samples <= 0 or cores <= 0:
        return ""
    st = f.stage_s
    cpu = (st.fetch_cpu + st.preprocess_cpu + st.transfer_producer_cpu) / f.samples
    if cpu <= 0:
        return ""
    rate, limit = p.steady_samples / p.steady_s, cores / cpu
    if rate <= CPU_LIMIT_TOLERANCE * limit:
        return ""
    return (f"refused a steady rate of {rate:,.0f} samples/s: the data work measured "
            f"{cpu * 1e6:.1f} us of CPU per sample, so {cores:g} cores allow at most "
            f"{limit:,.0f}/s: not a steady state")


def machine_cores() -> float:
    """The cores this process may run on (its affinity where the OS says, else all)."""
    return float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else (os.cpu_count() or 1))


def refuse_beyond_cores(f: RepeatFigures, cores: float | None = None) -> bool:
    """The one "faster than the cores allow" rule (``cpu_limit_reason``), applied to a run:
    its steady window is refused in place, saying why, and its steady rate is NaN (never
    clamped). The scenario runner (local producers) and ``profile`` both call this. True
    when it refused."""
    why = cpu_limit_reason(f, machine_cores() if cores is None else cores)
    if not why or f.phases is None:
        return False
    f.phases = refuse(f.phases, why, f.epoch_s, f.compute_s, f.batches, f.samples)
    f.steady_throughput_samples_s = math.nan
    return True


def refuse(p: Phases, reason: str, epoch_s: float, compute_s: float, batches: int,
           samples: int) -> Phases:
    """The run's phases with no steady window, saying why (nothing clamped)."""
    nan = math.nan
    return Phases(startup_items=p.startup_items, startup_batches=batches,
                  startup_samples=samples, startup_s=epoch_s,
                  startup_stall_s=epoch_s - compute_s, steady_batches=0, steady_samples=0,
                  steady_s=nan, steady_stall_s=nan, steady_wait_s=nan, steady_compute_s=nan,
                  steady_stall_share=nan, steady_epoch_s=nan, startup_cost_s=nan,
                  no_steady_reason=reason)


def rule_text(producers: int) -> str:
    s = max(producers, 1)
    if producers == 0:
        return ("start-up ends when the trainer asks for the first batch of work item 1: with "
                "no workers it made item 0 itself")
    who = f"each of the {s} producers has" if producers > 1 else "the producer has"
    return (f"start-up ends when the trainer asks for the first batch of work item {s}: "
            f"{who} delivered its first item")


def full_epoch_samples(dataset_rows: int, epochs: int, reps: Sequence[RepeatFigures]) -> int:
    """Samples a whole epoch (x ``epochs``) would give: the dataset's rows times the measured
    rows out per row in (filters and downsampling drop rows)."""
    ratios = [f.stage_rows.transfer / f.stage_rows.fetch for f in reps if f.stage_rows.fetch]
    ratio = sorted(ratios)[len(ratios) // 2] if ratios else 1.0
    return int(round(dataset_rows * epochs * ratio))


def extrapolate(p: Phases, full_samples: int) -> tuple[float, float]:
    """(EXTRAPOLATED seconds, stall share) of a run of ``full_samples`` samples: the measured
    start-up plus the rest at the measured steady rate (and steady stall per sample)."""
    if not p.has_steady or p.steady_samples <= 0:
        return math.nan, math.nan
    rest = max(full_samples - p.startup_samples, 0)
    t = p.startup_s + rest * p.steady_s / p.steady_samples
    stall = p.startup_stall_s + rest * p.steady_stall_s / p.steady_samples
    return t, (stall / t if t > 0 else math.nan)


def summarize(reps: Sequence[RepeatFigures], producers: int,
              full_samples: int | None) -> PhaseSummary | None:
    """Per-variant summaries of the full runs' phases; the EXTRAPOLATED full epoch only when
    the runs covered less than a whole epoch (``max_batches``)."""
    ph = [f.phases for f in reps if f.phases is not None]
    if not ph:
        return None
    steady = [p for p in ph if p.has_steady]
    out = PhaseSummary(
        rule=rule_text(producers),
        startup_s=Summary.of([p.startup_s for p in ph]),
        startup_cost_s=Summary.of([p.startup_cost_s for p in steady]),
        startup_stall_s=Summary.of([p.startup_stall_s for p in ph]),
        steady_s=Summary.of([p.steady_s for p in steady]),
        steady_stall_share=Summary.of([p.steady_stall_share for p in steady]),
        steady_samples_s=Summary.of([p.steady_samples / p.steady_s for p in steady
                                     if p.steady_s > 0]))
    capped = full_samples is not None and any(f.samples < 0.999 * full_samples for f in reps)
    if capped and steady:
        ex = [extrapolate(p, full_samples) for p in steady]   # type: ignore[arg-type]
        out.full_epoch_samples = full_samples
        out.extrapolated_full_epoch_s = Summary.of([e[0] for e in ex])
        out.extrapolated_full_epoch_stall_share = Summary.of([e[1] for e in ex])
    return out
