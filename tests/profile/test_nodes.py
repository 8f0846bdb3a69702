"""The rules of a multi-node profile that need no job (``stallbench/profile/nodes.py``, the
wire's ``nodes``): which node a launcher is, how node rank 0 is found, what crosses between
the nodes' launchers and what node rank 0 refuses, and how a node is named when its figures
are missing. The jobs themselves run in ``test_profile_nodes.py``."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import zlib
from pathlib import Path

import pytest

from stallbench.auth import tokens
from stallbench.errors import UserError
from stallbench.profile import endpoint, nodes
from stallbench.profile.agent import wire

TOKEN = "t" * 24
TR = "/venv/bin/torchrun"


def _topo(*args: str, env: dict | None = None, port: int | None = None) -> nodes.Topology:
    return nodes.topology([TR, *args, "train.py", "--node-rank", "7", "--nnodes", "9"],
                          env or {}, port)


def test_topology_from_torchrun_flags_env_and_slurm() -> None:
    """torchrun's own spellings, its PET_ variables, and Slurm's node id where the flags
    leave the node rank out; the script's own arguments (after ``train.py``) never count."""
    t = _topo("--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.5",
              "--master-port", "29600")
    assert (t.count, t.rank, t.host, t.port) == (2, 1, "10.0.0.5", 29601)
    assert t.port_from == "--master-port 29600 + 1" and not t.merges
    t = _topo("--nnodes=3", "--node_rank=0", "--rdzv-endpoint", "head:29400",
              "--rdzv-backend", "c10d")
    assert (t.count, t.rank, t.host, t.port, t.merges) == (3, 0, "head", 29401, True)
    # no --node-rank: torchrun's PET_NODE_RANK, else Slurm's node id
    with pytest.raises(UserError, match="without --node-rank"):
        _topo("--nnodes", "2", "--rdzv_endpoint=[::1]:29444")
    t = _topo("--nnodes", "2", "--rdzv_endpoint=[::1]:29444", env={"SLURM_NODEID": "1",
                                                                   "SLURM_NNODES": "2"})
    assert (t.rank, t.rank_from, t.host, t.port) == (1, "SLURM_NODEID", "::1", 29445)
    t = _topo(env={"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "h",
                   "PET_MASTER_PORT": "30000"})
    assert (t.count, t.rank, t.host, t.port) == (2, 1, "h", 30001)
    assert _topo("--nnodes", "2", "--node-rank", "0", port=4000).port == 4000
    t = nodes.topology(["python", "-m", "torch.distributed.run", "--nnodes", "2",
                        "--node-rank", "1", "-m", "pkg.train", "--node-rank", "0"], {})
    assert (t.count, t.rank, t.port) == (2, 1, 29501)
    assert _topo("--nnodes", "1").count == 1 and _topo().count == 1
    assert nodes.topology(["python", "t.py", "--nnodes", "2"], {}).count == 1
    with pytest.raises(UserError, match="spans 3 nodes"):
        _topo("--nnodes", "2", env={"SLURM_NODEID": "1", "SLURM_NNODES": "3"})
    with pytest.raises(UserError, match="outside 0..1"):
        _topo("--nnodes", "2", "--node-rank", "2")
    with pytest.raises(UserError, match="elastic range"):
        _topo("--nnodes", "1:2", "--node-rank", "0")


def test_the_token_follows_the_project_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(nodes.TOKEN_ENV, raising=False)
    assert nodes.node_token() is None and nodes.TOKEN_ENV == "STALLBENCH_NODE_TOKEN"
    monkeypatch.setenv(nodes.TOKEN_ENV, "short")
    with pytest.raises(UserError) as e:
        nodes.node_token()
    assert "short" not in str(e.value) and nodes.TOKEN_ENV in str(e.value)
    monkeypatch.setenv(nodes.TOKEN_ENV, TOKEN)
    assert nodes.node_token() == TOKEN and tokens.valid_token(TOKEN)


def _run_dir(tmp: Path, n: int = 1) -> Path:
    d = tmp / "run"
    d.mkdir()
    for i in range(n):
        (d / f"part-h-{100 + i}-ab.json").write_text(json.dumps(
            {"v": 1, "role": "trainer", "host": "h", "pid": 100 + i, "image": "ab",
             "launched": True, "rank": i, "world_size": n, "streams": []}))
    (d / "beat-h-100").write_text(json.dumps({"v": 1, "batches": 3}))
    (d / ".tmp-part-h-1-ab.json").write_text("half")        # a writer's temporary: not sent
    (d / wire.FLUSH_MARK).write_text("")
    return d


def test_a_packed_run_unpacks_to_the_wall_files_only(tmp_path: Path) -> None:
    rec = wire.NodeRun(node=1, nodes=2, host="h", run="v1r0", fingerprint="fp", nonce="x")
    body = wire.pack_node_run(rec, _run_dir(tmp_path, 2))
    got, files = wire.unpack_node_run([body[i:i + 7] for i in range(0, len(body), 7)],
                                      tmp_path / "into")
    assert got == rec and files == 3
    assert sorted(p.name for p in (tmp_path / "into").iterdir()) == [
        "beat-h-100", "part-h-100-ab.json", "part-h-101-ab.json"]
    assert [t.header.rank for t in wire.read(tmp_path / "into").trainers] == [0, 1]


def _packed(*files: tuple[str, bytes], head: bytes | None = None,
            lie: int = 0) -> bytes:
    """A packed run made by hand; ``lie``: bytes a file's line claims beyond its data."""
    h = head if head is not None else json.dumps(wire.NodeRun(
        node=1, nodes=2, host="h", run="v1r0", fingerprint="fp").to_json()).encode()
    raw = wire.nodes.MAGIC + b"%d\n" % len(h) + h
    for name, data in files:
        raw += name.encode() + b" %d\n" % (len(data) + lie) + data
    return zlib.compress(raw + b"\n")


@pytest.mark.parametrize("body, why", [
    (_packed(("../part-x.json", b"{}")), "name"),
    (_packed(("part-a/../../x", b"{}")), "name"),
    (_packed(("sitecustomize.py", b"")), "name"),
    (_packed(("part-a.json", b"{}"), lie=10), "ends inside"),     # its length lies
    (_packed(head=b"[1]"), "not a node run"),
    (zlib.compress(b"GET / HTTP/1.1\n\n"), "not a packed node run"),
    (b"not zlib at all", "not a packed node run"),
])
def test_unpack_refuses_what_breaks_a_rule(tmp_path: Path, body: bytes, why: str) -> None:
    with pytest.raises(wire.NodeRunRefused, match=why):
        wire.unpack_node_run([body], tmp_path / "into")
    assert not (tmp_path / "x").exists() and not (tmp_path.parent / "part-x.json").exists()


def test_unpack_is_bounded(tmp_path: Path) -> None:
    """A zip bomb stops at the bound, not at the end of the memory."""
    bomb = _packed(("part-a.json", b"0" * (8 << 20)))
    with pytest.raises(wire.NodeRunRefused, match="unpacked"):
        wire.unpack_node_run([bomb], tmp_path / "into", max_unpacked=1 << 20)
    with pytest.raises(wire.NodeRunRefused, match="packed"):
        wire.pack_node_run(wire.NodeRun(1, 2, "h", "v1r0", "fp"), _run_dir(tmp_path),
                           max_packed=64)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node0(port: int) -> nodes.Topology:
    return _topo("--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", port=port)


def test_node_rank_0_takes_a_signed_run_once_and_refuses_the_rest(tmp_path: Path) -> None:
    """The signature is checked before the body is read (a refused sender leaves nothing on
    node rank 0's disk), a run of another profile is refused, a run sent twice is merged
    once, and the token never crosses the wire nor appears in a line."""
    topo, said = _node0(_free_port()), []
    root = tmp_path / "root"
    src = _run_dir(tmp_path)
    rec = wire.NodeRun(node=1, nodes=2, host="h", run="v1r0", fingerprint="fp", nonce="a")
    with endpoint.Collector(topo.address, 2, TOKEN, "fp", root, said.append) as c:
        assert c.listening
        bad = endpoint.deliver(topo.address, "u" * 24, rec, src)
        assert "401" in bad and nodes.TOKEN_ENV in bad
        assert not list(root.rglob("*node1*"))                      # nothing written
        assert "refused: no valid signature" in c.refusals(1)[0]
        other = wire.NodeRun(node=1, nodes=2, host="h", run="v1r0", fingerprint="zz")
        assert "409" in endpoint.deliver(topo.address, TOKEN, other, src)
        assert endpoint.deliver(topo.address, TOKEN, rec, src) == ""
        assert endpoint.deliver(topo.address, TOKEN, rec, src) == ""      # once
        got = c.got("v1r0", 1)
        assert got is not None and got[0] == rec
        assert [t.header.pid for t in wire.read(got[1]).trainers] == [100]
        assert len(list(root.glob("v1r0/*recv*"))) == 1
    assert not any(TOKEN in line for line in said)
    with pytest.raises(OSError):            # closed with the profile: nothing listens
        socket.create_connection(("127.0.0.1", topo.port), timeout=2).close()


def test_no_listening_beyond_loopback_without_a_token(tmp_path: Path) -> None:
    said: list[str] = []
    topo = nodes.Topology(2, 0, "--node-rank", "10.255.255.1", _free_port(), "--node-port")
    with endpoint.Collector(topo.address, 2, None, "fp", tmp_path, said.append) as c:
        assert not c.listening
    assert nodes.TOKEN_ENV in said[0] and "shared --out" in said[0]
    sent = endpoint.deliver(topo.address, None, wire.NodeRun(1, 2, "h", "v1r0", "fp"),
                            tmp_path)
    assert sent.startswith(f"no ${nodes.TOKEN_ENV}")


def test_a_shared_out_marker_counts_once_and_never_a_stale_one(tmp_path: Path) -> None:
    """Node rank 0 tells this profile's marker from an earlier one's by its nonce (no clock
    of another machine is compared), and names a node that never reported."""
    topo = _node0(_free_port())
    folder = tmp_path / "v1r0" / "node1"
    folder.mkdir(parents=True)
    old = wire.NodeRun(node=1, nodes=2, host="h", run="v1r0", fingerprint="fp", nonce="old")
    (folder / wire.NodeRun.MARKER).write_text(json.dumps(old.to_json()))
    with endpoint.Collector(topo.address, 2, None, "fp", tmp_path, lambda _: None) as c:
        g = nodes.Gather(c, tmp_path, wait_s=0.5)
        g.before("v1r0")
        (r,) = g.after("v1r0", lambda _: None)
        assert not r.measured and "never reported within 0.5 s" in r.why
        new = wire.NodeRun(node=1, nodes=2, host="h", run="v1r0", fingerprint="fp",
                           exit_code=137, nonce="new")
        (folder / wire.NodeRun.MARKER).write_text(json.dumps(new.to_json()))
        (r,) = g.after("v1r0", lambda _: None)
    assert r.via == "shared --out" and not r.failed
    assert r.why.startswith("left out: its job was ended by signal 9 (exit 137)")


@pytest.mark.parametrize("code, why, failed, says", [
    (0, "", False, "no figures: its processes ended without writing"),
    (1, "", True, "its job exited with code 1"),
    (143, "", False, "signal 15 (exit 143)"),
    (2, "node rank 1 of 2 (h): profile: no batch for 5 s", False,
     "no figures: node rank 1 of 2 (h): profile: no batch for 5 s"),
])
def test_how_a_node_that_brought_nothing_is_named(tmp_path: Path, code: int, why: str,
                                                  failed: bool, says: str) -> None:
    rec = wire.NodeRun(node=1, nodes=2, host="h", run="v1r0", fingerprint="fp",
                       exit_code=code, why=why)
    r = nodes._report(rec, tmp_path, "endpoint")       # noqa: SLF001 - the rule itself
    assert r.failed is failed and says in r.why and not r.measured


def test_progress_timeout_names_the_rank_of_the_last_batch() -> None:
    """``--progress-timeout``'s line names the rank (and, on a multi-node job, the session
    prefixes the node: ``node rank 1 of 2 (host): profile: no batch for ...``)."""
    from stallbench.profile.launcher import last_batch
    b = wire.Beat(pid=42, batches=3, last=("Items#0", 0, 2))
    assert last_batch([b], {42: 3}) == "batch 2 of epoch 0 of Items#0 (rank 3, pid 42)"
    assert last_batch([b]) == "batch 2 of epoch 0 of Items#0 (pid 42)"
    assert nodes.Topology(2, 1).label.startswith("node rank 1 of 2 (")


def test_orders_reach_the_other_nodes_signed_and_in_order(tmp_path: Path) -> None:
    """A tune across nodes: node rank 0 publishes each run; another node's ask waits for it
    (a long poll), sees it stopped, and hears "done" as node rank 0 closes. Asks with another
    token or of another tune are refused by name; an answer that is not node rank 0's (a
    replayed one: signed for another nonce) is refused by the node."""
    topo = _node0(_free_port())
    addr = topo.address
    plan = wire.ReplayPlan(mode="compute_only", keep=4, counts={"Items#0": [8, 8]})
    with endpoint.Collector(addr, 2, TOKEN, "fp", tmp_path, lambda _: None) as c:
        first = endpoint.ask_order(addr, TOKEN, "fp", 1, 0, 0.0)
        assert isinstance(first, wire.NodeOrder) and first.seq == 0 and not first.done
        c.publish("t1", {"dataloader": {"num_workers": 2}}, plan.to_json(), "trial 2")
        got = endpoint.ask_order(addr, TOKEN, "fp", 1, 0, 5.0)
        assert isinstance(got, wire.NodeOrder)
        assert (got.seq, got.run, got.overrides, got.label) == (
            1, "t1", {"dataloader": {"num_workers": 2}}, "trial 2")
        assert wire.ReplayPlan.from_json(got.replay) == plan
        # nothing newer: the ask waits its time, then answers with the same order
        t0 = time.monotonic()
        same = endpoint.ask_order(addr, TOKEN, "fp", 1, 1, 0.5)
        assert isinstance(same, wire.NodeOrder) and same.seq == 1
        assert time.monotonic() - t0 >= 0.4
        c.stop("t1", "its steady rate was known")
        stopped = endpoint.ask_order(addr, TOKEN, "fp", 1, 1, 0.0)
        assert isinstance(stopped, wire.NodeOrder) and stopped.stopped == "its steady rate was known"
        with pytest.raises(endpoint.OrderRefused, match="answered 401"):
            endpoint.ask_order(addr, "u" * 24, "fp", 1, 1, 0.0)
        assert "refused: no valid signature" in c.refusals(1)[-1]
        with pytest.raises(endpoint.OrderRefused, match="answered 409"):
            endpoint.ask_order(addr, TOKEN, "zz", 1, 1, 0.0)
        # an answer node rank 0 signed for one ask, replayed to another by whatever holds
        # the port, is not taken (the ask's fresh nonce is in the answer's signature)
        replayed = _answer_of(addr, nonce="a" * 32)
        with _replaying(*replayed) as fake, \
                pytest.raises(endpoint.OrderRefused, match="is not node rank 0's"):
            endpoint.ask_order(fake, TOKEN, "fp", 1, 1, 0.0)
    # closed: the last word was "done"; an ask now cannot reach node rank 0
    assert isinstance(endpoint.ask_order(addr, TOKEN, "fp", 1, 1, 0.0), str)


def _answer_of(addr: endpoint.Address, nonce: str) -> tuple[bytes, str]:
    """Node rank 0's signed answer to one ask (its body and signature), as a wire sees it."""
    import http.client
    conn = http.client.HTTPConnection(addr.host, addr.port, timeout=10)
    conn.request("GET", endpoint.ORDER_PATH, headers={
        "X-Stallbench-Node": "1", "X-Stallbench-After": "1", "X-Stallbench-Wait": "0",
        "X-Stallbench-Fingerprint": "fp", "X-Stallbench-Nonce": nonce,
        "X-Stallbench-Mac": endpoint._order_mac(TOKEN, "ask", "fp", 1, 1, nonce)})  # noqa: SLF001
    resp = conn.getresponse()
    body, mac = resp.read(), resp.getheader("X-Stallbench-Mac", "")
    conn.close()
    assert resp.status == 200 and mac
    return body, mac


@contextlib.contextmanager
def _replaying(body: bytes, mac: str):
    """Something else on a port that answers every ask with ``body`` and ``mac``."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Replay(BaseHTTPRequestHandler):
        def do_GET(self) -> None:       # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Stallbench-Mac", mac)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Replay)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield endpoint.Address("127.0.0.1", server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_a_node_follows_until_done_and_hears_node_rank_0s_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Link.follow`` yields each published run once, in order, and ends at "done" (exit 0)
    or with node rank 0's own line where its tune failed (exit 3); ``stopped_by_leader`` says
    a run node rank 0 ended."""
    port = _free_port()
    leader = _node0(port)
    follower = _topo("--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                     port=port)
    monkeypatch.setenv(nodes.TOKEN_ENV, TOKEN)
    for failure in (None, RuntimeError("the job as written exited with code 1")):
        seen: list[str] = []
        with nodes.Link(follower, "fp", tmp_path / "f", 5.0, lambda _: None) as fl:
            def lead() -> None:
                try:
                    with nodes.Link(leader, "fp", tmp_path / "l", 5.0,
                                    lambda _: None) as ld:
                        for run in ("t1", "t2"):
                            ld.order(tmp_path / run, {}, None, run)
                            while run not in seen:
                                time.sleep(0.05)
                            ld.stopping(tmp_path / run, f"{run} known")
                        if failure is not None:
                            raise failure
                except RuntimeError:
                    pass
            t = threading.Thread(target=lead)
            t.start()
            for order in fl.follow():
                seen.append(order.run)
                while not fl.stopped_by_leader(order):
                    time.sleep(0.05)
            t.join()
            line, code = fl.left()
        assert seen == ["t1", "t2"]
        if failure is None:
            assert code == 0 and "its figures went to node rank 0" in line
        else:
            assert code == 3 and "the job as written exited with code 1" in line
