"""Ground truth for the differential attribution (issue 3's acceptance test).

Each scenario injects costs known by construction: emulated storage latency (fetch), a
calibrated CPU burn per row (preprocess), an emulated producer->trainer link (transfer) and an
emulated accelerator step (compute). With ``num_workers = 0`` the trainer runs every stage in
sequence, so the true stall of each stage is exactly its injected cost. The harness must name
the bounding stage and land each stall within 15% or 50 ms (whichever is larger) of the truth,
and the parts must close on the measured epoch time within 3%.
"""

from __future__ import annotations

import pytest

from stallbench import scenario
from stallbench.run.runner import RunOptions, run_scenario

import loadcheck
from stallbench.stages.costs import precise_wait

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
    parts += a.overhead_s + a.startup_cost_s       # start-up is its own part (steady basis)
    if abs(parts - v.epoch_s.median) > 0.03 * v.epoch_s.median or abs(a.closure_error) > 0.03:
        problems.append(f"parts {parts:.3f}s do not close on epoch {v.epoch_s.median:.3f}s")
    return [f"{case}: {p}" for p in problems]


ATTEMPTS = 3
NEED_CORES = 1.25    # the trainer's thread (0 workers) plus pyarrow's decode threads and the sampler


# Cases whose every injected cost is a wait (emulated storage, link or step: measured at
# 0.15-0.25 of a core over their run) are marked ``waits``: tests/run_suite.sh runs them beside
# the CPU-bound timing tests, each of which leaves them the ~0.5 core they need. The cases
# with a CPU burn run alone.
WAIT_ONLY = {"compute_bound", "fetch_bound", "transfer_bound"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.waits) if c in WAIT_ONLY
                                  else c for c in CASES])
def test_attribution_matches_injected_costs(case: str, cache_dir) -> None:
    # A CPU burn spins on its thread's CPU clock, so CPU taken by anything else (other
    # processes, the hypervisor's steal on this VM) stretches its wall time. Bursts of that
    # come and go on a shared machine: up to three measurements, each with the load it ran
    # under; a harness error shows in all of them (tests/loadcheck.py says when it skips).
    loadcheck.attempts(case, lambda: _check_case(case, cache_dir), ATTEMPTS, NEED_CORES)


def test_overlap_hides_a_cheaper_producer(cache_dir) -> None:
    """With one loader worker, a producer cheaper than compute overlaps with it: the harness
    must report compute-bound, not add the preprocess cost to the stall."""
    extra = ("[dataset]\nrows = 32768\n[model]\nstep_ms = 30\n[preprocess]\ncpu_cost_us_per_row = 8\n"
             "[loader]\nnum_workers = 1\nprefetch_batches = 4\n")
    sc = scenario.parse(_merge(BASE, extra), "<overlap>")

    def check() -> list[str]:
        result = run_scenario(sc, RunOptions(cache_dir=cache_dir, progress=False, repeats=2))
        a = result.variants[0].attribution
        # Alone, preprocess costs 32768 * 8 us = 262 ms; hidden behind 960 ms of compute.
        if a.bound_by != "compute" or a.preprocess_stall_s >= 0.05:
            return [f"{a.bound_by}, preprocess stall {a.preprocess_stall_s:.3f}s: {a.verdict}"]
        return []

    loadcheck.attempts("overlap", check, 2, NEED_CORES + 1)   # the worker's core as well


# ------------------------------------------------------------------ start-up vs steady state

# Pipelines whose costs are waits (emulated storage latency, emulated step), so they hold on a
# busy machine too: 16 row groups of 2048 rows, 32 batches of 1024 rows, 20 ms per row group
# of storage latency (10 ms a batch) and a 20 ms step.
STARTUP = ("[dataset]\nrows = 32768\n[storage]\nlatency_ms = 20\n[model]\nstep_ms = 20\n"
           "[run]\nrepeats = 2\n")
DELAY_S = 0.4


def _phase_figures(workers: int, delay: float, cache_dir, monkeypatch) -> dict:
    """Run the STARTUP pipeline with ``delay`` seconds injected before the first work item of
    every run that uses the loader (a slow executor start: connecting, importing, forking)."""
    from stallbench.executors.local import LocalExecutor

    original = LocalExecutor.run

    def delayed(self, plan):  # a generator, like the original: the delay lands in the run
        precise_wait(delay)
        yield from original(self, plan)

    monkeypatch.setattr(LocalExecutor, "run", delayed)
    try:
        extra = STARTUP + f"[loader]\nnum_workers = {workers}\n"
        sc = scenario.parse(_merge(BASE, extra), "<startup>")
        v = run_scenario(sc, RunOptions(cache_dir=cache_dir, progress=False)).variants[0]
    finally:
        monkeypatch.setattr(LocalExecutor, "run", original)
    a, ph = v.attribution, v.phases
    return {"startup_cost_s": ph.startup_cost_s.median, "attr_startup_s": a.startup_cost_s,
            "steady_stall_share": ph.steady_stall_share.median,
            "steady_epoch_s": a.steady_epoch_s, "bound": a.bound_by, "basis": a.basis,
            "epoch_s": v.epoch_s.median, "verdict": a.verdict}


# With 1 worker (compute-bound) it is the same rule on a second path, ~18 s: `slow` (make
# test-all); the default run keeps 0 workers here and the compute-bound start-up case below.
@pytest.mark.parametrize("workers, bound", [
    pytest.param(0, "fetch", marks=pytest.mark.waits),          # 0.08 of a core
    pytest.param(1, "compute", marks=pytest.mark.slow)])
def test_injected_startup_is_recovered_and_steady_state_does_not_move(
        workers: int, bound: str, cache_dir, monkeypatch) -> None:
    """Inject a known start-up cost (0.4 s before the first work item of every loader run):
    the start-up part must grow by 0.4 s within max(25%, 60 ms), the steady figures must not
    move (steady stall share within 4 points, steady epoch within 8%, same bound), with 0
    workers (fetch-bound: the trainer waits 10 ms of storage per 30 ms batch) and 1 worker
    (compute-bound: the worker's 10 ms hide behind the 20 ms step)."""
    def check() -> list[str]:
        clean = _phase_figures(workers, 0.0, cache_dir, monkeypatch)
        slow = _phase_figures(workers, DELAY_S, cache_dir, monkeypatch)
        problems = []
        for f in (clean, slow):
            if f["bound"] != bound or f["basis"] != "steady state":
                problems.append(f"bound {f['bound']} ({f['basis']}), expected {bound}: {f['verdict']}")
        tol = max(0.25 * DELAY_S, 0.060)
        for key in ("startup_cost_s", "attr_startup_s"):
            got = slow[key] - clean[key]
            if abs(got - DELAY_S) > tol:
                problems.append(f"{key} grew by {got:.3f}s, injected {DELAY_S}s")
        if abs(slow["steady_stall_share"] - clean["steady_stall_share"]) > 0.04:
            problems.append(f"steady stall share moved: {clean['steady_stall_share']:.3f} -> "
                            f"{slow['steady_stall_share']:.3f}")
        if abs(slow["steady_epoch_s"] / clean["steady_epoch_s"] - 1) > 0.08:
            problems.append(f"steady epoch moved: {clean['steady_epoch_s']:.3f} -> "
                            f"{slow['steady_epoch_s']:.3f}s")
        if slow["epoch_s"] - clean["epoch_s"] < 0.5 * DELAY_S:
            problems.append(f"the delay did not reach the run: {clean['epoch_s']:.3f} -> "
                            f"{slow['epoch_s']:.3f}s")
        return [f"workers={workers}: {p}" for p in problems]

    loadcheck.attempts(f"startup[{workers}]", check, 2, NEED_CORES + workers)


@pytest.mark.waits                   # waits: 0.10 of a core over its run
def test_compute_bound_pipeline_is_compute_bound_despite_its_startup(cache_dir, monkeypatch) -> None:
    """The issue's case: an emulated 40 ms step, 1 worker that keeps up easily, 1024-row
    batches, 47 batches, and 0.25 s to the first batch (injected: the run it was seen in had
    that much start-up). Named compute-bound with a steady-state stall under 3%; the same runs
    on whole epochs would carry the start-up as stall (checked, so this test can tell).

    The trainer's own data path is overlapped (a receive thread, and on a GPU the pin thread
    and a preloaded copy): with none, a GPU trainer copies each batch from pageable memory on
    its own thread (~1.4 ms a batch measured on an H100, 3.5% of this epoch), which is a real
    transfer stall, not this case's."""
    from stallbench.executors.local import LocalExecutor

    original = LocalExecutor.run

    def delayed(self, plan):
        precise_wait(0.25)
        yield from original(self, plan)

    extra = ("[dataset]\nrows = 48128\nrow_group_rows = 8192\n[model]\nstep_ms = 40\n"
             "[loader]\nnum_workers = 1\nprefetch_batches = 2\npin_memory = true\n"
             "device_prefetch = 1\n")
    sc = scenario.parse(_merge(BASE, extra), "<compute-bound>")

    def check() -> list[str]:
        monkeypatch.setattr(LocalExecutor, "run", delayed)
        try:
            v = run_scenario(sc, RunOptions(cache_dir=cache_dir, progress=False)).variants[0]
        finally:
            monkeypatch.setattr(LocalExecutor, "run", original)
        a = v.attribution
        problems = []
        if v.repeats[0].batches != 47:
            problems.append(f"{v.repeats[0].batches} batches")
        if a.bound_by != "compute" or not a.conclusive:
            problems.append(f"not conclusively compute-bound: {a.verdict}")
        if not a.steady_attributed_stall_share < 0.03:
            problems.append(f"steady attributed stall {a.steady_attributed_stall_share:.1%}")
        if not v.phases.steady_stall_share.median < 0.03:
            problems.append(f"steady trainer stall {v.phases.steady_stall_share.median:.1%}")
        if not v.stall_share.median > 0.03 + 0.2 / v.epoch_s.median:
            problems.append(f"whole-run stall {v.stall_share.median:.1%} does not hold the start-up")
        return problems

    loadcheck.attempts("compute-bound", check, 2, NEED_CORES + 1)
