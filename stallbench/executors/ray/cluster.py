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
- *address*: ``ray_address = "auto" | "host:port" | "ray://host:port"`` -> an existing cluster
  (``ray start``), with or without Ray's token authentication. Before ``ray.init``, a TCP
  check, an HTTP/2 greeting and a probe child (``stallbench.ray_probe``, killed on time-out)
  turn each way it can fail into one ``ScenarioError`` naming the cause: nothing listening, not
  Ray, token missing / rejected / token mode against a cluster without auth, Ray version
  mismatch, silence within ``connect_timeout_s``. ``ray.init`` itself is a poor probe: it
  reports them all as "Failed to connect" after 20 s, blocks for minutes on a silent port and
  aborts the process on some token misconfigurations. Nodes carrying ``stallbench_cpu_node``
  are the producer nodes, as on a simulated cluster.

Runtimes that stallbench starts run lean (``LEAN_SYSTEM_CONFIG``/``LEAN_ENV``: Ray's telemetry,
which nobody reads here, off), so the Ray path's CPU is the producers' work.

Whatever stallbench starts it stops, also on errors, Ctrl-C and SIGTERM: ``close`` shuts Ray
down and then kills any process the runtime left behind (it remembers which processes appeared
under this one while the runtime came up), and an ``atexit`` hook covers paths that skip
``close``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator

from ... import interrupts
from ...errors import ScenarioError, UserError, need_extra
from ...ray_setup import RUNTIME_ENV, avoid_fsspec_import_race, job_config
from ...scenario import ExecutorSpec
from .lost import REFUSED, RayLog, Vital, port_answer

RESOURCE = "stallbench_cpu_node"     # custom resource carried by simulated CPU nodes
# Ray's own telemetry in a runtime stallbench starts (local or simulated): nobody reads it
# (no dashboard), and every Ray process pays for it in CPU that the producer CPU figures would
# charge to the Ray path: metrics collection and export (core workers, raylet, the dashboard
# agent's metrics), per-handler event-loop statistics, and the agent's per-process stats
# sweep every 5 s. Measured by benchmarks/ray_efficiency.py (benchmarks/README.md). Clusters reached by
# address are left as their owner configured them.
LEAN_SYSTEM_CONFIG = {"enable_metrics_collection": False, "event_stats": False}
LEAN_ENV = {"REPORTER_UPDATE_INTERVAL_MS": "60000"}


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
    """``ray`` (with ``ray.data``), or one clear ``MissingExtra`` naming the [ray] extra."""
    need_extra("ray", f'{scenario_file}: executor.kind = "ray"')
    import ray
    avoid_fsspec_import_race()
    return ray


def _failure_signal_handler(disabled: Any) -> Any:
    """Set whether this process's core worker installs Ray's C++ failure-signal handler
    (``ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER``; see ``RayRuntime.open``); returns
    the value it had (None: Ray's internals moved, nothing done). Set only while stallbench
    owns a runtime: a Ray a library caller initialises later keeps Ray's behaviour."""
    try:
        from ray._private import ray_constants

        was = ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = disabled
        return was
    except (ImportError, AttributeError):  # pragma: no cover
        return None


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


class _lean_env:
    """``LEAN_ENV`` in the environment while Ray's processes start (they inherit it), then
    the environment as it was."""

    def __enter__(self) -> None:
        self.saved = {k: os.environ.get(k) for k in LEAN_ENV}
        for k, v in LEAN_ENV.items():
            os.environ.setdefault(k, v)

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _command_time() -> str:
    """What a lost runtime cost: the command's time so far, all of it lost with the run
    (`` after 12.3 s of the command``; empty where the process's start is unknown)."""
    try:
        import psutil

        took = max(time.time() - psutil.Process().create_time(), 0.0)
        return f" after {took:.1f} s of the command"
    except Exception:  # noqa: BLE001 - a figure of the message, never a failure
        return ""


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
    """Where `ray start` (and cluster_utils.Cluster) record the "current" cluster that
    address="auto" reads: ``$RAY_TMPDIR/ray`` (or ``/tmp/ray``) ``/ray_current_cluster``. A
    simulated cluster must not leave its address there for others."""
    from ray._common.utils import get_ray_address_file

    return get_ray_address_file(None)


class RayRuntime:
    def __init__(self, spec: ExecutorSpec, scenario_file: str = "<scenario>",
                 gcs_grace_s: float = 10.0) -> None:
        self.spec = spec
        self.gcs_grace_s = gcs_grace_s     # a cluster by address: its GCS silent that long
        self.file = scenario_file
        self.mode = "none"
        self.owned = False
        self.address: str | None = None
        self.client = False                # connected through Ray Client (ray://)
        self.cluster: Any = None
        self.producer_resources: dict[str, float] = {}
        self._before: dict[int, str] = {}
        self._spawned: set[int] = set()
        self._address_file: tuple[str, str | None] | None = None
        self._store_cache: tuple[float, float | None] = (0.0, None)
        self._pids_cache: tuple[float, list[int]] = (0.0, [])
        self._cpu_seen: dict[tuple[int, float], float] = {}   # (pid, start time) -> CPU s
        self._atexit = False
        self._handler_was: Any = None      # ray_constants' value before ``open``
        self._sigterm = interrupts.SigtermAsInterrupt()
        self.vital = Vital()               # what the run cannot go on without (lost.py)
        self.log = RayLog()                # Ray's own terminal output, into a file

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
        # The variable is for the processes Ray starts (they inherit it); this process read
        # it into ``ray_constants`` when it imported Ray, before this line, and its core
        # worker (created inside ``ray.init``) reads the constant: left as it was, a SIGTERM
        # between the driver's connection and the end of ``ray.init`` (before our handlers
        # are back) ended the command with a C++ stack dump and rc -6 instead of 143.
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        if self._handler_was is None:
            self._handler_was = _failure_signal_handler(True)
        self.owned = True              # from here on close() must clean up, even half-started
        if not self._atexit:
            atexit.register(self.close)
            self._atexit = True
        self.log.divert()                 # Ray's messages from its first moment on (RayLog)
        try:
            self._start()
        except KeyboardInterrupt:         # Interrupted too: SIGINT, SIGTERM
            interrupts.runtime_left()
            raise
        self._spawned = set(_descendants()) - set(self._before)
        self._take_sigterm()
        self._quiet_data()
        self.log.open(_logs_dir(), scratch=self.client)
        self._watch_vital()

    def _start(self) -> None:
        """Start or reach the runtime (``ray.init`` and what precedes it)."""
        import ray

        spec = self.spec
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
                with _lean_env():
                    ray.init(address="local", num_cpus=spec.cpus or os.cpu_count() or 1,
                             object_store_memory=spec.object_store_mb * 2**20,
                             include_dashboard=False, log_to_driver=False,
                             logging_level=logging.WARNING, namespace="stallbench",
                             runtime_env=RUNTIME_ENV, job_config=job_config(), _system_config=LEAN_SYSTEM_CONFIG)

    def _watch_vital(self) -> None:
        """The GCS and raylets of a runtime started here, from Ray's own node records,
        watched while the runtime is open (``lost.Vital``). Only under the CLI (its signal
        handlers are installed): ending the process is the command's to do, never a
        library caller's."""
        if not interrupts.installed():
            return
        try:
            if self.mode == "address" and not self.client and self.address:
                host, _, port = self.address.rpartition(":")
                self.vital = Vital(gcs=(host.strip("[]"), int(port)),
                                   gcs_grace_s=self.gcs_grace_s)
            elif self.mode == "address" and self.client:
                self.vital = Vital(gcs=_client_gcs(), gcs_grace_s=self.gcs_grace_s)
            elif self.mode == "local":
                from ray._private import worker as ray_worker

                self.vital = Vital.of(ray_worker._global_node)
            elif self.mode == "simulated" and self.cluster is not None:
                self.vital = Vital.of(self.cluster.head_node, list(self.cluster.worker_nodes))
        except Exception:  # noqa: BLE001 - Ray's internals moved: nothing watched, as before
            self.vital = Vital()
            return
        self.vital.watch(self._lost)

    def _lost(self, what: str) -> None:
        """A vital process died (``Vital.watch``'s thread): the run cannot complete. Said in
        one line, every process of the runtime killed by PID, and the process ended with
        exit 2 from here, at once: Ray's core worker would otherwise end it with exit 1 (a
        raylet lost) or wait a minute for the GCS, and the trainer's thread may be blocked
        inside Ray. No result can be half-written: results are written after the runtime
        closes, and closing stops this watch first."""
        if interrupts.pending() is not None:
            return                      # a Ctrl-C or SIGTERM reached Ray's processes too
        log = self.log.last_path
        whose = (f"the Ray cluster at {self.address} (executor.ray_address)"
                 if self.mode == "address" else "the Ray runtime stallbench started for this run")
        line = (f"stallbench: error: {self.file}: executor: {whose} lost {what}"
                f"{_command_time()}; the run cannot complete and no result is written"
                + (f" (Ray's log: {log})" if log else "") + "\n")
        try:
            os.write(self.log.terminal_fd(), line.encode("utf-8", "backslashreplace"))
        except OSError:
            pass
        try:
            import psutil

            victims = (set(_descendants()) - set(self._before)) | self._spawned
            for pid in victims:
                try:
                    psutil.Process(pid).kill()
                except psutil.Error:
                    pass
        finally:
            os._exit(2)

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
        self._sigterm.take()

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
        with _lean_env():
            self.cluster = Cluster(initialize_head=True, shutdown_at_exit=True, head_node_args={
                "num_cpus": 0, "object_store_memory": store, "include_dashboard": False,
                "_system_config": LEAN_SYSTEM_CONFIG})
            for _ in range(spec.simulated_nodes):
                self.cluster.add_node(wait=False, num_cpus=spec.cpus_per_node,
                                      resources={RESOURCE: float(spec.cpus_per_node)},
                                      object_store_memory=store)
            self.cluster.wait_for_nodes(timeout=120)
        self._restore_address_file()
        self.address = self.cluster.address
        ray.init(address=self.cluster.address, log_to_driver=False,
                 logging_level=logging.WARNING, namespace="stallbench", runtime_env=RUNTIME_ENV, job_config=job_config())
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
        """Connect to an existing cluster, or fail with one line that names the cause: nothing
        listening, not Ray, a token missing or rejected, a Ray/Python version mismatch, or a
        cluster that does not answer in ``connect_timeout_s``. ``address`` keeps Ray's
        meaning: ``"auto"`` is what ``ray.init("auto")`` finds (``RAY_ADDRESS``, else the
        current-cluster file of ``RAY_TMPDIR``/``/tmp/ray``, else a GCS process on this
        machine), with Ray's token auto-enable; an explicit address is used as given (a
        ``RAY_ADDRESS`` in the environment does not override it) and sends a token only when
        ``RAY_AUTH_MODE=token``, as Ray documents."""
        import ray

        from ... import ray_probe

        target = _parse_address(address, self.file)
        # Ray aborts the whole process (C++) on these: catch them before any Ray call.
        state = ray_probe.auth_state(target.auto)
        problem = ray_probe.auth_problem({**os.environ, "RAY_AUTH_MODE": "token"}
                                         if state["token"] else dict(os.environ))
        if problem:
            raise ScenarioError(self.file, _KEY, f"cannot authenticate to a Ray cluster: {problem}")
        timeout = self.spec.connect_timeout_s
        host, port = target.host, target.port
        # 1. Is anything listening? Refused or unroutable fails here in milliseconds.
        try:
            sock = socket.create_connection((host, port), timeout=min(5.0, timeout))
        except OSError as exc:
            raise ScenarioError(self.file, _KEY, f"nothing is listening at {target.hostport} "
                                                 f"({exc.strerror or exc}): no Ray cluster "
                                                 f"there{target.found}") from None
        # 2. Does it speak gRPC (HTTP/2), as Ray's GCS and Ray Client servers do? An answer
        #    in another protocol is final; silence is judged by the probe's time-out.
        with sock:
            reply = _sniff_http2(sock, min(3.0, timeout))
        if reply is not None and reply != "":
            raise ScenarioError(self.file, _KEY, f"{target.hostport} is not a Ray cluster: it "
                                                 f"answered {reply} where Ray speaks gRPC"
                                                 f"{target.hint}")
        # 3. Will it let us in, with matching versions? In a child, killed on time-out.
        out = _run_probe(target, timeout)
        if out is None:
            raise ScenarioError(self.file, _KEY, f"{target.hostport} accepts connections but no "
                                                 f"Ray cluster answered within {timeout:g} s "
                                                 f"(executor.connect_timeout_s){target.hint}")
        if not out.get("ok"):
            raise ScenarioError(self.file, _KEY, _probe_message(target, out))
        self.address = target.hostport if target.client else target.gcs
        # 4. The real connection, in this process.
        saved = os.environ.get("RAY_ADDRESS")
        try:
            if target.auto:
                pass                                   # Ray's own "auto" (RAY_ADDRESS first)
            elif target.client:
                os.environ.pop("RAY_ADDRESS", None)
            else:
                os.environ["RAY_ADDRESS"] = target.gcs   # the scenario's address wins
            # Ray Client: the driver runs on the head (its paths are the head's, not this
            # directory's), and the job config is unpickled by the client server, which has
            # no use for (and failed to start with) the path-keeping list of ``job_config``.
            ray.init(address=target.init_address, log_to_driver=False,
                     logging_level=logging.WARNING, namespace="stallbench",
                     runtime_env=RUNTIME_ENV,
                     job_config=None if target.client else job_config())
        except Exception as exc:  # noqa: BLE001 - one line for the user, whatever Ray raised
            text = " ".join(f"{exc} {exc.__cause__ or ''}".split())
            if "Version mismatch" in text:
                raise ScenarioError(self.file, _KEY, f"Ray version mismatch with the cluster at "
                                                     f"{target.hostport}: {text[:300]}") from None
            if "InvalidAuthToken" in text or "authentication" in text.lower():
                raise ScenarioError(self.file, _KEY, _probe_message(
                    target, {"cause": "auth_rejected" if state["token"] else "auth_missing",
                             "auth": state})) from None
            raise ScenarioError(self.file, _KEY, f"cannot connect to the Ray cluster at "
                                                 f"{target.hostport}: {text[:300]}") from None
        finally:
            if saved is None:
                os.environ.pop("RAY_ADDRESS", None)
            else:
                os.environ["RAY_ADDRESS"] = saved
        self.client = target.client
        self._use_producer_nodes()

    def _use_producer_nodes(self) -> None:
        """On a real cluster, nodes that carry ``stallbench_cpu_node`` (``ray start
        --resources='{"stallbench_cpu_node": N}'``) are the producer nodes: producers require
        the resource, so they never run next to the trainer on the head. A cluster without
        any such node runs producers wherever Ray places them."""
        import ray

        try:
            if ray.cluster_resources().get(RESOURCE, 0) > 0:
                self.producer_resources = {RESOURCE: 1.0}
        except Exception:  # noqa: BLE001 - a cluster that cannot say runs producers anywhere
            pass

    def failed(self, exc: Exception) -> None:
        """The scope that holds this runtime ends on ``exc`` (``runtimes.RuntimeScope``): a
        Ray Client run's scratch log (what the cluster side printed; removed at ``close``
        after a run that did not fail) is kept, and named on the error, after its one line
        (``cli._say_error``) or its traceback (a note)."""
        log = self.log
        if log.path is None or not log._scratch or log.keep:
            return
        log.keep = True
        try:
            exc.add_note(f"Ray's log: {log.path}")
        except Exception:  # noqa: BLE001 - a name for a message
            pass

    def close(self) -> None:
        """Shut down what this runtime started; a no-op for a reused or already closed one."""
        if not self.owned:
            return
        self.owned = False
        victims = (set(_descendants()) - set(self._before)) | self._spawned
        self.vital.closing = True         # its processes end now: not a loss
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
        if self._handler_was is not None:
            _failure_signal_handler(self._handler_was)
            self._handler_was = None
        self.log.close()
        self._sigterm.give_back()
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
        if self.mode == "address":
            out["producer_nodes_on_this_host"] = self._producer_nodes_here(nodes)
        if self.mode == "simulated":
            out["simulated_nodes"] = self.spec.simulated_nodes
            out["cpus_per_node"] = self.spec.cpus_per_node
            out["oversubscribed"] = (self.spec.simulated_nodes * self.spec.cpus_per_node
                                     > (os.cpu_count() or 1))
        return out

    def _producer_nodes_here(self, nodes: list[dict[str, Any]]) -> bool:
        """Whether every node that can run producers is on this machine: its address is one
        of this host's (loopback included). Ray Client: the cluster is elsewhere."""
        if self.client:
            return False
        import psutil

        here = {"localhost"}
        try:
            for addrs in psutil.net_if_addrs().values():
                here.update(a.address for a in addrs)
        except Exception:  # noqa: BLE001
            pass
        key = next(iter(self.producer_resources), "CPU")
        prod = [n for n in nodes if n.get("Resources", {}).get(key, 0) > 0]
        return bool(prod) and all(n.get("NodeManagerAddress") in here
                                  or str(n.get("NodeManagerAddress", "")).startswith("127.")
                                  for n in prod)

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
        own time); None for a cluster elsewhere. Monotone: a process that has exited keeps the
        CPU it had at the last read (Ray recycles idle workers; without this, one exiting
        between two reads would make their difference smaller, even negative), so only its CPU
        after the last read is lost: a lower bound."""
        if self.mode not in ("local", "simulated", "reused"):
            return None
        import psutil

        try:
            procs = psutil.Process().children(recursive=True)
        except psutil.Error:
            return None
        for p in procs:
            try:
                t = p.cpu_times()
                key = (p.pid, p.create_time())
            except psutil.Error:
                continue
            self._cpu_seen[key] = t.user + t.system + t.children_user + t.children_system
        return sum(self._cpu_seen.values()) if self._cpu_seen else None

    def cluster_cpu_by_kind(self) -> dict[str, float] | None:
        """``cluster_cpu_s`` split by what each process is: ``tasks`` (Ray workers that ran
        or wait for tasks: the producers), ``raylet``, ``gcs``, ``agents`` (dashboard and
        runtime-env agents, log monitor, dashboard), ``data_actors`` (Ray Data's helper
        actors). Where an extra CPU cost of the Ray path goes."""
        if self.mode not in ("local", "simulated", "reused"):
            return None
        import psutil

        out: dict[str, float] = {}
        try:
            procs = psutil.Process().children(recursive=True)
        except psutil.Error:
            return None
        for p in procs:
            try:
                t = p.cpu_times()
                name = p.name()
                cmd = " ".join(p.cmdline()[:3]) if not name.startswith("ray::") else name
            except psutil.Error:
                continue
            out_key = _cpu_kind(name, cmd)
            out[out_key] = out.get(out_key, 0.0) + t.user + t.system + t.children_user \
                + t.children_system
        return out

    def object_store_used_mb(self) -> float | None:
        """Object-store bytes in use on all nodes, as the raylets report them to the GCS
        (about once a second, so read at most once a second: every read is a GCS call whose
        CPU the producers' figures would carry); None where that is not reachable."""
        now = time.monotonic()
        if now - self._store_cache[0] < 1.0:     # each read is a GCS call; reports come ~1/s
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
    def producer_nodes_state(self) -> dict[str, dict[str, Any]]:
        """Every node that can run producers (it carries the producer resource, else any CPU),
        alive or not, by node id: ``{"alive", "reason"}``. Empty when Ray cannot say."""
        import ray

        try:
            nodes = ray.nodes()
        except Exception:  # noqa: BLE001 - a figure and a watchdog input, never a failure
            return {}
        key = next(iter(self.producer_resources), "CPU")
        out = {}
        for n in nodes:
            if n.get("Resources", {}).get(key, 0) > 0 or not n.get("Alive"):
                out[n["NodeID"]] = {"alive": bool(n.get("Alive")),
                                    "reason": str(n.get("DeathReasonMessage") or "")[:200],
                                    "raylet": (str(n.get("NodeManagerAddress") or ""),
                                               int(n.get("NodeManagerPort") or 0))}
        return out

    @staticmethod
    def raylet_gone(raylet: tuple[str, int], timeout_s: float = 1.0) -> str | None:
        """Why a node's raylet is known gone before Ray's GCS says so (its health checks take
        ~15-30 s to declare a node dead: a node lost near a run's end was alive in the GCS's
        records at the run's end, and the loss went unsaid): its node-manager port refuses
        a TCP connection. None: it accepts one, or cannot be asked (no address, a timeout:
        a slow network is not a loss)."""
        host, port = raylet
        if not host or not port or port_answer(host, port, timeout_s) != REFUSED:
            return None
        # (no dots: the report's line keeps a reason's first sentence, and an IP has them)
        return (f"its raylet refuses connections on port {port}; Ray's GCS had not yet "
                f"declared the node dead")

    def fault_marker(self) -> float:
        return time.time() * 1000.0

    def faults_since(self, marker_ms: float, task_name: str | None = None,
                     nodes_lost: bool = False) -> dict[str, Any]:
        """Worker deaths (GCS worker table) and task retries (GCS task events) since
        ``marker_ms`` (retries are looked up after a death, or a node lost: ``nodes_lost``).
        Reads Ray's internal state API; figures, never failures."""
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
        if not out["worker_deaths"] and not nodes_lost:
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


def _client_gcs(timeout_s: float = 30.0) -> tuple[str, int] | None:
    """Through Ray Client the GCS is the cluster's, not named in ``ray://host:port`` (that
    is the client server, which keeps accepting connections after the GCS is gone, so it
    cannot stand in): a task asks the cluster for its GCS address, and it is watched when
    this machine can connect to it. Unreachable from here (only the client port open),
    nothing is watched and ``[run] progress_timeout_s`` ends a run the loss stalls."""
    try:
        import ray

        @ray.remote(num_cpus=0, max_retries=0)
        def gcs_address() -> str:
            return ray.get_runtime_context().gcs_address

        host, _, port = str(ray.get(gcs_address.remote(), timeout=timeout_s)).rpartition(":")
        where = (host.strip("[]"), int(port))
        with socket.create_connection(where, timeout=2.0):
            return where
    except Exception:  # noqa: BLE001 - not answerable or not reachable: not watched
        return None


def _logs_dir() -> str:
    """The Ray session's log directory on this machine (where Ray's own logs are), else
    the temp directory."""
    try:
        from ray._private import worker as ray_worker

        return ray_worker._global_node.get_logs_dir_path()
    except Exception:  # noqa: BLE001
        import tempfile

        return tempfile.gettempdir()


def _cpu_kind(name: str, cmd: str) -> str:
    if name == "raylet":
        return "raylet"
    if name.startswith("gcs_server"):
        return "gcs"
    if name.startswith("ray::"):
        if any(a in name for a in ("DashboardAgent", "RuntimeEnvAgent")):
            return "agents"
        if any(a in name for a in _AGENTS):
            return "data_actors"
        return "tasks"
    if any(x in cmd for x in ("dashboard", "log_monitor", "monitor.py", "runtime_env")):
        return "agents"
    return "other"


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
    alive = [p for p in procs if interrupts.running(p)]
    if not alive:
        return
    _, alive = psutil.wait_procs(alive, timeout=min(1.0, grace_s))
    interrupts.terminate_then_kill(alive, grace_s)


# ------------------------------------------------------------------------ connecting by address

_KEY = "executor.ray_address"
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@dataclass(frozen=True)
class _Target:
    """A parsed ``ray_address``: where to probe, and what to give ``ray.init``."""

    given: str
    host: str
    port: int
    client: bool = False          # ray://: Ray Client
    auto: bool = False            # "auto": found the way ray.init("auto") finds it
    found: str = ""               # for "auto": where it was found (for messages)

    @property
    def hostport(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def gcs(self) -> str:
        return self.hostport

    @property
    def init_address(self) -> str:
        return "auto" if self.auto else (self.given if self.client else self.hostport)

    @property
    def hint(self) -> str:
        if self.client:
            return (" (expected the Ray Client port of a head started with `ray start --head "
                    "--ray-client-server-port=PORT`)")
        return (" (expected the GCS port of `ray start --head --port=PORT`; a Ray Client port "
                "is written \"ray://host:PORT\")")


def _split_hostport(hostport: str, given: str, file: str) -> tuple[str, int]:
    host, _, port_s = hostport.rpartition(":")
    host = host.strip("[]")
    if not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise ScenarioError(file, _KEY, f"expected \"auto\", \"host:port\" or \"ray://host:port\", "
                                        f"got {given!r}")
    return host, int(port_s)


def _parse_address(address: str, file: str) -> _Target:
    if address.startswith("ray://"):
        host, port = _split_hostport(address[len("ray://"):].split("/", 1)[0], address, file)
        return _Target(address, host, port, client=True)
    if address != "auto":
        host, port = _split_hostport(address, address, file)
        return _Target(address, host, port)
    env_addr = os.environ.get("RAY_ADDRESS")
    if env_addr:
        found = " (\"auto\" found it in RAY_ADDRESS)"
        if env_addr.startswith("ray://"):
            host, port = _split_hostport(env_addr[len("ray://"):].split("/", 1)[0], env_addr, file)
            return _Target(env_addr, host, port, client=True, found=found)
        host, port = _split_hostport(env_addr, env_addr, file)
        return _Target(address, host, port, auto=True, found=found)
    from ray._private import services

    where = _ray_address_file()
    try:
        resolved = services.canonicalize_bootstrap_address(address) or ""
    except (ConnectionError, ValueError):
        resolved = ""
    if not resolved:
        raise ScenarioError(file, _KEY, f"\"auto\" found no running Ray cluster on this machine "
                                        f"(RAY_ADDRESS is unset, there is no {where}, and no "
                                        f"gcs_server process runs here)")
    found = (f" (\"auto\" found it in {where})" if os.path.exists(where)
             else " (\"auto\" found a gcs_server process on this machine)")
    host, port = _split_hostport(resolved, resolved, file)
    return _Target(address, host, port, auto=True, found=found)


def _sniff_http2(sock: socket.socket, timeout: float) -> str | None:
    """Send the HTTP/2 client preface and read the first bytes back. None: an HTTP/2 server
    (Ray's gRPC servers answer with a SETTINGS frame at once); "": silence; else what came
    back, quoted. Skipped (None) when Ray uses TLS: then the first bytes are a handshake."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None
    try:
        sock.settimeout(timeout)
        sock.sendall(_H2_PREFACE)
        data = sock.recv(64)
    except socket.timeout:
        return ""
    except OSError as exc:
        return f"by closing the connection ({exc.strerror or exc})"
    if not data:
        return "by closing the connection"
    if len(data) >= 4 and data[3] == 0x04:
        return None
    text = data.split(b"\n", 1)[0].decode("latin-1").strip()
    printable = all(32 <= ord(c) < 127 for c in text) and text
    return f"\"{text[:60]}\"" if printable else f"{len(data)} bytes that are not HTTP/2"


def _run_probe(target: _Target, timeout: float) -> dict[str, Any] | None:
    """``stallbench.ray_probe`` in a child (see its docstring); None when it did not answer in
    time. Its start-up (importing Ray, ~1 s) is inside the time-out."""
    cmd = [sys.executable, "-m", "stallbench.ray_probe", "client" if target.client else "gcs",
           target.hostport, f"{timeout:g}", "auto" if target.auto else "explicit"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None
    for line in reversed((proc.stdout or "").strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    err = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()]
    return {"ok": False, "cause": "error",
            "detail": f"the probe exited with {proc.returncode}: {err[-1][:300] if err else '?'}"}


def _probe_message(target: _Target, out: dict[str, Any]) -> str:
    """The one line for a probe's answer (``stallbench.ray_probe``)."""
    hp = f"{target.hostport}{target.found}"
    cause, auth = out.get("cause"), out.get("auth") or {}
    fix = ("set RAY_AUTH_MODE=token and put the cluster's token in RAY_AUTH_TOKEN, a file "
           "named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token (`ray get-auth-token` on the "
           "head prints it)")
    if cause == "auth_missing":
        mode = auth.get("mode")
        if mode is None and auth.get("available"):
            why = (f"RAY_AUTH_MODE is unset, and Ray sends its token (found: "
                   f"{auth['available']}) to an explicit address only with RAY_AUTH_MODE=token")
        elif mode is None:
            why = "RAY_AUTH_MODE is unset and no token was found"
        else:
            why = f"RAY_AUTH_MODE={mode}"
        return (f"the Ray cluster at {hp} requires token authentication and this process sends "
                f"no token ({why}): {fix}")
    if cause == "auth_rejected":
        return (f"the Ray cluster at {hp} rejected this process's token (from "
                f"{auth.get('source')}): it is not the cluster's token; `ray get-auth-token` on "
                f"the head prints the right one")
    if cause == "auth_unexpected":
        src = (f"RAY_AUTH_MODE={auth.get('mode')}" if auth.get("mode")
               else f"token auth auto-enabled by \"auto\" (token in {auth.get('source')})")
        return (f"the Ray cluster at {hp} runs without token authentication, but this process "
                f"would use it ({src}): the cluster's workers could not hand results back to "
                f"it and the run would wait forever; set RAY_AUTH_MODE=disabled (or start the "
                f"cluster with RAY_AUTH_MODE=token)")
    if cause == "auth_no_token":
        return f"cannot authenticate to the Ray cluster at {hp}: {out.get('detail')}"
    if cause == "version":
        return (f"Ray version mismatch with the cluster at {hp}: it runs Ray "
                f"{out.get('cluster_ray')} on Python {out.get('cluster_python')}, this process "
                f"Ray {out.get('ray')} on Python {out.get('python')} (Ray needs the same Ray and "
                f"Python versions on every node and driver)")
    if cause == "not_ray":
        return f"{hp} is not a Ray cluster: it {out.get('detail')}{target.hint}"
    if cause == "silent":
        return (f"{hp} accepts connections but no Ray cluster answered within "
                f"{out.get('timeout', '?')} s (executor.connect_timeout_s){target.hint}")
    return f"cannot connect to the Ray cluster at {hp}: {out.get('detail')}"
