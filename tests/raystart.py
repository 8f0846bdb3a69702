"""A real multi-node Ray cluster on this machine, made with ``ray start`` (test helper).

This is what docs/ray.md ("Running on a real Ray cluster") tells a user to do, with
everything a shared machine needs on top: every node on loopback (``--node-ip-address=
127.0.0.2``: Ray keeps it, while it rewrites 127.0.0.1 to the machine's outward address),
ports of the test's own (none of Ray's defaults, so another cluster on the machine never
collides), a temp dir of the test's own (``RAY_TMPDIR``: Ray's current-cluster file, which
``address = "auto"`` reads, lands there and not in /tmp/ray), bounded CPUs and object store,
and token authentication with a token of the test's own (``RAY_AUTH_MODE=token`` plus
``RAY_AUTH_TOKEN``; never the user's ``~/.ray/auth_token``).

Every process a ``ray start`` leaves running inherits an environment tag, so the cluster's
processes are found (and stopped, by PID) without touching anyone else's: ``stop`` kills them
all and removes the current-cluster file, also when a test failed half-way.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

# Ray rewrites --node-ip-address=127.0.0.1 (and "localhost") to the machine's outward address
# (services.resolve_ip_for_localhost); another address of the loopback range is kept as given,
# so every node, port and connection of the test cluster stays on loopback.
LOOPBACK = "127.0.0.2"
RESOURCE = "stallbench_cpu_node"      # what stallbench's producers require when nodes carry it
TAG = "STALLBENCH_RAYSTART_TAG"
NODE = "STALLBENCH_RAYSTART_NODE"


def ray_cli() -> list[str]:
    """``ray`` of the interpreter running the tests: its nodes' workers then run that
    interpreter, with this checkout's stallbench (a ``ray`` on PATH may be another venv's)."""
    return [sys.executable, "-m", "ray.scripts.scripts"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ports() -> list[str]:
    """Every port a node opens, chosen here (Ray's defaults collide between clusters)."""
    lo = free_port()
    return [f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            # workers' ports: a small range of the test's (default 10002-19999 is shared)
            f"--min-worker-port={lo}", f"--max-worker-port={min(lo + 40, 65535)}"]


@dataclass
class Node:
    index: int
    resources: dict[str, float] = field(default_factory=dict)


class RayStartCluster:
    """Head (0 CPUs: the trainer's node) plus worker nodes, each from its own ``ray start``."""

    def __init__(self, token: str | None = "auto", object_store_mb: int = 80,
                 timeout_s: float = 120.0, ip: str = LOOPBACK) -> None:
        self.ip = ip
        # Short: Ray puts Unix sockets under the temp dir (a socket path has ~107 bytes).
        self.base = Path(tempfile.mkdtemp(prefix="sbray", dir="/tmp"))
        self.tag = uuid.uuid4().hex
        self.token = secrets.token_hex(32) if token == "auto" else token
        self.object_store_mb = object_store_mb
        self.timeout_s = timeout_s
        self.port = 0
        self.client_port = 0
        self.dashboard_port = 0
        self.nodes: list[Node] = []
        self.log: list[str] = []

    # ------------------------------------------------------------------------ environment
    def auth_env(self) -> dict[str, str]:
        """What a client of this cluster needs: the token (or auth explicitly off)."""
        if self.token is None:
            return {"RAY_AUTH_MODE": "disabled"}
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}

    def client_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment for stallbench against this cluster: its temp dir (for "auto"),
        its token, nothing of the surrounding shell's Ray settings."""
        env = dict(os.environ if base is None else base)
        for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            env.pop(k, None)
        env.update(self.auth_env())
        env["RAY_TMPDIR"] = str(self.base)
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        return env

    def _env(self, node: int) -> dict[str, str]:
        env = self.client_env()
        env[TAG] = self.tag
        env[NODE] = str(node)
        # Ray Client's proxy gives a new client's server process 30 s to come up; a loaded
        # machine has taken longer ("Starting Ray client server failed")
        env["RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S"] = "120"
        return env

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def dashboard_url(self) -> str:
        """Where ``ray job submit --address`` reaches the job server (``dashboard=True``)."""
        return f"http://{self.ip}:{self.dashboard_port}"

    @property
    def current_cluster_file(self) -> Path:
        return self.base / "ray" / "ray_current_cluster"

    # ------------------------------------------------------------------------- start/stop
    def _ray_start(self, node: int, args: list[str]) -> None:
        cmd = [*ray_cli(), "start", f"--node-ip-address={self.ip}", "--disable-usage-stats",
               f"--object-store-memory={self.object_store_mb * 2**20}", *args, *_ports()]
        t0 = time.time()
        try:
            r = subprocess.run(cmd, env=self._env(node), capture_output=True, text=True,
                               timeout=self.timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"ray start (node {node}) did not return within "
                               f"{self.timeout_s:g} s") from exc
        self.log.append(f"node {node}: ray start {time.time() - t0:.1f} s, rc {r.returncode}")
        if r.returncode != 0:
            raise RuntimeError(f"ray start (node {node}) failed: {r.stderr[-2000:]}")

    def start_head(self, cpus: int = 0, producer: bool = False, client_server: bool = True,
                   system_config: dict[str, Any] | None = None, dashboard: bool = False) -> str:
        """The head (the trainer's node). ``system_config``: GCS settings, e.g. faster health
        checks so that a lost node is declared dead in seconds rather than ~15 s.
        ``dashboard``: with Ray's dashboard and job server (``ray job submit`` to
        ``dashboard_url``), on a port of the test's own. A start that fails (a raylet that
        crashed waiting for its agents on a loaded machine) is retried up to twice, after its
        processes are stopped."""
        for attempt in (1, 2, 3):
            self.port = free_port()
            args = ["--head", f"--port={self.port}", f"--num-cpus={cpus}"]
            if dashboard:
                self.dashboard_port = free_port()
                args += ["--include-dashboard=true", f"--dashboard-port={self.dashboard_port}",
                         f"--dashboard-host={self.ip}"]
            else:
                args.append("--include-dashboard=false")
            if producer:
                args.append(f"--resources={json.dumps({RESOURCE: float(cpus)})}")
            if client_server:
                self.client_port = free_port()
                args.append(f"--ray-client-server-port={self.client_port}")
            if system_config:
                args.append(f"--system-config={json.dumps(system_config)}")
            try:
                self._ray_start(0, args)
                break
            except RuntimeError:
                if attempt == 3:
                    raise
                self.stop(remove_dir=False)
        self.nodes.append(Node(0, {RESOURCE: float(cpus)} if producer else {}))
        return self.address

    def add_node(self, cpus: int = 1, producer: bool = True) -> Node:
        """A worker node; ``producer``: it carries stallbench's producer resource."""
        i = len(self.nodes)
        res = {RESOURCE: float(cpus)} if producer else {}
        args = [f"--address={self.address}", f"--num-cpus={cpus}"]
        if res:
            args.append(f"--resources={json.dumps(res)}")
        try:
            self._ray_start(i, args)
        except RuntimeError:                  # as for the head: once more, after cleaning up
            for p in self.processes(i):
                p.kill()
            self._ray_start(i, args)
        node = Node(i, res)
        self.nodes.append(node)
        return node

    def wait_for_nodes(self, n: int | None = None, timeout_s: float = 60.0) -> None:
        """Until the GCS lists ``n`` live nodes (a fresh process: this one stays Ray-free)."""
        n = len(self.nodes) if n is None else n
        code = ("import sys, time, logging, ray\n"
                "ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False)\n"
                "t = time.time() + float(sys.argv[3])\n"
                "while sum(x['Alive'] for x in ray.nodes()) < int(sys.argv[2]):\n"
                "    if time.time() > t: sys.exit(3)\n"
                "    time.sleep(0.2)\n")
        r = subprocess.run([sys.executable, "-c", code, self.address, str(n), str(timeout_s)],
                           env=self._env(-1), capture_output=True, text=True,
                           timeout=timeout_s + 60)
        if r.returncode != 0:
            raise RuntimeError(f"{n} nodes not alive: {r.stderr[-1500:]}")

    def processes(self, node: int | None = None) -> list[psutil.Process]:
        """Live processes of this cluster (of one node), found by their inherited tag."""
        out = []
        for p in psutil.process_iter():
            try:
                env = p.environ()
                if env.get(TAG) != self.tag or p.status() == psutil.STATUS_ZOMBIE:
                    continue
                if node is None or env.get(NODE) == str(node):
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def raylet_pid(self, node: int) -> int:
        for p in self.processes(node):
            try:
                if p.name() == "raylet" or "raylet" in (p.cmdline() or [""])[0]:
                    return p.pid
            except psutil.Error:
                pass
        raise RuntimeError(f"node {node} has no raylet")

    def kill_node(self, node: int) -> int:
        """Lose a node: SIGKILL its raylet (by PID), as a machine that dies would. Its other
        processes notice and exit; ``stop`` reaps whatever does not."""
        pid = self.raylet_pid(node)
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self, remove_dir: bool = True) -> list[str]:
        """Stop every process of this cluster by PID (TERM, then KILL), remove the
        current-cluster file and the temp dir. Returns what had to be killed hard."""
        return stop_all([self], remove_dir)

    def __enter__(self) -> "RayStartCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def kill_left(procs: list[psutil.Process], wait_s: float = 5.0) -> list[str]:
    """Kill (SIGKILL, by PID) each of ``procs`` still there and wait up to ``wait_s`` for
    them; returns them as ``pid:name``, for the assertion that nothing was left. The one
    place tests end leftover processes, always by PID, never by process name."""
    names = []
    for p in procs:
        try:
            names.append(f"{p.pid}:{p.name()}")
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=wait_s)
    return names


# What a TERM does not stop: a cluster's GCS and raylets outlived it (measured: still running
# 10 s after it), and so does the head's autoscaler monitor once its GCS is gone (measured:
# still there 6 s after it); each stop waited out the whole TERM grace, then killed them.
KILLED_AT_ONCE = ("gcs_server", "raylet", "autoscaler/_private/monitor.py")


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return ""


def _killed_at_once(p: psutil.Process) -> bool:
    try:
        return p.name() in KILLED_AT_ONCE or any(a.endswith(KILLED_AT_ONCE[2])
                                                 for a in p.cmdline()[:3])
    except psutil.Error:
        return False


def stop_all(clusters: list[RayStartCluster], remove_dir: bool = True) -> list[str]:
    """``stop`` for several clusters at once: one TERM grace for all of them. What ignores a
    TERM (``KILLED_AT_ONCE``) is killed (SIGKILL, by PID) at once, the way every stop ended
    for it anyway, instead of after a grace it never used; the rest (agents, workers, the
    client server) get TERM and that grace. Returns what had to be killed hard."""
    hard = []
    for _ in range(3):
        procs = [p for c in clusters for p in c.processes()]
        if not procs:
            break
        at_once = [p for p in procs if _killed_at_once(p)]
        hard += kill_left(at_once, wait_s=0)
        for p in procs:
            try:
                if p not in at_once:
                    p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=5)
        hard += kill_left(alive)
    for c in clusters:
        try:
            c.current_cluster_file.unlink()
        except OSError:
            pass
        if remove_dir:
            shutil.rmtree(c.base, ignore_errors=True)
    return hard
