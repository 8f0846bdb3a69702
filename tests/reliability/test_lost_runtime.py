"""Class 6 of issue 26: a Ray runtime or a part of it lost mid-run, and a frozen Ray task.

The rules (docs/reliability-rules.md, "A lost runtime"): a runtime stallbench started that
loses its GCS or the trainer node's raylet ends the run at once with one line naming what was
lost and how it ended, exit 2, no result, every process of the runtime stopped by PID, and
Ray's own lines in a log file the line names (``executors/ray/lost.py``); a Ray worker killed
mid-run is retried by Ray and the run completes, with none of Ray's lines on the terminal; a
Ray task that makes no progress for ``[run] progress_timeout_s`` (a transform that never
returns, a worker stopped with ``kill -STOP``) ends the run with the watchdog's one line,
while a slow bulk materialisation that completes tasks is progress.

A trainer rank killed while the ranks meet is one line, torch's C++ log of the surviving
rank in a directory the line names (``trainers/processes._divert_stderr``). A cluster reached
by address (a real ``ray start --head``, tests/raystart.py) that loses its GCS is one line
within ``[run] progress_timeout_s`` (``lost.Vital._poll_gcs``).

Each test starts its own Ray runtime through a ``stallbench run`` subprocess and finds the
process to kill among that subprocess's children (never the session's shared runtime).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
from reliability_helpers import TINY, Watched, no_files, write

CODE = '''
import os, sys, time

def _in_ray_worker():
    return "default_worker" in (sys.argv[0] if sys.argv else "")

def slow(table, **kw):
    if _in_ray_worker():
        open(os.environ["MARK"], "a").write("x")
    time.sleep(float(os.environ.get("SLOW_S", "0.3")))
    return table

def hang(table, **kw):
    if _in_ray_worker():
        open(os.environ["MARK"], "a").write("x")
        time.sleep(10 ** 6)
    return table
'''

RAY = TINY.replace("rows = 4096", "rows = 8192") + """
[executor]
kind = "ray"
cpus = 2
object_store_mb = 100
"""

RAY_LINES = ("core_worker.cc", "task_manager.cc", "(raylet)", "[state-dump]", "raylet.cc",
             "Ray Client connection timed out", "SIGTERM handler is not set")


def _project(tmp_path: Path, fn: str, extra: str = "") -> None:
    (tmp_path / "usercode.py").write_text(CODE)
    write(tmp_path, RAY + f'[preprocess]\ntransforms = ["usercode:{fn}"]\n' + extra)


def _start(tmp_path: Path, env: dict, **more: str) -> tuple[Watched, Path]:
    mark = tmp_path / "mark"
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"],
                {**env, "MARK": str(mark), **more}, tmp_path)
    return w, mark


def _when_producing(w: Watched, mark: Path, name: str, timeout: float = 240,
                    items: int = 1) -> psutil.Process:
    """The first child of the command whose name contains ``name``, once Ray workers have
    started the transform on ``items`` work items (the untimed warm pass before the runs
    does 2: the cpus; ``items = 4`` is inside the measured run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and w.proc.poll() is None:
        kids = w.children()
        if mark.exists() and len(mark.read_text()) >= items:
            for k in kids:
                if name in w.seen.get(k.pid, ""):
                    return k
        time.sleep(0.02)
    code, out, err = w.finish(timeout=60)
    raise AssertionError(f"no {name} while producing (rc {code}): {err[-2000:]}")


def _follow(w: Watched) -> tuple[int, str, str]:
    """Wait for the command, recording every process that appears under it."""
    while w.proc.poll() is None:
        w.children()
        time.sleep(0.05)
    return w.finish(timeout=60)


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("stallbench: error: s.toml: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("name, sig, says", [
    ("raylet", signal.SIGKILL, "the raylet of the trainer's node"),
    ("gcs_server", signal.SIGKILL, "its GCS (gcs_server"),
    pytest.param("raylet", signal.SIGSEGV, "the raylet of the trainer's node",
                 marks=pytest.mark.slow),
])
def test_a_lost_raylet_or_gcs_is_one_line(tmp_path: Path, env: dict, name: str,
                                          sig: signal.Signals, says: str) -> None:
    """Was: rc 1 and Ray's C++ lines (raylet), a 60 s hang and Ray agents left (GCS)."""
    _project(tmp_path, "slow")
    w, mark = _start(tmp_path, env)
    victim = _when_producing(w, mark, name)
    victim.send_signal(sig)
    t0 = time.monotonic()
    code, out, err = _follow(w)
    took = time.monotonic() - t0
    assert code == 2, (code, err[-3000:], out[-2000:])
    line = _one_line(err)
    assert says in line and f"pid {victim.pid}" in line, line
    assert f"killed by {sig.name}" in line and "no result is written" in line, line
    # what it cost: the command's time so far, all lost with the run
    assert re.search(r"killed by SIG\w+ after \d+\.\d s of the command; the run cannot "
                     r"complete", line), line
    assert took < 30, took            # Ray alone: ~60 s for a lost GCS
    log = line.split("(Ray's log: ")[1].rstrip(")")
    assert Path(log).is_file(), log
    for bad in RAY_LINES:
        assert bad not in out + err, (bad, out[-2000:])
    assert no_files(tmp_path / "out")
    assert w.leftovers() == []


def test_a_killed_ray_worker_is_retried_and_the_run_completes(tmp_path: Path,
                                                              env: dict) -> None:
    """A producer's worker process killed mid-run: Ray re-runs its task, every row still
    comes once, the result records the death, and none of Ray's lines reach the terminal."""
    _project(tmp_path, "slow")
    w, mark = _start(tmp_path, env)
    victim = _when_producing(w, mark, "MapBatches", items=4)
    victim.kill()
    code, out, err = _follow(w)
    assert code == 0, (code, err[-3000:])
    for bad in RAY_LINES:
        assert bad not in out + err, (bad, out[-2000:], err[-2000:])
    [result] = list((tmp_path / "out").glob("*.json"))
    faults = json.loads(result.read_text())["variants"][0]["repeats"][0][
        "executor_figures"]["faults"]
    assert faults["worker_deaths"] >= 1 and victim.pid in [
        d["pid"] for d in faults["dead_workers"]], faults
    [line] = [ln for ln in out.splitlines() if ln.startswith("RAY FAULTS:")]
    assert f"pid {victim.pid}" in line and "the run completed" in line, line
    assert w.leftovers() == []


@pytest.mark.parametrize("how", ["hang", pytest.param("sigstop", marks=pytest.mark.slow)])
def test_a_frozen_ray_task_ends_the_run(tmp_path: Path, env: dict, how: str) -> None:
    """A transform that never returns in a Ray worker, or a Ray worker stopped with
    ``kill -STOP``: the watchdog's line naming the Ray executor, exit 2, no result."""
    _project(tmp_path, "hang" if how == "hang" else "slow", "[run]\nprogress_timeout_s = 3\n")
    w, mark = _start(tmp_path, env)
    if how == "sigstop":
        victim = _when_producing(w, mark, "MapBatches", items=4)
        victim.send_signal(signal.SIGSTOP)
    code, out, err = _follow(w)
    assert code == 2, (code, err[-3000:])
    line = _one_line(err)
    assert "run.progress_timeout_s" in line and "for 3 s" in line, line
    assert "the ray executor was waiting on Ray Data's producer tasks" in line, line
    assert no_files(tmp_path / "out")
    assert w.leftovers(grace_s=10) == []


def test_slow_bulk_materialisation_is_progress(tmp_path: Path, env: dict) -> None:
    """A bulk epoch whose tasks take 0.3 s each takes longer than the 2 s timeout before its
    first batch: every finished task moves the clock, so it completes."""
    _project(tmp_path, "slow", "[run]\nprogress_timeout_s = 2\n")
    text = (tmp_path / "s.toml").read_text().replace("batch_size = 512",
                                                     'batch_size = 512\nexecution = "bulk"')
    write(tmp_path, text)
    w, mark = _start(tmp_path, env)
    code, out, err = _follow(w)
    assert code == 0, (code, err[-3000:])
    data = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    ttfb = data["variants"][0]["summary"]["time_to_first_batch_s"]["median"] \
        if "summary" in data["variants"][0] else None
    if ttfb is not None:
        assert ttfb > 2, ttfb       # the wait was longer than the timeout: a real instance
    assert w.leftovers() == []


@pytest.mark.slow
def test_a_lost_simulated_producer_node_completes_and_says_so(tmp_path: Path,
                                                              env: dict) -> None:
    """A worker node of a simulated cluster loses its raylet mid-run: Ray re-runs its tasks
    on the other node, the run completes with its result, the loss is one ``RAY FAULTS``
    line and ``faults.nodes_lost`` names the node; nothing of the cluster is left."""
    (tmp_path / "usercode.py").write_text(CODE)
    write(tmp_path, RAY.replace("cpus = 2\n", "simulated_nodes = 2\ncpus_per_node = 1\n")
          .replace("object_store_mb = 100", "object_store_mb = 80")
          + '[preprocess]\ntransforms = ["usercode:slow"]\n')
    w, mark = _start(tmp_path, env)
    deadline = time.monotonic() + 240
    victim = None
    while victim is None and time.monotonic() < deadline and w.proc.poll() is None:
        kids = w.children()
        if mark.exists() and len(mark.read_text()) >= 4:
            for k in kids:
                try:
                    if k.name() == "raylet" and "--head" not in k.cmdline():
                        victim = k
                        break
                except psutil.Error:
                    continue
        time.sleep(0.02)
    assert victim is not None, w.finish(timeout=60)[2][-2000:]
    victim.kill()
    code, out, err = _follow(w)
    assert code == 0, (code, err[-3000:])
    for bad in RAY_LINES:
        assert bad not in out + err, (bad, out[-2000:], err[-2000:])
    [line] = [ln for ln in out.splitlines() if ln.startswith("RAY FAULTS:")]
    assert "lost 1 producer node(s)" in line and f"raylet, pid {victim.pid}" in line, line
    data = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    lost = data["variants"][0]["repeats"][0]["executor_figures"]["faults"]["nodes_lost"]
    assert len(lost) == 1 and lost[0]["node_id"], lost
    assert w.leftovers(grace_s=10) == []


def test_ray_messages_before_the_log_opens_stay_off_the_terminal(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture
                                                                 ) -> None:
    """Ray's error subscriber starts inside ``ray.init``; the session's log file is known only
    after it. A raylet lost in between had its last 20 log lines printed on stdout (seen in a
    re-run: ``kill -9`` of the raylet while Ray Data was being imported). What Ray hands its
    printer (``print_to_stdstream``, the function its subscriber calls) from ``divert`` on is
    kept and lands in the log file when it opens; ``close`` gives Ray its printer back."""
    from ray._private import worker as ray_worker

    from stallbench.executors.ray.lost import RayLog

    original = ray_worker.print_to_stdstream
    log = RayLog()
    log.divert()
    try:
        ray_worker.print_to_stdstream({"lines": ["Raylet is terminated. early"], "pid": "raylet",
                                       "is_err": False}, ignore_prefix=False)
        log.open(str(tmp_path))
        ray_worker.print_to_stdstream({"lines": ["later"], "pid": "raylet", "is_err": False},
                                      ignore_prefix=False)
        path = log.path
    finally:
        log.close()
    assert ray_worker.print_to_stdstream is original
    out = capsys.readouterr()
    assert "Raylet" not in out.out + out.err and "later" not in out.out + out.err, out
    text = Path(path).read_text()
    assert "(raylet) Raylet is terminated. early\n" in text and "(raylet) later\n" in text, text
    # Diverted but never opened (the runtime did not come up): Ray's printer is given back.
    log2 = RayLog()
    log2.divert()
    log2.close()
    assert ray_worker.print_to_stdstream is original


def test_ray_client_stream_and_rays_warnings_stay_off_the_terminal(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Through Ray Client, what the cluster side prints or logs reaches the driver on the
    client's log stream, printed by ``LogstreamClient`` (a successful run printed the client
    server's "SIGTERM handler is not set because current thread is not the main thread"),
    and Ray's client warns through ``warnings`` when the head is gone. While diverted both
    land in the log; a warning of the user's own code still reaches the terminal; ``close``
    gives everything back, and a scratch log (Ray Client: no session directory here) is
    removed."""
    import warnings

    from ray.util.client.logsclient import LogstreamClient

    from stallbench.executors.ray.lost import RayLog

    seen: list[str] = []
    before = warnings.showwarning
    warnings.showwarning = lambda message, *a, **k: seen.append(str(message))  # the terminal's
    originals = (LogstreamClient.stdstream, LogstreamClient.log, warnings.showwarning)
    stream = LogstreamClient.__new__(LogstreamClient)      # no connection: the printer only
    log = RayLog()
    log.divert()
    try:
        stream.stdstream(level=-2, msg="SIGTERM handler is not set early\n")
        log.open(str(tmp_path), scratch=True)
        stream.log(level=30, msg="a log record of the cluster side")
        warnings.showwarning(UserWarning("Ray Client connection timed out"), UserWarning,
                             "/x/site-packages/ray/util/client/worker.py", 335)
        warnings.showwarning(UserWarning("the user's own"), UserWarning, "/home/u/mytf.py", 3)
        text = Path(log.path).read_text()
        path = log.path
    finally:
        log.close()
        restored = warnings.showwarning
        warnings.showwarning = before
    assert (LogstreamClient.stdstream, LogstreamClient.log, restored) == originals
    out = capsys.readouterr()
    assert "SIGTERM handler" not in out.out + out.err, out
    assert "a log record" not in out.out + out.err, out
    assert "connection timed out" not in out.out + out.err, out
    assert seen == ["the user's own"], seen
    assert "(ray client) SIGTERM handler is not set early\n" in text, text
    assert "(ray client) a log record of the cluster side\n" in text, text
    assert "Ray Client connection timed out" in text, text
    assert not Path(path).exists()


# ---------------------------------------------------------------------- trainer ranks
RANKS = TINY + "[trainers]\nranks = 2\n"
PRINTS = '''
import logging, os, sys

logging.basicConfig()      # at import, in the job's process: the handler holds its stderr

def say(table, **kw):
    if os.environ.get("RANK") is not None:
        print(f"user stdout from rank {os.environ['RANK']}", flush=True)
        print(f"user stderr from rank {os.environ['RANK']}", file=sys.stderr, flush=True)
        logging.getLogger("user").warning(f"user log from rank {os.environ['RANK']}")
    return table
'''


def _ranks_of(w: Watched) -> list[psutil.Process]:
    """The command's rank processes (its direct children, forked: no loader workers here),
    in the order they were started, so rank 0 first."""
    try:
        kids = w.ps.children()
    except psutil.Error:
        return []
    for k in kids:
        w.seen.setdefault(k.pid, "python")
    try:
        return sorted(kids, key=lambda k: (k.create_time(), k.pid))
    except psutil.Error:
        return []


@pytest.mark.parametrize("victim", [0, 1])
def test_a_rank_killed_during_start_up_is_one_line(tmp_path: Path, env: dict,
                                                   victim: int) -> None:
    """``kill -9`` of a trainer rank while the ranks meet (the process group's TCPStore,
    before the other rank connected): was the right last line after ~50 lines of torch's
    C++ log from the surviving rank (``TCPStore.cpp ... TCP client failed to
    connect/validate ... Interrupted system call`` and its C++ frames). Now one line; the
    ranks' own log lines are in a directory the line names (or none is left)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    write(tmp_path, RANKS)
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"], {**env, "TMPDIR": str(tmp)},
                tmp_path)
    deadline = time.monotonic() + 120
    ranks: list[psutil.Process] = []
    while len(ranks) < 2 and time.monotonic() < deadline and w.proc.poll() is None:
        ranks = _ranks_of(w)
        time.sleep(0.002)
    assert len(ranks) >= 2, w.finish(timeout=60)[2][-2000:]
    pid = ranks[victim].pid
    ranks[victim].kill()
    code, out, err = _follow(w)
    assert code == 2, (code, err[-3000:])
    line = _one_line(err.replace("stallbench: error: ", "stallbench: error: s.toml: ", 1))
    assert f"trainer rank {victim} (pid {pid}) killed by SIGKILL before it finished; " \
           f"no result written" in line, line
    assert "TCPStore" not in out + err and "frame #" not in out + err, err[-2000:]
    left = [p.name for p in tmp.iterdir() if p.name.startswith("stallbench-ranks-")]
    if "the ranks' own log lines: " in line:
        named = line.split("the ranks' own log lines: ")[1].rstrip(")")
        assert left == [Path(named).name], (left, named)
        assert any(f.stat().st_size for f in Path(named).iterdir()), named
    else:
        assert left == [], left
    assert no_files(tmp_path / "out")
    assert w.leftovers() == []


def test_ranks_keep_the_users_prints_and_leave_no_log(tmp_path: Path, env: dict) -> None:
    """What the user's code in a rank prints (stdout and Python's stderr) or logs (a handler
    made at import, before the ranks started) still reaches the terminal, as before the
    ranks' fd 2 went to a log file; a run that ends well leaves no log directory."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "usercode.py").write_text(PRINTS)
    write(tmp_path, RANKS + '[preprocess]\ntransforms = ["usercode:say"]\n')
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"], {**env, "TMPDIR": str(tmp)},
                tmp_path)
    code, out, err = _follow(w)
    assert code == 0, (code, err[-3000:])
    for r in (0, 1):
        assert f"user stdout from rank {r}" in out, out[-2000:]
        assert f"user stderr from rank {r}" in err, err[-2000:]
        assert f"user log from rank {r}" in err, err[-2000:]
    assert [p for p in tmp.iterdir() if p.name.startswith("stallbench-ranks-")] == []
    assert w.leftovers() == []


# ------------------------------------------------------------- a cluster reached by address
def test_a_gcs_that_accepts_no_connection_is_lost_after_the_grace() -> None:
    """The watch of a cluster by address (``Vital._poll_gcs``), without Ray: a port that
    listens is not a loss; once it refuses connections for the grace, ``on_lost`` is called
    once, with what was lost and for how long. (The real cluster: the slow test below.)"""
    import socket
    import threading

    from stallbench.executors.ray.lost import Vital

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    port = srv.getsockname()[1]
    said: list[str] = []
    done = threading.Event()
    vital = Vital(gcs=("127.0.0.1", port), gcs_grace_s=1.0)
    vital.watch(lambda what: (said.append(what), done.set()))
    try:
        time.sleep(1.5)                        # listening: more than the grace, no loss
        assert said == []
        srv.close()
        assert done.wait(timeout=30), "the lost GCS was never reported"
        time.sleep(0.6)
    finally:
        vital.closing = True
        srv.close()
    assert len(said) == 1, said
    assert said[0].startswith(f"its GCS at 127.0.0.1:{port} (no connection accepted for "), said
    assert "connection refused" in said[0], said


@pytest.mark.slow      # a real cluster: ~40 s; the watch itself is the fast test above
@pytest.mark.parametrize("client", [False, True], ids=["host-port", "ray-client"])
def test_a_lost_gcs_of_a_cluster_by_address_is_one_line(tmp_path: Path, env: dict,
                                                        client: bool) -> None:
    """A real ``ray start --head`` (tests/raystart.py, stopped by PID) whose ``gcs_server`` is
    killed mid-run: was a 60 s hang (Ray's ``gcs_rpc_server_reconnect_timeout_s``) and rc 1;
    through Ray Client (``ray://``), 62 s, a progress-timeout line that did not say the GCS
    was lost and Ray's "connection timed out" warning. Now one line naming the cluster and its
    GCS, exit 2, within ``[run] progress_timeout_s`` (3 s here), none of Ray's lines on the
    terminal, nothing of stallbench's left running."""
    from raystart import LOOPBACK, RayStartCluster

    cluster = RayStartCluster(token="auto")
    try:
        cluster.start_head(cpus=1, producer=False, client_server=client)
        address = f"ray://{LOOPBACK}:{cluster.client_port}" if client else cluster.address
        mark = tmp_path / "mark"
        # the cluster's workers do not inherit this test's environment: the mark's path is
        # written into the module
        (tmp_path / "usercode.py").write_text(CODE.replace('os.environ["MARK"]',
                                                           repr(str(mark))))
        write(tmp_path, RAY.replace("cpus = 2\n", f'ray_address = "{address}"\n'
                                                  f'connect_timeout_s = 60\n')
              + '[preprocess]\ntransforms = ["usercode:slow"]\n'
              + "[run]\nprogress_timeout_s = 3\n")
        scratch = tmp_path / "tmp"          # Ray Client's driver log is a temp-dir file
        scratch.mkdir()
        w = Watched(["run", "s.toml", "--out", "out", "--no-progress"],
                    {**cluster.client_env(env), "TMPDIR": str(scratch)}, tmp_path)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and w.proc.poll() is None and not (
                mark.exists() and len(mark.read_text()) >= 3):
            w.children()
            time.sleep(0.05)
        [gcs] = [p for p in cluster.processes(0) if p.name() == "gcs_server"]
        assert w.proc.poll() is None, w.finish(timeout=60)[2][-2000:]
        gcs.kill()
        t0 = time.monotonic()
        code, out, err = _follow(w)
        took = time.monotonic() - t0
    finally:
        cluster.stop()
    assert code == 2, (code, err[-3000:], out[-2000:])
    line = _one_line(err)
    shown = address.removeprefix("ray://")
    assert f"the Ray cluster at {shown} (executor.ray_address) lost its GCS at " \
           f"{cluster.address} (no connection accepted for " in line, line
    assert "the run cannot complete and no result is written" in line, line
    if client:                               # the scratch log is kept: the line names it
        assert f"(Ray's log: {scratch}/stallbench-driver-" in line, line
    assert took < 30, took                   # Ray alone: 60 s, then rc 1
    for bad in RAY_LINES:
        assert bad not in out + err, (bad, out[-2000:])
    assert no_files(tmp_path / "out")
    assert w.leftovers() == []
    assert not cluster.current_cluster_file.exists() and cluster.processes() == []


def test_a_raylet_refusing_connections_is_gone_and_a_listening_one_is_not() -> None:
    """A node lost near a run's end is still alive in the GCS's records (its health checks
    take ~15-30 s): its node-manager port refusing a connection says it is gone. A port that
    accepts, or no address, is not a loss."""
    import socket

    from stallbench.executors.ray.cluster import RayRuntime

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        assert RayRuntime.raylet_gone(("127.0.0.1", port)) is None
    why = RayRuntime.raylet_gone(("127.0.0.1", port))      # closed now: refused
    assert why is not None and f"port {port}" in why and "." not in why, why
    assert RayRuntime.raylet_gone(("", 0)) is None
