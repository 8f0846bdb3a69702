"""Verdict accuracy (issue 25): the gains the verdicts print against what the same run measured.

Runs each scenario (default ``scenarios/recsys.toml`` and ``scenarios/demo.toml``; or loads
saved results with ``--from``), then, for every variant whose verdict suggests a producer
count, asks the verdict again with one measured count hidden at a time (leave one out, as the
what-if back-test does): the suggestion it then makes is PREDICTED, and where the run
measured that count the prediction is set beside the measured steady ratio.

Printed per case: scenario, variant, the count suggested, predicted [interval] (or "not
predicted" and why), measured steady ratio (median over repeats) and its min..max over the
repeats' pairings, the error, and whether it is within 10% or inside the measured range.
A summary line gives the share within target and the share "not predicted". First, the
verdicts each run prints as it is (nothing hidden), and how each gives its gain.

Targets (issue 25): every predicted speedup within 10% of the measured steady ratio (or inside
that ratio's own range over repeats where wider); "not predicted" in at most one in five.

Nothing of the hidden count reaches the verdict: the what-if, its leave-one-out back-test
(which picks the rows and the model that vouch for a prediction, issue 25) and the other
models are all fitted on the run without it.

    python3 benchmarks/verdict_accuracy.py                       # measure both, minutes
    python3 benchmarks/verdict_accuracy.py --from a.json b.json  # evaluate saved results
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stallbench import results, scenario  # noqa: E402
from stallbench.analysis import advice, whatif  # noqa: E402
from stallbench.report.tables import table  # noqa: E402
from stallbench.run.runner import RunOptions, run_scenario  # noqa: E402

TARGET = 0.10


def _steady(v: Any) -> list[float]:
    if v.phases is not None:
        return [f.phases.steady_samples / f.phases.steady_s for f in v.repeats
                if f.phases is not None and f.phases.has_steady and f.phases.steady_s > 0]
    return []


def _measured(v: Any, s: Any) -> tuple[float, float, float] | None:
    """(median ratio, min, max over the repeats' pairings) of ``s``'s steady rate to ``v``'s."""
    a, b = _steady(v), _steady(s)
    if not a or not b:
        return None
    ratios = sorted(y / x for x in a for y in b if x > 0)
    mid = (sorted(b)[len(b) // 2]) / (sorted(a)[len(a) // 2])
    return mid, ratios[0], ratios[-1]


def verdict(v: Any, r: Any) -> Any:
    """``v``'s recommendation as the runner makes it from ``r``'s variants, with the what-if,
    its back-test and the other models fitted afresh on them (a result saved before a change
    of the back-test carries the old one)."""
    seen = dataclasses.replace(r)
    wi = whatif.validate(seen)
    seen.analysis = dataclasses.replace(r.analysis, whatif=wi)
    return advice.recommend(v, r.machine, r.variants, wi.backtest if wi else None,
                            advice.model_for(v, wi), advice.alternatives_for(v, seen))


def cases(r: Any) -> list[list[str]]:
    rows = []
    for v in r.variants:
        full = verdict(v, r)
        if full is None or not full.knob:
            continue
        for hidden in r.variants:
            if hidden is v:
                continue
            # the verdict on a run that never measured the hidden count
            rec = verdict(v, dataclasses.replace(r, variants=[x for x in r.variants
                                                              if x is not hidden]))
            if rec is None or rec.knob is None or rec.value is None:
                continue
            s = advice._sibling(v, r.variants, rec.knob, rec.value)
            if s is not hidden:
                continue
            m = _measured(v, s)
            if rec.not_predicted:
                pred, err, ok = f"not predicted ({rec.not_predicted})", "-", "-"
            elif rec.predicted_speedup is None or m is None:
                continue
            else:
                x = rec.predicted_speedup
                iv = (f" [{rec.predicted_low:.2f}x, {rec.predicted_high:.2f}x]"
                      if rec.predicted_low is not None else "")
                pred = f"{x:.2f}x{iv}"
                e = x / m[0] - 1
                err = f"{e:+.1%}"
                ok = "yes" if abs(e) <= TARGET or m[1] <= x <= m[2] else "NO"
            meas = f"{m[0]:.2f}x ({m[1]:.2f}..{m[2]:.2f})" if m else "-"
            rows.append([r.scenario.name, v.name, f"{rec.knob}={rec.value}", pred, meas, err, ok])
    return rows


def printed(r: Any) -> list[list[str]]:
    """The verdicts the run itself prints (every variant, nothing hidden): how each gain is
    given (measured, predicted, an upper bound, not predicted)."""
    rows = []
    for v in r.variants:
        rec = verdict(v, r)
        if rec is None:
            continue
        how = ("not predicted" if rec.not_predicted else
               "measured" if rec.measured_speedup is not None else
               "predicted" if rec.predicted_from == "what-if model" else
               "upper bound" if rec.predicted_from.startswith("attribution") else "no gain")
        rows.append([r.scenario.name, v.name, how, advice.action_text(rec)])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenarios", nargs="*", default=["scenarios/recsys.toml",
                                                      "scenarios/demo.toml"])
    ap.add_argument("--from", dest="saved", nargs="*", default=None,
                    help="evaluate saved result files instead of running")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}; cores: {os.cpu_count()}")
    if args.saved:
        loaded = [results.load(Path(p)) for p in args.saved]
    else:
        loaded = []
        cache = Path(tempfile.gettempdir()) / "stallbench-verdict-accuracy"
        for p in args.scenarios:
            sc = scenario.load(ROOT / p) if not Path(p).is_absolute() else scenario.load(Path(p))
            r = run_scenario(sc, RunOptions(cache_dir=cache, progress=False))
            print(f"saved: {results.save(r, Path(tempfile.gettempdir()) / 'verdict-accuracy')}",
                  flush=True)
            loaded.append(r)
    said = [row for r in loaded for row in printed(r)]
    print(table(["scenario", "variant", "gain", "verdict's action"], said))
    unpredicted = sum(x[2] == "not predicted" for x in said)
    print(f"verdicts the runs print: {len(said)}; not predicted: {unpredicted} "
          f"(target: at most 1 in 5)\n")
    rows = [row for r in loaded for row in cases(r)]
    head = ["scenario", "variant", "suggested (leave one out)", "predicted [interval]",
            "measured steady (range)", "error", "within"]
    print(table(head, rows, right={5}) if rows else "no case: no suggested count was measured")
    judged = [x for x in rows if x[6] != "-"]
    hit = sum(x[6] == "yes" for x in judged)
    none = sum(x[6] == "-" for x in rows)
    print(f"within target: {hit} of {len(judged)}; not predicted: {none} of {len(rows)}"
          f"{' (target: at most 1 in 5)' if rows else ''}")
    print(f"load average at end: {os.getloadavg()}")
    return 0 if (judged and hit == len(judged) and none * 5 <= len(rows)
                 and unpredicted * 5 <= len(said)) else 1


if __name__ == "__main__":
    sys.exit(main())
