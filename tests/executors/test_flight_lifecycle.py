"""In-process Flight servers, one after another in one process (as the tests make them).

Found for issue 37: a test's own Flight server, just started on port 0, refused connections
("failed to connect to all addresses ... Connection refused") in 2 of 3 parallel whole-suite
runs. The cause, seen with ``strace -f -e shutdown,close,listen``: the server before it had
been served from a thread (``threading.Thread(target=srv.serve)``); after ``srv.shutdown()``
returned and the next server's listening socket took the freed fd number, one of gRPC's
``event_engine`` threads shut down and closed that fd number a second time. The new server
was then not listening. Measured with the loop below under load 15 on 2 cores: 7 of 100 and
1 of 100 servers refused with a ``serve()`` thread, 0 of 100 with the thread joined and 0 of
100 without one (a ``FlightServerBase`` serves from its construction; ``serve()`` only
blocks). Parallel runs made it likely (more load, so a later teardown), never its cause.

So no test serves an in-process Flight server from a thread; this test holds the pattern
the tests use to that: every server, checked from another process, is listening.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

flight = pytest.importorskip("pyarrow.flight")

CONNECT = """
import socket, sys
s = socket.socket()
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
    print("ok")
except OSError as exc:
    print(exc)
"""


class _Answer(flight.FlightServerBase):
    def do_action(self, context, action):  # noqa: ANN001
        yield flight.Result(b"[]")


def test_servers_made_one_after_another_in_one_process_all_listen() -> None:
    refused = []
    for _ in range(40):
        srv = _Answer("grpc://127.0.0.1:0")
        try:
            r = subprocess.run([sys.executable, "-c", CONNECT, str(srv.port)],
                               capture_output=True, text=True, timeout=60)
            if r.stdout.strip() != "ok":
                refused.append((srv.port, r.stdout.strip(), r.stderr[-500:]))
        finally:
            srv.shutdown()
    assert refused == [], refused


def test_no_test_serves_an_in_process_flight_server_from_a_thread() -> None:
    """The pattern that refused, ``Thread(target=<server>.serve)``, in no test file."""
    here = Path(__file__).resolve()
    pattern = re.compile(r"target\s*=\s*\w+\.serve\b(?!_forever)")
    hits = [str(p) for p in here.parents[1].rglob("*.py")
            if p != here and pattern.search(p.read_text())]
    assert hits == [], hits
