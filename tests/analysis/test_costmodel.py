"""The what-if from measured costs (issue 58): its mechanics on injected costs.

Pure cases (no timing): the replay's bounds are the inputs' own (one worker never faster than
its CPU per sample allows; CPU-bound workers never more than the cores; a wait overlaps),
the cores shared with a measured foreign load, a wait for a core not taken for a wait a
worker overlaps, a fit whose costs do not replay its own run withheld with the reason, and a
curve point that contradicts the run's figures withheld. The issue's cases as real runs are
``test_issue_cases_*`` (under ``tests/loadcheck.py``'s rule).
"""

from __future__ import annotations

import math
from pathlib import Path

import loadcheck
import pytest

from stallbench.analysis import costmodel as cm

US = 1e-6


def costs(**kw) -> cm.Costs:
    base = dict(cpu=8 * US, handoff=0.0, wait=0.0, trainer_cpu=0.3e-3, trainer_wall=6e-3,
                start_s=0.0, cores=2.0, foreign=0.0, item_rows=2048, batch_rows=1024,
                prefetch=2, fit_workers=1, fit_samples=65536)
    base.update(kw)
    return cm.Costs(**base)


def test_one_worker_never_beats_its_own_cpu_per_sample() -> None:
    # issue 58: "10.1 + 0.8 us CPU/sample": one worker delivers at most ~92k samples/s
    c = costs(cpu=10.1 * US, handoff=0.8 * US, trainer_wall=1e-3)
    run = cm.simulate(c, 1)
    assert run.whole_samples_s <= 1 / (10.9 * US) * 1.001
    # the steady figure as a run measures it counts the first item made before it: a few %
    assert run.steady_samples_s == pytest.approx(1 / (10.9 * US), rel=0.03)
    assert cm.contradiction(c, 1, run.steady_samples_s) == ""
    assert "at most 91,743" in cm.contradiction(c, 1, 150_000)
    assert cm.contradiction(c, 1, 90_000) == ""


def test_cpu_bound_workers_share_the_cores() -> None:
    # issue 58: 4 ms CPU per item, 4 workers on 2 cores: at most 2x one worker, not 3.75x
    c = costs(cpu=4e-3, item_rows=1, batch_rows=1, trainer_wall=0.2e-3, trainer_cpu=0.0,
              fit_samples=400)
    one, four = cm.simulate(c, 1), cm.simulate(c, 4)
    assert four.whole_samples_s / one.whole_samples_s == pytest.approx(2.0, rel=0.03)
    # and a foreign process busy on one core takes its fair share: 4 of ours + 1 on 2 cores
    loaded = cm.simulate(c, 4, foreign=1.0)
    assert loaded.whole_samples_s / one.whole_samples_s == pytest.approx(2.0 * 4 / 5, rel=0.03)


def test_waits_overlap_across_workers() -> None:
    c = costs(cpu=0.5e-3, wait=10e-3, item_rows=1, batch_rows=1, trainer_wall=1e-3,
              trainer_cpu=0.0, fit_samples=600)
    rates = [cm.simulate(c, n).steady_samples_s for n in (1, 2, 4, 8, 16)]
    assert rates[1] == pytest.approx(2 * rates[0], rel=0.05)
    assert rates[3] == pytest.approx(8 / 10.5e-3, rel=0.15)   # 8 workers' own pace
    assert rates[4] <= 1 / 1e-3 * 1.03                         # the trainer binds at 16


def test_zero_workers_add_every_cost_in_turn() -> None:
    c = costs(cpu=8 * US, wait=2 * US, trainer_wall=6e-3, item_rows=1024, batch_rows=1024)
    run = cm.simulate(c, 0)
    per = 10 * US + 6e-3 / 1024
    assert run.whole_samples_s == pytest.approx(1 / per, rel=0.01)


def test_prefetch_bounds_how_far_workers_run_ahead() -> None:
    # a burst per item: the queue decides how much of it the trainer sees
    c = costs(cpu=0.0, wait=20e-3, item_rows=1, batch_rows=1, trainer_wall=5e-3,
              trainer_cpu=0.0, fit_samples=200, prefetch=1)
    deep = cm.simulate(costs(**{**c.__dict__, "prefetch": 8}), 4)
    shallow = cm.simulate(c, 4)
    assert shallow.whole_samples_s <= deep.whole_samples_s * 1.001


class _F:
    """A repeat's figures, as ``repeat_costs`` reads them."""

    def __init__(self, **kw) -> None:
        from stallbench.results import ForeignLoad, StageSeconds
        self.samples, self.batches, self.epoch_s = kw["samples"], kw["batches"], kw["epoch"]
        self.stage_s = StageSeconds(preprocess=kw["pre"], preprocess_cpu=kw["pre_cpu"],
                                    fetch=kw.get("fetch", 0.0), fetch_cpu=kw.get("fetch_cpu", 0.0))
        self.trainer_cpu_s, self.producer_cpu_s = kw["trainer_cpu"], kw.get("producer_cpu")
        self.compute_s, self.trainer_transfer_s = kw["compute"], 0.0
        self.time_to_first_batch_s = 0.01
        self.load = ForeignLoad(wall_s=kw["epoch"], busy_cpu_s=0, own_cpu_s=0, foreign_cpu_s=0,
                                foreign_cores=kw.get("foreign", 0.0), cores=2)


def test_a_wait_for_a_core_is_not_taken_for_a_wait_that_overlaps() -> None:
    # issue 58: a fetch's wall stretched by CPU contention was taken for a sleep; on a full
    # machine (ours + others' cores at the cores) the preprocess stage's wall / CPU is the
    # stretch, and the fetch wall it explains is not a wait
    full = _F(samples=1000, batches=1, epoch=1.0, pre=0.4, pre_cpu=0.2, fetch=0.2,
              fetch_cpu=0.1, trainer_cpu=0.3, compute=0.1, foreign=1.7)
    r = cm.repeat_costs(full, 0, 2.0)
    assert r["wait"] == pytest.approx(0.0, abs=1e-9)
    assert r["foreign"] > 1.7
    quiet = _F(samples=1000, batches=1, epoch=1.0, pre=0.2, pre_cpu=0.2, fetch=0.3,
               fetch_cpu=0.1, trainer_cpu=0.3, compute=0.1, foreign=0.0)
    assert cm.repeat_costs(quiet, 0, 2.0)["wait"] == pytest.approx(0.2 / 1000)


def test_costs_that_do_not_replay_their_run_are_no_basis() -> None:
    c = costs(fit_whole_samples_s=1e6)
    assert "replay the fit run" in cm.consistency(c)
    ok = cm.simulate(c, 1).whole_samples_s
    assert cm.consistency(costs(fit_whole_samples_s=ok)) == ""
    assert "ranks" in cm.consistency(costs(fit_whole_samples_s=ok, ranks=2))
    p = cm.point(c, 2, reason=cm.consistency(c))
    assert p.not_predicted and math.isnan(p.predicted_samples_s)
    assert "exceed" in cm.budget_reason(c, 9, budget=2.0)


def test_an_interval_from_the_repeats_spread_covers_a_costlier_run() -> None:
    c = costs()
    p = cm.point(c, 1, rel_spread=0.10)
    slower = cm.simulate(cm._scaled(c, 1.08), 1).whole_samples_s
    assert p.low_samples_s <= slower <= p.high_samples_s


def _timeline_run(step_s: list[float], startup: int = 0):
    from types import SimpleNamespace as NS
    n = len(step_s)
    return NS(timeline=NS(wait_s=[0.0] * n, transfer_s=[0.0] * n, compute_s=list(step_s)),
              repeats=[NS(phases=NS(startup_batches=startup))])


def test_run_noise_is_the_standard_error_of_a_runs_mean_batch_time() -> None:
    """Truth by construction: batches drawn with a known spread (random means, spreads and
    lengths, seeded), the relative standard error of their mean is sd / (mean sqrt(n));
    ``run_noise`` finds it within 35% on each draw's median over 40 runs, and a run whose
    items come in bursts (every 4th batch 5x) is noisier than an even one of equal mean."""
    import random
    rng = random.Random(58)
    for _ in range(20):
        mean, cv, n = rng.uniform(1e-3, 20e-3), rng.uniform(0.05, 1.0), rng.randrange(60, 2000)
        got = sorted(cm.run_noise(_timeline_run([max(rng.gauss(mean, cv * mean), 0.0)
                                                 for _ in range(n)])) for _ in range(40))
        truth = cv / math.sqrt(n)
        assert got[20] == pytest.approx(truth, rel=0.35), (mean, cv, n)
    bursts = [5e-3 if i % 4 == 0 else 1e-3 for i in range(96)]
    even = [2e-3] * 96
    assert cm.run_noise(_timeline_run(bursts)) > cm.run_noise(_timeline_run(even)) == 0.0
    assert cm.run_noise(_timeline_run([1e-3] * 5)) == 0.0     # too short to say


def test_an_interval_is_never_narrower_than_the_fit_runs_own_noise() -> None:
    """A point built on a run that measures its own rate to +-10% (standard error) gets at
    least a 90% band of two such runs: +-1.645 sqrt(2) x 10% in log."""
    c = costs()
    p = cm.point(c, 1, noise=0.10)
    x = p.predicted_samples_s
    assert math.log(p.high_samples_s / x) >= 1.645 * math.sqrt(2) * 0.10 - 1e-9
    assert math.log(x / p.low_samples_s) >= 1.645 * math.sqrt(2) * 0.10 - 1e-9
    quiet = cm.point(c, 1)
    assert quiet.high_samples_s < p.high_samples_s


# --------------------------------------------------------------------- the issue's case, run
ISSUE = """
name = "issue58-cpu"
[dataset]
rows = 65536
row_group_rows = 2048
files = 1
dense_features = 4
sparse_features = 2
sequence_features = 0
[preprocess]
cpu_cost_us_per_row = 8
[model]
kind = "emulated"
step_ms = 6
[loader]
batch_size = 1024
batch_format = "single_buffer"
[analysis]
differential = false
[run]
repeats = 1
[matrix]
"loader.num_workers" = [0, 1, 2]
"""


def _pairs(text: str, name: str, pairs, tmp_path: Path, tolerance: float,
           need: float) -> None:
    """Run ``text``; each (target, source) count PREDICTED from the source's measured costs
    is within ``tolerance`` of the target's run, or withheld with a reason, and never above
    what the source's own figures allow (``contradiction``)."""
    from stallbench import scenario
    from stallbench.run.runner import RunOptions, run_scenario

    def check() -> list[str]:
        r = run_scenario(scenario.parse(text, f"{name}.toml"),
                         RunOptions(cache_dir=tmp_path, progress=False))
        by = {v.executor.producer_slots: v for v in r.variants}
        problems = []
        for target, src in pairs:
            p = cm.predict_points(by[src], r.machine, r.dataset, [target],
                                  samples=by[target].repeats[0].samples)[0]
            if p.not_predicted:
                print(f"{name}: {target} from {src} withheld: {p.not_predicted}")
                continue
            print(f"{name}: {target} from {src}: {p.predicted_samples_s:,.0f}")
            meas = by[target].throughput_samples_s.median
            c = cm.fit(by[src], r.machine, r.dataset)
            if cm.contradiction(c, target, p.predicted_steady_samples_s):
                problems.append(f"{target} from {src}: contradicts its inputs")
            if abs(p.predicted_samples_s / meas - 1) > tolerance:
                problems.append(f"{target} from {src}: {p.predicted_samples_s:,.0f} vs "
                                f"{meas:,.0f} measured")
        return problems

    loadcheck.attempts(name, check, 2, need=need)


@pytest.mark.groundtruth
def test_issue_case_cpu_decode_on_two_cores(tmp_path: Path) -> None:
    """Issue 58: 4 ms of CPU per item at 4 workers on 2 cores was predicted 3.75x, measured
    1.44x: from 1 worker's costs, 2 and 4 workers within 25% (or withheld)."""
    text = ISSUE.replace("cpu_cost_us_per_row = 8", "cpu_cost_us_per_row = 15.625").replace(
        "row_group_rows = 2048", "row_group_rows = 256").replace(
        "rows = 65536", "rows = 16384").replace("step_ms = 6", "step_ms = 0.5").replace(
        "batch_size = 1024", "batch_size = 256").replace("[0, 1, 2]", "[1, 2, 4]")
    _pairs(text, "issue58-decode", ((2, 1), (4, 2)), tmp_path, 0.25, need=2.25)


@pytest.mark.groundtruth
def test_issue_case_sleep_fetch(tmp_path: Path) -> None:
    """Issue 58: a sleep fetch was predicted 1.90x for 1 worker, measured 1.10x: 1 worker
    from 0 workers' costs (and back) within 15%, or withheld."""
    text = ISSUE.replace("cpu_cost_us_per_row = 8", "cpu_cost_us_per_row = 2").replace(
        "[storage]", "").replace("[preprocess]", "[storage]\nlatency_ms = 12\n[preprocess]")
    _pairs(text, "issue58-sleep", ((1, 0), (0, 1), (2, 1)), tmp_path, 0.15, need=1.25)


@pytest.mark.groundtruth
def test_issue_case_cpu_bound_preprocess_is_predicted_or_withheld(tmp_path: Path) -> None:
    """Issue 58's first case: 8 us/row of CPU, a 6 ms step, 0/1/2 workers; 1 worker was
    predicted 60% too fast. Each count PREDICTED from its neighbour's measured costs is within
    15% of its run or withheld with the reason, and never above one worker's CPU bound."""
    _pairs(ISSUE, "issue58-cpu", ((1, 0), (2, 1), (1, 2)), tmp_path, 0.15, need=2.25)
