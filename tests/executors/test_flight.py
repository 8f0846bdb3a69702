"""The Flight executor over real loopback sockets: the local executor's batches, in order and
exactly once, from local servers and from `stallbench serve`; ablation caches built by the
servers; the servers' CPU, stage times and link bytes measured; servers that fail, do not
answer or serve another scenario; and no server process left behind.

Local servers cost ~3-5 s to start here (a fresh interpreter importing torch and pyarrow), so
the in-process tests share one started executor; tests that need their own servers say so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from stallbench import scenario
from stallbench.errors import ScenarioError, UserError
from stallbench.executors import EXECUTORS
from stallbench.executors.flight import link, protocol
from stallbench.measure.probe import measured_run
from stallbench.pipeline import Ablation, Plan, StageCaches, dataset_for

ROOT = Path(__file__).resolve().parents[2]

BASE = """
name = "flighttest"
[dataset]
rows = 2400
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
step_ms = {step}
[loader]
batch_size = 128
batch_format = "{fmt}"
collate = "{collate}"
compression = "{comp}"
execution = "{execution}"
prefetch_factor = 1
[executor]
kind = "{kind}"
flight_local_servers = 2
flight_streams_per_server = 2
"""


def _text(**kw: Any) -> str:
    d = dict(cost=0, step=0, fmt="single_buffer", collate="producer", comp="none",
             execution="streaming", kind="flight")
    d.update(kw)
    return BASE.format(**d)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flight-cache")


def _plan(cache: Path, text: str | None = None, **kw: Any) -> Plan:
    cfg = scenario.parse(text or _text(**kw), "flight.toml").base
    return Plan.create(cfg, dataset_for(cfg, cache, "flight.toml"), scenario_file="flight.toml")


@pytest.fixture(scope="module")
def flight_ex(cache: Path) -> Any:
    """One started executor with 2 local servers x 2 streams, shared by the module."""
    ex = EXECUTORS.get("flight")(_plan(cache).config, "flight.toml")
    ex.start()
    yield ex
    pids = ex.worker_pids()
    ex.stop()
    _assert_gone(pids)


def _assert_gone(pids: list[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        time.sleep(0.05)
    assert not alive, f"Flight servers left running: {alive}"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _batches(plan: Plan, ex: Any) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in b.items()} for out in ex.run(plan)
            for b, _, _ in plan.receive(out)]


def _local(plan: Plan) -> list[dict[str, torch.Tensor]]:
    ex = EXECUTORS.get("local")(plan.config, "flight.toml")
    with ex:
        return _batches(plan, ex)


def _same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    """Tensor by tensor, the keys of the local executor's batches (``b``): padded or jagged."""
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert set(x) == set(y), (sorted(x), sorted(y))
        for k in y:
            assert torch.equal(x[k], y[k]), k


# ------------------------------------------------------------------------- same batches

@pytest.mark.parametrize("fmt,collate,comp,execution", [
    ("single_buffer", "producer", "none", "streaming"),
    ("single_buffer", "trainer", "zstd", "bulk"),
    ("jagged", "producer", "zstd", "streaming"),      # the default: the lossless Arrow wire
    ("jagged", "trainer", "none", "streaming"),
])
def test_same_batches_as_local_in_order_exactly_once(flight_ex: Any, cache: Path, fmt: str,
                                                     collate: str, comp: str,
                                                     execution: str) -> None:
    """Checksum of the whole epoch: the local executor's batches, in its order, from four
    streams of two servers; every row group exactly once. With ``jagged`` the batches are the
    local jagged ones (``seq_values`` + ``seq_offsets``), not padded."""
    plan = _plan(cache, fmt=fmt, collate=collate, comp=comp, execution=execution)
    got = _batches(plan, flight_ex)
    _same(got, _local(plan))
    fig = flight_ex.run_figures()["flight"]
    assert fig["complete"] and fig["work_items"] == len(plan.items) == 8, fig
    assert fig["streams"] == 4 and fig["ipc_compression"].startswith(comp), fig


def test_every_server_owns_its_share_of_the_row_groups(flight_ex: Any, cache: Path) -> None:
    plan = _plan(cache)
    seen: dict[int, set[int]] = {}
    for out in flight_ex.run(plan):
        seen.setdefault(out.times.worker, set()).add(out.shard)
    pids = flight_ex.worker_pids()
    assert sorted(seen) == sorted(pids)               # both servers produced
    for k, pid in enumerate(pids):                    # server k: shards k modulo 2
        assert seen[pid] == {s for s in range(8) if s % 2 == k}, seen


def test_ablation_caches_are_built_by_the_servers(flight_ex: Any, cache: Path) -> None:
    plan = _plan(cache, collate="trainer")
    want = _local(plan)
    caches = StageCaches.build(plan)
    flight_ex.prepare(plan, caches)
    for ab in (Ablation(fetch=True), Ablation(True, True), Ablation(True, True, True),
               Ablation(preprocess=True)):
        p = plan.with_ablation(ab, caches)
        outs = list(flight_ex.run(p))
        if ab.transfer:                               # nothing but the trailers crossed
            assert all(o.payloads is None for o in outs)
        _same([{k: v.clone() for k, v in b.items()} for o in outs for b, _, _ in p.receive(o)],
              want)
        if ab.fetch:                                  # the servers did not read Parquet
            assert sum(o.times.storage_bytes for o in outs) == 0


def test_a_run_stopped_early_leaves_the_servers_ready(flight_ex: Any, cache: Path) -> None:
    plan = _plan(cache)
    capped = Plan.create(plan.config.replace(loader=dataclasses.replace(
        plan.config.loader, max_batches=3)), plan.dataset, scenario_file="flight.toml")
    fig, _, _ = measured_run(capped, flight_ex, capped.build_compute())
    assert fig.batches == 3
    _same(_batches(plan, flight_ex), _local(plan))    # the next run is whole


# --------------------------------------------------------------------------------- figures

def test_measured_run_sees_the_servers_cpu_stages_and_link_bytes(flight_ex: Any,
                                                                 cache: Path) -> None:
    """Ground truth: 200 us of CPU per row in the servers' preprocess (2400 rows: 0.48 s),
    which their own clocks must see; the link's bytes from the kernel's socket counters
    against the Arrow IPC size of what was sent."""
    plan = _plan(cache, cost=200)
    fig, _, _ = measured_run(plan, flight_ex, plan.build_compute())
    assert fig.samples == 2400 and fig.producer_processes == 2, fig
    assert fig.stage_s.preprocess_cpu >= 0.48 * 0.95, fig.stage_s
    assert fig.producer_cpu_s is not None and fig.producer_cpu_s >= 0.48 * 0.95, fig.producer_cpu_s
    assert fig.stage_s.transfer_producer > 0 and fig.stage_s.transfer_trainer > 0, fig.stage_s
    b = fig.bytes
    link_bytes = fig.executor_figures["flight"]["link_bytes_received"]
    if shutil.which("ss") is None:                     # no socket counters: the IPC size
        assert link_bytes is None and b.wire_bytes == b.raw_bytes == b.ipc_bytes > 0, b
        return
    assert link_bytes == b.wire_bytes == b.ipc_bytes, (link_bytes, b)
    # uncompressed: what crossed is the IPC messages plus gRPC/HTTP2 framing (a few %)
    assert b.raw_bytes <= b.wire_bytes <= b.raw_bytes * 1.10, b

    zplan = _plan(cache, comp="zstd")
    zfig, _, _ = measured_run(zplan, flight_ex, zplan.build_compute())
    assert zfig.bytes.raw_bytes == b.raw_bytes            # the same batches ...
    assert zfig.bytes.wire_bytes < 0.9 * b.wire_bytes    # ... fewer bytes on the wire
    assert zfig.executor_figures["flight"]["ipc_compression"] == "zstd level 1"


def test_end_of_run_bookkeeping_is_outside_the_measured_epoch(
        flight_ex: Any, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ground truth by construction: reading the link's byte counters (``link.bytes_received``,
    ``ss``) is made to take DELAY s more, in the trainer's process. The run's start count is
    read in ``prepare`` and its end count (with the stream threads' joins and the figures)
    once ``measured_run`` has stopped its clock, so neither the first batch nor the epoch's
    tail after the last step (one ``next()`` that finds the streams over) holds DELAY, while
    the link's bytes are still read once and reported. Before the fix both reads ran inside
    the trainer's ``next()``: the first batch waited DELAY and the tail held DELAY. Tolerance:
    what is left of each is the stream's own time (ms here; under DELAY on a busy core)."""
    delay = 1.0
    real = link.bytes_received
    calls: list[float] = []

    def slow(*a: Any, **kw: Any) -> int | None:
        time.sleep(delay)
        calls.append(time.perf_counter())
        return real(*a, **kw)

    plan = _plan(cache)
    monkeypatch.setattr(link, "bytes_received", slow)
    flight_ex.prepare(plan, None)          # the run's start count, read here (untimed)
    calls.clear()
    ends: list[float] = []
    fig, _, _ = measured_run(plan, flight_ex, plan.build_compute(),
                             on_batch=lambda n, s, t: ends.append(t))
    tail = fig.epoch_s - ends[-1]
    assert tail < delay, (tail, fig.epoch_s)
    assert fig.time_to_first_batch_s < delay, (fig.time_to_first_batch_s, fig.epoch_s)
    assert fig.samples == 2400 and len(calls) == 1, (fig.samples, calls)   # the end count
    flight = fig.executor_figures["flight"]
    assert flight["complete"] and flight["work_items"] == len(plan.items), flight
    b = fig.bytes
    if shutil.which("ss") is None:
        assert flight["link_bytes_received"] is None and b.wire_bytes == b.raw_bytes > 0, b
        return
    assert flight["link_bytes_received"] == b.wire_bytes == b.ipc_bytes, (flight, b)
    assert b.raw_bytes <= b.wire_bytes <= b.raw_bytes * 1.10, b


def test_thread_budget_reaches_the_servers(flight_ex: Any, cache: Path) -> None:
    """loader.producer_threads is applied in every server process (its pyarrow pool): by
    default the cores split between the local servers; 0: no budget (every core)."""
    from stallbench.threads import machine_cores

    def pools() -> list[int]:
        return [flight_ex._ping(c, i, loc)["pyarrow_threads"]
                for i, (c, loc) in enumerate(zip(flight_ex.clients, flight_ex.locations))]

    cores = machine_cores()
    plan = _plan(cache)
    list(flight_ex.run(plan))
    assert flight_ex.producer_threads() == max(1, cores // 2)
    assert pools() == [max(1, cores // 2)] * 2
    unbounded = plan.config.replace(loader=dataclasses.replace(plan.config.loader,
                                                               producer_threads=0))
    flight_ex.config = unbounded
    try:
        assert flight_ex.producer_threads() is None
        list(flight_ex.run(dataclasses.replace(plan, config=unbounded)))
        assert pools() == [cores] * 2
    finally:
        flight_ex.config = plan.config
    list(flight_ex.run(plan))
    assert pools() == [max(1, cores // 2)] * 2


# ------------------------------------------------------------------------ failing servers

def test_a_server_killed_mid_epoch_is_an_error_naming_it(cache: Path) -> None:
    """Each server has 4 row groups of ~0.3 s of CPU in one stream: when the first item
    arrives, the second server still has work to do, and its death must be an error that
    names it, not a hang and not a short epoch."""
    text = _text(cost=1000).replace("flight_streams_per_server = 2", "flight_streams_per_server = 1")
    plan = _plan(cache, text=text)
    ex = EXECUTORS.get("flight")(plan.config, "flight.toml")
    ex.start()
    pids = ex.worker_pids()
    delivered = 0
    try:
        with pytest.raises(UserError, match="Flight server (grpc://127.0.0.1:|1 exited)") as e:
            for out in ex.run(plan):
                delivered += 1
                if delivered == 1:
                    os.kill(pids[1], signal.SIGKILL)
    finally:
        ex.stop()
    assert delivered < len(plan.items), str(e.value)
    _assert_gone(pids)


def test_validation_of_flight_servers() -> None:
    from stallbench.run.preflight import check_config

    for value, key in (('["http://a:1"]', "executor.flight_servers[0]"),
                       ('["grpc://a"]', "executor.flight_servers[0]"),
                       ("[]", "executor.flight_servers"),
                       ('["grpc://a:1", "grpc://a:1"]', "executor.flight_servers")):
        cfg = scenario.parse(_text() + f"flight_servers = {value}\n", "f.toml").base
        with pytest.raises(ScenarioError) as e:
            check_config(cfg, "f.toml")
        assert e.value.key == key, (value, str(e.value))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_that_does_not_answer_is_a_user_error_at_once(cache: Path) -> None:
    text = _text() + f'flight_servers = ["grpc://127.0.0.1:{_free_port()}"]\nconnect_timeout_s = 3\n'
    ex = EXECUTORS.get("flight")(_plan(cache, text=text).config, "f.toml")
    t0 = time.monotonic()
    with pytest.raises(ScenarioError) as e:
        ex.start()
    assert e.value.key == "executor.flight_servers[0]" and "no Flight server answers" in str(e.value)
    assert time.monotonic() - t0 < 15


# ------------------------------------------------------------------ stallbench serve (remote)

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`stallbench serve` on loopback, as another machine would run it."""
    d = tmp_path_factory.mktemp("serve")
    (d / "s.toml").write_text(_text(collate="trainer", comp="zstd"))
    # Port 0: the server binds the port the kernel gives it and says which. A port chosen
    # here and bound by the server seconds later (its imports) could be taken in between by
    # another process of a parallel test run.
    env = {**os.environ, "STALLBENCH_CACHE": str(d / "cache"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "stallbench", "serve", "s.toml", "--port",
                             "0", "--host", "127.0.0.1"], cwd=d, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    try:
        assert "serving 1 variant(s) of scenario 'flighttest'" in line, line + proc.stderr.read()
        port = int(line.split("grpc://127.0.0.1:")[1].split()[0])
        yield d, port, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    # SIGTERM: a clean stop, exit 143 like every verb (issue 26; tests/reliability/test_exit_codes)
    assert proc.returncode == 143 and "stopped" in proc.stdout.read()


def test_served_scenario_gives_the_local_batches(served: Any) -> None:
    d, port, proc = served
    text = (d / "s.toml").read_text() + f'flight_servers = ["grpc://127.0.0.1:{port}"]\n'
    cfg = scenario.parse(text, "s.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, d / "trainer-cache", "s.toml"), scenario_file="s.toml")
    ex = EXECUTORS.get("flight")(cfg, "s.toml")
    with ex:
        assert ex.producer_slots() == 2 and ex.producer_nodes() == 1 and not ex.nodes_simulated()
        assert ex.worker_pids() == [] and ex.producer_threads() is None
        caches = StageCaches.build(plan)
        ex.prepare(plan, caches)
        got = _batches(plan, ex)
        _same(_batches(plan.with_ablation(Ablation(True, True), caches), ex), got)
        fig, _, _ = measured_run(plan, ex, plan.build_compute())
    _same(got, _local(plan))
    assert fig.producer_cpu_s is None                  # its clocks are on "another machine"
    assert fig.stage_s.fetch > 0 and fig.bytes.wire_bytes > 0
    assert fig.producer_processes == 1 and proc.poll() is None


def test_served_scenario_refuses_another_variant(served: Any, cache: Path) -> None:
    d, port, _ = served
    text = _text(collate="producer") + f'flight_servers = ["grpc://127.0.0.1:{port}"]\n'
    plan = _plan(cache, text=text)
    ex = EXECUTORS.get("flight")(plan.config, "s.toml")
    ex.start()
    try:
        with pytest.raises(ScenarioError) as e:
            list(ex.run(plan))
    finally:
        ex.stop()
    assert e.value.key == "executor.flight_servers[0]"
    assert "serves scenario 'flighttest', without this variant" in str(e.value)


def test_a_server_answers_bad_tickets_with_errors(served: Any) -> None:
    """What the socket may carry is validated by the server: JSON only, its own variants."""
    import pyarrow.flight as flight

    _, port, proc = served
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    try:
        good = protocol.Ticket("nope", Ablation(), (0,), (0,))
        for raw, fragment in ((good.encode(), "does not serve variant nope"),
                              (b"\x80\x04not json", "ticket is not JSON")):
            with pytest.raises(flight.FlightError, match=fragment):
                client.do_get(flight.Ticket(raw)).read_all()
        with pytest.raises(flight.FlightError, match="unknown action"):
            list(client.do_action(flight.Action("shutdown", b"{}")))
    finally:
        client.close()
    assert proc.poll() is None                         # and it keeps serving


def test_serve_cli_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: Any) -> None:
    r = subprocess.run([sys.executable, "-m", "stallbench", "serve", "missing.toml", "--port",
                        "1"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == "stallbench: error: missing.toml: no such scenario file"
    from stallbench.cli import main

    (tmp_path / "s.toml").write_text(_text())
    assert main(["serve", str(tmp_path / "s.toml"), "--port", "70000"]) == 2
    assert capsys.readouterr().err == ("stallbench: error: --port: expected a whole number in "
                                       "[0, 65535], got '70000'\n")


def test_cli_ctrl_c_stops_the_local_servers(tmp_path: Path) -> None:
    """Ctrl-C reaches the trainer only (servers run in their own session); it stops them by
    PID, exits 130 and writes no result."""
    (tmp_path / "s.toml").write_text(_text(step=200) + "[analysis]\ndifferential = false\n")
    env = {**os.environ, "STALLBENCH_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "stallbench", "run", "s.toml", "--no-progress"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            kids = psutil.Process(proc.pid).children(recursive=True)
            servers = [k.pid for k in kids if "flight.server" in " ".join(_cmdline(k))]
            if len(servers) == 2 and (tmp_path / "cache").exists():
                break
            time.sleep(0.2)
        assert len(servers) == 2, "the run never started its two servers"
        time.sleep(4.0)                                # into the measured runs (200 ms steps)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and not (tmp_path / "results").exists()
    _assert_gone(servers)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


# ------------------------------------------------------------------------------ protocol

def test_config_key_names_what_a_server_produces() -> None:
    base = scenario.parse(_text(), "f.toml").base
    key = protocol.config_key(base)
    same = scenario.parse(_text(step=5).replace("prefetch_factor = 1", "prefetch_factor = 4")
                          + 'flight_servers = ["grpc://h:1"]\n', "f.toml").base
    assert protocol.config_key(same) == key            # trainer-only keys do not matter
    for other in (_text(comp="zstd"), _text(collate="trainer"), _text(cost=1), _text(fmt="jagged")):
        assert protocol.config_key(scenario.parse(other, "f.toml").base) != key


def test_tickets_round_trip_and_bad_ones_are_refused() -> None:
    t = protocol.Ticket("k", Ablation(True, False, False), (3, 5), (0, 1), 2, False)
    assert protocol.Ticket.decode(t.encode()) == t
    good = json.loads(t.encode())
    for bad in (b"not json", b"[]", json.dumps({**good, "shards": [-1, 2]}).encode(),
                json.dumps({**good, "items": [0]}).encode(),
                json.dumps({**good, "threads": "many"}).encode(),
                json.dumps({k: v for k, v in good.items() if k != "key"}).encode()):
        with pytest.raises(protocol.ProtocolError):
            protocol.Ticket.decode(bad)


def test_link_counter_parses_ss_records() -> None:
    out = ("ESTAB 0 0 127.0.0.1:5000 127.0.0.1:7000 users:((\"python\",pid=42,fd=3))\n"
           "\t cubic rtt:0.1 bytes_sent:10 bytes_received:1234 segs_in:3\n"
           "ESTAB 0 0 127.0.0.1:5001 127.0.0.1:7000 users:((\"other\",pid=7,fd=3))\n"
           "\t cubic bytes_received:999\n")
    assert link.received(out, pid=42) == 1234 and link.received(out, pid=7) == 999
    assert link.received("ESTAB 0 0 127.0.0.1:5 127.0.0.1:7 users:((\"p\",pid=42,fd=3))\n",
                         pid=42) == 0                  # ss leaves out a counter of 0


def test_a_stopped_server_cuts_its_open_streams_with_an_error(cache: Path) -> None:
    """``ProducerServer.stop``: an open stream gets its grace, then ends with an error its
    trainer reports (it used to end as if complete, and the trainer's "ended before work
    item" was a traceback), and ``stop`` counts it. 300 ms of preprocessing per row group
    keeps the stream open past the grace by construction."""
    import threading

    from pyarrow import flight

    from stallbench.executors.flight.server import Catalog, ProducerServer
    from stallbench.pipeline import FULL

    cfg = scenario.parse(_text(cost=1000), "flight.toml").base
    ds = dataset_for(cfg, cache, "flight.toml")
    catalog = Catalog("flighttest")
    key = catalog.add(cfg, ds, "flight.toml")
    server = ProducerServer("grpc://127.0.0.1:0", catalog)
    client = flight.FlightClient(f"grpc://127.0.0.1:{server.port}")
    try:
        n = len(ds.shards)
        ticket = protocol.Ticket(key, FULL, tuple(range(n)), tuple(range(n)))
        reader = client.do_get(flight.Ticket(ticket.encode()))
        reader.read_chunk()
        said: dict[str, int] = {}
        stopping = threading.Thread(target=lambda: said.update(cut=server.stop(grace_s=0.2)))
        stopping.start()
        with pytest.raises(flight.FlightUnavailableError, match="is stopping"):
            while True:
                reader.read_chunk()
        stopping.join(60)
        assert said == {"cut": 1}
    finally:
        client.close()
