"""``stallbench serve``: a Flight server for a scenario's variants, on a machine with the data.

A trainer whose scenario says ``[executor] kind = "flight"`` and
``flight_servers = ["grpc://this-host:PORT"]`` reads its batches from here. The server opens
(or, for a synthetic table, generates into ``--cache-dir``) the dataset of every variant of
the scenario before it listens, so the first stream does not pay for that, and serves until
Ctrl-C or SIGTERM.

It streams whole datasets, so it listens on loopback (127.0.0.1) unless ``--host`` says
otherwise, and any other address needs a bearer token (``--token-env NAME`` or
``--token-file PATH``), checked on every call (``executors.flight.auth``); the check comes
before the dataset is opened, so a refused start costs nothing.
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

from .. import outputs
from ..errors import UserError


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve a scenario's batches to Flight trainers",
                       description="Serve every variant of a scenario as Arrow Flight streams "
                                   "(the producers of `[executor] kind = \"flight\"` with "
                                   "`flight_servers`). Runs until Ctrl-C or SIGTERM.")
    p.add_argument("scenario", help="scenario TOML file (the trainer's)")
    p.add_argument("--port", required=True, help="TCP port to listen on (0: any free port)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: loopback, 127.0.0.1); any other "
                        "address (0.0.0.0: every interface) needs --token-env or --token-file")
    tok = p.add_mutually_exclusive_group()
    tok.add_argument("--token-env", metavar="NAME", default=None,
                     help="environment variable holding the bearer token every caller must "
                          "send (the trainer's executor.flight_token_env)")
    tok.add_argument("--token-file", metavar="PATH", type=Path, default=None,
                     help="file holding that token (one line; keep it chmod 600)")
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
    from ..executors.flight import auth

    # Who may call, decided before the dataset is opened (a refused start costs nothing)
    token = auth.serve_token(args.token_env, args.token_file)
    if token is None and not auth.is_loopback(args.host):
        raise UserError(f"--host {args.host}: serving beyond this machine needs a token "
                        f"(--token-env NAME or --token-file PATH), which every trainer sends "
                        f"(executor.flight_token_env); see docs/flight.md")
    from ..executors.flight.server import STOP_GRACE_S, Catalog, ProducerServer

    cache = args.cache_dir or default_cache_dir()
    catalog = Catalog(sc.name)
    for v in sc.variants:
        catalog.add(v.config, dataset_for(v.config, cache, sc.path), sc.path)
    with fd2_captured() as said:       # gRPC logs a failed bind to fd 2 itself (C++)
        try:
            server = ProducerServer(f"grpc://{_bracketed(args.host)}:{args.port}", catalog,
                                    auth.Gate(reader=token))
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
    who = (f"token from {'$' + args.token_env if args.token_env else args.token_file}"
           if token is not None else "no token: every user of this machine may stream")
    print(f"serving {len(catalog.entries)} variant(s) of scenario {sc.name!r} on "
          f"grpc://{_bracketed(args.host)}:{server.port} (pid {os.getpid()}; {who}); "
          f"Ctrl-C or SIGTERM stops", flush=True)
    failed = outputs.stdout_error()
    if failed is not None:      # it serves on: say now that its address went nowhere
        print(f"stallbench serve: cannot write to stdout ({failed.strerror or failed}); "
              f"serving on grpc://{_bracketed(args.host)}:{server.port} (pid {os.getpid()})",
              file=sys.stderr, flush=True)
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


def _bracketed(host: str) -> str:
    """An IPv6 literal in a URI's host is bracketed (``grpc://[::1]:8815``)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


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
