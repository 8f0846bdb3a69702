"""Ground truth over a real, kernel-shaped link: Flight servers in their own network namespace
behind a veth pair whose egress the kernel's token bucket filter holds to 200 Mbit/s
(``tc qdisc ... tbf rate 200mbit``). Every byte of the epoch crosses that link, the
producers and the trainer are far faster than it, so the stall attribution must find a
transfer-bound variant whose transfer stall is the link's cost: the bytes the link carried
(the kernel's own counter of the veth pair) divided by its rate, within 10%.

Traffic goes only to the addresses of the namespace this test creates (a /30 of 10.254.x.y,
private to the pair); the namespace, the pair and the servers are removed whatever happens
(servers stopped by PID). Where namespaces cannot be made (not root, no iproute2, a sandbox
that forbids them) the test skips, saying why.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from stallbench import scenario
from stallbench.executors.flight.driver import FlightExecutor
from stallbench.pipeline import dataset_for
from stallbench.run.runner import RunOptions, run_scenario

pytestmark = pytest.mark.groundtruth

RATE_BYTES_S = 200e6 / 8                  # tbf rate 200mbit (tc's mbit is 10^6 bits)
TOLERANCE = 0.10


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=check)


def _why_not() -> str | None:
    """Why this machine cannot run the test, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    if os.geteuid() != 0:
        return "creating a network namespace needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"iproute2's `{tool}` is not installed"
    probe = f"sbprobe{secrets.token_hex(3)}"
    r = _sh("ip", "netns", "add", probe, check=False)
    if r.returncode:
        return f"`ip netns add` is not allowed here ({r.stderr.strip()[:120]})"
    _sh("ip", "netns", "del", probe, check=False)
    return None


@pytest.fixture
def shaped_link() -> Iterator[dict[str, Any]]:
    """A namespace behind a veth pair shaped to 200 Mbit/s from the namespace's side."""
    why = _why_not()
    if why:
        pytest.skip(why)
    tag = secrets.token_hex(3)
    ns, host_dev, ns_dev = f"sbtest-{tag}", f"sbh{tag}", f"sbn{tag}"
    taken = _sh("ip", "-4", "addr").stdout + _sh("ip", "-4", "route").stdout
    for _ in range(100):                              # a /30 nobody here uses
        prefix = f"10.254.{secrets.randbelow(256)}"
        low = 4 * secrets.randbelow(64)
        if f"{prefix}.{low}" not in taken and f"{prefix}.{low + 1}" not in taken:
            break
    host_ip, ns_ip = f"{prefix}.{low + 1}", f"{prefix}.{low + 2}"
    link = {"ns": ns, "host_dev": host_dev, "host_ip": host_ip, "ns_ip": ns_ip, "procs": []}
    try:
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", host_dev, "type", "veth", "peer", "name", ns_dev, "netns", ns)
        _sh("ip", "addr", "add", f"{host_ip}/30", "dev", host_dev)
        _sh("ip", "link", "set", host_dev, "up")
        _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_dev)
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_dev, "up")
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ns_dev, "root", "tbf",
            "rate", "200mbit", "burst", "64kb", "latency", "100ms")
        yield link
    finally:
        for p in link["procs"]:                       # only what this test started, by PID
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        _sh("ip", "netns", "del", ns, check=False)
        _sh("ip", "link", "del", host_dev, check=False)   # gone with the namespace, normally
        left = _sh("ip", "netns", "list").stdout
        assert ns not in left, f"namespace {ns} left behind"


def _received_bytes(dev: str) -> int:
    """Bytes the host side of the pair received: what the namespace sent over the link."""
    return int(Path(f"/sys/class/net/{dev}/statistics/rx_bytes").read_text())


SCENARIO = """
name = "shaped-link"
description = "Flight servers behind a 200 Mbit/s tbf-shaped veth link"
[dataset]
rows = 80000
row_group_rows = 10000
files = 2
dense_features = 200
sparse_features = 8
sequence_features = 1
sequence_max_len = 8
[model]
kind = "emulated"
step_ms = 1
[loader]
batch_size = 4096
collate = "producer"
compression = "none"
prefetch_factor = 2
[executor]
kind = "flight"
flight_servers = [{servers}]
flight_token_env = "SB_LINK_TOKEN"
connect_timeout_s = 30
[analysis]
method = "chain"
[run]
repeats = 1
"""


def test_attribution_recovers_the_shaped_links_cost(shaped_link: dict[str, Any], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ns, ns_ip, dev = shaped_link["ns"], shaped_link["ns_ip"], shaped_link["host_dev"]
    ports = [47100 + secrets.randbelow(800) * 2 + i for i in range(2)]
    servers = ", ".join(f'"grpc://{ns_ip}:{p}"' for p in ports)
    path = tmp_path / "link.toml"
    path.write_text(SCENARIO.format(servers=servers))
    sc = scenario.load(path)
    cache = tmp_path / "cache"
    dataset_for(sc.base, cache, str(path))            # generated once, before the servers read it
    # Not loopback: the servers need a token (issue 38), which the trainer sends
    monkeypatch.setenv("SB_LINK_TOKEN", secrets.token_urlsafe(32))
    env = {**os.environ, "STALLBENCH_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
    for port in ports:
        p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "stallbench",
                              "serve", str(path), "--port", str(port), "--host", ns_ip,
                              "--token-env", "SB_LINK_TOKEN"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        shaped_link["procs"].append(p)
    for p in shaped_link["procs"]:
        line = p.stdout.readline()
        assert "serving 1 variant(s)" in line, line + p.stderr.read()

    # The link's own counter around each run of the executor (the test's instrument).
    runs: list[tuple[str, int, int]] = []
    real_run = FlightExecutor.run

    def counted(self: FlightExecutor, plan: Any) -> Iterator[Any]:
        b0 = _received_bytes(dev)
        try:
            yield from real_run(self, plan)
        finally:
            runs.append((plan.ablation.name, len(plan.items), _received_bytes(dev) - b0))

    monkeypatch.setattr(FlightExecutor, "run", counted)
    # The link is the kernel's, but the producers and the trainer must keep up with it, on
    # a machine others share: up to three measurements (servers kept); a harness error
    # shows in all of them, and each attempt's figures are reported.
    seen = []
    for _ in range(ATTEMPTS):
        runs.clear()
        problems, why = _measure(sc, cache, runs)
        print(why)
        seen.append(why + "".join(f"; {p}" for p in problems))
        if not problems:
            return
    pytest.fail(f"wrong in all {ATTEMPTS} attempts: " + " || ".join(seen))


ATTEMPTS = 3


def _measure(sc: Any, cache: Path, runs: list[tuple[str, int, int]]) -> tuple[list[str], str]:
    result = run_scenario(sc, RunOptions(cache_dir=cache, progress=False))
    v = result.variants[0]
    a = v.attribution
    assert a is not None
    items = max(n for _, n, _ in runs)                # the measured runs (not the warm-up)
    by_name = {name: b for name, n, b in runs if n == items}
    truth = (by_name["no_fetch_preprocess"] - by_name["no_fetch_preprocess_transfer"]) / RATE_BYTES_S
    wire = v.repeats[0].bytes.wire_bytes
    why = (f"transfer stall {a.transfer_stall_s:.3f} s vs link {truth:.3f} s "
           f"({(a.transfer_stall_s - truth) / truth:+.1%}; full run: epoch "
           f"{v.epoch_s.median:.3f} s, link carried {by_name['full'] / 1e6:.1f} MB, trainer's "
           f"sockets {wire / 1e6:.1f} MB; parts: fetch {a.fetch_stall_s:.3f} preprocess "
           f"{a.preprocess_stall_s:.3f} overhead {a.overhead_s:.3f} compute {a.compute_s:.3f}; "
           f"ablation epochs {({k: round(x, 3) for k, x in a.ablation_epoch_s.items()})})")
    problems = []
    if truth < 1.5:                                   # the link dominates by construction
        problems.append(f"the link carried too little ({truth:.3f} s)")
    if a.bound_by != "transfer":
        problems.append(f"bound by {a.bound_by}: {a.verdict}")
    if abs(a.transfer_stall_s - truth) > TOLERANCE * truth:
        problems.append(f"transfer stall off by more than {TOLERANCE:.0%}")
    # stallbench's own byte count (the trainer's socket counters: TCP payload, no headers)
    # saw what the link carried (frames: the same bytes plus TCP/IP/Ethernet headers)
    if not 0.9 * by_name["full"] <= wire <= by_name["full"]:
        problems.append(f"socket bytes {wire} vs link bytes {by_name['full']}")
    return problems, why
