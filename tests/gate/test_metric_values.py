"""What the gate reads off a variant: per-repeat attribution parts (the stored attribution's
formula on each repeat's own runs) and the rows they make, "preprocess stall +8 pt"."""

from __future__ import annotations

import pytest

import factories
from stallbench.gate import pairs as ab
from stallbench.gate import ab as ab_gate
from stallbench.gate import baseline as gate
from stallbench.gate import formats
from stallbench.gate import metrics as metric_values
from stallbench.analysis import differential
from stallbench.gate.rule import METRICS

CHAIN = ["no_fetch", "no_fetch_preprocess", "no_fetch_preprocess_transfer", "compute_only"]


def attributed(full: list[float], runs: dict[str, list[float]], method: str = "chain"):
    """A variant whose full runs and ablation runs took these epochs (10,000 samples each)."""
    v = factories.variant("v", [10_000 / e for e in full])
    v.ablations = {k: [factories.repeat(10_000 / e) for e in es] for k, es in runs.items()}
    v.attribution = differential.analyze({"full": full, **runs}, method)
    return v


def chain(full: float, fetch: float, prep: float, xfer: float, over: float) -> dict:
    """Epochs of the chain's runs for known parts (compute = the rest)."""
    nf = full - fetch
    nfp = nf - prep
    free = nfp - xfer
    return {"no_fetch": nf, "no_fetch_preprocess": nfp, "no_fetch_preprocess_transfer": free,
            "compute_only": free - over}


def test_parts_per_repeat_are_the_stored_formula_on_each_repeat() -> None:
    r1, r2 = chain(10.0, 1.0, 3.0, 0.5, 0.2), chain(12.0, 1.2, 4.8, 0.6, 0.2)
    v = attributed([10.0, 12.0], {k: [r1[k], r2[k]] for k in CHAIN})
    prep = metric_values.per_repeat(v, METRICS["preprocess_stall_share"])
    assert prep == pytest.approx([0.30, 0.40])
    assert metric_values.per_repeat(v, METRICS["fetch_stall_share"]) == pytest.approx([0.1, 0.1])
    assert metric_values.per_repeat(v, METRICS["loader_overhead_share"]) == pytest.approx(
        [0.02, 0.2 / 12])
    one = attributed([10.0], {k: [r1[k]] for k in CHAIN})
    assert metric_values.per_repeat(one, METRICS["preprocess_stall_share"])[0] == pytest.approx(
        one.attribution.preprocess_stall_s / one.attribution.epoch_s)


def test_shapley_parts_per_repeat() -> None:
    names = [a.name for a in differential.ablations_for("shapley") if a.name != "full"]
    epochs = {n: [8.0 if "preprocess" in n else 10.0] for n in names}
    epochs["compute_only"] = [6.0]
    v = attributed([10.0], epochs, "shapley")
    assert metric_values.per_repeat(v, METRICS["preprocess_stall_share"]) == pytest.approx(
        [v.attribution.preprocess_stall_s / 10.0])


def test_no_attribution_means_no_rows_not_empty_rows() -> None:
    plain = factories.result([factories.variant("v", [100.0, 101.0, 99.0])])
    report = gate.compare([plain], [plain], threshold=0.1, n_boot=50)
    assert {r.metric for r in report.rows} == {"throughput", "stall_share"}


def test_preprocess_stall_plus_8_points_is_a_slower_row() -> None:
    pairs = []
    for i in range(12):
        full = 10.0 + 0.3 * i                          # drift
        a = chain(full, 1.0, 2.0, 0.5, 0.2)
        # the commit adds preprocess work worth 8 points of its (longer) epoch
        b = chain(full * 1.1, 1.1, 2.0 * 1.1 + 0.08 * full * 1.1, 0.55, 0.22)
        va = attributed([full], {k: [a[k]] for k in CHAIN})
        vb = attributed([full * 1.1], {k: [b[k]] for k in CHAIN})
        ra, rb = factories.result([va], scenario="s"), factories.result([vb], scenario="s")
        pairs.append(ab.Pair(i, "a", {"s": ra}, {"s": rb}))
    report = ab_gate.paired_report(pairs, threshold=0.05, alpha=0.05)
    rows = {r.metric: r for r in report.rows}
    assert set(rows) >= {"preprocess_stall_share", "fetch_stall_share", "transfer_stall_share",
                         "loader_overhead_share"}
    prep = rows["preprocess_stall_share"]
    assert prep.verdict == "slower"
    assert prep.change == pytest.approx(0.08)
    assert formats.format_change(prep) == "+8.0 pt"
    assert rows["fetch_stall_share"].verdict == "same"
