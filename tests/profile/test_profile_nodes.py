"""torchrun across machines without a shared file system (issue 56): two nodes on loopback,
each its own ``stallbench profile`` launch with its own ``--out`` and its own ``TMPDIR``, the
figures brought to node rank 0 over its endpoint, signed with ``STALLBENCH_NODE_TOKEN``.

- the ranks of node 1 pay ITEM_MS per item (a sleep, so the truth does not depend on free
  cores): node 1's ranks are the stragglers, named across nodes, per-node rows present, and
  nothing is left on either node (scratch, listener, process);
- node 1's job killed mid-run (SIGKILL to its torchrun, by PID): node rank 0 writes the result
  of the ranks that reported and names node 1 (exit 3);
- node 1 with another token: refused, named, nothing of it merged (exit 3 on both);
- SIGTERM to one node's launcher mid-run: its job ended, nothing left on it (no scratch, no
  listener, no process), the other node ends as its job does (node rank 0 names node 1);
- ``tune`` across the two nodes: every trial node rank 0 chooses runs on both nodes with its
  settings, ends on both when node rank 0 ends its own, and the answer holds every rank.

The shared ``--out`` case is ``test_profile_ranks.py``'s."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import loadcheck
import profile_helpers as helpers

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
TOKEN = "node-token-" + "x" * 20
ITEM_MS, STEP_MS, SLOW_NODE = 6.0, 5.0, "node:1"     # ddp_train.py: every rank of node 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp: Path, k: int, master: int, node_port: int, args: list[str], token: str,
            nproc: int = 2, extra: tuple[str, ...] = (),
            verb: tuple[str, ...] = ("profile", "--no-analyze")) -> subprocess.Popen:
    """Node ``k``: its own --out, its own TMPDIR, the token in its environment."""
    (tmp / f"tmp{k}").mkdir(exist_ok=True)
    env = helpers.env(TMPDIR=str(tmp / f"tmp{k}"), **{"STALLBENCH_NODE_TOKEN": token})
    return subprocess.Popen(
        [sys.executable, "-m", "stallbench", *verb, "--out",
         str(tmp / f"out{k}"), "--node-port", str(node_port), *extra, "--", TORCHRUN,
         "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", str(nproc),
         "--master-addr", "127.0.0.1", "--master-port", str(master),
         helpers.script("ddp_train.py"), *args],
        cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _left_behind(tmp: Path, port: int) -> list[str]:
    """What a profile must not leave on any node: a scratch folder, a listener, a process
    started for a node (its TMPDIR is that node's, under this test's folder)."""
    out = [str(p) for k in (0, 1) for p in (tmp / f"out{k}").glob(".stallbench-profile-*")]
    out += [str(p) for k in (0, 1) for p in (tmp / f"tmp{k}").glob("*stallbench*")]
    out += [f"listener on {port}" for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port]
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("TMPDIR", "").startswith(str(tmp)):
                out.append(f"process {p.pid} {' '.join(p.cmdline())[:80]}")
        except psutil.Error:
            pass
    return out


def _both(procs: list[subprocess.Popen], timeout: float = 400) -> list[tuple[str, str]]:
    return [p.communicate(timeout=timeout) for p in procs]


@pytest.mark.groundtruth
def test_two_nodes_each_its_own_out_name_the_slow_node(tmp_path: Path) -> None:
    def case() -> list[str]:
        for k in (0, 1):
            for d in (tmp_path / f"out{k}", tmp_path / f"tmp{k}"):
                subprocess.run(["rm", "-rf", str(d)], check=True)
        port, master = _free_port(), _free_port()
        procs = [_launch(tmp_path, k, master, port,
                         [str(ITEM_MS), str(STEP_MS), SLOW_NODE, "2048"], TOKEN)
                 for k in (0, 1)]
        got = _both(procs)
        assert [p.returncode for p in procs] == [0, 0], got
        assert "its figures went to node rank 0" in got[1][1]
        assert "merged the figures of 2 of 2 nodes (via endpoint)" in got[0][1]
        assert not (tmp_path / "out1").exists()         # node 1's --out: nothing kept
        assert TOKEN not in "".join(o + e for o, e in got)
        assert TOKEN not in helpers.result_files(tmp_path / "out0")[0].read_text()
        left = _left_behind(tmp_path, port)
        assert not left, left
        r = helpers.load(tmp_path / "out0")
        assert r.profile.nodes == 2 and r.profile.world_size == 4
        v = r.variants[0]
        rows = {n.node: n for n in v.profile.nodes}
        assert sorted(rows) == [0, 1] and not any(n.missing for n in rows.values())
        assert (rows[0].ranks, rows[1].ranks) == ([0, 1], [2, 3]), rows
        assert rows[1].via == "endpoint" and rows[0].via == "this node"
        host = socket.gethostname()     # one machine here: both nodes' host
        want = {0: f"0 ({host})", 1: f"0 ({host})", 2: f"1 ({host})", 3: f"1 ({host})"}
        assert {st.rank: st.node for st in v.ranks.ranks} == want
        assert {lo.rank: lo.node for lo in v.profile.loaders} == want
        assert "nodes (one stallbench profile per node" in got[0][0]
        problems = []
        if v.ranks.straggler not in (2, 3):
            problems.append(f"straggler {v.ranks.straggler}, not a rank of node 1: "
                            f"{v.ranks.verdict}")
        elif "(node rank 1, " not in v.ranks.verdict or \
                "every rank of node rank 1 (2, 3) waited" not in v.ranks.verdict:
            problems.append(f"the verdict does not name node 1: {v.ranks.verdict}")
        # each slow rank's wait is its items' time, both measured on its own node's clock (a
        # sleep never ends early; how much later it ends is the machine's load, not checked)
        nominal = 2048 / 4 * ITEM_MS / 1e3
        for lo in v.profile.loaders:
            items = next(s for s in lo.stages if s.name == "dataset.__getitem__")
            if lo.node == 1 and not nominal <= items.wall_s:
                problems.append(f"rank {lo.rank} items {items.wall_s:.2f} s vs {nominal:.2f}")
            if lo.node == 1 and abs(lo.wait_s - items.wall_s) > 0.15 * items.wall_s:
                problems.append(f"rank {lo.rank} wait {lo.wait_s:.2f} s vs items "
                                f"{items.wall_s:.2f} s")
        if not rows[1].wait_s > 4 * rows[0].wait_s:
            problems.append(f"node waits {rows[0].wait_s:.2f} / {rows[1].wait_s:.2f} s")
        return problems
    loadcheck.attempts("two nodes, two --out", case, 2, 1.5)


def _beats(folder: Path, node: int = 1, run: str = "v1r0") -> int:
    """The batches node ``node``'s processes reported in their beats of ``run`` so far."""
    n = 0
    for b in folder.glob(f".stallbench-profile-*/{run}/node{node}/beat-*"):
        try:
            n += int(json.loads(b.read_text()).get("batches", 0))
        except (OSError, ValueError):
            pass
    return n


@pytest.mark.e2e
def test_a_node_killed_mid_run_is_named_in_node_0s_result(tmp_path: Path) -> None:
    port, master = _free_port(), _free_port()
    procs = [_launch(tmp_path, k, master, port, ["20", "5", "node:1", "4096"], TOKEN, nproc=1,
                     extra=("--node-wait", "60")) for k in (0, 1)]
    deadline = time.monotonic() + 300
    while _beats(tmp_path / "out1") < 5:
        assert time.monotonic() < deadline and procs[1].poll() is None, "node 1 never ran"
        time.sleep(0.3)
    leader = next(c for c in psutil.Process(procs[1].pid).children()
                  if "torchrun" in " ".join(c.cmdline()))
    os.kill(leader.pid, signal.SIGKILL)                 # node 1's job, by its PID
    got = _both(procs)
    assert procs[1].returncode == 137, got[1][1]
    assert procs[0].returncode == 3, got[0][1]
    assert "node rank 1" in got[0][1] and "signal 9 (exit 137)" in got[0][1]
    assert "WARNING: a node is missing from this result" in got[0][1]
    r = helpers.load(tmp_path / "out0")
    v = r.variants[0]
    rows = {n.node: n for n in v.profile.nodes}
    assert rows[1].missing.startswith("left out: its job was ended by signal 9")
    assert rows[1].runs == 0 and not rows[1].ranks and rows[0].ranks == [0]
    assert "signal 9" in v.notes["node 1"]
    assert {lo.node for lo in v.profile.loaders} == {f"0 ({socket.gethostname()})"}
    assert "MISSING" in got[0][0]
    left = _left_behind(tmp_path, port)
    assert not left, left


@pytest.mark.e2e
def test_a_set_matrix_runs_on_every_node_in_the_same_order(tmp_path: Path) -> None:
    """``profile --set`` across nodes (what ``tune -- torchrun --nnodes 2`` points to): each
    node runs the same variants and repeats, interleaved in one order, so every run of node
    rank 0 meets its peer at the rendezvous; the result holds each variant with both nodes'
    ranks, each loader with the workers its variant set."""
    port, master = _free_port(), _free_port()
    matrix = ("--set", "dataloader.num_workers=0,1", "--repeats", "2")
    procs = [_launch(tmp_path, k, master, port, ["0", "2", "none", "128"], TOKEN, nproc=1,
                     extra=matrix) for k in (0, 1)]
    got = _both(procs)
    assert [p.returncode for p in procs] == [0, 0], got
    r = helpers.load(tmp_path / "out0")
    assert sorted(v.name for v in r.variants) == ["num_workers=0", "num_workers=1"], r.variants
    for v in r.variants:
        assert len(v.repeats) == 2, (v.name, v.repeats)
        assert sorted(n.node for n in v.profile.nodes if n.ranks) == [0, 1], v.profile.nodes
        assert {lo.rank for lo in v.profile.loaders} == {0, 1}, v.profile.loaders
        want = int(v.name.rsplit("=", 1)[1])
        assert {lo.settings.get("num_workers") for lo in v.profile.loaders} == {want}, \
            [lo.settings for lo in v.profile.loaders]
    assert not _left_behind(tmp_path, port)


@pytest.mark.e2e
def test_a_node_with_another_token_is_refused_and_named(tmp_path: Path) -> None:
    port, master = _free_port(), _free_port()
    procs = [_launch(tmp_path, 0, master, port, ["0", "5", "node:1", "256"], TOKEN, nproc=1,
                     extra=("--node-wait", "5")),
             _launch(tmp_path, 1, master, port, ["0", "5", "node:1", "256"], "another-" + TOKEN,
                     nproc=1)]
    got = _both(procs)
    assert [p.returncode for p in procs] == [3, 3], got
    assert "answered 401: refused: no valid signature" in got[1][1]
    assert "for node rank 0 to merge from one shared --out" in got[1][1]
    assert "claiming node rank 1 was refused: no valid signature" in got[0][1]
    r = helpers.load(tmp_path / "out0")
    v = r.variants[0]
    rows = {n.node: n for n in v.profile.nodes}
    assert "refused" in rows[1].missing and not rows[1].ranks and rows[1].runs == 0
    assert {lo.rank for lo in v.profile.loaders} == {0}     # nothing of node 1 merged
    text = "".join(o + e for o, e in got) + helpers.result_files(tmp_path / "out0")[0].read_text()
    assert TOKEN not in text
    assert not list((tmp_path / "out0").glob(".stallbench-profile-*"))


@pytest.mark.e2e
@pytest.mark.parametrize("victim", [0, 1])
def test_sigterm_to_one_node_leaves_nothing_on_it(tmp_path: Path, victim: int) -> None:
    port, master = _free_port(), _free_port()
    procs = [_launch(tmp_path, k, master, port, ["20", "5", "node:1", "4096"], TOKEN, nproc=1,
                     extra=("--node-wait", "5")) for k in (0, 1)]
    deadline = time.monotonic() + 300
    while _beats(tmp_path / f"out{victim}", victim) < 3:
        assert time.monotonic() < deadline and procs[victim].poll() is None, "never ran"
        time.sleep(0.3)
    tree = psutil.Process(procs[victim].pid).children(recursive=True)
    procs[victim].send_signal(signal.SIGTERM)
    got = _both(procs)
    assert procs[victim].returncode == 143, got[victim][1]
    assert "interrupted by SIGTERM" in got[victim][1]
    gone = psutil.wait_procs(tree, timeout=10)[1]
    assert not gone, gone
    assert not (tmp_path / f"out{victim}").exists() or not any(
        (tmp_path / f"out{victim}").iterdir())
    if victim == 1:     # node rank 0 writes what it has and names node 1
        assert procs[0].returncode == 3, got[0][1]
        assert "node rank 1: no figures: never reported within 5 s" in got[0][1]
    else:               # node 1's job lost its peers: its code, nothing kept
        assert procs[1].returncode not in (0, 3), got[1][1]
        assert "is not kept" in got[1][1]
    left = _left_behind(tmp_path, port)
    assert not left, left


@pytest.mark.e2e
def test_tune_across_two_nodes_runs_each_trial_on_every_rank(tmp_path: Path) -> None:
    """One ``stallbench tune`` per node, each with its own --out and TMPDIR: node rank 0
    chooses the trials, node 1 runs each with the same settings (its loader records them),
    both end each trial together (``--trial-batches``), node rank 0's result holds both
    nodes' ranks in every trial. Truth by construction: every rank's items sleep ITEM_MS
    (16 per batch, far above the step), so loader workers are what the job lacks, and the
    answer found must run more than one producer per rank and beat the job as written."""
    port, master = _free_port(), _free_port()
    tune = ("tune", "--budget-minutes", "4", "--trial-batches", "40",
            "--keys", "dataloader.num_workers,dataloader.persistent_workers")
    procs = [_launch(tmp_path, k, master, port, ["2", "5", "all", "256", "12"], TOKEN,
                     nproc=1, verb=tune) for k in (0, 1)]
    got = _both(procs)
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for _, e in got]
    assert "its figures went to node rank 0" in got[1][1]
    assert "(as node rank 0 ordered)" in got[1][1]
    assert "ended by node rank 0: --trial-batches 40 reached" in got[1][1]
    assert TOKEN not in "".join(o + e for o, e in got)
    r = helpers.load(tmp_path / "out0")
    assert r.tune is not None and r.profile.nodes == 2 and r.profile.world_size == 2
    measured = [t for t in r.tune.trials if t.outcome == "measured"]
    assert len(measured) >= 2, r.tune.trials
    for v in r.variants:            # one per measured trial: both nodes' ranks, its settings
        rows = {n.node: n for n in v.profile.nodes}
        assert sorted(rows) == [0, 1] and not any(n.missing for n in rows.values()), rows
        assert (rows[0].ranks, rows[1].ranks) == ([0], [1]), rows
        want = next(t.settings for t in r.tune.trials if t.name == v.name)
        for lo in v.profile.loaders:
            assert lo.settings.get("num_workers") == want.get("num_workers", 0), \
                (v.name, lo.rank, lo.settings)
    best = r.tune.best
    assert best.settings.get("num_workers", 0) >= 1 and best.speedup > 1.2, best
    left = _left_behind(tmp_path, port)
    assert not left, left


@pytest.mark.e2e
@pytest.mark.parametrize("victim", [0, 1])
def test_tune_ends_on_every_node_when_one_launcher_is_gone(tmp_path: Path, victim: int) -> None:
    """SIGTERM to one node's tune in a trial. Node 1's: node rank 0's run hangs on its lost
    peer, and the tune ends there naming node 1 (exit 2, no result), never recording the
    trial's setting as one the job fails under. Node rank 0's: node 1 hears it ended (its
    run stopped, exit 3 with node rank 0's line). Nothing is left on either node."""
    port, master = _free_port(), _free_port()
    tune = ("tune", "--budget-minutes", "4", "--trial-batches", "40", "--node-wait", "5",
            "--progress-timeout", "15")
    procs = [_launch(tmp_path, k, master, port, ["2", "5", "all", "256", "12"], TOKEN,
                     nproc=1, verb=tune) for k in (0, 1)]
    deadline = time.monotonic() + 300
    while _beats(tmp_path / "out1", run="t3") < 3:
        assert time.monotonic() < deadline and procs[1].poll() is None, "no trial ran"
        time.sleep(0.3)
    procs[victim].send_signal(signal.SIGTERM)
    got = _both(procs)
    assert procs[victim].returncode == 143, got[victim][1][-2000:]
    if victim == 1:
        assert procs[0].returncode == 2, got[0][1][-2000:]
        assert "run 3: node rank 1: no figures: never reported within 5 s" in got[0][1]
        assert "cannot go on without one of its nodes" in got[0][1]
    else:
        assert procs[1].returncode == 3, got[1][1][-2000:]
        assert "t3: ended by node rank 0: node rank 0 ended: SIGTERM" in got[1][1]
    assert not helpers.result_files(tmp_path / "out0")
    left = _left_behind(tmp_path, port)
    assert not left, left


@pytest.mark.e2e
def test_analyze_across_two_nodes_runs_every_ablation_on_every_node(tmp_path: Path) -> None:
    """``profile --analyze`` (the default) on two nodes, each with its own --out: node rank 0
    hands each ablation run to node 1, which runs it (recording and serving its own rank's
    batches), and merges both nodes' figures into each. Truth by construction: every rank's
    items sleep ITEM_MS, so serving the loader from memory on *every* rank removes the
    measured wait (a rank left on its full loader would hold the other in the all-reduce
    and leave the compute-only epoch as long as the full one): full - compute-only is each
    rank's measured wait, within 10% + 50 ms. Nothing is left on either node, the
    recordings included."""
    port, master = _free_port(), _free_port()
    procs = [_launch(tmp_path, k, master, port, ["2", "5", "all", "512", "2"], TOKEN,
                     nproc=1, verb=("profile", "--analyze")) for k in (0, 1)]
    got = _both(procs)
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for _, e in got]
    assert got[1][1].count("(as node rank 0 ordered)") == 4, got[1][1][-3000:]   # 4 ablations
    assert got[0][1].count("merged the figures of 2 of 2 nodes") == 5, got[0][1][-3000:]
    r = helpers.load(tmp_path / "out0")
    v = r.variants[0]
    an = v.profile.analysis
    assert an is not None and all(a.done for a in an.ablations), an.ablations
    head = [lo for lo in v.profile.loaders if lo.headline]
    assert sorted(lo.rank for lo in head) == [0, 1], head
    wait = max(lo.wait_s for lo in head)
    assert abs(an.data_stall_s - wait) <= 0.10 * wait + 0.05, (an.data_stall_s, wait)
    left = _left_behind(tmp_path, port)
    assert not left, left
