"""A/A calibration: how noisy is this machine for this scenario, and what can the gate promise?

``stallbench gate --calibrate SCENARIO.toml...`` measures the working tree against itself with
exactly the A/B gate's machinery (``ab.run_pairs``: interleaved pairs, one subprocess a run),
``rounds x pairs`` pairs in all. Every pair of an A/A is a draw of the gate's per-pair
difference under *no change*, so from the measured differences d_1..d_K of each scenario /
variant / metric (log ratios, or share points) it derives:

- ``noise_sd`` (sample SD of d) and ``noise_robust_sd`` (1.4826 x median absolute deviation:
  one disturbed pair does not set it);
- ``observed_false_alarms`` of ``rounds`` disjoint gates of ``pairs`` pairs each, decided by
  the paired rule (``compare.compare_paired``): a direct, coarse measurement;
- ``false_alarm_rate``: the share of ``resamples`` simulated gates that say slower or faster,
  each drawing ``pairs`` differences with replacement from the measured ones and deciding with
  the paired rule (bootstrap of the null: a duplicate drawn twice agrees with itself, which
  makes the estimate err on the high side); ``false_alarm_rate_confirmed`` = its square, the
  rate after the gate's confirmation rerun (an independent second gate must agree);
- ``power``: the share of simulated gates that say *slower* when every drawn difference is
  shifted by the slowdown to detect (``detect``: a run taking ``detect`` longer, i.e.
  ln(1 / (1 + detect)) on throughput's log ratio, ln(1 + detect) on a lower-is-better ratio,
  +detect points on a share); ``power_confirmed`` = power squared;
- ``pairs_for_power``: the fewest pairs whose confirmed power reaches ``power_target`` (95%),
  searched from ``MIN_PAIRS`` (6) up to ``MAX_PAIRS`` (40);
- ``noise_floor``: the smallest threshold (on a 0.5% grid) whose simulated false-alarm rate of
  the gate (with its confirmation rerun; of one run with ``--no-confirm``) at these pairs and
  alpha is at most ``MAX_FALSE_ALARM`` (5%). The signed-rank test already holds one run's
  false alarms near alpha when the A/A differences are symmetric, so the floor is usually the
  grid's first step; it rises when they lean one way (a broken pairing, an order effect), and
  then the threshold is what keeps the gate from alarming.

The file (one per scenario, ``<baseline dir>/calibration/<scenario>.json``, versioned by
``calibration_version``) keeps the measured differences themselves, so the gate re-derives
every figure for its own threshold, alpha and pairs; it uses a calibration only from the same
machine (CPU model and core count) and the same scenario text. The gate then (a) takes
``pairs_for_power`` of the throughput rows as its number of pairs when ``--repeats`` is not
given, and (b) refuses (exit 2) a threshold below the noise floor of a gated row, saying the
floor and the measured noise.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .rule import FASTER, METRICS, SLOWER, Metric, compare_paired, paired_differences
from .. import interrupts
from ..analysis.stats import t_quantile
from ..errors import ResultError
from ..results import codec

CALIBRATION_VERSION = 1
MAX_PAIRS = 40
# Fewest pairs the calibration recommends: below this the paired t interval decides alone, and
# one disturbed pair (rarer in a resample than on the machine) can swing it.
MIN_PAIRS = 6
MAX_FALSE_ALARM = 0.05
POWER_TARGET = 0.95
DEFAULT_DETECT = 0.10
DEFAULT_ROUNDS = 3
ROUGH_BELOW = 20      # fewer measured pairs than this: the table says its rates are rough
RESAMPLES = 4000


# ------------------------------------------------------------------------------ the file

@dataclass
class CalibrationMachine:
    cpu_model: str
    cores_logical: int | None
    hostname: str = ""
    load_avg_at_start: list[float] | None = None
    load_avg_at_end: list[float] | None = None


@dataclass
class MetricNoise:
    """One scenario / variant / metric: the measured A/A differences and what they imply at the
    calibration's settings (the gate re-derives these for its own settings)."""

    variant: str
    metric: str
    kind: str                          # "ratio" (d = log ratio) or "points"
    diffs: list[float]                 # measured per-pair differences, in pair order
    noise_sd: float
    noise_robust_sd: float
    observed_false_alarms: int         # over `rounds` disjoint gates of `pairs` pairs
    false_alarm_rate: float            # simulated, one gate run
    false_alarm_rate_confirmed: float  # with the confirmation rerun (squared)
    power: float                       # simulated, one gate run, slowdown `detect`
    power_confirmed: float
    pairs_for_power: int | None        # None: not reached within MAX_PAIRS
    noise_floor: float | None          # None: no threshold < 50% keeps false alarms <= 5%


@dataclass
class Calibration:
    calibration_version: int
    created_utc: str
    tool_version: str
    scenario: str
    scenario_sha256: str
    scenario_path: str
    machine: CalibrationMachine
    commit: str | None
    threshold: float
    alpha: float
    pairs: int                         # pairs per gate run (the A/B's --repeats)
    rounds: int
    detect: float
    power_target: float
    resamples: int
    seconds: float                     # wall time of the calibration's runs
    metrics: list[MetricNoise] = field(default_factory=list)
    recommended_pairs: int | None = None   # max pairs_for_power over the throughput rows


def path_for(directory: Path, scenario: str) -> Path:
    import re

    return Path(directory) / (re.sub(r"[^A-Za-z0-9_.-]+", "_", scenario) + ".json")


def save(cal: Calibration, directory: Path) -> Path:
    from ..results import write_atomic

    path = path_for(directory, cal.scenario)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(codec.to_json(cal), indent=1) + "\n")
    return path


def load(path: Path) -> Calibration:
    """A calibration file, strictly: wrong types, missing keys or another version are a
    one-line error naming the file and the key (exit 2)."""
    from ..scenario import NotReadable, read_text

    try:
        data = json.loads(read_text(Path(path), 64 * 2**20))
    except FileNotFoundError:
        raise ResultError(f"{path}: no such calibration file") from None
    except NotReadable as exc:
        raise ResultError(f"{path}: {exc}: not a calibration file") from None
    except RecursionError:
        raise ResultError(f"{path}: nested too deeply: not a calibration file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ResultError(f"{path}: not a readable calibration file ({exc})") from None
    if not isinstance(data, dict):
        raise ResultError(f"{path}: expected a JSON object")
    codec.check_depth(data, str(path))
    version = data.get("calibration_version")
    if version != CALIBRATION_VERSION or isinstance(version, bool):
        raise ResultError(f"{path}: calibration_version: expected {CALIBRATION_VERSION}, "
                          f"got {version!r}")
    return codec.from_json(Calibration, data, f"{path}:")


# ------------------------------------------------------------------------------ simulation

@lru_cache(maxsize=None)
def signed_rank_critical(n: int, alpha: float) -> int | None:
    """Largest rank sum w with exact two-sided p = 2 P(W+ <= w) < alpha for ``n`` untied,
    non-zero differences (None: no outcome reaches alpha; the rule then uses the paired t)."""
    top = n * (n + 1) // 2
    counts = np.zeros(top + 1)
    counts[0] = 1.0
    for r in range(1, n + 1):
        counts[r:] = counts[r:] + counts[:-r].copy()
    cdf = np.cumsum(counts) / 2.0 ** n
    ok = np.nonzero(2 * cdf < alpha)[0]
    return int(ok[-1]) if ok.size else None


def rule_parts(draws: np.ndarray, m: Metric, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(change, significant) of the paired rule on each row of ``draws`` (rows of differences),
    vectorised. Equal to ``compare.compare_paired`` on untied differences (a test checks it);
    ties (a bootstrap's duplicates) get ranks by position instead of mid-ranks, a small
    approximation inside an estimate."""
    draws = np.asarray(draws, dtype=float)
    rows, n = draws.shape
    i, j = np.triu_indices(n)
    hl = np.median((draws[:, i] + draws[:, j]) / 2.0, axis=1)
    crit = signed_rank_critical(n, alpha)
    if crit is not None:
        ranks = np.argsort(np.argsort(np.abs(draws), axis=1), axis=1) + 1
        wplus = np.where(draws > 0, ranks, 0).sum(axis=1)
        wminus = np.where(draws < 0, ranks, 0).sum(axis=1)
        significant = (np.minimum(wplus, wminus) <= crit) & (draws != 0).all(axis=1)
    else:
        mean = draws.mean(axis=1)
        sd = draws.std(axis=1, ddof=1)
        h = t_quantile(n - 1, 1 - alpha / 2) * sd / math.sqrt(n)
        significant = (mean - h > 0) | (mean + h < 0)
    change = np.exp(hl) if m.kind == "ratio" else hl
    return change, significant


def verdicts(change: np.ndarray, significant: np.ndarray, m: Metric,
             threshold: float) -> np.ndarray:
    """``compare.decide`` on arrays: +1 worse (slower), -1 better (faster), 0 otherwise."""
    if m.kind == "points":
        up, down = change > threshold, change < -threshold
    else:
        up, down = change > 1 + threshold, change < 1 - threshold
    worse, better = (down, up) if m.higher_is_better else (up, down)
    return np.where(significant & worse, 1, np.where(significant & better, -1, 0))


def simulate(draws: np.ndarray, m: Metric, threshold: float, alpha: float) -> np.ndarray:
    """The paired rule's verdict on each row of ``draws``: +1 slower, -1 faster, 0 neither."""
    change, significant = rule_parts(draws, m, alpha)
    return verdicts(change, significant, m, threshold)


def shift_for(m: Metric, detect: float) -> float:
    """The per-pair difference a slowdown of ``detect`` (each run takes that much longer, or a
    share rises by that many points) adds to d, in the metric's worse direction."""
    if m.kind == "points":
        return -detect if m.higher_is_better else detect
    return -math.log1p(detect) if m.higher_is_better else math.log1p(detect)


def _draws(diffs: Sequence[float], pairs: int, resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    arr = np.asarray(diffs, dtype=float)
    return arr[rng.integers(0, arr.size, size=(resamples, pairs))]


def false_alarm_rate(diffs: Sequence[float], m: Metric, threshold: float, alpha: float,
                     pairs: int, resamples: int = RESAMPLES, seed: int = 0) -> float:
    if len(diffs) < 2:
        return math.nan
    v = simulate(_draws(diffs, pairs, resamples, seed), m, threshold, alpha)
    return float(np.mean(v != 0))


def power(diffs: Sequence[float], m: Metric, threshold: float, alpha: float, pairs: int,
          detect: float, resamples: int = RESAMPLES, seed: int = 1) -> float:
    if len(diffs) < 2:
        return math.nan
    d = _draws(diffs, pairs, resamples, seed) + shift_for(m, detect)
    return float(np.mean(simulate(d, m, threshold, alpha) == 1))


def pairs_for_power(diffs: Sequence[float], m: Metric, threshold: float, alpha: float,
                    detect: float, target: float = POWER_TARGET, max_pairs: int = MAX_PAIRS,
                    resamples: int = 2000) -> int | None:
    """Fewest pairs whose confirmed power (power squared) reaches ``target``."""
    if len(diffs) < 2:
        return None
    for n in range(MIN_PAIRS, max_pairs + 1):
        if power(diffs, m, threshold, alpha, n, detect, resamples) ** 2 >= target:
            return n
    return None


def noise_floor(diffs: Sequence[float], m: Metric, alpha: float, pairs: int,
                max_rate: float = MAX_FALSE_ALARM, resamples: int = RESAMPLES,
                confirmed: bool = True) -> float | None:
    """Smallest threshold on a 0.5% grid (up to 49.5%) whose simulated false-alarm rate is at
    most ``max_rate``: the gate's rate, i.e. with the confirmation rerun (one run's rate
    squared), or of one run alone (``confirmed=False``, the gate's ``--no-confirm``)."""
    if len(diffs) < 2:
        return None
    change, significant = rule_parts(_draws(diffs, pairs, resamples, 0), m, alpha)
    for k in range(1, 100):
        t = k * 0.005
        rate = float(np.mean(verdicts(change, significant, m, t) != 0))
        if (rate * rate if confirmed else rate) <= max_rate:
            return t
    return None


def observed_false_alarms(diffs: Sequence[float], m: Metric, threshold: float, alpha: float,
                          pairs: int) -> tuple[int, int]:
    """(false alarms, gates) over disjoint consecutive chunks of ``pairs`` measured pairs."""
    alarms = gates = 0
    for k in range(0, len(diffs) - pairs + 1, pairs):
        chunk = list(diffs[k:k + pairs])
        # rebuild the pairs from the differences: baseline 1, current exp(d) (or 0, d)
        if m.kind == "ratio":
            c = compare_paired([1.0] * pairs, [math.exp(x) for x in chunk], m,
                               threshold=threshold, alpha=alpha)
        else:
            c = compare_paired([0.0] * pairs, chunk, m, threshold=threshold, alpha=alpha)
        alarms += c.verdict in (SLOWER, FASTER)
        gates += 1
    return alarms, gates


def robust_sd(values: Sequence[float]) -> float:
    if len(values) < 2:
        return math.nan
    med = statistics.median(values)
    return 1.4826 * statistics.median(abs(x - med) for x in values)


def assess(variant: str, m: Metric, diffs: Sequence[float], *, threshold: float, alpha: float,
           pairs: int, detect: float) -> MetricNoise:
    fa = false_alarm_rate(diffs, m, threshold, alpha, pairs)
    pw = power(diffs, m, threshold, alpha, pairs, detect)
    alarms, _ = observed_false_alarms(diffs, m, threshold, alpha, pairs)
    return MetricNoise(
        variant=variant, metric=m.name, kind=m.kind, diffs=[float(x) for x in diffs],
        noise_sd=statistics.stdev(diffs) if len(diffs) >= 2 else math.nan,
        noise_robust_sd=robust_sd(diffs), observed_false_alarms=alarms,
        false_alarm_rate=fa, false_alarm_rate_confirmed=fa * fa, power=pw,
        power_confirmed=pw * pw,
        pairs_for_power=pairs_for_power(diffs, m, threshold, alpha, detect),
        noise_floor=noise_floor(diffs, m, alpha, pairs))


def recommended(metrics: Sequence[MetricNoise]) -> int | None:
    """Pairs for the gate: the most any throughput row needs (None when one cannot reach the
    power within MAX_PAIRS, or there is no throughput row)."""
    need = [x.pairs_for_power for x in metrics if x.metric == "throughput"]
    if not need or any(n is None for n in need):
        return None
    return max(n for n in need if n is not None)


# ------------------------------------------------------------------------------ running

def calibrate(scenarios: Sequence[Path], *, threshold: float, alpha: float, pairs: int,
              rounds: int, detect: float, metrics: Sequence[str], cwd: Path,
              say: Callable[[str], None] = lambda s: None) -> list[Calibration]:
    """Run ``rounds x pairs`` A/A pairs of the working tree against itself; one calibration
    per scenario."""
    import os
    import time

    from . import pairs as ab
    from . import worktree
    from .ab import paired_values, variant_names
    from .rows import gated_metrics
    from ..measure.machine import metadata
    from ..results import now_utc
    from .. import __version__

    repo = worktree.toplevel(cwd)
    machine = metadata()
    start_load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    t0 = time.perf_counter()
    with interrupts.SigtermAsInterrupt():
        runs = ab.run_pairs(scenarios, ab.Side("A", repo), ab.Side("B", repo), pairs * rounds,
                            cwd=cwd, work_root=repo, say=say)
    seconds = time.perf_counter() - t0
    end_load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    chosen = gated_metrics(metrics, False)
    out = []
    for name in runs[0].a:
        first = runs[0].a[name]
        rows = []
        for vname in variant_names(runs, name):
            for m in chosen:
                a, b = paired_values(runs, name, vname, m)
                d = paired_differences(a, b, m)
                if len(d) < 2:
                    continue
                rows.append(assess(vname, m, d, threshold=threshold, alpha=alpha, pairs=pairs,
                                   detect=detect))
        out.append(Calibration(
            calibration_version=CALIBRATION_VERSION, created_utc=now_utc(),
            tool_version=__version__, scenario=name, scenario_sha256=first.scenario.sha256,
            scenario_path=first.scenario.path,
            machine=CalibrationMachine(machine.cpu_model, machine.cores_logical,
                                       machine.hostname, start_load, end_load),
            commit=machine.git.commit if machine.git else None, threshold=threshold,
            alpha=alpha, pairs=pairs, rounds=rounds, detect=detect, power_target=POWER_TARGET,
            resamples=RESAMPLES, seconds=seconds, metrics=rows, recommended_pairs=recommended(rows)))
    return out


def format_calibration(cal: Calibration) -> str:
    """A table a person reads: noise, false alarms and power per row, and the recommendation."""
    head = ["variant", "metric", "noise sd", "robust sd", "A/A alarms", "false alarm",
            "confirmed", f"power {cal.detect:.0%}", "confirmed", "pairs for 95%", "noise floor"]

    def pct(x: float | None, kind: str = "ratio") -> str:
        if x is None or not math.isfinite(x):
            return "-"
        return f"{x * 100:.1f}%" if kind == "ratio" else f"{x * 100:.1f} pt"

    body = []
    for x in cal.metrics:
        body.append([x.variant, x.metric, pct(x.noise_sd, x.kind), pct(x.noise_robust_sd, x.kind),
                     f"{x.observed_false_alarms}/{cal.rounds}", pct(x.false_alarm_rate),
                     pct(x.false_alarm_rate_confirmed), pct(x.power), pct(x.power_confirmed),
                     str(x.pairs_for_power) if x.pairs_for_power else f"> {MAX_PAIRS}",
                     pct(x.noise_floor, x.kind)])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [f"A/A calibration of {cal.scenario} on {cal.machine.cpu_model} "
             f"x{cal.machine.cores_logical}: {cal.rounds} x {cal.pairs} pairs in "
             f"{cal.seconds:.0f} s (load average {_load(cal.machine.load_avg_at_start)} at start, "
             f"{_load(cal.machine.load_avg_at_end)} at end); threshold {cal.threshold:.1%}, "
             f"alpha {cal.alpha:g}"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *body]]
    rec = cal.recommended_pairs
    measured = max((len(x.diffs) for x in cal.metrics), default=0)
    if measured < ROUGH_BELOW:
        lines.append(f"only {measured} measured A/A pairs: every rate below is resampled from "
                     f"them and rough; calibrate with at least {ROUGH_BELOW} (--rounds x "
                     "--repeats)")
    lines.append(f"noise sd: of one pair's difference (log ratio, shown as %; share points); "
                 f"false alarm / power: simulated gates of {cal.pairs} pairs resampled from the "
                 f"measured A/A pairs (confirmed: with the rerun, squared)")
    lines.append(f"recommended pairs (--repeats) to catch a {cal.detect:.0%} slowdown in "
                 f"{cal.power_target:.0%} of gates: " +
                 (str(rec) if rec else f"not reachable within {MAX_PAIRS} pairs on this machine"))
    return "\n".join(lines) + "\n"


def _load(x: list[float] | None) -> str:
    return "?" if not x else f"{x[0]:.1f}"


# ------------------------------------------------------------------------------ the gate's use

@dataclass
class Applied:
    """What the gate took from the calibrations: pairs, notes, refusals."""

    pairs: int | None = None
    notes: list[str] = field(default_factory=list)


def find_for(directory: Path, scenario: str, sha256: str, machine_key: tuple[str, int | None],
             ) -> tuple[Calibration | None, str]:
    """The usable calibration of ``scenario`` in ``directory`` (or None) and why not."""
    path = path_for(directory, scenario)
    if not path.is_file():
        return None, f"{scenario}: no calibration at {path}"
    cal = load(path)
    if (cal.machine.cpu_model, cal.machine.cores_logical) != machine_key:
        return None, (f"{scenario}: calibration {path} is from another machine "
                      f"({cal.machine.cpu_model} x{cal.machine.cores_logical}); ignored")
    if cal.scenario_sha256 != sha256:
        return None, f"{scenario}: the scenario changed since calibration {path}; ignored"
    return cal, f"{scenario}: using calibration {path} ({cal.created_utc})"


def apply(cals: Sequence[Calibration], *, threshold: float, alpha: float, pairs: int | None,
          default_pairs: int, metrics: Sequence[str], confirm: bool = True) -> Applied:
    """The gate's use of calibrations (see the module docstring): the pairs when ``--repeats``
    is not given, a ``UserError`` for a threshold below a gated row's noise floor, and notes
    saying what the gate can promise at the pairs it runs."""
    from ..errors import UserError
    from .rows import gated_metrics

    gated = {m.name for m in gated_metrics(metrics, False)}
    rows = [(cal, x) for cal in cals for x in cal.metrics if x.metric in gated]
    tput = [(cal, x) for cal, x in rows if x.metric == "throughput"]
    out = Applied(pairs=pairs)
    chosen = pairs or default_pairs
    if pairs is None and tput:
        need = [pairs_for_power(x.diffs, METRICS[x.metric], threshold, alpha, cal.detect)
                for cal, x in tput]
        if any(n is None for n in need):
            chosen = MAX_PAIRS
            out.notes.append(f"calibration: no number of pairs up to {MAX_PAIRS} catches the "
                             f"calibrated slowdown in {POWER_TARGET:.0%} of gates on this "
                             f"machine; running {MAX_PAIRS}")
        else:
            chosen = max(n for n in need if n is not None)
        out.pairs = chosen
    for cal, x in rows:
        m = METRICS[x.metric]
        floor = noise_floor(x.diffs, m, alpha, chosen, confirmed=confirm)
        if floor is not None and threshold >= floor - 1e-12:
            continue
        unit = "%" if m.kind == "ratio" else " points"
        floor_txt = f"{floor * 100:g}{unit}" if floor is not None else "above 50%"
        raise UserError(
            f"gate: --threshold {threshold * 100:g}% is below the noise floor of "
            f"{cal.scenario}/{x.variant} {x.metric} on this machine ({floor_txt} at {chosen} "
            f"pairs and alpha {alpha:g}: two runs of the same code differ by "
            f"{x.noise_robust_sd * 100:.1f}{unit} (robust sd; A/A calibration of "
            f"{cal.created_utc}), so a smaller change cannot be told from noise); use a "
            f"threshold of at least {floor_txt}, more pairs (--repeats), other metrics "
            f"(--metric), or recalibrate")
    for cal, x in tput:
        m = METRICS[x.metric]
        pw = power(x.diffs, m, threshold, alpha, chosen, cal.detect)
        fa = false_alarm_rate(x.diffs, m, threshold, alpha, chosen)
        out.notes.append(
            f"calibration: at {chosen} pairs a {cal.detect:.0%} slowdown of {cal.scenario}/"
            f"{x.variant} throughput is caught in {pw * pw:.0%} of gates (confirmed; "
            f"{pw:.0%} in one run), A/A false alarms {fa * fa:.1%} ({fa:.1%} in one run); "
            f"simulated from {len(x.diffs)} measured A/A pairs")
    return out
