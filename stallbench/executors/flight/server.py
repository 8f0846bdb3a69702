"""The Flight server: owns a share of the row groups, fetches and preprocesses them, and streams
the trainer's batches as Arrow record batches.

One class serves both ways of running it:

- ``stallbench serve SCENARIO.toml --port P`` (``commands/serve.py``): on any machine with
  the data, it opens (or generates) the dataset of every variant of the scenario and serves
  them until stopped; tickets name a variant by ``protocol.config_key``;
- a *local* server that the Flight executor starts on the trainer's machine (``main``, run as
  ``python -m stallbench.executors.flight.server``): its parent hands it an owner token,
  then each plan's config and dataset, through its stdin (a pipe only the parent holds, so it
  is as trusted as a forked worker), and closing that pipe ends the server: it never outlives
  its trainer.

Who may call it, and what, is ``auth``'s: every call passes its ``Gate`` (bearer tokens,
compared in constant time) before a handler runs; ``release`` is the owner's, and a reader's
stream may budget at most the server's cores.

A stream (``do_get``) runs the real producer code (``Plan.produce``: fetch, preprocess, the
wire format's encode, ``protocol.wire_format``: ``arrow_jagged`` for a loader format that keeps
every id, ``arrow`` for a padded one) for each work item of its ticket and yields the batches;
Flight's own IPC writer serialises each one (compressed with zstd when the variant asks for
``loader.compression = "zstd"``: real Arrow IPC body compression, not an emulation) and
writes it to the socket. The time from handing a batch to Flight until Flight asks for the
next one (IPC encode, compression, the gRPC write, including waiting while the link or the
trainer is behind, as an emulated link's wait is counted) is added to the item's producer
transfer time. Ablation caches are built by the server itself for its own shards (the
``prepare`` action), so nothing large crosses the socket for them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from ... import __version__, interrupts, threads
from ...data.parquet import Dataset
from ...pipeline import FULL, Plan, StageCaches
from ...scenario import Config
from . import auth, protocol
from .auth import OWNER
from .protocol import ProtocolError, Ticket, Trailer

READY = "PORT"            # a local server's first stdout line: "PORT <port>"
REGISTERED = "REGISTERED"
STOP_GRACE_S = 5.0        # how long a stop waits for open streams before it cuts them
_STUCK: list["ProducerServer"] = []   # servers whose shutdown is stuck: alive until the end


@dataclass
class Entry:
    """One variant a server serves: its config and dataset, the server's plan of it (built
    once) and the ablation caches of the shards it was asked to prepare."""

    config: Config
    dataset: Dataset
    file: str
    plan: Plan | None = None
    caches: StageCaches = field(default_factory=StageCaches)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def base_plan(self) -> Plan:
        with self.lock:
            if self.plan is None:
                self.plan = Plan.create(protocol.server_config(self.config), self.dataset, FULL,
                                        self.file)
            return self.plan

    def prepare(self, shards: list[int]) -> None:
        """Fetched and preprocessed tables of ``shards`` for the ablations (untimed)."""
        plan = self.base_plan()
        for i in shards:
            if i in self.caches.prepped:
                continue
            table = self.dataset.read_shard(self.dataset.shards[i])
            prepped = plan.preprocess(table, i)
            with self.lock:
                self.caches.fetched[i] = table
                self.caches.prepped[i] = prepped


class Catalog:
    """The variants a server serves, by ``protocol.config_key``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.entries: dict[str, Entry] = {}

    def add(self, cfg: Config, dataset: Dataset, file: str = "<scenario>") -> str:
        key = protocol.config_key(cfg)
        if key not in self.entries:
            self.entries[key] = Entry(cfg, dataset, file)
        return key

    def get(self, key: str) -> Entry:
        e = self.entries.get(key)
        if e is None:
            raise flight.FlightServerError(
                f"this server (scenario {self.name!r}) does not serve variant {key}: start it "
                f"with the trainer's scenario file (same dataset, preprocess and loader keys)")
        return e


def _error(exc: BaseException) -> flight.FlightServerError:
    return flight.FlightServerError(f"{type(exc).__name__}: {exc}")


class ProducerServer(flight.FlightServerBase):
    def __init__(self, location: str, catalog: Catalog, gate: auth.Gate | None = None) -> None:
        """``gate``: who may call (``auth.Gate``); None: every caller is a reader (tests)."""
        super().__init__(location, middleware={auth.MIDDLEWARE: gate} if gate is not None else None)
        self.catalog = catalog
        self.streams = 0          # open now
        self.cut = 0              # ended by ``stop`` before their last item
        self._count = threading.Lock()
        self.closing = threading.Event()
        self._grace_s = STOP_GRACE_S   # what ``stop`` gave open streams (its line says it)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int:
        """Stop serving within about ``grace_s``; returns how many open streams were cut.

        Flight's ``shutdown`` waits, without an end, for every open call, and a stream whose
        client stopped reading (a trainer frozen under a debugger or ``kill -STOP``, a link
        that hangs) blocks inside gRPC's write, where no Python code runs: measured, a
        ``stallbench serve`` then ignored SIGTERM until that client died. Open streams get
        ``grace_s`` to finish as they would have, then end at their next batch with an error
        their trainer reports in one line (``closing``). A call gRPC still holds a second
        later is left to the shutdown's daemon thread: the process must then end without
        C++'s destructors or pyarrow's ``atexit`` finaliser, which would wait on it again
        (``interrupts.runtime_left``; this server is kept alive until then)."""
        self._grace_s = grace_s
        done = threading.Thread(target=self.shutdown, daemon=True,
                                name="stallbench-flight-shutdown")
        done.start()
        done.join(grace_s)
        if done.is_alive():
            self.closing.set()
            done.join(1.0)
        if done.is_alive():
            interrupts.runtime_left(run_atexit=False)
            _STUCK.append(self)
        with self._count:
            return self.cut + (self.streams if done.is_alive() else 0)

    # ------------------------------------------------------------------------ actions
    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [("ping", "who is serving what"),
                ("prepare", "build ablation caches: {key, shards}"),
                ("release", "drop ablation caches: {key} (the server's owner only)")]

    def do_action(self, context: Any, action: flight.Action) -> Iterator[bytes]:
        kind = action.type
        if kind not in ("ping", "prepare", "release"):
            raise flight.FlightServerError(f"unknown action {kind!r}")
        try:
            if kind == "ping":
                return iter([json.dumps(self.describe()).encode()])
            if kind == "release" and auth.role_of(context) != OWNER:
                # another trainer's ablation run may be reading these caches
                raise flight.FlightUnauthorizedError(
                    "release is for the server's owner (the trainer that started it)")
            body = protocol.json_object(action.body.to_pybytes() if action.body else b"", kind)
            entry = self.catalog.get(str(body.get("key")))
            if kind == "prepare":
                shards = body.get("shards")
                if not protocol.non_negative_ints(shards) or any(s >= len(entry.dataset.shards)
                                                     for s in shards):
                    raise ProtocolError("prepare: shards must be indices of the dataset")
                t0 = time.perf_counter()
                entry.prepare(shards)
                return iter([json.dumps({"shards": len(shards),
                                         "s": time.perf_counter() - t0}).encode()])
            if kind == "release":
                with entry.lock:
                    entry.caches = StageCaches()
                return iter([b"{}"])
        except flight.FlightError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the trainer
            raise _error(exc) from None
        raise AssertionError(kind)   # pragma: no cover - every known kind returned above

    def describe(self) -> dict[str, Any]:
        return {"v": protocol.VERSION, "stallbench": __version__, "pid": os.getpid(),
                "cores": threads.machine_cores(), "pyarrow_threads": pa.cpu_count(),
                "scenario": self.catalog.name,
                "variants": {k: {"shards": len(e.dataset.shards), "rows": e.dataset.rows}
                             for k, e in self.catalog.entries.items()}}

    # ------------------------------------------------------------------------- streams
    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        try:
            t = Ticket.decode(ticket.ticket)
            if auth.role_of(context) != OWNER:
                _check_reader_threads(t.threads)
            entry = self.catalog.get(t.key)
            n = len(entry.dataset.shards)
            bad = [s for s in t.shards if s >= n]
            if bad:
                raise ProtocolError(f"shard {bad[0]} does not exist (the dataset has {n}): is "
                                    f"the data on this machine the trainer's?")
            plan = entry.base_plan()
            caches = None
            if t.ablation.fetch or t.ablation.preprocess:
                caches = entry.caches
                need = caches.prepped if t.ablation.preprocess else caches.fetched
                missing = [s for s in t.shards if s not in need]
                if missing:
                    raise ProtocolError(f"shard {missing[0]} is not prepared for the "
                                        f"{t.ablation.name} ablation (send 'prepare' first)")
            plan = dataclasses.replace(
                plan, ablation=t.ablation, caches=caches,
                items=tuple(entry.dataset.shards[s] for s in t.shards),
                home_pid=-1 if t.process_clock else os.getpid())
        except flight.FlightError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _error(exc) from None
        schema = plan.transfer.format.arrow     # the wire's: arrow or arrow_jagged
        opts = pa.ipc.IpcWriteOptions(compression=_codec(entry.config))
        return flight.GeneratorStream(schema, self._stream(plan, t, schema, context), options=opts)

    def _stream(self, plan: Plan, t: Ticket, schema: pa.Schema, context: Any) -> Iterator[Any]:
        with self._count:
            self.streams += 1
        try:
            threads.apply(threads.producer_budget(t.threads, 1))
            empty = pa.RecordBatch.from_pylist([], schema=schema)
            perf = time.perf_counter
            for k, pos in enumerate(t.items):
                if context.is_cancelled():
                    return
                self._check_closing()
                out = plan.produce(k)
                times = out.times
                clock = plan._cpu_clock()
                payloads = out.payloads or []
                for part, p in enumerate(payloads):
                    self._check_closing()
                    w0, c0 = perf(), clock()
                    yield p.data, protocol.batch_meta(pos, part, p.rows, p.batch_id)
                    times.transfer_s += perf() - w0
                    times.transfer_cpu_s += clock() - c0
                yield empty, Trailer(pos, out.shard, len(payloads), out.batches, out.rows,
                                     out.payloads is not None, times).encode()
        finally:
            with self._count:
                self.streams -= 1

    def _check_closing(self) -> None:
        """A stream cut by ``stop`` ends with an error, never as if it were complete: its
        trainer then says the server stopped, in one line."""
        if self.closing.is_set():
            with self._count:
                self.cut += 1
            raise flight.FlightUnavailableError(
                f"the server (pid {os.getpid()}) is stopping: this stream was cut "
                f"{self._grace_s:g} s after it was told to stop")


def _check_reader_threads(asked: int | None) -> None:
    """A reader's stream resizes the server's process-wide pools (``threads.apply``) for as
    long as it runs: it may ask for the server's cores at most (None and 0 mean the cores)."""
    bound = auth.reader_threads_max()
    if asked is not None and asked > bound:
        raise flight.FlightUnauthorizedError(
            f"a stream's thread budget of {asked} is above this server's bound of {bound} (its "
            f"cores); set loader.producer_threads to at most {bound}")


def _codec(cfg: Config) -> pa.Codec | None:
    """Arrow IPC body compression of the variant's ``loader.compression``."""
    lc = cfg.loader
    if lc.compression == "zstd":
        return pa.Codec("zstd", compression_level=lc.compression_level)
    return None


# ------------------------------------------------------------- a server of the trainer's

def send_registration(pipe: Any, cfg: Config, dataset: Dataset, file: str) -> None:
    """What the parent writes to a local server's stdin: one length-prefixed pickle of the
    variant and its scenario file (whose directory the user's modules are found in, and
    which the server's errors name)."""
    blob = pickle.dumps((cfg, dataset, file), protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(struct.pack("<Q", len(blob)) + blob)
    pipe.flush()


def send_token(pipe: Any, token: str) -> None:
    """What the parent writes to a local server's stdin first: the owner token, one line."""
    pipe.write(token.encode("ascii") + b"\n")
    pipe.flush()


def _registrations(server: ProducerServer) -> None:
    """Read (config, dataset, scenario file) from stdin; at its end, shut the server down."""
    src = sys.stdin.buffer
    try:
        while True:
            head = src.read(8)
            if len(head) < 8:
                break
            (n,) = struct.unpack("<Q", head)
            cfg, dataset, file = pickle.loads(src.read(n))
            key = server.catalog.add(cfg, dataset, file)
            print(f"{REGISTERED} {key}", flush=True)
    finally:
        server.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A Flight producer started by a stallbench trainer "
                                            "(reads its plans from stdin; use `stallbench serve` "
                                            "to serve a scenario yourself).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    # The owner token first: the parent writes it before anything else
    token = sys.stdin.buffer.readline().decode("ascii", "replace").strip()
    if not auth.valid_token(token):
        print("stallbench flight server: no owner token on stdin (started by a trainer only)",
              file=sys.stderr)
        return 2
    server = ProducerServer(f"grpc://{args.host}:{args.port}", Catalog("<trainer>"),
                            auth.Gate(owner=token))
    print(f"{READY} {server.port}", flush=True)
    reader = threading.Thread(target=_registrations, args=(server,), daemon=True,
                              name="stallbench-registrations")
    reader.start()
    try:
        server.wait()            # until stdin closes (no signal handlers: the parent stops us)
    except KeyboardInterrupt:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
