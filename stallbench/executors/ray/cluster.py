"""Ray runtimes for the ``ray`` executor: which cluster, how it is reached, and that it ends.

Four ways to get a Ray runtime, chosen from ``[executor]``:

- *reused*: Ray is already initialised in this process (a test session, a notebook): use it,
  never shut it down;
- *local*: ``ray_address`` unset -> a private single-node Ray with ``cpus`` CPUs, started here
  (``address="local"``, so it never attaches to some other cluster by accident) and shut down
  in ``close``;
- *simulated*: ``simulated_nodes = N`` -> ``ray.cluster_utils.Cluster`` on this machine: a head
  node with 0 CPUs for the trainer and N worker nodes of ``cpus_per_node`` CPUs, each carrying
  the custom resource ``stallbench_cpu_node`` that producer tasks require, so preprocessing
  never runs on the trainer's node. The nodes share this machine's cores: N x cpus_per_node
  above the real core count is oversubscribed, and results say so (``emulated``);
- *address*: ``ray_address = "auto" | "host:port" | "ray://host:port"`` -> an existing cluster.
  A cluster that does not answer is a ``UserError`` within ``connect_timeout_s`` (a TCP check,
  then a probe ``ray.init`` in a child process that is killed on time-out, because an in-process
  ``ray.init`` against a silent address blocks for minutes).

Whatever stallbench starts it stops, also on errors, Ctrl-C and SIGTERM: ``close`` shuts Ray
down and then kills any process the runtime left behind (it remembers which processes appeared
under this one while the runtime came up), and an ``atexit`` hook covers paths that skip
``close``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

from ... import interrupts
from ...errors import ScenarioError, UserError
from ...ray_setup import RUNTIME_ENV, avoid_fsspec_import_race
from ...scenario import ExecutorSpec

RESOURCE = "stallbench_cpu_node"     # custom resource carried by simulated CPU nodes
_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


class _DropDefaultTokenNotice(logging.Filter):
    """Ray's "Token authentication is enabled for this Ray cluster" notice (Ray >= 2.5x)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Token authentication is enabled for this Ray")


_DEFAULT_TOKEN_NOTICE = _DropDefaultTokenNotice()
_AGENTS = ("DashboardAgent", "RuntimeEnvAgent", "_StatsActor", "_AutoscalingCoordinator",
           "AutoscalingRequester", "SplitCoordinator")
_UNEXPECTED_EXITS = (0, 2, 4)        # WorkerExitType: SYSTEM_ERROR, USER_ERROR, NODE_OUT_OF_MEMORY


def import_ray(scenario_file: str = "<scenario>") -> Any:
    """``ray`` (with ``ray.data``), or one clear ``UserError`` when it is not installed."""
    try:
        import ray
        import ray.data  # noqa: F401 - the executor needs Ray Data, not just Ray core
    except ImportError as exc:
        what = getattr(exc, "name", None) or str(exc)
        raise UserError(f"{scenario_file}: executor.kind = \"ray\" needs Ray Data, which is not "
                        f"installed here (cannot import {what}); install it with: "
                        f"pip install \"ray[data]\"") from None
    avoid_fsspec_import_race()
    return ray


def _quiet_logs() -> None:
    for name in ("ray", "ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # Ray Data logs a failed run's exception at ERROR (with its traceback) before raising it;
    # stallbench reports what it raises, as one line or a user-code block (driver._explain).
    logging.getLogger("ray.data").setLevel(logging.CRITICAL)


@contextlib.contextmanager
def _start_failure(scenario_file: str) -> Iterator[None]:
    """Ray failing to start (a node timing out on an overloaded machine, a port taken) is one
    line naming the executor, not Ray's traceback; ``close`` still stops what did start."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - Ray raises bare Exception for a start time-out
        text = str(exc).strip().splitlines()
        raise UserError(f"{scenario_file}: executor: Ray did not start "
                        f"({type(exc).__name__}: {text[0][:300] if text else ''})") from None


def _descendants() -> dict[int, str]:
    import psutil

    out = {}
    try:
        for p in psutil.Process().children(recursive=True):
            try:
                out[p.pid] = p.name()
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return out


def _ray_address_file() -> str:
    # Where `ray start` (and cluster_utils.Cluster) record the "current" cluster for
    # address="auto"; a simulated cluster must not leave its address there for others.
    import tempfile

    return os.path.join(os.environ.get("RAY_TMPDIR", os.path.join(tempfile.gettempdir(), "ray")),
                        "ray_current_cluster")


class RayRuntime:
    def __init__(self, spec: ExecutorSpec, scenario_file: str = "<scenario>") -> None:
        self.spec = spec
        self.file = scenario_file
        self.mode = "none"
        self.owned = False
        self.address: str | None = None
        self.cluster: Any = None
        self.producer_resources: dict[str, float] = {}
        self._before: dict[int, str] = {}
        self._spawned: set[int] = set()
        self._address_file: tuple[str, str | None] | None = None
        self._store_cache: tuple[float, float | None] = (0.0, None)
        self._pids_cache: tuple[float, list[int]] = (0.0, [])
        self._atexit = False
        self._old_sigterm: Any = None

    # ---------------------------------------------------------------------------- lifecycle
    def open(self) -> None:
        ray = import_ray(self.file)
        spec = self.spec
        if ray.is_initialized():
            if spec.simulated_nodes or spec.ray_address:
                raise UserError(f"{self.file}: executor: Ray is already initialised in this "
                                f"process, so stallbench cannot start a simulated cluster or "
                                f"connect to {spec.ray_address or 'another cluster'}; run it in "
                                f"a fresh process")
            self.mode = "reused"
            self.owned = False
            self._quiet_data()
            return
        self._before = _descendants()
        # Ray's usage-stats actor costs ~1 s of CPU per runtime and reports nothing we need.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Ray's C++ core would install a SIGTERM handler that aborts with a stack dump,
        # skipping every clean-up; stallbench handles SIGTERM itself (stallbench.interrupts).
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        self.owned = True              # from here on close() must clean up, even half-started
        if not self._atexit:
            atexit.register(self.close)
            self._atexit = True
        with interrupts.foreign_handlers(), _start_failure(self.file):
            if spec.ray_address:
                self.mode = "address"
                self._connect(spec.ray_address)
            elif spec.simulated_nodes:
                self.mode = "simulated"
                self._own_auth_mode()
                self._start_simulated()
            else:
                self.mode = "local"
                self._own_auth_mode()
                ray.init(address="local", num_cpus=spec.cpus or os.cpu_count() or 1,
                         object_store_memory=spec.object_store_mb * 2**20,
                         include_dashboard=False, log_to_driver=False,
                         logging_level=logging.WARNING, namespace="stallbench",
                         runtime_env=RUNTIME_ENV)
        self._spawned = set(_descendants()) - set(self._before)
        self._take_sigterm()
        self._quiet_data()

    def _own_auth_mode(self) -> None:
        """A cluster stallbench starts itself keeps Ray's default, token authentication,
        without Ray's warning that it is on (printed at every start, it made every one-line
        error of stallbench two lines). Done with a logging filter on that one message:
        setting ``RAY_AUTH_MODE=token`` instead would need to happen before Ray is imported
        (Ray caches its config then; set later, the GCS refuses the driver)."""
        logging.getLogger(_AUTH_LOGGER).addFilter(_DEFAULT_TOKEN_NOTICE)

    def _take_sigterm(self) -> None:
        """Ray's core installs a C++ SIGTERM handler that aborts the process, skipping every
        ``finally``; while stallbench owns a runtime, SIGTERM is a KeyboardInterrupt instead,
        so the run unwinds and ``close`` shuts the runtime down (as on Ctrl-C). Under the CLI
        that is its own handler (``stallbench.interrupts``), put back here."""
        if interrupts.installed():
            interrupts.reinstall()
            return
        if threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt("SIGTERM")

        try:
            self._old_sigterm = signal.signal(signal.SIGTERM, on_term)
        except (ValueError, OSError):  # pragma: no cover - not the main thread / no signals
            self._old_sigterm = None

    def _quiet_data(self) -> None:
        _quiet_logs()
        import ray.data

        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        try:
            ctx.print_on_execution_start = False
        except AttributeError:  # pragma: no cover - older Ray
            pass

    def _start_simulated(self) -> None:
        import ray
        from ray.cluster_utils import Cluster

        spec = self.spec
        addr_file = _ray_address_file()
        try:
            with open(addr_file, encoding="utf-8") as f:
                previous: str | None = f.read()
        except OSError:
            previous = None
        self._address_file = (addr_file, previous)
        store = spec.object_store_mb * 2**20
        # Head: the trainer's node. 0 CPUs, so no producer task can land next to the trainer.
        self.cluster = Cluster(initialize_head=True, shutdown_at_exit=True, head_node_args={
            "num_cpus": 0, "object_store_memory": store, "include_dashboard": False})
        for _ in range(spec.simulated_nodes):
            self.cluster.add_node(wait=False, num_cpus=spec.cpus_per_node,
                                  resources={RESOURCE: float(spec.cpus_per_node)},
                                  object_store_memory=store)
        self.cluster.wait_for_nodes(timeout=120)
        self._restore_address_file()
        self.address = self.cluster.address
        ray.init(address=self.cluster.address, log_to_driver=False,
                 logging_level=logging.WARNING, namespace="stallbench", runtime_env=RUNTIME_ENV)
        self.producer_resources = {RESOURCE: 1.0}

    def _restore_address_file(self) -> None:
        if not self._address_file:
            return
        path, previous = self._address_file
        try:
            if previous is None:
                if os.path.exists(path):
                    os.remove(path)
            else:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(previous)
        except OSError:
            pass

    def _connect(self, address: str) -> None:
        import ray

        key = "executor.ray_address"
        timeout = self.spec.connect_timeout_s
        target = address
        if address.startswith("ray://"):
            hostport = address[len("ray://"):].split("/", 1)[0]
        else:
            if address == "auto":
                from ray._private import services

                try:
                    target = services.canonicalize_bootstrap_address(address) or ""
                except (ConnectionError, ValueError) as exc:
                    raise ScenarioError(self.file, key, f"\"auto\" found no running Ray cluster "
                                                        f"on this machine ({exc})") from None
                if not target:
                    raise ScenarioError(self.file, key, "\"auto\" found no running Ray cluster")
            hostport = target
        host, _, port_s = hostport.rpartition(":")
        if not host or not port_s.isdigit():
            raise ScenarioError(self.file, key, f"expected \"auto\", \"host:port\" or "
                                                f"\"ray://host:port\", got {address!r}")
        # 1. Is anything listening? Refused or unroutable fails here in seconds.
        try:
            with socket.create_connection((host, int(port_s)), timeout=min(5.0, timeout)):
                pass
        except OSError as exc:
            raise ScenarioError(self.file, key, f"no Ray cluster answers at {hostport} "
                                                f"({exc.strerror or exc})") from None
        # 2. Is it Ray? A probe in a child process, killed on time-out: in-process ray.init
        #    against a port that is open but silent blocks for minutes.
        probe = ("import json, sys, logging, ray\n"
                 "ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False)\n"
                 "print(json.dumps(ray.cluster_resources()))\n"
                 "ray.shutdown()\n")
        try:
            proc = subprocess.run([sys.executable, "-c", probe, target], capture_output=True,
                                  text=True, timeout=timeout,
                                  env={**os.environ, "RAY_ADDRESS": ""})
        except subprocess.TimeoutExpired:
            raise ScenarioError(self.file, key, f"{hostport} accepts connections but no Ray "
                                                f"cluster answered within {timeout:g} s "
                                                f"(executor.connect_timeout_s)") from None
        if proc.returncode != 0:
            last = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()]
            raise ScenarioError(self.file, key, f"cannot connect to the Ray cluster at {hostport}: "
                                                f"{last[-1] if last else 'probe failed'}")
        self.address = target
        ray.init(address=target, log_to_driver=False, logging_level=logging.WARNING,
                 namespace="stallbench", runtime_env=RUNTIME_ENV)

    def close(self) -> None:
        """Shut down what this runtime started; a no-op for a reused or already closed one."""
        if not self.owned:
            return
        self.owned = False
        victims = (set(_descendants()) - set(self._before)) | self._spawned
        try:
            import ray

            ray.shutdown()
        except Exception:  # noqa: BLE001 - best effort; leftovers are killed below
            pass
        if self.cluster is not None:
            try:
                self.cluster.shutdown()
            except Exception:  # noqa: BLE001
                pass
            self.cluster = None
        self._restore_address_file()
        _reap(victims)
        if self._old_sigterm is not None and threading.current_thread() is threading.main_thread():
            try:
                signal.signal(signal.SIGTERM, self._old_sigterm)
            except (ValueError, OSError, TypeError):  # pragma: no cover
                pass
            self._old_sigterm = None
        self.mode = "closed"

    # ---------------------------------------------------------------------------- figures
    def describe(self) -> dict[str, Any]:
        """Nodes and CPUs of the runtime: what the variant ran on."""
        import ray

        out: dict[str, Any] = {"mode": self.mode, "address": self.address}
        try:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
        except Exception:  # noqa: BLE001 - client mode and old Rays
            return out
        cpu_nodes = [n for n in nodes if n.get("Resources", {}).get("CPU", 0) > 0]
        out.update({
            "nodes": len(nodes),
            "cpu_nodes": len(cpu_nodes),
            "cpus": sum(n.get("Resources", {}).get("CPU", 0) for n in nodes),
            "producer_cpus": self.producer_cpus(),
            "object_store_mb": round(sum(n.get("Resources", {}).get("object_store_memory", 0)
                                         for n in nodes) / 2**20, 1),
            "machine_cores": os.cpu_count(),
        })
        try:
            out["head_node_id"] = ray.get_runtime_context().get_node_id()   # the trainer's node
        except Exception:  # noqa: BLE001
            pass
        if self.mode == "simulated":
            out["simulated_nodes"] = self.spec.simulated_nodes
            out["cpus_per_node"] = self.spec.cpus_per_node
            out["oversubscribed"] = (self.spec.simulated_nodes * self.spec.cpus_per_node
                                     > (os.cpu_count() or 1))
        return out

    def producer_cpus(self) -> int:
        """CPUs producer tasks may use (those carrying the producer resources)."""
        import ray

        try:
            res = ray.cluster_resources()
        except Exception:  # noqa: BLE001
            return 1
        if self.producer_resources:
            key = next(iter(self.producer_resources))
            return max(1, int(res.get(key, 0)))
        return max(1, int(res.get("CPU", 1)))

    def worker_pids(self) -> list[int]:
        """Ray worker processes on this machine (cached for a second: the sampler asks often)."""
        now = time.monotonic()
        if now - self._pids_cache[0] < 1.0:
            return self._pids_cache[1]
        pids = [pid for pid, name in _descendants().items()
                if name.startswith("ray::") and not any(a in name for a in _AGENTS)]
        self._pids_cache = (now, pids)
        return pids

    def cluster_cpu_s(self) -> float | None:
        """CPU seconds so far of every process of a Ray cluster running on this machine
        (raylets, GCS, workers, agents: what disaggregation costs here, not only the tasks'
        own time); None for a cluster elsewhere. A process that exits between two reads
        takes its CPU with it, so this is a lower bound when Ray recycles workers."""
        if self.mode not in ("local", "simulated", "reused"):
            return None
        import psutil

        total, seen = 0.0, 0
        try:
            procs = psutil.Process().children(recursive=True)
        except psutil.Error:
            return None
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system + t.children_user + t.children_system
            seen += 1
        return total if seen else None

    def object_store_used_mb(self) -> float | None:
        """Object-store bytes in use on all nodes, as the raylets report them to the GCS
        (about once a second); None where that is not reachable (client mode)."""
        now = time.monotonic()
        if now - self._store_cache[0] < 0.2:
            return self._store_cache[1]
        value = None
        try:
            from ray._private.state import state
            from ray.core.generated import gcs_pb2

            raw = state._connect_and_get_accessor().get_all_resource_usage()
            batch = gcs_pb2.ResourceUsageBatchData.FromString(raw).batch
            used = 0.0
            for node in batch:
                total = node.resources_total.get("object_store_memory", 0.0)
                used += total - node.resources_available.get("object_store_memory", total)
            value = used / 2**20
        except Exception:  # noqa: BLE001 - a figure, never a failure
            value = None
        self._store_cache = (now, value)
        return value

    # ------------------------------------------------------------------------------ faults
    def fault_marker(self) -> float:
        return time.time() * 1000.0

    def faults_since(self, marker_ms: float, task_name: str | None = None) -> dict[str, Any]:
        """Worker deaths (GCS worker table) and task retries (GCS task events) since
        ``marker_ms``. Reads Ray's internal state API; figures, never failures."""
        out: dict[str, Any] = {"worker_deaths": 0, "task_retries": 0, "dead_workers": []}
        try:
            from ray._private.state import state
            from ray.core.generated import gcs_pb2

            job = _job_id()
            accessor = state._connect_and_get_accessor()
            for raw in accessor.get_worker_table():
                w = gcs_pb2.WorkerTableData.FromString(raw)
                if job and w.job_id and w.job_id.hex() != job:
                    continue                        # another driver's worker (shared cluster)
                if (not w.is_alive and w.worker_type == 0 and w.end_time_ms >= marker_ms
                        and w.HasField("exit_type") and w.exit_type in _UNEXPECTED_EXITS):
                    out["dead_workers"].append({"pid": w.pid, "exit_type": int(w.exit_type),
                                                "detail": w.exit_detail[:160]})
            out["worker_deaths"] = len(out["dead_workers"])
        except Exception as exc:  # noqa: BLE001
            out["worker_table_error"] = str(exc)[:200]
            return out
        if not out["worker_deaths"]:
            return out
        # Retries are reported by the workers asynchronously (about every second).
        deadline = time.monotonic() + 3.0
        while True:
            retries = self._retries(marker_ms, task_name)
            if retries is None or retries or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        if retries is None:
            out["task_retries_error"] = "task events unavailable"
        else:
            out["task_retries"] = retries
        return out

    @staticmethod
    def _retries(marker_ms: float, task_name: str | None) -> int | None:
        try:
            from ray._private.state import state

            seen = set()
            job = _job_id()
            for ev in state._get_all_task_events():
                if ev.attempt_number <= 0:
                    continue
                if job and ev.job_id and ev.job_id.hex() != job:
                    continue
                if task_name and ev.HasField("task_info") and task_name not in ev.task_info.name:
                    continue
                if ev.HasField("state_updates"):
                    ts = [v / 1e6 for v in ev.state_updates.state_ts_ns.values()]
                    if ts and max(ts) < marker_ms:
                        continue
                seen.add((ev.task_id, ev.attempt_number))
            return len(seen)
        except Exception:  # noqa: BLE001
            return None


def _job_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001
        return None


def _reap(pids: set[int], grace_s: float = 5.0) -> None:
    """Terminate (then kill) the given processes and anything still under them."""
    import psutil

    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs.append(p)
            procs.extend(p.children(recursive=True))
        except psutil.Error:
            pass
    alive = [p for p in procs if _alive(p)]
    if not alive:
        return
    _, alive = psutil.wait_procs(alive, timeout=min(1.0, grace_s))
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def _alive(p: Any) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
