"""The stallbench endpoint between the launchers of a multi-node profile (issue 56): node rank
0's listener (``Collector``) and the other nodes' sender (``deliver``).

**Why a stallbench endpoint and not the job's rendezvous store.** The store (torch's
``TCPStore``) lives in node rank 0's torchrun, so it is gone when the job ends, which is
exactly when a node's figures are complete (its processes write them at exit); it takes no
token; it would put keys into the job's own store (the job is to run unchanged); and the
launcher would have to import torch. This endpoint outlives every run of the profile and
answers for itself: HTTP on the standard library, for as long as the profile lives (a context
manager: closed however the profile ends), node rank 0 binding it before its first run (so
torchrun never picks its port).

**What crosses.** A node's run, packed by the wire (``wire.pack_node_run``: its wall files
and how its run ended, ``NodeRun``), at most ``wire.nodes.MAX_PACKED_BYTES``; node rank 0
unpacks it straight to disk with every bound checked (``wire.unpack_node_run``) and reads the
files with the wire's readers. A run is taken once: sent twice, merged once.

**Authentication.** ``STALLBENCH_NODE_TOKEN`` (``TOKEN_ENV``), in the environment of every
node's launcher (``srun`` passes it on), shaped by the project's token rule (``tokens``). The
token never crosses the network: a sender signs the request's fields (the profile's
fingerprint, the run, its node, the body's length and SHA-256) with HMAC-SHA256; node rank 0
checks the signature in constant time before it reads any body (a first request carries no
body at all), then the body against its digest. So something else that holds the port learns
no token, a refused sender costs node rank 0 no disk, and a run of another profile (another
command, matrix or batch cap) is refused by name. The token is never printed or recorded.
Without one, node rank 0 listens on loopback only, as ``stallbench serve`` does.

**Orders** (``tune`` and ``profile --analyze`` across nodes, ``orders``): where node rank 0
chooses each run as it goes, the other nodes cannot run a fixed list; each asks node rank 0
for the next run (``ORDER_PATH``, ``ask_order``), which answers with the one ``NodeOrder`` it
published (``Collector.publish``): the run's name, its ``--set`` overrides and replay plan,
whether node rank 0 stopped it (``Collector.stop``: a trial's rate known) and whether it is
done (``Collector.finish``, said at the latest as the endpoint closes).
An ask waits up to ``ORDER_WAIT_S`` for something new (a long poll), so a node learns of the
next run as it is published without node rank 0 reaching out to it. Both ways are signed: the
ask as a run is (its fields and a fresh nonce), the answer with the nonce in it, so a replayed
old answer or one from whatever else holds the port is refused by the node.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import http.client
import os
import re
import shutil
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from .. import interrupts
from ..auth import tokens
from ..errors import UserError
from .agent import wire

TOKEN_ENV = "STALLBENCH_NODE_TOKEN"
SEND_TRY_S = 5.0            # how long a node tries to reach node rank 0: it listens from before
                            # its first run, so a refused connection means it is not there
SEND_TIMEOUT_S = 120.0      # one read or write of a request (a packed run is bounded)
PATH = "/stallbench/node-run"
ORDER_PATH = "/stallbench/node-order"
ORDER_WAIT_S = 5.0          # the longest an ask for the next order waits for one (long poll)
_RUN = re.compile(r"v[0-9]{1,6}r[0-9]{1,6}|[ta][0-9]{1,6}")   # profile, tune, ablation runs
_NONCE = re.compile(r"[0-9a-f]{16,64}")


@dataclass(frozen=True)
class Address:
    """Where node rank 0 listens, and the rule that gave it (``nodes.topology``)."""

    host: str
    port: int
    why: str = ""


def node_token() -> str | None:
    """The nodes' token from ``TOKEN_ENV`` (None: unset); never printed, never recorded."""
    token = tokens.token_from_env(TOKEN_ENV)
    if token is not None and not tokens.valid_token(token):
        raise UserError(f"profile: ${TOKEN_ENV} must hold {tokens.TOKEN_RULE}")
    return token


# ------------------------------------------------------------------ node rank 0: listening

def _mac(token: str, fingerprint: str, run: str, node: int, length: int, digest: str) -> str:
    msg = f"stallbench-node-run/1\n{fingerprint}\n{run}\n{node}\n{length}\n{digest}"
    return hmac.new(token.encode(), msg.encode(), hashlib.sha256).hexdigest()


def _order_mac(token: str, what: str, fingerprint: str, node: int, after: int, nonce: str,
               digest: str = "") -> str:
    """An ask (``what`` "ask") or an answer ("answer", with its body's digest): never one
    for the other, nor for a run's request."""
    msg = f"stallbench-node-order/1\n{what}\n{fingerprint}\n{node}\n{after}\n{nonce}\n{digest}"
    return hmac.new(token.encode(), msg.encode(), hashlib.sha256).hexdigest()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    collector: "Collector"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A sender that hung up mid-request (its side ended): nothing to print; what it
        sent was not taken."""

    def server_bind(self) -> None:
        """Bind without ``HTTPServer``'s reverse lookup of the address (a DNS wait)."""
        import socketserver
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    """One node's packed run, in two requests: a check of its signed header fields (no body:
    a refused sender learns it before sending anything), then the same fields with the body.
    Nothing of a body is read unless its signature holds."""

    server: _Server
    timeout = SEND_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:    # noqa: A002 - quiet
        pass

    def _answer(self, code: int, text: str) -> None:
        body = text.encode()[:500]
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refused(self, node: int, mac: str, want: str | None, fp: str,
                 other: tuple[str, str, str]) -> bool:
        """One rule for both requests: the signature (checked in constant time, where there
        is a token), then the profile's fingerprint; a refusal answered and recorded for the
        node's line (``other``: what the node did, what was refused, what differs)."""
        c = self.server.collector
        if want is not None and not tokens.same(mac.encode(), want.encode()):
            c.refused(node, f"a sender at {self.client_address[0]} claiming node rank {node} "
                            f"was refused: no valid signature (${TOKEN_ENV} differs)")
            self._answer(401, f"refused: no valid signature (${TOKEN_ENV} differs between "
                              "the nodes)")
            return True
        if fp != c.fingerprint:
            did, what, differs = other
            c.refused(node, f"node rank {node} {did} ({differs} differ)")
            self._answer(409, f"refused: {what} ({differs} differ from node rank 0's)")
            return True
        return False

    def do_GET(self) -> None:       # noqa: N802 - http.server's name
        """An ask for the next order: answered at once where there is something newer than
        ``after`` (or the ask waits 0 s), else when something is published, at most
        ``ORDER_WAIT_S`` later."""
        c = self.server.collector
        h = self.headers
        try:
            node, after = int(h.get("X-Stallbench-Node", "")), int(h.get("X-Stallbench-After", ""))
            wait = min(ORDER_WAIT_S, max(0.0, float(h.get("X-Stallbench-Wait", "0"))))
        except ValueError:
            return self._answer(400, "not a stallbench order ask")
        fp, nonce = h.get("X-Stallbench-Fingerprint", ""), h.get("X-Stallbench-Nonce", "")
        if self.path != ORDER_PATH or not 0 < node < c.nodes or not _NONCE.fullmatch(nonce):
            return self._answer(400, "not a stallbench order ask of this job")
        want = (_order_mac(c.token, "ask", fp, node, after, nonce) if c.token is not None
                else None)
        if self._refused(node, h.get("X-Stallbench-Mac", ""), want, fp,
                         ("asked for the runs of another profile or tune",
                          "another profile's or tune's ask",
                          "the command, --set matrix, --analyze, --keys or --trial-batches")):
            return
        body = c.order_after(node, after, wait).to_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if c.token is not None:
            self.send_header("X-Stallbench-Mac", _order_mac(
                c.token, "answer", fp, node, after, nonce, hashlib.sha256(body).hexdigest()))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:      # noqa: N802 - http.server's name
        c = self.server.collector
        h = self.headers
        try:
            node, length = int(h.get("X-Stallbench-Node", "")), int(h.get("X-Stallbench-Length", ""))
            sent = int(h.get("Content-Length", "0"))
        except ValueError:
            return self._answer(400, "not a stallbench node run")
        run, fp = h.get("X-Stallbench-Run", ""), h.get("X-Stallbench-Fingerprint", "")
        digest, mac = h.get("X-Stallbench-Digest", ""), h.get("X-Stallbench-Mac", "")
        if self.path not in (PATH, PATH + "?check") or not _RUN.fullmatch(run) or \
                not 0 < node < c.nodes or sent not in (0, length):
            return self._answer(400, "not a stallbench node run of this job")
        want = (_mac(c.token, fp, run, node, length, digest) if c.token is not None
                else None)
        if self._refused(node, mac, want, fp,
                         ("sent a run of another profile", "another profile's run",
                          "the command, --set matrix, --max-batches or --analyze")):
            return
        if length > wire.nodes.MAX_PACKED_BYTES:
            return self._answer(413, "refused: larger than a packed run may be")
        if self.path.endswith("?check") or sent == 0:
            return self._answer(200, "go on")
        self._answer(*c.take(run, node, _Hashed(self.rfile, length), digest))


class _Hashed:
    def __init__(self, f: Any, n: int) -> None:
        self.f, self.n, self.h = f, n, hashlib.sha256()

    def __iter__(self):
        while self.n > 0:
            piece = self.f.read(min(self.n, 1 << 20))
            if not piece:
                return
            self.n -= len(piece)
            self.h.update(piece)
            yield piece


class Collector:
    """Node rank 0's endpoint for the life of a profile (a context manager: closed however the
    profile ends). ``take`` files a node's run under ``root/<run>/recv-node<k>``, once."""

    def __init__(self, address: Address, nodes: int, token: str | None, fingerprint: str,
                 root: Path, say: Callable[[str], None]) -> None:
        self.address, self.nodes, self.token = address, nodes, token
        self.fingerprint, self.root, self.say = fingerprint, root, say
        self._got: dict[tuple[str, int], tuple[wire.NodeRun, Path]] = {}
        self._refusals: dict[int, list[str]] = {}
        self._order = wire.NodeOrder()             # seq 0: nothing published yet
        self._asked: dict[int, int] = {}           # node -> the last seq it was answered
        self._published = 0.0                      # when the current order was (monotonic)
        self._lock = threading.Condition()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Collector":
        self._server = _bind(self.address, self.token, self.say)
        if self._server is not None:
            self._server.collector = self
            self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,),
                                            name="stallbench-nodes", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            with interrupts.deferred():
                self._last_word(exc[1])
                self._server.shutdown()
                self._server.server_close()
                if self._thread is not None:
                    self._thread.join(timeout=5.0)
            self._server = None

    @property
    def listening(self) -> bool:
        return self._server is not None

    # ---- orders (a tune across nodes)

    def publish(self, run: str, overrides: dict[str, dict[str, Any]],
                replay: dict[str, Any] | None, label: str) -> None:
        """The next run every other node is to run (its asks are answered with it)."""
        with self._lock:
            self._order = wire.NodeOrder(seq=self._order.seq + 1, run=run,
                                         overrides=overrides, replay=replay, label=label)
            self._published = time.monotonic()
            self._lock.notify_all()

    def late(self, wait_s: float) -> list[int]:
        """The nodes that have not taken the current order ``wait_s`` after it was
        published (each takes it within a long poll of its last run's end)."""
        with self._lock:
            if self._order.seq == 0 or time.monotonic() - self._published < wait_s:
                return []
            return [k for k in range(1, self.nodes)
                    if self._asked.get(k, 0) not in (self._order.seq, -1)]

    def stop(self, run: str, why: str) -> None:
        """Node rank 0 ended ``run`` (its rule, ``why``): the nodes end theirs."""
        with self._lock:
            if self._order.run == run and not self._order.stopped:
                self._order = dataclasses.replace(self._order, stopped=why or "stopped")
                self._lock.notify_all()

    def finish(self, why: str = "") -> None:
        """No next run: the nodes' launchers end (``why`` "" where the tune ended well)."""
        with self._lock:
            if not self._order.done:
                self._order = dataclasses.replace(self._order, done=True, why_done=why)
                self._lock.notify_all()

    def order_after(self, node: int, after: int, wait: float) -> wire.NodeOrder:
        """The current order, once it is newer than ``after`` or done, or ``wait`` seconds
        have passed (a stop is read with ``wait`` 0: a long poll on it would spin)."""
        deadline = time.monotonic() + wait
        with self._lock:
            while True:
                o = self._order
                left = deadline - time.monotonic()
                if o.seq != after or o.done or left <= 0:
                    self._asked[node] = o.seq if not o.done else -1
                    return o
                self._lock.wait(min(left, 0.5))

    def _last_word(self, exc: BaseException | None) -> None:
        """``done`` (with node rank 0's line where it ended by an error), and a moment for
        the nodes that asked for orders to hear it, so that they end at once rather than
        after failing to reach a closed port (a node that never asked is not waited for)."""
        from ..outputs import one_line
        self.finish("" if exc is None else f"node rank 0 ended: "
                    f"{one_line(str(exc)) or type(exc).__name__}")
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            with self._lock:
                if all(seq == -1 for seq in self._asked.values()):
                    return
            time.sleep(0.05)

    def refused(self, node: int, line: str) -> None:
        with self._lock:
            self._refusals.setdefault(node, []).append(line)

    def refusals(self, node: int) -> list[str]:
        with self._lock:
            return list(self._refusals.get(node, []))

    def take(self, run: str, node: int, body: _Hashed, digest: str) -> tuple[int, str]:
        with self._lock:
            if (run, node) in self._got:
                return 200, "already merged"
        tmp = self.root / run / f".recv-node{node}-{uuid.uuid4().hex[:8]}"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        try:
            rec, _ = wire.unpack_node_run(body, tmp)
            if not tokens.same(body.h.hexdigest().encode(), digest.encode()):
                raise wire.NodeRunRefused("its body is not the one signed")
            if (rec.node, rec.run, rec.fingerprint) != (node, run, self.fingerprint):
                raise wire.NodeRunRefused("its header disagrees with the request")
        except (wire.NodeRunRefused, OSError) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            return 400, f"refused: {exc}"
        final = self.root / run / f"recv-node{node}"
        with self._lock:
            if (run, node) in self._got:
                shutil.rmtree(tmp, ignore_errors=True)
                return 200, "already merged"
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            self._got[(run, node)] = (rec, final)
            self._lock.notify_all()
        return 200, "merged"

    def got(self, run: str, node: int) -> tuple[wire.NodeRun, Path] | None:
        """Node ``node``'s record of ``run`` and the folder its files are in, once taken."""
        with self._lock:
            return self._got.get((run, node))


def _bind(topo: Address, token: str | None, say: Callable[[str], None]) -> _Server | None:
    """The listening socket: rendezvous host's address, else every interface (token only);
    None, with the line that says why, where it may not or cannot listen."""
    where = f"{topo.host}:{topo.port} ({topo.why})"
    loop = tokens.is_loopback(topo.host)
    if token is None and not loop:
        say(f"no ${TOKEN_ENV}: not listening beyond loopback for the other nodes' figures; "
            f"they must come through one shared --out (docs/profile.md, Across machines)")
        return None
    try:
        family = socket.getaddrinfo(topo.host, topo.port, type=socket.SOCK_STREAM)[0][0]
    except (OSError, UnicodeError):
        family = socket.AF_INET
    cls = type("_Bound", (_Server,), {"address_family": family})
    tried = [topo.host] if loop else [topo.host, "::" if family == socket.AF_INET6 else ""]
    for host in tried:
        try:
            server = cls((host, topo.port), _Handler)
        except OSError as exc:
            last = exc
            continue
        shown = host or "every interface"
        say(f"listening for the other nodes' figures on {shown}:{topo.port} ({topo.why}"
            f"{'; token from $' + TOKEN_ENV if token else '; loopback, no token'})")
        return server
    say(f"cannot listen on {where}: {last.strerror or last}; the other nodes' figures must come "
        "through one shared --out (--node-port sets another port)")
    return None


# ------------------------------------------------------------------ the other nodes: sending

def deliver(topo: Address, token: str | None, rec: wire.NodeRun, run_dir: Path) -> str:
    """Send this node's run to node rank 0; "" once node rank 0 took it, else why not (the
    caller then leaves the files and a marker for a shared ``--out``)."""
    if token is None and not tokens.is_loopback(topo.host):
        return f"no ${TOKEN_ENV}: not sent over the network"
    try:
        body = wire.pack_node_run(rec, run_dir)
    except wire.NodeRunRefused as exc:
        return f"too large to send ({exc})"
    digest = hashlib.sha256(body).hexdigest()
    headers = {"Content-Type": "application/octet-stream", "X-Stallbench-Node": str(rec.node),
               "X-Stallbench-Run": rec.run, "X-Stallbench-Fingerprint": rec.fingerprint,
               "X-Stallbench-Length": str(len(body)), "X-Stallbench-Digest": digest}
    if token is not None:
        headers["X-Stallbench-Mac"] = _mac(token, rec.fingerprint, rec.run, rec.node,
                                           len(body), digest)
    deadline = time.monotonic() + SEND_TRY_S
    while True:
        try:
            return _post(topo, b"", headers, PATH + "?check") or _post(topo, body, headers, PATH)
        except OSError as exc:
            if time.monotonic() > deadline:
                return f"cannot reach node rank 0 at {topo.host}:{topo.port}: {exc}"
        interrupts.check()
        time.sleep(1.0)


def _post(topo: Address, body: bytes, headers: dict[str, str], path: str) -> str:
    """One request; "" on 200, else node rank 0's answer (OSError: not reached)."""
    conn = http.client.HTTPConnection(topo.host, topo.port, timeout=SEND_TIMEOUT_S)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        text = resp.read(500).decode("utf-8", "replace")
    except (http.client.HTTPException, UnicodeError) as exc:
        raise OSError(str(exc)) from None
    finally:
        conn.close()
    if resp.status == 200:
        return ""
    from ..outputs import one_line
    return f"node rank 0 at {topo.host}:{topo.port} answered {resp.status}: {one_line(text)}"


class OrderRefused(Exception):
    """Node rank 0 answered an ask for orders with a refusal, or with something that is not
    its signed order: asking again changes nothing (the line says why)."""


def ask_order(topo: Address, token: str | None, fingerprint: str, node: int, after: int,
              wait: float) -> wire.NodeOrder | str:
    """Node rank 0's current order once newer than ``after`` (or after ``wait`` s: the same
    one); the line of an ``OSError`` where node rank 0 was not reached (worth asking again);
    ``OrderRefused`` where it answered with anything but its signed order."""
    nonce = uuid.uuid4().hex
    headers = {"X-Stallbench-Node": str(node), "X-Stallbench-After": str(after),
               "X-Stallbench-Wait": f"{wait:g}", "X-Stallbench-Fingerprint": fingerprint,
               "X-Stallbench-Nonce": nonce}
    if token is not None:
        headers["X-Stallbench-Mac"] = _order_mac(token, "ask", fingerprint, node, after, nonce)
    conn = http.client.HTTPConnection(topo.host, topo.port, timeout=wait + SEND_TIMEOUT_S)
    try:
        conn.request("GET", ORDER_PATH, headers=headers)
        resp = conn.getresponse()
        body = resp.read(wire.nodes.MAX_ORDER_BYTES + 1)
        mac = resp.getheader("X-Stallbench-Mac", "")
    except (OSError, http.client.HTTPException) as exc:
        return f"cannot reach node rank 0 at {topo.host}:{topo.port}: {exc}"
    finally:
        conn.close()
    from ..outputs import one_line
    at = f"{topo.host}:{topo.port}"
    if resp.status != 200:
        raise OrderRefused(f"node rank 0 at {at} answered {resp.status}: "
                           f"{one_line(body[:500].decode('utf-8', 'replace'))}")
    if len(body) > wire.nodes.MAX_ORDER_BYTES:
        raise OrderRefused(f"node rank 0 at {at} answered more than an order may be")
    if token is not None and not tokens.same(mac.encode(), _order_mac(
            token, "answer", fingerprint, node, after, nonce,
            hashlib.sha256(body).hexdigest()).encode()):
        raise OrderRefused(f"the answer from {at} is not node rank 0's (no valid signature: "
                           f"${TOKEN_ENV} differs, or something else holds the port)")
    got = wire.NodeOrder.from_bytes(body)
    if got is None:
        raise OrderRefused(f"node rank 0 at {at} sent no order")
    return got
