"""Class 4 of issue 26 with trainer ranks: Flight with ranks works and leaves nothing behind,
and a rank that stops progressing ends the run.

The rules: ``kind = "flight"`` with ``[trainers] ranks = N`` starts the servers once for the
job and every rank streams its own work items from them (``FlightExecutor.rank_options``);
whether the run succeeds, fails, or is ended by SIGINT/SIGTERM, no ``stallbench-flight-*``
temp dir and no server or rank process is left. ``[run] progress_timeout_s`` watches ranks
too (``trainers.processes``: each rank publishes its last progress and what it is doing): a
rank stuck in its set-up or waiting for its batch, or stopped with ``kill -STOP``, ends the
run with one line naming the rank, its pid and what it waited for, exit 2, no result, no rank
process left. The same for Ray's rank actors (``executors.ray.ranks``, the same rule in
``trainers.base.stalled``), whose shared producers freeze: no process of the run and no
progress file left.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from reliability_helpers import TINY, Watched, no_files, one_error_line, write

CODE = '''
import os, time

_calls = [0]

def hang_rank1_setup(table, **kw):
    if os.environ.get("RANK") == "1":
        time.sleep(10 ** 6)
    return table

def hang_rank1_later(table, **kw):
    _calls[0] += 1
    if os.environ.get("RANK") == "1" and _calls[0] > 1:
        time.sleep(10 ** 6)
    return table

def stop_worker_rank1(table, **kw):
    from torch.utils.data import get_worker_info
    import signal
    if os.environ.get("RANK") == "1" and get_worker_info() is not None:
        os.kill(os.getpid(), signal.SIGSTOP)
    return table

def mark(table, **kw):
    d = os.environ.get("MARK_DIR")
    if d:
        with open(os.path.join(d, f"rank{os.environ.get('RANK')}-{os.getpid()}"), "a") as f:
            f.write("x")
    return table

def _in_ray_worker():
    import sys
    return "default_worker" in (sys.argv[0] if sys.argv else "")

def hang_in_ray_after(table, **kw):
    """A Ray producer freezes on its call number AFTER + 1 (every Ray worker counts in
    one file): the untimed passes before the run make the first calls."""
    if _in_ray_worker():
        with open(os.environ["MARK"], "a") as f:
            f.write("x")
        with open(os.environ["MARK"]) as f:
            if len(f.read()) > int(os.environ["AFTER"]):
                time.sleep(10 ** 6)
    return table

def fail_in_server(table, **kw):
    import sys
    if sys.argv[0].endswith("server.py"):     # a Flight server, after its warm-up passes
        _calls[0] += 1
        if _calls[0] > 4:
            raise ValueError("the server refuses")
    return table
'''

FLIGHT = '[executor]\nkind = "flight"\nflight_local_servers = {servers}\n[trainers]\nranks = 2\n'


@pytest.fixture
def tmp_env(tmp_path: Path, env: dict) -> dict:
    """Temp files of the command (Flight servers' logs) go where the test can look."""
    (tmp_path / "tmp").mkdir()
    return {**env, "TMPDIR": str(tmp_path / "tmp")}


def _run(tmp_path: Path, env: dict, text: str) -> tuple[int, str, str, list[str]]:
    (tmp_path / "usercode.py").write_text(CODE)
    write(tmp_path, text)
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path)
    while w.proc.poll() is None:
        w.children()
        time.sleep(0.05)
    code, out, err = w.finish()
    return code, out, err, w.leftovers()


def _clean(tmp_path: Path) -> None:
    assert list((tmp_path / "tmp").glob("stallbench-flight-*")) == []


@pytest.mark.parametrize("servers, extra, differential", [
    pytest.param(1, "", "false", marks=pytest.mark.slow),  # CI time: 2 servers cover 1 too
    # CI time: one run checks both exactly-once over 2 servers with 2 streams each and the
    # ablation runs (they read the servers' caches of each rank's own row groups); they were
    # two runs of ~20 s each
    (2, "flight_streams_per_server = 2\n", "true"),
])
def test_flight_with_ranks_completes_exactly_once(tmp_path: Path, tmp_env: dict, servers: int,
                                                  extra: str, differential: str) -> None:
    pytest.importorskip("pyarrow.flight")
    code, out, err, left = _run(tmp_path, tmp_env, TINY.replace(
        "differential = false", f"differential = {differential}") + FLIGHT.format(
        servers=servers).replace("[trainers]", extra + "[trainers]"))
    assert code == 0, err[-3000:]
    assert left == [] and _clean(tmp_path) is None
    (res,) = (tmp_path / "out").glob("*.json")
    v = json.loads(res.read_text())["variants"][0]
    once = v["ranks"]["exactly_once"]
    assert once["delivered_rows"] == once["expected_rows"] == 4096, once
    assert once["duplicate_batches"] == 0 and once["dropped_batches"] == 0, once
    assert v["ranks"]["producers_per_rank"] is False
    # the servers were started once, by stallbench's process, and both ranks read from them
    figs = v["repeats"][0]["executor_figures"]["ranks"]
    assert len({tuple(f["flight"]["server_pids"]) for f in figs}) == 1
    assert [f["flight"]["work_items"] for f in figs] == [4, 4]
    # the ablation runs (with ranks, from the servers' caches) completed and were attributed
    assert ("stall attribution" in out) == (differential == "true"), out[-3000:]


def test_a_failing_flight_rank_leaves_nothing(tmp_path: Path, tmp_env: dict) -> None:
    pytest.importorskip("pyarrow.flight")
    code, out, err, left = _run(tmp_path, tmp_env, TINY + FLIGHT.format(servers=1)
                                + '[preprocess]\ntransforms = ["usercode:fail_in_server"]\n')
    one_error_line(type("R", (), {"returncode": code, "stderr": err})(), "the server refuses")
    assert left == [] and _clean(tmp_path) is None
    assert no_files(tmp_path / "out")


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT"])   # CI time: SIGINT's path is SIGTERM's
def test_a_signal_during_flight_ranks_leaves_nothing(tmp_path: Path, tmp_env: dict,
                                                     sig: int) -> None:
    pytest.importorskip("pyarrow.flight")
    write(tmp_path, TINY.replace("step_ms = 1", "step_ms = 1000") + FLIGHT.format(servers=1))
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"], tmp_env, tmp_path)
    # the server and both ranks exist (set-up or the run: 4 steps of 1 s; either way the
    # signal must leave nothing)
    assert w.wait_for(lambda kids: len(kids) >= 3, timeout=180)
    time.sleep(3)
    w.interrupt(sig)
    _clean(tmp_path)
    assert no_files(tmp_path / "out")


def _safe(procs: list) -> list:
    out = []
    for p in procs:
        try:
            p.cmdline()
            out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.mark.parametrize("fn, says, base", [
    ("hang_rank1_setup", "trainer rank 1 (pid ", TINY),
    ("hang_rank1_later", "for trainer rank 1 (pid ", TINY),
    ("stop_worker_rank1", "loader worker(s) (pids ",
     TINY.replace("batch_size = 512", "batch_size = 512\nnum_workers = 1")),
])
def test_a_stuck_rank_ends_the_run(tmp_path: Path, env: dict, fn: str, says: str,
                                   base: str) -> None:
    code, out, err, left = _run(tmp_path, env, base + "[trainers]\nranks = 2\n"
                                f'[preprocess]\ntransforms = ["usercode:{fn}"]\n'
                                "[run]\nprogress_timeout_s = 2\n")
    line = one_error_line(type("R", (), {"returncode": code, "stderr": err})(),
                          "s.toml: run.progress_timeout_s:", says, "no result written")
    assert "rank 0 " not in line, line
    assert no_files(tmp_path / "out")
    assert left == []


def test_a_stopped_rank_ends_the_run(tmp_path: Path, env: dict) -> None:
    """``kill -STOP`` of rank 1 mid-run: rank 0 waits in the all-reduce (not blamed), and the
    launcher names rank 1 as stopped."""
    (tmp_path / "usercode.py").write_text(CODE)
    marks = tmp_path / "marks"
    marks.mkdir()
    write(tmp_path, TINY.replace("step_ms = 1", "step_ms = 1000")
          + '[trainers]\nranks = 2\n[preprocess]\ntransforms = ["usercode:mark"]\n'
          + "[run]\nprogress_timeout_s = 2\n")
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"],
                {**env, "MARK_DIR": str(marks)}, tmp_path)
    # rank 1 has done its warm-up row group and produced its first measured one: 3 steps
    # of 1 s are still to come when it is stopped
    assert w.wait_for(lambda kids: any(m.read_text() == "xx" for m in marks.glob("rank1-*")),
                      timeout=180), "rank 1 never started its run"
    (m,) = marks.glob("rank1-*")
    rank1 = int(m.name.split("-")[1])
    os.kill(rank1, signal.SIGSTOP)
    try:
        code, out, err = w.finish(timeout=120)
    finally:
        try:
            os.kill(rank1, signal.SIGCONT)
        except OSError:
            pass
    line = one_error_line(type("R", (), {"returncode": code, "stderr": err})(),
                          "s.toml: run.progress_timeout_s:", f"(pid {rank1}) is stopped")
    assert "trainer rank 1" in line, line
    assert no_files(tmp_path / "out")
    assert w.leftovers() == []


RAY_RANKS = ('[executor]\nkind = "ray"\ncpus = 2\nobject_store_mb = 100\n[trainers]\nranks = 2\n'
             '[preprocess]\ntransforms = ["usercode:hang_in_ray_after"]\n'
             '[run]\nprogress_timeout_s = 3\n')


@pytest.mark.parametrize("after, where", [
    # CI time: the same watch; the pass over the splits comes first, so it ends sooner
    (4, "the ranks' untimed pass over their splits"),
    # 2 calls of the executor's warm-up, 8 of the split's pass, then 1 of the measured run
    pytest.param(11, "the measured run", marks=pytest.mark.slow),
])
def test_a_frozen_ray_producer_ends_a_ray_ranks_run(tmp_path: Path, env: dict, after: int,
                                                    where: str) -> None:
    """Ray's rank actors wait on one pipeline split between them; a producer task that never
    returns there was a wait forever (the ranks' watchdog watched only the ``processes``
    launcher). Both ranks wait for their batch: the line names them, their pids and the Ray
    executor's producers."""
    (tmp_path / "usercode.py").write_text(CODE)
    write(tmp_path, TINY + RAY_RANKS)
    mark = tmp_path / "mark"
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"],
                {**env, "MARK": str(mark), "AFTER": str(after)}, tmp_path)
    while w.proc.poll() is None:
        w.children()
        time.sleep(0.05)
    code, out, err = w.finish()
    line = one_error_line(type("R", (), {"returncode": code, "stderr": err})(),
                          "s.toml: run.progress_timeout_s: no trainer rank made progress for 3 s",
                          "trainer ranks 0 (pid ", " and 1 (pid ",
                          "waiting for their next batch from the ray executor",
                          "Ray Data's producer tasks", "no result written")
    assert len(mark.read_text()) > after, (where, mark.read_text(), line)   # it did freeze
    assert no_files(tmp_path / "out")
    assert w.leftovers(grace_s=10) == []
    assert list(Path("/dev/shm").glob(f"stallbench-progress-{w.proc.pid}-*")) == []
