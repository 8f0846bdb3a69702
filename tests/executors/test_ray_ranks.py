"""Ray's data-parallel ranks: one stallbench-mode pipeline split across the ranks by
``streaming_split(N, equal=True)`` (``executors.ray.ranks``), on the session's real Ray.

*Exactly once, with equal=True.* A Ray row is one trainer batch here. The split gives every
rank the same number of batches: it may cut a work item's block between two ranks and it
drops the last ``batches mod N`` batches of the run. So "exactly once" means: no row reaches
two ranks (or one rank twice), every row a rank trained on is a row of the job, every rank
takes the same number of steps, and the rows that did not arrive are exactly the dropped
batches, fewer than N of them, which the result counts (``exactly_once``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from raystart import kill_left
from stallbench import scenario
from stallbench.analysis.ranks import exactly_once
from stallbench.errors import ScenarioError
from stallbench.executors import EXECUTORS
from stallbench.pipeline import FULL, Plan, dataset_for
from stallbench.trainers import job
from stallbench.trainers.rank import row_hashes

pytestmark = pytest.mark.ray

# 7 row groups of 450 rows (the last 400): 6 x 3 + 2 = 20 batches of 200
TEXT = """
name = "ray-ranks"
[dataset]
rows = 3100
row_group_rows = 450
files = 1
dense_features = 3
sparse_features = 2
sequence_features = 1
sequence_max_len = 4
[model]
kind = "emulated"
step_ms = 1
[loader]
batch_size = 200
batch_format = "single_buffer"
[executor]
kind = "ray"
concurrency = {concurrency}
[trainers]
ranks = {ranks}
"""
BATCHES = 20


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray-ranks-cache")


def _plan(cache: Path, ranks: int, concurrency: int = 2) -> Plan:
    cfg = scenario.parse(TEXT.format(ranks=ranks, concurrency=concurrency), "r.toml").base
    return Plan.create(cfg, dataset_for(cfg, cache, "r.toml"), scenario_file="r.toml")


def _reference(plan: Plan) -> Counter[int]:
    out: Counter[int] = Counter()
    for i in range(len(plan.items)):
        for batch, _rows, _tx in plan.receive(plan.produce(i)):
            out.update(row_hashes(batch))
    return out


@pytest.mark.parametrize("ranks,concurrency", [pytest.param(2, 1, marks=pytest.mark.slow),
                                               (3, 2)])   # CI time: 3 ranks covers 2
def test_every_row_once_across_ranks_except_what_equal_drops(ray_session: Any, cache: Path,
                                                             ranks: int,
                                                             concurrency: int) -> None:
    plan = _plan(cache, ranks, concurrency)
    ex = EXECUTORS.get("ray")(plan.config, "r.toml")
    ex.start()
    try:
        jr = job.run_job(plan, ex, [FULL], 1, row_hashes=True)
    finally:
        ex.stop()
    (runs,) = jr.rank_runs["full"]
    ref = _reference(plan)
    per_rank = [Counter(r.row_hashes) for r in runs]
    got = sum(per_rank, Counter())
    assert max(got.values()) == 1, "a row reached a rank twice"
    assert not got - ref, "a rank trained on a row that is not the job's"
    steps = {r.figures.batches for r in runs}
    assert len(steps) == 1, f"equal split, unequal steps: {steps}"
    dropped = BATCHES % ranks
    assert sum(r.figures.batches for r in runs) == BATCHES - dropped
    e = exactly_once(runs, plan)
    assert (e.duplicate_batches, e.dropped_batches) == (0, dropped)
    assert (e.expected_batches, e.expected_rows) == (BATCHES, 3100)
    missing = ref - got
    assert sum(missing.values()) == e.dropped_rows == 3100 - sum(got.values())
    assert 0 < e.dropped_rows <= dropped * 200 if dropped else e.dropped_rows == 0
    # one pipeline for all: the same producer processes served every rank
    assert len({p for r in runs for p in r.producer_pids}) <= concurrency + 1
    assert jr.launcher == "ray_actors" and not jr.producers_per_rank


def test_ray_ranks_with_stock_mode_are_refused(tmp_path: Path) -> None:
    from stallbench.run.preflight import check_scenario

    sc = scenario.parse(TEXT.format(ranks=2, concurrency=1) + "", "r.toml")
    text = sc.text.replace('kind = "ray"', 'kind = "ray"\nray_mode = "stock"')
    with pytest.raises(ScenarioError, match="executor.ray_mode"):
        check_scenario(scenario.parse(text, "r.toml"))


def test_cli_ctrl_c_stops_every_rank_actor_and_ray(tmp_path: Path) -> None:
    """Ctrl-C while Ray ranks train: exit 130, no result, and no process left (the rank actors
    are killed, the runtime stallbench started is shut down)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import uuid

    import psutil

    text = TEXT.format(ranks=2, concurrency=1).replace("step_ms = 1", "step_ms = 300")
    (tmp_path / "s.toml").write_text(text + "[analysis]\ndifferential = false\n")
    tag = uuid.uuid4().hex
    env = {**os.environ, "STALLBENCH_CACHE": str(tmp_path / "cache"), "STALLBENCH_TEST_TAG": tag}
    env.pop("RAY_ADDRESS", None)

    def tagged() -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter():
            try:
                if (p.environ().get("STALLBENCH_TEST_TAG") == tag
                        and p.status() != psutil.STATUS_ZOMBIE):
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def ranks_up() -> bool:
        for p in tagged():
            try:
                if "RankActor" in " ".join(p.cmdline()):
                    return True
            except psutil.Error:
                pass
        return False

    proc = subprocess.Popen([sys.executable, "-m", "stallbench", "run", "s.toml", "--no-progress"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and not ranks_up():
            time.sleep(0.5)
        time.sleep(3.0)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert not (tmp_path / "results").exists()
    deadline = time.time() + 15
    while tagged() and time.time() < deadline:
        time.sleep(0.3)
    left = tagged()
    assert not left, f"processes left behind: {kill_left(left)}"


def test_a_collective_failed_by_a_dead_peer_names_the_dead_peer(ray_session: Any) -> None:
    """Rank 0's collective fails because rank 1's actor died (gloo raises at once; Ray may
    report the death later, and on a busy core it did, so the run ended with rank 0's gloo
    traceback and exit 1): ``_dead_peer`` finds rank 1's death; with no dead peer (the other
    rank finished, or failed otherwise) it answers None: rank 0's own error is the cause."""
    import os
    import time

    import ray

    from stallbench.executors.ray.ranks import RayRankLauncher

    @ray.remote(num_cpus=0)
    class Rank:
        def fail(self, after: float) -> None:
            time.sleep(after)
            raise RuntimeError("gloo: a remote worker hanging or bugs in the application")

        def die(self, after: float) -> None:
            time.sleep(after)
            os._exit(7)

        def ok(self) -> int:
            return 1

    a, b, c = Rank.remote(), Rank.remote(), Rank.remote()
    refs = [a.fail.remote(0.0), b.die.remote(0.5)]
    with pytest.raises(RuntimeError):
        ray.get(refs[0])
    got = RayRankLauncher._dead_peer(None, refs, 0)
    assert got is not None and got[0] == 1
    assert isinstance(got[1], ray.exceptions.RayActorError)
    assert RayRankLauncher._dead_peer(None, [c.fail.remote(0.0), c.ok.remote()], 0) is None
    assert RayRankLauncher._dead_peer(None, [c.ok.remote(), c.fail.remote(0.0)], 0) is None
    for x in (a, c):
        ray.kill(x)


def test_a_store_port_taken_before_rank_0_binds_it_is_chosen_again() -> None:
    """The port ``free_port`` read can be taken before rank 0's store binds it (EADDRINUSE,
    once in a CI run): the ranks are set up again on a new port, at most PORT_ATTEMPTS
    times; any other failure is raised as it came."""
    from types import SimpleNamespace

    from stallbench.executors.ray import ranks
    from stallbench.trainers.base import RankError

    cls = ranks.RayRankLauncher
    ports: list[int] = []

    def flaky(port: int) -> None:
        ports.append(port)
        if len(ports) == 1:
            raise RankError("trainer rank 0 (Ray actor) failed: DistNetworkError: The server "
                            "socket has failed to listen ... EADDRINUSE, address already in use")

    fake = SimpleNamespace(PORT_ATTEMPTS=cls.PORT_ATTEMPTS, _start=flaky)
    cls.start(fake)
    assert len(ports) == 2
    other = SimpleNamespace(PORT_ATTEMPTS=3, _start=lambda port: (_ for _ in ()).throw(
        RankError("trainer rank 1 failed: ValueError")))
    with pytest.raises(RankError, match="ValueError"):
        cls.start(other)
