"""``torchrun`` under ``stallbench profile``: per-rank figures and the straggler, on one host
(``--nproc-per-node 2``) and as two nodes on loopback (``--nnodes 2``, one launcher per node,
a shared ``--out``; node rank 0 merges; ``test_profile_nodes.py`` has a ``--out`` per node). Rank 1's items cost ITEM_MS (sleeps: the truth does
not depend on free cores), rank 0's nothing: rank 1 must be named the straggler, and its wait
must match the item time its dataset spent (the stage the hooks timed in the same process
and the nominal cost)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import profile_helpers as helpers
import loadcheck

pytestmark = pytest.mark.groundtruth
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
ITEM_MS, STEP_MS, ITEMS_PER_RANK = 2.0, 5.0, 256


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check(out: Path) -> list[str]:
    r = helpers.load(out)
    v = r.variants[0]
    problems = []
    if v.ranks is None or v.ranks.world != 2:
        return [f"expected 2 ranks, got {v.ranks}"]
    if v.ranks.straggler != 1:
        problems.append(f"straggler {v.ranks.straggler} (candidate {v.ranks.candidate}), "
                        f"not rank 1: {v.ranks.verdict}")
    slow = next(lo for lo in v.profile.loaders if lo.rank == 1)
    items = next(s for s in slow.stages if s.name == "dataset.__getitem__")
    nominal = ITEMS_PER_RANK * ITEM_MS / 1e3
    if abs(slow.wait_s - items.wall_s) > 0.10 * items.wall_s:
        problems.append(f"rank 1 wait {slow.wait_s:.3f} s vs its items {items.wall_s:.3f} s")
    if not nominal <= items.wall_s <= 1.5 * nominal:
        problems.append(f"rank 1 items {items.wall_s:.3f} s vs nominal {nominal:.3f} s")
    return problems


def test_torchrun_two_ranks_names_the_straggler(tmp_path: Path) -> None:
    out = tmp_path / "out"

    def case() -> list[str]:
        shutil.rmtree(out, ignore_errors=True)
        cp = helpers.profile(["--out", str(out), "--", TORCHRUN, "--nproc-per-node", "2",
                              "--master-port", str(_free_port()),
                              helpers.script("ddp_train.py"), str(ITEM_MS), str(STEP_MS), "1"],
                             cwd=tmp_path)
        assert cp.returncode == 0, cp.stderr
        assert "rank 1 is the straggler" in cp.stdout or "no straggler" in cp.stdout
        return _check(out)
    loadcheck.attempts("torchrun", case, 2, 1.0)


@pytest.mark.parametrize("via", ["endpoint", "shared --out"])
def test_two_nodes_on_loopback_merge_on_node_rank_0(tmp_path: Path, via: str) -> None:
    """One shared ``--out``: node rank 1's figures reach node rank 0 over its endpoint
    (loopback, no token), or, where node 1 cannot reach it (pointed at a port nothing
    listens on), through the shared directory as before issue 56; merged once either way."""
    out = tmp_path / "out"

    def case() -> list[str]:
        shutil.rmtree(out, ignore_errors=True)
        port, node_port = str(_free_port()), _free_port()
        elsewhere = [] if via == "endpoint" else ["--node-port", str(_free_port())]
        procs = [subprocess.Popen(
            [sys.executable, "-m", "stallbench", "profile", "--out", str(out),
             "--node-port", str(node_port), *(elsewhere if k == 1 else []), "--", TORCHRUN,
             "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "1", "--master-addr",
             "127.0.0.1", "--master-port", port, helpers.script("ddp_train.py"), str(ITEM_MS),
             str(STEP_MS), "1"], cwd=tmp_path, env=helpers.env(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True) for k in (0, 1)]
        got = [p.communicate(timeout=240) for p in procs]
        if via == "endpoint":
            assert [p.returncode for p in procs] == [0, 0], got
            assert "node rank 1 of 2" in got[1][1] and "its figures went to node rank 0" \
                in got[1][1]
        else:       # node 1 could not hand them over as asked: said, exit 3; merged anyway
            assert [p.returncode for p in procs] == [0, 3], got
            assert "for node rank 0 to merge from one shared --out" in got[1][1]
        assert f"merged the figures of 2 of 2 nodes (via {via})" in got[0][1]
        assert len(helpers.result_files(out)) == 1
        assert not list(out.glob(".stallbench-profile-*"))
        r = helpers.load(out)
        assert r.profile.nodes == 2
        assert [(n.node, n.via, n.missing) for n in r.variants[0].profile.nodes] == [
            (0, "this node", ""), (1, via, "")]
        return _check(out)
    loadcheck.attempts("two nodes", case, 2, 1.0)
