"""``stallbench serve``: a Flight server for a scenario's variants, on a machine with the data.

A trainer whose scenario says ``[executor] kind = "flight"`` and
``flight_servers = ["grpc://this-host:PORT"]`` reads its batches from here. The server opens
(or, for a synthetic table, generates into ``--cache-dir``) the dataset of every variant of
the scenario before it listens, so the first stream does not pay for that, and serves until
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterator

from ..errors import UserError


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve a scenario's batches to Flight trainers",
                       description="Serve every variant of a scenario as Arrow Flight streams "
                                   "(the producers of `[executor] kind = \"flight\"` with "
                                   "`flight_servers`). Runs until Ctrl-C or SIGTERM.")
    p.add_argument("scenario", help="scenario TOML file (the trainer's)")
    p.add_argument("--port", required=True, help="TCP port to listen on (0: any free port)")
    p.add_argument("--host", default="0.0.0.0",
                   help="address to listen on (default: every interface, 0.0.0.0)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="where generated datasets are cached (default: $STALLBENCH_CACHE or .cache/stallbench)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from .numbers import integer

    args.port = integer(args.port, "--port", 0, 65535)
    from .. import scenario
    from ..executors.flight.driver import import_flight
    from ..pipeline import dataset_for
    from ..run.runner import default_cache_dir
    from ..run.preflight import check_scenario

    sc = scenario.load(args.scenario)
    check_scenario(sc)
    import_flight(sc.path)
    from ..executors.flight.server import STOP_GRACE_S, Catalog, ProducerServer

    cache = args.cache_dir or default_cache_dir()
    catalog = Catalog(sc.name)
    for v in sc.variants:
        catalog.add(v.config, dataset_for(v.config, cache, sc.path), sc.path)
    with fd2_captured() as said:       # gRPC logs a failed bind to fd 2 itself (C++)
        try:
            server = ProducerServer(f"grpc://{args.host}:{args.port}", catalog)
            failed = None
        except Exception as exc:  # noqa: BLE001 - a port in use, an address not of this machine
            failed = exc
    if failed is not None:
        raise UserError(listen_error(args.host, args.port, said(), failed)) from None
    sys.stderr.write(said())           # a successful start's own log lines, if any, as they were
    # The server's threads serve from its construction on; this thread only waits for a
    # stop, in Python, where SIGINT and SIGTERM handlers run (installed before the line
    # saying it serves: a signal right after that line is this command's to report).
    stop = threading.Event()
    got: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        got.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    print(f"serving {len(catalog.entries)} variant(s) of scenario {sc.name!r} on "
          f"grpc://{args.host}:{server.port} (pid {os.getpid()}); Ctrl-C or SIGTERM stops",
          flush=True)
    while not stop.wait(0.5):
        pass
    cut = server.stop()
    print("stallbench serve: stopped", flush=True)
    # Like every verb: 130 for SIGINT, 143 for SIGTERM (a supervisor reads how it ended).
    from .. import interrupts

    exc = interrupts.received(got[0])
    exc.outcome = "server stopped"
    if cut:
        exc.outcome += f"; {cut} open stream(s) cut after {STOP_GRACE_S:g} s"
    raise exc


@contextlib.contextmanager
def fd2_captured() -> Iterator[Callable[[], str]]:
    """File descriptor 2 (where gRPC's C++ logs go, around Python's ``sys.stderr``) into a
    temp file for the block; yields a function that returns what was written there."""
    sys.stderr.flush()
    saved = os.dup(2)
    text = [""]
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lambda: text[0]
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text[0] = tmp.read(64 * 1024).decode(errors="replace")


_BIND = re.compile(r"Error in bind for address '([^']*)': ([^)]*?)(?=Error in bind|\)|$)")


def listen_error(host: str, port: int, log: str, exc: BaseException) -> str:
    """One line for a server that could not listen: the reason gRPC logged (the exception
    itself only says "Server did not start properly")."""
    reasons = sorted({m.group(2).strip() for m in _BIND.finditer(log)})
    why = "; ".join(reasons) or " ".join(str(exc).split())[:200]
    hint = ""
    if any("in use" in r for r in reasons):
        hint = (f": another process listens on port {port}; choose another --port "
                f"(--port 0: any free one)")
    elif any("assign" in r for r in reasons):
        hint = f": {host} is not an address of this machine (--host)"
    return f"--port {port}: cannot listen on {host}:{port} ({why}){hint}"
