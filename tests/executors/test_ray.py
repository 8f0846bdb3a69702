"""The Ray executor on a real local Ray: same batches as the local executor, ablation caches
through the object store, Ray's own figures, a worker killed mid-epoch, clusters that do not
answer, and no Ray process left behind (errors, Ctrl-C, simulated multi-node clusters).

In-process tests share ONE Ray runtime per session (``ray_session`` in tests/conftest.py);
tests that need their own runtime run the ``stallbench`` CLI in a subprocess, tagged with an
environment variable so every process that subprocess started can be found afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from raystart import kill_left
from stallbench import scenario
from stallbench.errors import ScenarioError, UserError
from stallbench.executors import EXECUTORS
from stallbench.executors.ray.cluster import RayRuntime
from stallbench.measure.probe import measured_run
from stallbench.pipeline import Ablation, Plan, StageCaches, dataset_for
from stallbench.stages.batch_format import padded_from_jagged

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]

BASE = """
name = "raytest"
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
compression = "{comp}"
execution = "{execution}"
[executor]
kind = "{kind}"
ray_mode = "{mode}"
ray_pool = "{pool}"
"""


def _text(**kw: Any) -> str:
    d = dict(cost=0, step=0, fmt="single_buffer", comp="none", execution="streaming",
             kind="ray", mode="stallbench", pool="tasks")
    d.update(kw)
    return BASE.format(**d)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray-cache")


def _plan(cache: Path, **kw: Any) -> Plan:
    cfg = scenario.parse(_text(**kw), "ray.toml").base
    return Plan.create(cfg, dataset_for(cfg, cache, "ray.toml"), scenario_file="ray.toml")


@pytest.fixture(scope="module")
def ray_ex(ray_session: Any, cache: Path) -> Any:
    """One started RayExecutor on the session's Ray (reused: stop() leaves Ray running)."""
    cfg = _plan(cache).config
    ex = EXECUTORS.get("ray")(cfg, "ray.toml")
    ex.start()
    yield ex
    ex.stop()
    assert ray_session.is_initialized()


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    e = dict(os.environ)
    e["STALLBENCH_CACHE"] = str(tmp_path_factory.mktemp("ray-cli-cache"))
    e["PYTHONUNBUFFERED"] = "1"
    e.pop("RAY_ADDRESS", None)
    return e


class _Background:
    """A ``stallbench run`` started early in its own Ray runtime, checked by a later test:
    the CLI tests' Ray start-ups overlap the in-process tests instead of adding to them."""

    def __init__(self, cwd: Path, env: dict[str, str], args: list[str],
                 interrupt: bool = False) -> None:
        self.cwd = cwd
        self.tag = uuid.uuid4().hex
        # Files, not pipes: nobody reads a pipe until the test runs, and a full one blocks.
        self.out, self.err = open(cwd / "stdout.txt", "w"), open(cwd / "stderr.txt", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "stallbench", *args], cwd=cwd,
                                     env={**env, "STALLBENCH_TEST_TAG": self.tag},
                                     stdout=self.out, stderr=self.err, text=True)
        self.interrupted_at: float | None = None
        self.watcher = None
        if interrupt:
            self.watcher = threading.Thread(target=self._interrupt, daemon=True)
            self.watcher.start()

    def _interrupt(self) -> None:
        """Ctrl-C once Ray runs producer work (a Ray worker process exists) plus 3 s."""
        deadline = time.time() + 120
        while time.time() < deadline and self.proc.poll() is None:
            if any(n.startswith("ray::") and "Agent" not in n
                   for n in (_name(q) for q in _tagged(self.tag))):
                break
            time.sleep(0.3)
        time.sleep(3.0)
        if self.proc.poll() is None:
            self.interrupted_at = time.time()
            self.proc.send_signal(signal.SIGINT)

    def result(self, timeout: float = 240) -> subprocess.CompletedProcess:
        try:
            if self.watcher is not None:
                self.watcher.join(timeout=timeout)
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.out.close()
            self.err.close()
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode,
                                           (self.cwd / "stdout.txt").read_text(),
                                           (self.cwd / "stderr.txt").read_text())


BOOM = ("import os\n"
        "def fail_on_second(table, **kw):\n"
        "    n = int(os.environ.get('BOOM_COUNT', '0')) + 1\n"
        "    os.environ['BOOM_COUNT'] = str(n)\n"
        "    if n == 2:\n"
        "        raise RuntimeError('injected failure')\n"
        "    return table\n")


@pytest.fixture(scope="module", autouse=True)
def background(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
               cli_env: dict[str, str]) -> Any:
    """Start the heavy CLI runs of the tests selected in this session, at module start."""
    selected = {item.name for item in request.session.items}
    runs: dict[str, _Background] = {}
    if "test_cli_error_mid_run_leaves_no_ray_process" in selected:
        d = tmp_path_factory.mktemp("ray-cli-error")
        (d / "boom.py").write_text(BOOM)
        text = _text().replace('transforms = ["log_dense",',
                               'transforms = ["boom:fail_on_second", "log_dense",')
        (d / "s.toml").write_text(text + "[analysis]\ndifferential = false\n")
        runs["error"] = _Background(d, {**cli_env, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(d), cli_env.get("PYTHONPATH")]))},
                                    ["run", "s.toml", "--no-progress"])
    if "test_cli_simulated_nodes_end_to_end" in selected:
        d = tmp_path_factory.mktemp("ray-cli-sim")
        (d / "s.toml").write_text(
            _text(step=1) + "simulated_nodes = 2\ncpus_per_node = 1\nobject_store_mb = 128\n"
            "[analysis]\nmethod = \"chain\"\n"
            "[matrix]\n\"loader.compression\" = [\"none\", \"zstd\"]\n")
        runs["simulated"] = _Background(d, cli_env, ["run", "s.toml", "--out", "out",
                                                     "--no-progress"])
    if "test_cli_ctrl_c_shuts_ray_down" in selected:
        d = tmp_path_factory.mktemp("ray-cli-ctrl-c")
        (d / "s.toml").write_text(_text(step=300) + "[analysis]\ndifferential = false\n")
        runs["ctrl_c"] = _Background(d, cli_env, ["run", "s.toml", "--no-progress"],
                                     interrupt=True)
    yield runs
    for r in runs.values():
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()
        for p in _tagged(r.tag):
            p.kill()


def _epoch(plan: Plan, ex: Any, keys: set[str] | None = None) -> dict[str, torch.Tensor]:
    """Every batch the trainer would see, concatenated per tensor (order matters). A jagged
    batch's sequences count as ``seq`` padded to a fixed width (none of these is longer), so
    batches cut at other rows still compare."""
    parts: dict[str, list[torch.Tensor]] = {}
    for out in ex.run(plan):
        for batch, _, _ in plan.receive(out):
            if keys is not None:
                keys.update(batch)
            if "seq_values" in batch:
                n = int(batch["label"].shape[0])
                seq = padded_from_jagged(batch["seq_offsets"], batch["seq_values"],
                                         len(plan.schema.sequence), n, JAGGED_WIDTH)
                assert seq.shape[2] == JAGGED_WIDTH
                batch = {**batch, "seq": seq}
            for k in ("dense", "sparse", "seq", "label"):
                parts.setdefault(k, []).append(batch[k].clone())
    return {k: torch.cat(v) for k, v in parts.items()}


JAGGED_WIDTH = 16


def _batches(plan: Plan, ex: Any) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in b.items()} for out in ex.run(plan)
            for b, _, _ in plan.receive(out)]


def _local(plan: Plan) -> Any:
    ex = EXECUTORS.get("local")(plan.config, "ray.toml")
    ex.start()
    return ex


def _same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in ("dense", "sparse", "seq", "label"):
            assert torch.equal(x[k], y[k]), k


# ------------------------------------------------------------------------- same batches

@pytest.mark.parametrize("fmt,comp,execution", [
    ("single_buffer", "none", "streaming"),
    ("columnar", "zstd", "bulk"),
])
def test_same_batches_as_local(ray_ex: Any, cache: Path, fmt: str, comp: str,
                               execution: str) -> None:
    plan = _plan(cache, fmt=fmt, comp=comp, execution=execution)
    want = _batches(plan, _local(plan))
    got = _batches(plan, ray_ex)
    _same(got, want)
    fig = ray_ex.run_figures()
    assert fig["ray"]["complete"] and fig["ray"]["execution"] == execution
    assert fig["faults"]["duplicates_dropped"] == 0


def test_actor_pool_runs_end_to_end(ray_session: Any, cache: Path) -> None:
    """``ray_pool = "actors"`` from the scenario, through start (its warm-up runs on the actor
    pool too), prepare and a measured run: the same batches as the local executor."""
    cfg = scenario.parse(_text(fmt="rows", pool="actors") + "concurrency = 1\n", "ray.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, cache, "ray.toml"), scenario_file="ray.toml")
    want = _batches(plan, _local(plan))
    ex = EXECUTORS.get("ray")(cfg, "ray.toml")
    try:
        ex.start()                          # one actor: each costs a process start and imports
        assert ex.producer_slots() == 1 and ex.has_producers()
        ex.prepare(plan, None)
        got = _batches(plan, ex)
        fig = ex.run_figures()
    finally:
        ex.stop()
    _same(got, want)
    assert fig["ray"]["pool"] == "actors" and fig["ray"]["complete"], fig["ray"]
    names = [op["name"] for op in fig["ray"]["operators"]]
    assert any("Producer" in n for n in names), names       # the actor UDF ran the work


def test_ablation_caches_reach_workers_through_the_object_store(ray_ex: Any, cache: Path) -> None:
    plan = _plan(cache)
    want = _batches(plan, _local(plan))
    caches = StageCaches.build(plan)
    ray_ex.prepare(plan, caches)
    for ab in (Ablation(fetch=True), Ablation(True, True), Ablation(True, True, True),
               Ablation(preprocess=True)):
        p = plan.with_ablation(ab, caches)
        _same(_batches(p, ray_ex), want)
        # What each task receives is the plan plus ObjectRefs, never the cached tables.
        job = pickle.dumps(ray_ex._job(p))
        cached = sum(t.nbytes for t in caches.prepped.values())
        assert len(job) < 64_000 < cached


@pytest.mark.parametrize("fmt", ["columnar", "jagged"])
def test_stock_mode_delivers_the_same_rows(ray_ex: Any, cache: Path, fmt: str) -> None:
    """Stock mode's batches hold the local executor's rows in its order, in the dict of the
    loader's format: padded ``seq`` for a padded format, jagged (every id) for the default."""
    plan = _plan(cache, mode="stock", fmt=fmt)
    want = _epoch(plan, _local(plan))
    ray_ex.spec = plan.config.executor
    try:
        keys: set[str] = set()
        got = _epoch(plan, ray_ex, keys)
        if fmt == "jagged":
            assert keys == {"dense", "sparse", "label", "seq_values", "seq_offsets"}, keys
            for k in want:
                assert torch.equal(got[k], want[k]), k
            return
        late = ray_ex.late_stage_times()
        fig, _, _ = measured_run(plan, ray_ex, plan.build_compute())
    finally:
        ray_ex.spec = ray_ex.config.executor
    for k in want:
        assert torch.equal(got[k], want[k]), k
    names = [op["name"] for op in ray_ex.run_figures()["ray"]["operators"]]
    assert any("ReadFiles" in n or "ReadParquet" in n for n in names), names
    # Stock producers run Ray's code: their stage time is known only once the run has ended.
    assert late is not None and late.preprocess_s > 0 and late.fetch_s >= 0, late
    assert fig.samples == 2400 and fig.stage_s.preprocess > 0, fig.stage_s   # ... and counts


def test_executor_reports_its_producers(ray_ex: Any) -> None:
    """What "workers" means for each executor comes from the executor, not config keys."""
    assert ray_ex.has_producers()
    assert ray_ex.producer_slots() == 2          # the session's Ray: 2 CPUs, no concurrency set
    assert ray_ex.producer_nodes() == 1
    for workers in (0, 3):
        cfg = scenario.parse(_text(kind="local"), "ray.toml").base
        cfg = cfg.replace(loader=dataclasses.replace(cfg.loader, num_workers=workers))
        local = EXECUTORS.get("local")(cfg, "ray.toml")
        assert local.producer_slots() == workers and local.has_producers() == (workers > 0)
        assert local.producer_nodes() is None


def test_measured_run_records_ray_figures(ray_ex: Any, cache: Path) -> None:
    plan = _plan(cache, step=2)
    fig, _, res = measured_run(plan, ray_ex, plan.build_compute(), sample_interval_s=0.05)
    ray = fig.executor_figures["ray"]
    why = json.dumps(fig.executor_figures, default=str)[:3000]
    assert fig.samples == 2400 and fig.time_to_first_batch_s > 0, why
    assert ray["cluster"]["cpus"] == 2 and ray["cluster"]["mode"] == "reused", why
    assert ray["nodes_used"] == 1 and ray["producer_processes"] >= 1, why
    assert ray["first_block_s"] is not None and ray["blocks"] == len(plan.items), why
    ops = {op["name"]: op for op in ray["operators"]}
    produce = next(op for name, op in ops.items() if "MapBatches" in name)
    assert produce["tasks"] == len(plan.items) and produce["wall_s"] > 0, why
    assert res.object_store_mb, res
    assert fig.executor_figures["faults"]["worker_deaths"] == 0, why
    assert fig.stage_s.preprocess > 0 and fig.stage_rows.fetch == 2400, fig.stage_s
    # the cluster's own CPU clocks see at least what the tasks' stage timers saw
    stage_cpu = fig.stage_s.fetch_cpu + fig.stage_s.preprocess_cpu + fig.stage_s.transfer_producer_cpu
    assert fig.producer_cpu_s is not None and fig.producer_cpu_s >= 0.9 * stage_cpu > 0, (fig.producer_cpu_s, stage_cpu)


def test_end_of_run_checks_are_outside_the_measured_epoch(ray_ex: Any, cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Ground truth by construction: the end-of-run fault query (Ray's state API) is made to
    take DELAY s more. The epoch ends when the stream does, so the time from the last step's
    end to the epoch's end (one ``next()`` that finds the stream over) stays under DELAY, as
    does Ray's own clock (``steady_rows_s``), while the faults are still read and reported.
    Before the fix the query ran inside the trainer's last ``next()``: the tail held DELAY."""
    delay = 1.0
    calls: list[float] = []
    real = ray_ex.runtime.faults_since

    def slow(*a: Any, **kw: Any) -> dict:
        calls.append(time.perf_counter())
        time.sleep(delay)
        return real(*a, **kw)

    monkeypatch.setattr(ray_ex.runtime, "faults_since", slow)
    plan = _plan(cache)
    ends: list[float] = []
    fig, _, _ = measured_run(plan, ray_ex, plan.build_compute(),
                             on_batch=lambda n, s, t: ends.append(t))
    ray = fig.executor_figures["ray"]
    tail = fig.epoch_s - ends[-1]
    assert len(calls) == 1 and fig.samples == 2400, (calls, fig.samples)
    assert tail < delay, (tail, fig.epoch_s)
    assert fig.executor_figures["faults"]["worker_deaths"] == 0, fig.executor_figures
    # Ray's elapsed time behind steady_rows_s: rows / rate + first block, within the epoch
    elapsed = ray["first_block_s"] + 2400 / ray["steady_rows_s"]
    assert elapsed < ends[-1] + delay, (elapsed, ends[-1])


# ---------------------------------------------------------------------------------- faults

class _Gated:
    """The plan's preprocess, held while a gate file exists: a producer task waits there until
    the test has killed one (then the gate opens and the retried task goes through), so a task
    is running when the kill lands on any machine, however many cores finish the epoch."""

    def __init__(self, inner: Any, gate: str, hold_s: float = 60.0) -> None:
        self.inner = inner
        self.gate = gate
        self.hold_s = hold_s
        self.output_schema = inner.output_schema

    def __call__(self, table: Any, shard_index: int) -> Any:
        deadline = time.time() + self.hold_s
        while os.path.exists(self.gate) and time.time() < deadline:
            time.sleep(0.01)
        return self.inner(table, shard_index)


def test_worker_killed_mid_epoch_every_row_once(ray_ex: Any, cache: Path, tmp_path: Path) -> None:
    import ray.cloudpickle

    plan = _plan(cache)
    want = _batches(plan.with_ablation(plan.ablation, None), _local(plan))
    gate = tmp_path / "gate"
    gate.touch()
    gated = dataclasses.replace(plan, preprocess=_Gated(plan.preprocess, str(gate)))
    killed: list[int] = []

    def kill_one_then_open() -> None:
        deadline = time.time() + 60
        while not killed and time.time() < deadline:
            ray_ex.runtime._pids_cache = (0.0, [])
            for pid in ray_ex.worker_pids():
                try:
                    title = " ".join(psutil.Process(pid).cmdline())
                except psutil.Error:
                    continue
                if "MapBatches" in title:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    break
            time.sleep(0.02)
        gate.unlink(missing_ok=True)

    # The gate class lives in this test module, which Ray workers cannot import: ship it by value.
    module = sys.modules[__name__]
    ray.cloudpickle.register_pickle_by_value(module)
    killer = threading.Thread(target=kill_one_then_open, daemon=True)
    killer.start()
    try:
        got = _batches(gated, ray_ex)
    finally:
        gate.unlink(missing_ok=True)
        killer.join()
        ray.cloudpickle.unregister_pickle_by_value(module)
    assert killed, "no producer task was running to kill"
    _same(got, want)                                    # every row exactly once, in order
    faults = ray_ex.run_figures()["faults"]
    assert faults["worker_deaths"] >= 1, faults
    assert killed[0] in [w["pid"] for w in faults["dead_workers"]]
    assert faults["task_retries"] >= 1, faults


# ------------------------------------------------------------------ clusters that do not answer

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_address_is_a_user_error_at_once() -> None:
    spec = scenario.parse(_text() + f'ray_address = "127.0.0.1:{_free_port()}"\n', "a.toml").base
    t0 = time.time()
    with pytest.raises(ScenarioError) as e:
        RayRuntime(spec.executor, "a.toml")._connect(spec.executor.ray_address)
    assert e.value.key == "executor.ray_address" and "nothing is listening" in str(e.value)
    assert time.time() - t0 < 10


def test_silent_address_times_out_as_a_user_error() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def accept() -> None:       # accept and say nothing, like a wrong service would
        conns = []
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass
        for c in conns:
            c.close()

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        port = srv.getsockname()[1]
        spec = scenario.parse(_text() + f'ray_address = "127.0.0.1:{port}"\n'
                              "connect_timeout_s = 4\n", "a.toml").base
        t0 = time.time()
        with pytest.raises(ScenarioError) as e:
            RayRuntime(spec.executor, "a.toml")._connect(spec.executor.ray_address)
        assert "no Ray cluster answered within 4 s" in str(e.value)
        assert time.time() - t0 < 30
    finally:
        stop.set()
        th.join()
        srv.close()


def test_simulated_nodes_need_a_fresh_process(ray_session: Any) -> None:
    spec = scenario.parse(_text() + "simulated_nodes = 2\n", "a.toml").base
    with pytest.raises(UserError, match="already initialised"):
        RayRuntime(spec.executor, "a.toml").open()


# --------------------------------------------------------------------- the CLI, own runtimes

def _tagged(tag: str) -> list[psutil.Process]:
    """Every live process that inherited the test's tag (i.e. that the subprocess started)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("STALLBENCH_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _assert_no_leftovers(tag: str) -> None:
    deadline = time.time() + 10
    left = _tagged(tag)
    while left and time.time() < deadline:
        time.sleep(0.3)
        left = _tagged(tag)
    assert not left, f"processes left behind: {kill_left(left)}"


def _sb(args: list[str], env: dict[str, str], cwd: Path, tag: str,
        timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallbench", *args], cwd=cwd,
                          env={**env, "STALLBENCH_TEST_TAG": tag}, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_unreachable_address_one_line_exit_2(tmp_path: Path, cli_env: dict) -> None:
    (tmp_path / "s.toml").write_text(_text() + f'ray_address = "127.0.0.1:{_free_port()}"\n')
    t0 = time.time()
    r = _sb(["run", "s.toml", "--no-progress"], cli_env, tmp_path, uuid.uuid4().hex, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "executor.ray_address" in lines[0], r.stderr
    assert time.time() - t0 < 30


def test_cli_without_ray_one_line_exit_2(tmp_path: Path, cli_env: dict) -> None:
    (tmp_path / "s.toml").write_text(_text())
    code = ("import sys; sys.modules['ray'] = None\n"
            "from stallbench.cli import main\n"
            "sys.exit(main(['run', 's.toml', '--no-progress']))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=cli_env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "needs the [ray] extra" in lines[0], r.stderr
    assert "pip install 'stallbench[ray]'" in lines[0], r.stderr
    assert not (tmp_path / "results").exists()


def test_cli_error_mid_run_leaves_no_ray_process(background: dict) -> None:
    run = background["error"]
    r = run.result()
    assert r.returncode != 0
    assert "injected failure" in r.stderr
    _assert_no_leftovers(run.tag)


def test_cli_ctrl_c_shuts_ray_down(background: dict) -> None:
    run = background["ctrl_c"]
    r = run.result()
    assert run.interrupted_at is not None, "the run ended before Ctrl-C: " + r.stderr[-2000:]
    assert r.returncode == 130, r.stderr[-2000:]
    assert "interrupted" in r.stderr
    _assert_no_leftovers(run.tag)


def _name(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def test_cli_simulated_nodes_end_to_end(background: dict) -> None:
    """A 2-node simulated cluster: preprocessing stays off the trainer's (head) node, the
    differential attribution works through Ray, the second variant reuses the first one's
    cluster (same shape), and every process ends with the run."""
    run = background["simulated"]
    r = run.result()
    assert r.returncode == 0, r.stderr[-3000:]
    (result,) = list((run.cwd / "out").glob("*.json"))
    first, second = json.loads(result.read_text())["variants"]
    assert first["startup"]["runtime"] == "started" and first["startup"]["runtime_start_s"] > 0
    assert second["startup"]["runtime"] == "reused" and second["startup"]["runtime_start_s"] == 0
    assert second["startup"]["executor_start_s"] < first["startup"]["executor_start_s"]
    head_ids = {v["repeats"][0]["executor_figures"]["ray"]["cluster"]["head_node_id"]
                for v in (first, second)}
    assert len(head_ids) == 1                            # one cluster for both variants
    v = first
    ray = v["repeats"][0]["executor_figures"]["ray"]
    cl = ray["cluster"]
    assert cl["mode"] == "simulated" and cl["nodes"] == 3 and cl["cpu_nodes"] == 2
    assert cl["head_node_id"] not in ray["producer_nodes"]
    assert 1 <= ray["nodes_used"] <= 2
    assert "executor.simulated_nodes" in v["emulated"]
    assert v["attribution"]["bound_by"] in {"fetch", "preprocess", "transfer", "compute"}
    assert set(v["ablations"]) >= {"no_fetch", "no_fetch_preprocess", "compute_only"}
    _assert_no_leftovers(run.tag)
