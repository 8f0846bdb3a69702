"""Ground truth for the differential attribution (issue 3's acceptance test).

Each scenario injects costs known by construction: emulated storage latency (fetch), a
calibrated CPU burn per row (preprocess), an emulated producer->trainer link (transfer) and an
emulated accelerator step (compute). With ``num_workers = 0`` the trainer runs every stage in
sequence, so the true stall of each stage is exactly its injected cost. The harness must name
the bounding stage and land each stall within 15% or 50 ms (whichever is larger) of the truth,
and the parts must close on the measured epoch time within 3%.
"""

from __future__ import annotations

import os
import time

import pytest

from stallbench import scenario
from stallbench.runner import RunOptions, run_scenario

pytestmark = pytest.mark.groundtruth

ROWS, RG, BATCH = 16384, 2048, 1024          # 8 row groups, 16 batches
SHARDS, BATCHES = ROWS // RG, ROWS // BATCH

BASE = f"""
name = "gt"
[dataset]
rows = {ROWS}
row_group_rows = {RG}
files = 1
dense_features = 4
sparse_features = 2
sequence_features = 1
sequence_max_len = 4
[loader]
batch_size = {BATCH}
num_workers = 0
batch_format = "single_buffer"
[model]
kind = "emulated"
[analysis]
method = "chain"
[run]
repeats = 3
"""

CASES = {
    # name: (extra TOML, expected bound, truth in seconds per stall)
    # Overlapped (one worker + trainer-side preload) and long enough to amortise the first
    # batch's fill, which is real data-stage time the trainer waits for.
    "compute_bound": ("[dataset]\nrows = 32768\n[model]\nstep_ms = 30\n"
                      "[loader]\nnum_workers = 1\nprefetch_batches = 4\n", "compute",
                      {"fetch": 0.0, "preprocess": 0.0, "transfer": 0.0}),
    "fetch_bound": ("[model]\nstep_ms = 5\n[storage]\nlatency_ms = 60\n", "fetch",
                    {"fetch": SHARDS * 0.060, "preprocess": 0.0, "transfer": 0.0}),
    "preprocess_bound": ("[model]\nstep_ms = 5\n[preprocess]\ncpu_cost_us_per_row = 30\n",
                         "preprocess", {"fetch": 0.0, "preprocess": ROWS * 30e-6, "transfer": 0.0}),
    "transfer_bound": ("[model]\nstep_ms = 5\n[loader]\nwire_bandwidth_mb_s = 3\n", "transfer",
                       {"fetch": 0.0, "preprocess": 0.0, "transfer": None}),  # from wire bytes
    "mixed": ("[model]\nstep_ms = 10\n[storage]\nlatency_ms = 30\n"
              "[preprocess]\ncpu_cost_us_per_row = 25\n[loader]\nwire_bandwidth_mb_s = 6\n",
              "preprocess", {"fetch": SHARDS * 0.030, "preprocess": ROWS * 25e-6,
                             "transfer": None}),
}


def _merge(base: str, extra: str) -> str:
    """Overlay extra keys onto base, section by section (TOML forbids repeating a table)."""
    sections: dict[str, list[str]] = {}
    order: list[str] = []
    for text in (base, extra):
        current = ""
        for line in text.strip().splitlines():
            if line.startswith("["):
                current = line
                if current not in sections:
                    sections[current] = []
                    order.append(current)
            else:
                sections.setdefault(current, [])
                if current not in order:
                    order.insert(0, current)
                key = line.split("=", 1)[0].strip()
                sections[current] = [ln for ln in sections[current]
                                     if ln.split("=", 1)[0].strip() != key]
                sections[current].append(line)
    return "\n".join(("" if s == "" else s + "\n") + "\n".join(sections[s]) for s in order) + "\n"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("gt-cache")


def _check_case(case: str, cache_dir) -> list[str]:
    """Run one case; return what disagrees with the injected truth (empty: all good)."""
    extra, bound, truth = CASES[case]
    sc = scenario.parse(_merge(BASE, extra), f"<{case}>")
    result = run_scenario(sc, RunOptions(cache_dir=cache_dir, progress=False))
    v = result.variants[0]
    a = v.attribution
    if truth["transfer"] is None:
        bw = sc.base.loader.wire_bandwidth_mb_s * 1e6
        truth = {**truth, "transfer": v.bytes.wire_bytes / bw}
    problems = []
    if a.bound_by != bound:
        problems.append(f"bound {a.bound_by} != {bound}: {a.verdict}")
    for stage, expected in truth.items():
        got = a.part_s(stage)
        if abs(got - expected) > max(0.15 * expected, 0.050):
            problems.append(f"{stage} stall {got:.3f}s vs truth {expected:.3f}s")
    if v.repeats[0].batches != sc.base.dataset.rows // BATCH:
        problems.append(f"batches {v.repeats[0].batches}")
    compute_truth = v.repeats[0].batches * sc.base.model.step_ms / 1000
    if abs(a.compute_s - compute_truth) > max(0.15 * compute_truth, 0.050):
        problems.append(f"compute {a.compute_s:.3f}s vs truth {compute_truth:.3f}s")
    parts = a.compute_s + a.fetch_stall_s + a.preprocess_stall_s + a.transfer_stall_s
    parts += a.overhead_s
    if abs(parts - v.epoch_s.median) > 0.03 * v.epoch_s.median or abs(a.closure_error) > 0.03:
        problems.append(f"parts {parts:.3f}s do not close on epoch {v.epoch_s.median:.3f}s")
    return [f"{case}: {p}" for p in problems]


def _cpu_stat() -> dict[str, float]:
    with open("/proc/stat") as fh:
        f = [float(x) for x in fh.readline().split()[1:9]]
    return dict(zip(("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"), f))


ATTEMPTS = 3
STEAL_LIMIT_CORES = 0.05    # 2.5% of this 2-core machine taken by the hypervisor


@pytest.mark.parametrize("case", list(CASES))
def test_attribution_matches_injected_costs(case: str, cache_dir) -> None:
    # A CPU burn spins on its thread's CPU clock, so CPU taken by anything else (other
    # processes, the hypervisor's steal on this VM) stretches its wall time. Bursts of that
    # come and go on a shared machine: up to three measurements; a harness error shows in all.
    # Each attempt's machine-wide steal and iowait are reported to tell the two apart.
    seen = []
    for _ in range(ATTEMPTS):
        s0, t0 = _cpu_stat(), time.monotonic()
        problems = _check_case(case, cache_dir)
        s1, wall = _cpu_stat(), (time.monotonic() - t0) * os.sysconf("SC_CLK_TCK")
        seen.append({"problems": problems,
                     "steal_cores": round((s1["steal"] - s0["steal"]) / wall, 3),
                     "iowait_cores": round((s1["iowait"] - s0["iowait"]) / wall, 3)})
        if not problems:
            return
    if all(a["steal_cores"] > STEAL_LIMIT_CORES for a in seen):
        # The hypervisor took CPU from this VM during every attempt: the injected costs were
        # not what ran, so the measurement is no evidence either way. Said, not passed.
        pytest.skip(f"{case}: CPU steal above {STEAL_LIMIT_CORES} cores in all {ATTEMPTS} "
                    f"attempts (machine under interference): {seen}")
    pytest.fail(f"{case}: wrong in all {ATTEMPTS} attempts: {seen}")


def test_overlap_hides_a_cheaper_producer(cache_dir) -> None:
    """With one loader worker, a producer cheaper than compute overlaps with it: the harness
    must report compute-bound, not add the preprocess cost to the stall."""
    extra = ("[dataset]\nrows = 32768\n[model]\nstep_ms = 30\n[preprocess]\ncpu_cost_us_per_row = 8\n"
             "[loader]\nnum_workers = 1\nprefetch_batches = 4\n")
    sc = scenario.parse(_merge(BASE, extra), "<overlap>")
    for attempt in range(2):   # one re-measurement absorbs a burst of foreign load
        result = run_scenario(sc, RunOptions(cache_dir=cache_dir, progress=False, repeats=2))
        a = result.variants[0].attribution
        if a.bound_by == "compute" and a.preprocess_stall_s < 0.05:
            break
    assert a.bound_by == "compute", a.verdict
    # Alone, preprocess costs 32768 * 8 us = 262 ms; hidden behind 960 ms of compute.
    assert a.preprocess_stall_s < 0.05
