"""stallbench on real clusters made with ``ray start`` on this machine (tests/raystart.py): a
head (the trainer's node, 0 CPUs) and two worker nodes of 1 CPU that carry the producer
resource, with Ray's token authentication on; and a one-node cluster with it off.

What is checked: the three address forms connect ("host:port", "auto", "ray://"), with the
token and without; producers run on the worker nodes only; every batch arrives exactly once
and in order (a digest of each batch against the local executor's); each way a connection can
fail is one line naming its cause (nothing listening, not Ray, token missing, token rejected,
version mismatch); losing a worker node mid-epoch completes on the other one without losing
or repeating a row, and losing the last one fails with one line instead of hanging. Every
process a cluster started is stopped at the end of the module (by PID), also on failure.

The clusters are started once for the module (tens of seconds on a loaded 2-core machine);
stallbench runs in subprocesses (``ray_cluster_driver.py`` or the CLI): a Ray driver is per
process, and this one may hold the session's local Ray.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from raystart import LOOPBACK, RayStartCluster, stop_all
from stallbench import scenario
from stallbench.errors import ScenarioError
from stallbench.executors import EXECUTORS
from stallbench.executors.ray.cluster import RayRuntime
from stallbench.pipeline import Plan, dataset_for

pytestmark = pytest.mark.ray

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "ray_cluster_driver.py"
# GCS health checks fast enough that a lost node is declared dead in ~5 s, not ~15 s, and
# loose enough that a raylet slowed down by a loaded machine is not (5 missed checks of 1 s,
# 2 s each to answer).
FAST_HEALTH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5,
               "health_check_timeout_ms": 2000, "health_check_initial_delay_ms": 1000}

SCENARIO = """
name = "raycluster"
[dataset]
rows = {rows}
row_group_rows = 300
files = 2
dense_features = 3
sparse_features = 2
sequence_features = 2
sequence_max_len = 5
[preprocess]
transforms = ["log_dense", {{name = "hash_ids", buckets = 1000}}]
cpu_cost_us_per_row = {cost}
[model]
kind = "emulated"
step_ms = 1
[loader]
batch_size = 128
batch_format = "single_buffer"
[executor]
kind = "ray"
ray_address = "{address}"
connect_timeout_s = 30
object_store_mb = 64
[analysis]
differential = false
"""


def _text(address: str, rows: int = 2400, cost: float = 0.0) -> str:
    return SCENARIO.format(address=address, rows=rows, cost=cost)


# ----------------------------------------------------------------------------- clusters

@pytest.fixture(scope="module")
def clusters() -> Any:
    """Both clusters (one after the other: on a loaded 2-core machine, starting them side by
    side makes raylets miss Ray's 30 s start-up limit), stopped at the end, also on failure."""
    token = RayStartCluster(token="auto")
    plain = RayStartCluster(token=None)
    try:
        token.start_head(system_config=FAST_HEALTH)
        token.add_node(cpus=1)
        token.add_node(cpus=1)
        token.wait_for_nodes(3)
        plain.start_head(cpus=1, producer=False, client_server=False)
        yield {"token": token, "plain": plain}
    finally:
        stop_all([token, plain])      # one TERM grace for both (GCS and raylets: KILL at once)
        # nothing of either cluster is left, and no current-cluster file points at them
        left = token.processes() + plain.processes()
        assert not left, [p.pid for p in left]
        assert not token.current_cluster_file.exists() and not plain.current_cluster_file.exists()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("raycluster-cache")


_TRUTH: dict[str, list[str]] = {}


def _digests(text: str, cache: Path, file: str) -> list[str]:
    """What the trainer gets from the local executor: the ground truth, batch by batch.

    Computed with the injected CPU cost set to 0 and the address left out, once per remaining
    scenario: neither changes a batch (``cpu_cost_us_per_row`` is a busy loop before the
    transforms, ``Preprocess.__call__``; the address is the executor's), and the cost was
    paid in full here a second time, in this process, beside the cluster (~5 s of 6000 rows
    at 0.8 ms). The run on the cluster keeps its cost: that is what makes a node die
    mid-epoch."""
    from ray_cluster_driver import digest

    cfg = scenario.parse(text, file).base
    cfg = dataclasses.replace(cfg, preprocess=dataclasses.replace(cfg.preprocess,
                                                                  cpu_cost_us_per_row=0.0))
    key = repr(dataclasses.replace(cfg, executor=None))
    if key not in _TRUTH:
        plan = Plan.create(cfg, dataset_for(cfg, cache, file), scenario_file=file)
        ex = EXECUTORS.get("local")(cfg, file)
        ex.start()
        try:
            _TRUTH[key] = [digest(b) for o in ex.run(plan) for b, _, _ in plan.receive(o)]
        finally:
            ex.stop()
    return _TRUTH[key]


class _Driver:
    """``ray_cluster_driver.py`` in its own process, its stdout read line by line."""

    def __init__(self, tmp: Path, text: str, cache: Path, env: dict[str, str]) -> None:
        self.path = tmp / "s.toml"
        self.path.write_text(text)
        self.out = tmp / "out.json"
        self.err = open(tmp / "stderr.txt", "w+")
        self.proc = subprocess.Popen([sys.executable, str(DRIVER), str(self.path), str(cache),
                                      str(self.out)], env=env, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True)
        self.batches = 0

    def wait_for_batches(self, n: int, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        assert self.proc.stdout is not None
        while self.batches < n and time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("BATCH"):
                self.batches = int(line.split()[1])

    def finish(self, timeout: float = 240) -> tuple[int, dict[str, Any], str]:
        try:
            # Bounded as a whole: a read of stdout to its end had no end of its own (a Ray
            # Client connection that came up slowly once held a test 153 s).
            self.proc.communicate(timeout=timeout)
            rc = self.proc.returncode
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self.err.seek(0)
        err = self.err.read()
        self.err.close()
        return rc, (json.loads(self.out.read_text()) if self.out.exists() else {}), err


def _run(tmp: Path, text: str, cache: Path, env: dict[str, str]) -> tuple[int, dict, str]:
    return _Driver(tmp, text, cache, env).finish()


def _head_ids(result: dict[str, Any]) -> set[str]:
    return {n["id"] for n in result["nodes"] if n["head"]}


# ----------------------------------------------------------------------- runs that succeed

def test_host_port_with_token_every_batch_once_on_worker_nodes(clusters: dict, cache: Path,
                                                               tmp_path: Path) -> None:
    c = clusters["token"]
    text = _text(c.address, rows=4800)
    want = _digests(text, cache, "s.toml")
    rc, got, err = _run(tmp_path, text, cache, c.client_env())
    assert rc == 0, err[-3000:]
    assert got["digests"] == want                 # every batch exactly once, in order
    ray_fig = got["figures"]["ray"]
    used = set(ray_fig["producer_nodes"])
    workers = {n["id"] for n in got["nodes"] if n["resources"].get("stallbench_cpu_node")}
    assert used and used <= workers and not used & _head_ids(got), (used, got["nodes"])
    assert got["producer_resources"] == {"stallbench_cpu_node": 1.0}
    assert got["slots"] == 2 and got["producer_nodes"] == 2
    assert ray_fig["cluster"]["mode"] == "address" and ray_fig["complete"]
    assert got["figures"]["faults"]["duplicates_dropped"] == 0


def test_ray_client_address_with_token(clusters: dict, cache: Path, tmp_path: Path) -> None:
    c = clusters["token"]
    text = _text(f"ray://{LOOPBACK}:{c.client_port}")
    want = _digests(text, cache, "s.toml")
    rc, got, err = _run(tmp_path, text, cache, c.client_env())
    if _client_server_failed(rc, err):
        first = err[-1500:] + _client_server_log(c, err)
        time.sleep(5)
        (tmp_path / "again").mkdir()
        rc, got, err = _run(tmp_path / "again", text, cache, c.client_env())
        err = f"{err}\n--- first attempt:\n{first}"
    assert rc == 0, err[-6000:]
    assert got["client"] is True and got["digests"] == want
    assert not set(got["figures"]["ray"]["producer_nodes"]) & _head_ids(got)
    # Ray Data's figures from the pump actor, read after the run (``RayExecutor._finish``)
    ops = got["figures"]["ray"]["operators"]
    assert any("MapBatches" in op["name"] and op["tasks"] > 0 for op in ops), ops


def _client_server_failed(rc: int, err: str) -> bool:
    """Whether a run failed because Ray's proxier could not start the per-client server.

    The proxier starts one server process per client connection, on the first port of
    23000-23999 that a bind test finds free; every cluster's proxier starts at 23000, so two
    test clusters whose first clients connect within the seconds a server takes to start
    pick the same port, and one server exits at start ("Starting Ray client server failed",
    or an exception inside ``start_specific_server``: both "Initialization failure from
    server"). Seen only in whole-suite runs, never alone. Ray's own start-up, not
    stallbench's: one more connection, seconds later (the other server then holds its port
    and the bind test skips it), and a failure then is a failure."""
    return rc != 0 and "Initialization failure from server" in err and (
        "start_specific_server" in err or "Starting Ray client server failed" in err)


def _client_server_log(c: RayStartCluster, err: str) -> str:
    """The tail of the Ray Client server log that a "Starting Ray client server failed. See
    ray_client_server_PORT.err" names, read from the head's session before the cluster goes."""
    import re

    m = re.search(r"ray_client_server_(\d+)\.err", err)
    if not m:
        return ""
    logs = c.base / "ray" / "session_latest" / "logs"
    out = []
    for name in (f"ray_client_server_{m.group(1)}.err", f"ray_client_server_{m.group(1)}.out",
                 "ray_client_server.err"):
        try:
            out.append(f"--- {name}:\n{(logs / name).read_text(errors='replace')[-2000:]}")
        except OSError as exc:
            out.append(f"--- {name}: {exc}")
    return "\n".join(out)


FROZEN = """
import sys, time

def freeze(table, **kw):
    if "default_worker" in (sys.argv[0] if sys.argv else ""):
        time.sleep(8)       # never returns within the run's 2 s; bounded for the next tests
    return table
"""


def test_ray_client_run_is_watched(clusters: dict, tmp_path: Path) -> None:
    """Through Ray Client the dataset runs in the pump actor on the head node: the trainer
    asks it for its producers' progress while it waits, so a producer that does not return
    ends the run after ``[run] progress_timeout_s`` with the watchdog's line (it was a wait
    without an end: the pump's task completions were not seen). The run failed: its scratch
    log of what the cluster side printed is kept and the line names it."""
    c = clusters["token"]
    (tmp_path / "frozen.py").write_text(FROZEN)
    (tmp_path / "s.toml").write_text(
        _text(f"ray://{LOOPBACK}:{c.client_port}").replace(
            'transforms = ["log_dense", {name = "hash_ids", buckets = 1000}]',
            'transforms = ["frozen:freeze"]') + "[run]\nprogress_timeout_s = 2\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**c.client_env(), "STALLBENCH_CACHE": str(tmp_path / "cache"),
           "TMPDIR": str(scratch)}
    def run() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "stallbench", "run", "s.toml", "--out",
                               "out", "--no-progress"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
    r = run()
    if _client_server_failed(r.returncode, r.stderr):
        for f in scratch.glob("stallbench-driver-*.log"):
            f.unlink()
        time.sleep(5)
        r = run()
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("stallbench: error:")]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert "run.progress_timeout_s" in lines[0] and "for 2 s" in lines[0], lines[0]
    assert "run through Ray Client by the pump actor (pid " in lines[0], lines[0]
    kept = list(scratch.glob("stallbench-driver-*.log"))
    assert len(kept) == 1 and lines[0].endswith(f" (Ray's log: {kept[0]})"), (kept, lines[0])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_cli_auto_with_token_end_to_end(clusters: dict, tmp_path: Path) -> None:
    """The steps of docs/ray.md: ``ray_address = "auto"`` finds the cluster through the
    current-cluster file of ``RAY_TMPDIR``, the token comes from the environment."""
    c = clusters["token"]
    (tmp_path / "s.toml").write_text(_text("auto"))
    env = {**c.client_env(), "STALLBENCH_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "stallbench", "run", "s.toml", "--out", "out",
                        "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (result,) = list((tmp_path / "out").glob("*.json"))
    v = json.loads(result.read_text())["variants"][0]
    ray_fig = v["repeats"][0]["executor_figures"]["ray"]
    assert ray_fig["cluster"]["mode"] == "address" and ray_fig["cluster"]["cpu_nodes"] == 2
    assert ray_fig["cluster"]["head_node_id"] not in ray_fig["producer_nodes"]
    assert v["repeats"][0]["samples"] == 2400
    assert v["executor"]["producer_nodes"] == 2 and v["executor"]["producer_slots"] == 2
    assert not v["executor"]["nodes_simulated"]


def test_auth_off_cluster_runs_without_token(clusters: dict, cache: Path, tmp_path: Path) -> None:
    """A cluster without token auth and without producer nodes: producers run where Ray puts
    them (the head's CPU)."""
    c = clusters["plain"]
    text = _text(c.address)
    want = _digests(text, cache, "s.toml")
    rc, got, err = _run(tmp_path, text, cache, c.client_env())
    assert rc == 0, err[-3000:]
    assert got["digests"] == want and got["producer_resources"] == {}


def test_token_against_auth_off_cluster_is_named(clusters: dict,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver in token mode on a cluster without it connects, but its tasks' results never
    come back (its own gRPC server wants the token the workers do not have): seen as a run
    that waited forever. It is refused up front instead."""
    c = clusters["plain"]
    msg = _connect_error(_text(c.address), monkeypatch,
                         {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "f" * 64})
    assert "runs without token authentication, but this process would use it" in msg, msg
    assert "RAY_AUTH_MODE=disabled" in msg, msg


# ---------------------------------------------------------------- connections that fail

def _connect_error(text: str, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> str:
    """The one-line error of connecting (in this process: the probe fails before any
    ``ray.init``, so a Ray runtime of this test session does not matter)."""
    for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = scenario.parse(text, "s.toml").base.executor
    t0 = time.time()
    with pytest.raises(ScenarioError) as e:
        RayRuntime(spec, "s.toml")._connect(spec.ray_address)
    assert e.value.key == "executor.ray_address"
    assert "\n" not in str(e.value)
    assert time.time() - t0 < 25, "a cause that is known at once must not wait for a time-out"
    return str(e.value)


@pytest.mark.parametrize("form", ["gcs", "client"])
def test_token_missing_is_named(clusters: dict, monkeypatch: pytest.MonkeyPatch,
                                tmp_path: Path, form: str) -> None:
    c = clusters["token"]
    addr = c.address if form == "gcs" else f"ray://{LOOPBACK}:{c.client_port}"
    # a token exists (a file), but RAY_AUTH_MODE is unset: Ray sends none to an explicit address
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text(c.token or "")
    msg = _connect_error(_text(addr), monkeypatch, {"HOME": str(tmp_path)})
    assert "requires token authentication and this process sends no token" in msg, msg
    assert "RAY_AUTH_MODE is unset" in msg and "RAY_AUTH_MODE=token" in msg, msg


def test_token_rejected_is_named(clusters: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    c = clusters["token"]
    msg = _connect_error(_text(c.address), monkeypatch,
                         {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64})
    assert "rejected this process's token (from RAY_AUTH_TOKEN)" in msg, msg


def test_token_mode_without_any_token_is_named(clusters: dict, monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """Ray's C++ side aborts the process on this one: it must be caught before Ray runs."""
    c = clusters["token"]
    msg = _connect_error(_text(c.address), monkeypatch,
                         {"RAY_AUTH_MODE": "token", "HOME": str(tmp_path)})
    assert "RAY_AUTH_MODE=token but no token was found" in msg, msg


def test_not_ray_is_named(clusters: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ray Client port given as a GCS address: it speaks gRPC, but is not a GCS."""
    c = clusters["token"]
    msg = _connect_error(_text(f"{LOOPBACK}:{c.client_port}"), monkeypatch, c.auth_env())
    assert "is not a Ray cluster" in msg and "not a Ray GCS" in msg, msg


def test_version_mismatch_is_named(clusters: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster records the Ray and Python versions it was started with (GCS key
    CLUSTER_METADATA, what ``ray.init`` compares); here it says 2.0.0, then is put back."""
    c = clusters["plain"]
    edit = ("import json, sys\n"
            "from ray._raylet import GcsClient\n"
            "g = GcsClient(address=sys.argv[1])\n"
            "old = g.internal_kv_get(b'CLUSTER_METADATA', namespace=b'cluster', timeout=10)\n"
            "meta = json.loads(old) if sys.argv[2] == 'old' else {**json.loads(old), "
            "'ray_version': '2.0.0'}\n"
            "if sys.argv[2] == 'old': meta = json.loads(sys.argv[3])\n"
            "g.internal_kv_put(b'CLUSTER_METADATA', json.dumps(meta).encode(), True, "
            "namespace=b'cluster', timeout=10)\n"
            "print(old.decode())\n")
    r = subprocess.run([sys.executable, "-c", edit, c.address, "new"], env=c.client_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    original = r.stdout.strip().splitlines()[-1]
    try:
        msg = _connect_error(_text(c.address), monkeypatch, c.auth_env())
    finally:
        r = subprocess.run([sys.executable, "-c", edit, c.address, "old", original],
                           env=c.client_env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
    assert "Ray version mismatch" in msg and "it runs Ray 2.0.0" in msg, msg


def test_nothing_listening_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from raystart import free_port

    msg = _connect_error(_text(f"{LOOPBACK}:{free_port()}"), monkeypatch, {})
    assert "nothing is listening" in msg, msg


def test_auto_without_cluster_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """"auto" with an empty temp dir finds no current-cluster file. Ray's "auto" then looks
    for any gcs_server process on the machine (there are always some here: this module's
    clusters, other people's): that scan is stubbed to find none."""
    from ray._private import services

    monkeypatch.setattr(services, "find_gcs_addresses", lambda: [])
    msg = _connect_error(_text("auto"), monkeypatch, {"RAY_TMPDIR": str(tmp_path),
                                                      "RAY_AUTH_MODE": "disabled"})
    assert "\"auto\" found no running Ray cluster" in msg, msg
    assert str(tmp_path / "ray" / "ray_current_cluster") in msg, msg


def test_http_server_is_not_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Quiet(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), Quiet)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        msg = _connect_error(_text(f"127.0.0.1:{srv.server_port}"), monkeypatch, {})
    finally:
        srv.shutdown()
        srv.server_close()
    # http.server answers an HTTP/2 preface with an error page (no status line: HTTP/0.9 style)
    assert "is not a Ray cluster: it answered \"" in msg and "where Ray speaks gRPC" in msg, msg


# -------------------------------------------------------------------------- lost nodes

def test_worker_node_lost_mid_epoch_completes_every_row_once(clusters: dict, cache: Path,
                                                             tmp_path: Path) -> None:
    """One of the two producer nodes loses its raylet (SIGKILL by PID) while producers run:
    Ray declares the node dead, re-runs its tasks on the other node, and the trainer gets
    every batch exactly once and in order."""
    c = clusters["token"]
    # 20 row groups of 300 rows at 0.8 ms/row: ~5 s of producer work over the two nodes
    text = _text(c.address, rows=6000, cost=800)
    want = _digests(text, cache, "s.toml")
    d = _Driver(tmp_path, text, cache, c.client_env())
    d.wait_for_batches(3)
    assert d.batches >= 3, "the run did not start"
    killed = c.kill_node(2)
    rc, got, err = d.finish()
    assert rc == 0, err[-3000:]
    assert len(got["digests"]) == len(want) and got["digests"] == want
    faults = got["figures"]["faults"]
    lost = faults.get("nodes_lost", [])
    assert len(lost) == 1, (killed, faults)
    assert got["figures"]["ray"]["complete"]
    # Ray's own lines about the lost node (its raylet's last log lines, [state-dump] blocks)
    # go to the driver's Ray log file, not the terminal (executors/ray/lost.py)
    assert "[state-dump]" not in err and "(raylet)" not in err, err[-3000:]
    c.nodes[2].resources.clear()                  # for the next test: one producer node left


@pytest.mark.slow      # a node added and lost: ~30 s; the loss itself: the driver test above
def test_cli_says_a_lost_producer_node_and_what_it_cost(clusters: dict, tmp_path: Path) -> None:
    """Campaign case 38, as users run it (the CLI): a producer node added to the cluster
    loses its raylet (SIGKILL by PID) mid-run. The run completes, prints one ``RAY FAULTS``
    line naming the lost node and the run's time with the loss, records it in
    ``faults.nodes_lost``, and none of Ray's lines about the node (``[state-dump]``, the
    raylet's last log lines) reach the terminal. A node lost near the run's end, before the
    GCS's health checks declare it dead, is found by its refused node-manager port."""
    c = clusters["token"]
    node = c.add_node(cpus=1)
    try:
        c.wait_for_nodes(3)                   # the head, node 1 and this one (2 was lost)
        mark = tmp_path / "mark"
        (tmp_path / "usercode.py").write_text(
            "def mark(table, **kw):\n"
            f"    open({str(mark)!r}, 'a').write('x')\n"
            "    return table\n")
        text = _text(c.address, rows=6000, cost=800).replace(
            'transforms = ["log_dense"', 'transforms = ["usercode:mark", "log_dense"')
        (tmp_path / "s.toml").write_text(text)
        env = {**c.client_env(), "STALLBENCH_CACHE": str(tmp_path / "cache")}
        proc = subprocess.Popen([sys.executable, "-m", "stallbench", "run", "s.toml", "--out",
                                 "out", "--no-progress"], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 240
            while proc.poll() is None and time.time() < deadline and not (
                    mark.exists() and len(mark.read_text()) >= 6):
                time.sleep(0.05)
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            c.kill_node(node.index)
            out, err = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        node.resources.clear()                # for the next test: one producer node left
    assert proc.returncode == 0, err[-3000:]
    assert "[state-dump]" not in out + err and "(raylet)" not in out + err, (out + err)[-3000:]
    [line] = [ln for ln in out.splitlines() if ln.startswith("RAY FAULTS:")]
    assert "lost 1 producer node(s): node " in line and "the run completed" in line, line
    assert "the run with the loss took " in line, line
    [result] = list((tmp_path / "out").glob("*.json"))
    faults = json.loads(result.read_text())["variants"][0]["repeats"][0][
        "executor_figures"]["faults"]
    assert len(faults["nodes_lost"]) == 1, faults


def test_last_producer_node_lost_fails_with_one_line(clusters: dict, cache: Path,
                                                    tmp_path: Path) -> None:
    """With no producer node left, Ray would wait forever for the producer resource; the
    trainer's watchdog ends the run with one line (exit 2) instead."""
    c = clusters["token"]
    alive = [n.index for n in c.nodes if n.resources]
    assert alive == [1], alive
    d = _Driver(tmp_path, _text(c.address, rows=6000, cost=800), cache, c.client_env())
    d.wait_for_batches(3)
    c.kill_node(1)
    t0 = time.time()
    rc, _, err = d.finish(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.startswith("stallbench: error:")]
    assert rc == 2 and len(lines) == 1, err[-3000:]
    assert "no live producer node left" in lines[0], lines[0]
    assert time.time() - t0 < 60
