"""The Flight executor's trainer side: which servers, which share each streams, and the merge.

*Servers.* ``flight_servers = ["grpc://host:port", ...]`` names servers someone started with
``stallbench serve`` (on machines with the data); unset, ``flight_local_servers`` servers are
started on this machine (``local.LocalServers``). Before anything runs, each must answer a
ping within ``connect_timeout_s`` and serve this variant (same dataset, preprocessing and
wire keys: ``protocol.config_key``), else a one-line error naming the address. Every call
carries a bearer token (``auth``): for ``flight_servers``, the one in the environment variable
``flight_token_env`` names (if set); for local servers, the owner token this trainer made
for them; a server that refuses it is one line naming ``executor.flight_token_env``.

*Shares and streams.* With N servers and S streams per server, stream ``j`` (of N x S) reads
the work items whose shard index is ``j`` modulo N x S, from server ``j`` modulo N; so server
``k`` owns the shards whose index is ``k`` modulo N, in every epoch. Each stream is one
``do_get``, read by its own thread into a bounded queue of ``prefetch_factor`` work items:
when the trainer falls behind, the thread stops reading, gRPC's flow control fills, and the
server's generator blocks (the backpressure is the transport's own). The trainer takes work
items in the plan's order, each from its stream's queue, so it sees the batches of the local
executor in the same order; each stream's items arrive in order and exactly once (checked: a
gap or a stream that ends early is an error naming the server).

*Batches.* A batch arrives as an Arrow record batch, in the wire format of the loader's
format (``protocol.wire_format``, results note it): ``arrow_jagged`` when it keeps every id
(``jagged``, the default: the feature columns, sequences as Arrow list arrays, built into the
``jagged`` batch by the trainer), ``arrow`` when it pads; its IPC body is decompressed by Arrow
in the reader thread, and the trainer's timed transfer turns it into tensors (``decode``: one
copy per tensor or column, or the vectorised collation with ``collate = "trainer"``).

*Figures.* Stage times come from the servers (each item's trailer); producer CPU from the
local servers' own process clocks (None for servers elsewhere); the bytes that crossed the
link from the kernel's counters of the trainer's sockets (``link``), reported after the run
as ``wire_bytes`` (``late_stage_times``), beside the uncompressed IPC size (``raw_bytes``).
Where those counters cannot be read (no ``ss``), ``wire_bytes`` is the uncompressed IPC size
the servers sent, and the run's figures say so.

*Outside the clock.* A generator's ``finally`` runs inside the trainer's last ``next()``,
i.e. inside the measured epoch; so ``run`` ends there only what delivering the data needs
(the streams told to stop; the threads of a run cut short or failed joined, bounded), and
the bookkeeping (the threads of a complete run joined, the link's counters read with ``ss``,
the run's figures) waits for ``_settle``, which ``late_stage_times`` / ``run_figures`` call
once ``measured_run`` has stopped its clock. The counters at a run's start are read before
it too (at ``prepare``'s end, then at each run's settling for the next run).
"""

from __future__ import annotations

import dataclasses
import json
import math
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from ... import __version__
from ...errors import NoProgress, ScenarioError, UserError, cut
from ...measure.watchdog import tick
from ...pipeline import Plan, ShardOutput, StageCaches, StageTimes
from ...scenario import Config
from ...stages.transfer import Payload
from ... import threads
from ..base import EXECUTORS, Executor
from . import link, protocol
from .protocol import Ticket, Trailer

_END = object()

# The longest a run's end waits, in all, for its stream threads once they were told to stop
# (each reads one gRPC stream; a cancelled ``do_get`` ends its read at once): a thread
# still alive after it is left (a daemon) rather than hang the trainer.
_JOIN_S = 10.0

_UNREAD = object()    # the link's start count: not read outside a run's clock


def import_flight(scenario_file: str = "<scenario>") -> Any:
    try:
        import pyarrow.flight as flight
    except ImportError as exc:
        raise UserError(f"{scenario_file}: executor.kind = \"flight\" needs pyarrow with Flight, "
                        f"which is not available here ({exc}); install it with: "
                        f"pip install pyarrow") from None
    return flight


@dataclass
class _Stream:
    index: int
    server: int
    items: list[int]                     # positions in the plan's work list
    queue: "queue.Queue[Any]"
    thread: threading.Thread | None = None
    reader: Any = None
    first_chunk_s: float | None = None


@dataclass
class _RunState:
    t0: float = 0.0
    streams: list[_Stream] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    link0: int | None = None
    delivered: int = 0
    complete: bool = False


@EXECUTORS.register("flight")
class FlightExecutor(Executor):
    name = "flight"
    scaling_knobs = ("executor.flight_local_servers", "executor.flight_streams_per_server",
                     "executor.flight_servers")
    # Ranks (``trainers.ranks`` > 1): stallbench's process starts (or connects to) the servers
    # once for the job; every rank attaches to them and streams its own work items. Ranks are
    # spawned: a process forked from one that has used a Flight (gRPC) client hangs in its
    # own first gRPC call.
    ranks_share_producers = True
    rank_start_method = "spawn"

    def __init__(self, config: Config, scenario_file: str = "<scenario>",
                 attach: list[str] | None = None, token: str | None = None) -> None:
        """``attach``: the servers some other process of this job runs (a rank's view of the
        servers stallbench's process started); this executor starts and stops none.
        ``token``: the token that process sends them (handed over the rank's private pipe)."""
        super().__init__(config, scenario_file)
        self.spec = config.executor
        self.remote = list(self.spec.flight_servers or [])
        self.attach = list(attach) if attach is not None else None
        self.token = token                       # sent with every call (``auth.Bearer``)
        self.local: Any = None                   # local.LocalServers once started
        self.locations: list[str] = []
        self.clients: list[Any] = []
        self.peers: list[tuple[str, int]] = []
        self.served: list[dict[str, Any]] = []   # each server's ping answer
        self._startup: dict[str, float] = {}
        self._prepared: tuple[str, int] | None = None
        self._run: _RunState | None = None
        self._late: StageTimes | None = None
        self._last: dict[str, Any] = {}
        self._doing: str | None = None             # a server call before the runs (waiting_for)
        # A run that has ended, its bookkeeping (threads joined, link counters, figures) done
        # when its figures are first asked for: after the trainer's clock (``_settle``).
        self._pending: tuple[Plan, _RunState] | None = None
        # The link's byte counter read outside any run's clock (``prepare``'s end, a run's
        # settling) with no Flight call since: the next run's start count (None: no counters
        # here). _UNREAD: the next run reads its own.
        self._link_base: Any = _UNREAD

    # ------------------------------------------------------------------ before anything runs
    @classmethod
    def validate(cls, config: Config, scenario_file: str = "<scenario>") -> None:
        servers = config.executor.flight_servers
        if servers is None:
            return
        if not servers:
            raise ScenarioError(scenario_file, "executor.flight_servers",
                                "expected at least one \"grpc://host:port\" (or leave it unset)")
        for i, uri in enumerate(servers):
            try:
                protocol.parse_location(uri)
            except ValueError as exc:
                raise ScenarioError(scenario_file, f"executor.flight_servers[{i}]", str(exc)) from None
        if len(set(servers)) != len(servers):
            raise ScenarioError(scenario_file, "executor.flight_servers",
                                "a server is listed twice")
        name = config.executor.flight_token_env
        if name is not None and not _ENV_NAME.fullmatch(name):
            # never quoted: a token pasted here by mistake must not reach a terminal or log
            raise ScenarioError(scenario_file, "executor.flight_token_env",
                                "expected the name of an environment variable (letters, digits, "
                                "_) that holds the token, not the token itself")

    @classmethod
    def check(cls, config: Config, scenario_file: str = "<scenario>") -> None:
        import_flight(scenario_file)
        if config.executor.flight_servers:
            _remote_token(config, scenario_file)

    # ------------------------------------------------------------------------ its producers
    def _servers(self) -> int:
        return len(self.remote) if self.remote else self.spec.flight_local_servers

    def producer_slots(self) -> int:
        """Streams read at once: servers x streams per server."""
        return self._servers() * self.spec.flight_streams_per_server

    def has_producers(self) -> bool:
        return True

    def producer_nodes(self) -> int | None:
        """Each server is a node: the what-if's "nodes" are Flight servers."""
        return self._servers()

    def nodes_simulated(self) -> bool:
        """Local servers share this machine's cores."""
        return not self.remote

    def local_producers(self) -> int:
        """Producer processes on this machine: the local servers (remote ones budget their
        own machine's cores)."""
        return 0 if self.remote else self.spec.flight_local_servers

    def producer_threads(self) -> int | None:
        if self.remote:
            setting = self.config.loader.producer_threads
            return None if setting in (None, threads.UNBOUNDED) else setting
        return super().producer_threads()

    def _ticket_threads(self) -> int | None:
        """What a ticket asks for: the budget resolved here for local servers; for remote ones
        the scenario's setting (None: the server's cores; 0: no budget)."""
        if self.remote:
            return self.config.loader.producer_threads
        budget = self.producer_threads()
        return threads.UNBOUNDED if budget is None else budget

    # ---------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        import_flight(self.scenario_file)    # a clear error before anything starts
        t0 = time.perf_counter()
        if self.attach is not None:
            self.locations = list(self.attach)
        elif self.remote:
            self.locations = list(self.remote)
            self.token = _remote_token(self.config, self.scenario_file)
        else:
            from .local import LocalServers

            self.local = LocalServers(self.spec.flight_local_servers, self.producer_threads(),
                                      self.scenario_file, self.config.run.progress_timeout_s)
            try:
                self.local.start()
            except BaseException:
                self.stop()
                raise
            self.locations = self.local.locations
            self.token = self.local.token
        t1 = time.perf_counter()
        from . import auth

        self.clients, self.peers, self.served = [], [], []
        for i, loc in enumerate(self.locations):
            host, port = protocol.parse_location(loc)
            self.peers += link.resolve(host, port)
            client = auth.connect(loc, self.token)
            self.clients.append(client)
            self.served.append(self._ping(client, i, loc))
        self._startup = {"servers_start_s": t1 - t0, "connect_s": time.perf_counter() - t1}

    def rank_options(self) -> dict[str, Any]:
        """Each rank streams its own work items from this job's servers (started once), with
        this process's token (the pipe to a spawned rank is private to the job)."""
        return {"attach": list(self.locations), "token": self.token}

    def _where(self, i: int) -> str:
        return (f"executor.flight_servers[{i}]" if self.remote else "executor.flight_local_servers")

    def _ping(self, client: Any, i: int, loc: str) -> dict[str, Any]:
        flight = import_flight()
        self._link_base = _UNREAD         # its answer crosses the link: a base read before is stale
        opts = flight.FlightCallOptions(timeout=self.spec.connect_timeout_s)
        try:
            res = list(client.do_action(flight.Action("ping", b""), options=opts))
        except flight.FlightUnauthenticatedError:
            self.stop()
            if not self.remote:
                raise UserError(f"{self.scenario_file}: executor: the local Flight server at "
                                f"{loc} refused the token this trainer made for it (another "
                                f"process listening on its port?)") from None
            raise ScenarioError(self.scenario_file, "executor.flight_token_env",
                                self._refused(loc)) from None
        except (flight.FlightError, OSError) as exc:
            self.stop()
            raise ScenarioError(self.scenario_file, self._where(i),
                                f"no Flight server answers at {loc} within "
                                f"{self.spec.connect_timeout_s:g} s ({_short(exc)}); start one "
                                f"with: stallbench serve SCENARIO.toml --port PORT") from None
        # A server answered: what it said is data to check, never "no server answers" (a
        # foreign Flight service answering nothing or non-JSON is not a stallbench server).
        body = res[0].body.to_pybytes() if res else b""
        try:
            info = json.loads(body)
        except ValueError:
            info = _NOT_JSON
        if not _is_ping_answer(info):     # e.g. another Flight service answering "[]"
            self.stop()
            said = (f"{_short(repr(info), 80)}" if info is not _NOT_JSON
                    else f"{_short(repr(body[:80]), 80)} (not JSON)" if res else "nothing")
            raise ScenarioError(self.scenario_file, self._where(i),
                                f"the Flight server at {loc} answered the ping with "
                                f"{said}: not a stallbench Flight server")
        if info["v"] != protocol.VERSION:
            self.stop()
            release = info.get("stallbench")
            raise ScenarioError(self.scenario_file, self._where(i),
                                f"the Flight server at {loc} speaks stallbench's Flight "
                                f"protocol {info['v']}, this trainer protocol "
                                f"{protocol.VERSION} (stallbench {__version__}); run the same "
                                f"stallbench release on both sides"
                                + (f" (the server runs {_short(repr(release), 40)})"
                                   if release is not None else ""))
        return info

    def _refused(self, loc: str) -> str:
        """Why a server of ``flight_servers`` refused this trainer's calls, naming where its
        token comes from (never the token)."""
        name = self.spec.flight_token_env
        if name is None:
            return (f"the Flight server at {loc} refused the call without a token (it was "
                    f"started with one): set flight_token_env to the name of an environment "
                    f"variable holding it")
        return (f"the Flight server at {loc} refused the token in ${name} (not the one it was "
                f"started with)")

    def _server_pid(self, k: int) -> str:
        """``" (pid N)"`` of server ``k`` as its ping said, for lines that name it (a remote
        server's pid is what its operator looks for); empty before the ping."""
        pid = self.served[k].get("pid") if k < len(self.served) else None
        return f" (pid {pid})" if pid is not None else ""

    def waiting_for(self) -> str:
        """What the trainer waits on (the progress watchdog's line): the server call under
        way before the runs (a registration, a row group's ablation caches), else the
        streams."""
        return self._doing or f"Flight stream(s) from {', '.join(self.locations)}"

    def _register(self, plan: Plan) -> str:
        """Make sure every server serves this plan's variant (local ones are handed it)."""
        key = protocol.config_key(plan.config)
        if self.local is not None:
            self._doing = (f"the local Flight server(s) {', '.join(self.locations)} (pids "
                           f"{', '.join(map(str, self.local.pids()))}) registering the variant")
            self.local.register(plan.config, plan.dataset, key, plan.preprocess.scenario_file)
            self._doing = None
            for s in self.served:
                s.setdefault("variants", {})[key] = {"shards": len(plan.dataset.shards),
                                                     "rows": plan.dataset.rows}
        for i, info in enumerate(self.served):
            v = info.get("variants", {}).get(key)
            if v is None:
                self.stop()
                raise ScenarioError(self.scenario_file, self._where(i),
                                    f"the Flight server at {self.locations[i]} serves scenario "
                                    f"{info.get('scenario')!r}, without this variant (same "
                                    f"dataset, preprocess and loader keys); start it with this "
                                    f"scenario file")
            if (v["shards"], v["rows"]) != (len(plan.dataset.shards), plan.dataset.rows):
                self.stop()
                raise ScenarioError(self.scenario_file, self._where(i),
                                    f"the Flight server at {self.locations[i]} has "
                                    f"{v['rows']} rows in {v['shards']} row groups, the trainer "
                                    f"{plan.dataset.rows} in {len(plan.dataset.shards)}: not the "
                                    f"same data")
        return key

    def prepare(self, plan: Plan, caches: StageCaches | None) -> None:
        """Register the variant, have each server build the ablation caches of its own shards,
        then one untimed pass over one work item per stream (first-use costs: Parquet footers,
        Arrow kernels, gRPC connections), reported as start-up."""
        flight = import_flight()
        t0 = time.perf_counter()
        key = self._register(plan)
        if caches is not None and self._prepared != (key, id(caches)):
            # One call per row group, each with a deadline of ``progress_timeout_s``: a call
            # blocked in gRPC's C++ is beyond the watchdog's signal (and SIGTERM's), so a
            # server stopped mid-way kept the trainer waiting forever; each row group done is
            # progress (a long build of many is not a stall).
            n = len(self.clients)
            shards = sorted({s.index for s in plan.items})
            timeout = self.config.run.progress_timeout_s
            opts = flight.FlightCallOptions(timeout=timeout)
            for k, client in enumerate(self.clients):
                for shard in (s for s in shards if s % n == k):
                    body = json.dumps({"key": key, "shards": [shard]})
                    self._doing = (f"the Flight server {self.locations[k]}"
                                   f"{self._server_pid(k)}: the ablation caches of row group "
                                   f"{shard} (untimed preparation before the runs)")
                    try:
                        list(client.do_action(flight.Action("prepare", body.encode()),
                                              options=opts))
                    except flight.FlightTimedOutError:
                        # The call's deadline: the server may have been busy all along (a
                        # row group whose caches take longer), so the line says what is known.
                        raise NoProgress(
                            f"{self.scenario_file}: run.progress_timeout_s: a call did not "
                            f"finish within {timeout:g} s: the flight executor was waiting "
                            f"on {self._doing} (a row group whose caches take longer needs "
                            f"a larger run.progress_timeout_s); no result written") from None
                    except flight.FlightError as exc:
                        raise UserError(f"{self.scenario_file}: executor: Flight server "
                                        f"{self.locations[k]} could not prepare the ablation "
                                        f"caches ({_short(exc)})") from None
                    tick()
            self._doing = None
            self._prepared = (key, id(caches))
        t1 = time.perf_counter()
        warm_items = self._first_per_stream(plan)
        if warm_items:
            warm = dataclasses.replace(plan, caches=None, items=warm_items, max_batches=math.inf)
            gen = self.run(warm)
            try:
                for _ in gen:
                    pass
            finally:
                gen.close()
                self._drop_pending()           # the warm-up's figures are not kept
        self._last, self._late = {}, None
        self._startup.update({"prepare_caches_s": t1 - t0, "warm_plan_s": time.perf_counter() - t1})
        # The first measured run's start count, read here (untimed), not in its first next()
        self._link_base = link.bytes_received(self.peers)

    def _first_per_stream(self, plan: Plan) -> tuple[Any, ...]:
        total = self.producer_slots()
        seen: dict[int, Any] = {}
        for s in plan.items:
            seen.setdefault(s.index % total, s)
        return tuple(seen.values())

    def stop(self) -> None:
        self._doing = None
        self._close_run()
        self._drop_pending()
        self._link_base = _UNREAD
        for c in self.clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self.clients = []
        if self.local is not None:
            self.local.stop()
            self.local = None
        self._prepared = None

    # --------------------------------------------------------------------------------- run
    def run(self, plan: Plan) -> Iterator[ShardOutput]:
        if not self.clients:
            raise RuntimeError("FlightExecutor.start() has not run")
        key = self._register(plan)
        self._drop_pending()           # a run never settled: its figures are not asked for
        self._late, self._last = None, {}
        r = self._run = _RunState(t0=time.perf_counter())
        base, self._link_base = self._link_base, _UNREAD
        # The start count read outside the clock if there is one, else now (inside it)
        r.link0 = base if base is not _UNREAD else link.bytes_received(self.peers)
        try:
            if plan.config.loader.execution == "bulk":
                done = list(self._merge(plan, key, r))   # the whole epoch before the first batch
                yield from done
            else:
                yield from self._merge(plan, key, r)
        finally:
            # Inside the trainer's last next() when the run is complete: only the streams
            # told to stop here. A complete run's threads have delivered every item (at
            # most one still reads its stream's end): they are joined with the link's
            # counters and figures in ``_settle``, after the clock. A run cut short
            # (``max_batches``: closed after the clock) or failed waits for its threads
            # now, bounded, so none still reads when the next run starts.
            self._end_streams(r, wait=not r.complete)
            if self._run is r:
                self._run = None
            self._pending = (plan, r)

    def _merge(self, plan: Plan, key: str, r: _RunState) -> Iterator[ShardOutput]:
        n_servers = len(self.clients)
        total = n_servers * self.spec.flight_streams_per_server
        by_stream: dict[int, list[int]] = {}
        for pos, s in enumerate(plan.items):
            by_stream.setdefault(s.index % total, []).append(pos)
        depth = max(1, plan.config.loader.prefetch_factor)
        ticket_threads = self._ticket_threads()
        single = self.spec.flight_streams_per_server == 1
        for j, items in sorted(by_stream.items()):
            st = _Stream(j, j % n_servers, items, queue.Queue(maxsize=depth))
            ticket = Ticket(key, plan.ablation, tuple(plan.items[p].index for p in items),
                            tuple(items), ticket_threads, process_clock=single)
            st.thread = threading.Thread(target=self._read, args=(st, ticket, plan, r),
                                         name=f"stallbench-flight-{j}", daemon=True)
            r.streams.append(st)
        for st in r.streams:
            st.thread.start()
        stream_of = {p: st for st in r.streams for p in st.items}
        for pos in range(len(plan.items)):
            st = stream_of[pos]
            while True:
                try:
                    got = st.queue.get(timeout=1.0)
                    break
                except queue.Empty:
                    if r.stop.is_set():             # aborted (the progress watchdog fired)
                        return
                    if self.local is not None:
                        self.local.check_alive()    # a dead server is an error, not a hang
            if isinstance(got, BaseException):
                raise got
            if got is _END or got.item != pos:
                where = self.locations[st.server]
                what = "ended" if got is _END else f"sent work item {got.item}"
                raise UserError(f"{self.scenario_file}: executor: Flight server {where} {what} "
                                f"while work item {pos} was due on stream {st.index}: a batch "
                                f"was lost")
            r.delivered += 1
            yield got
        r.complete = True

    def _read(self, st: _Stream, ticket: Ticket, plan: Plan, r: _RunState) -> None:
        """One stream: read batches, assemble each work item, queue it (blocking when full)."""
        flight = import_flight()
        client = self.clients[st.server]

        def put(x: Any) -> bool:
            while not r.stop.is_set():
                try:
                    st.queue.put(x, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        wire = protocol.wire_format(plan.config)
        try:
            reader = st.reader = client.do_get(flight.Ticket(ticket.encode()))
            if r.stop.is_set():
                reader.cancel()
                return
            payloads: list[Payload] = []
            want = iter(st.items)
            expect = next(want, None)
            while not r.stop.is_set():
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                tick()        # a chunk arrived: the server progresses (a slow item too)
                if st.first_chunk_s is None:
                    st.first_chunk_s = time.perf_counter() - r.t0
                meta = protocol.decode_meta(chunk.app_metadata)
                if isinstance(meta, Trailer):
                    if meta.item != expect or meta.parts != len(payloads):
                        raise UserError(f"{self.scenario_file}: executor: Flight server "
                                        f"{self.locations[st.server]} sent work item {meta.item} "
                                        f"with {len(payloads)} of {meta.parts} batches on stream "
                                        f"{st.index} while item {expect} was due")
                    t = meta.times
                    if r.link0 is not None:
                        t.wire_bytes = 0      # the link's bytes are counted by the kernel
                    out = ShardOutput(meta.item, meta.shard, payloads if meta.payload else None,
                                      meta.batches, meta.rows, t)
                    payloads = []
                    expect = next(want, None)
                    if not put(out):
                        return
                    continue
                rb = chunk.data
                payloads.append(Payload(meta["id"], meta["rows"], rb, False, rb.nbytes,
                                        rb.nbytes, format=wire))
            if not r.stop.is_set() and expect is not None:
                # A remote server can always stop (SIGTERM, a crash between batches): its
                # user's one line, not a stallbench bug's traceback.
                raise UserError(f"{self.scenario_file}: executor: Flight server "
                                f"{self.locations[st.server]} ended stream {st.index} before "
                                f"work item {expect} (it stopped or crashed between batches)")
            put(_END)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the trainer's thread
            if r.stop.is_set():
                return
            if isinstance(exc, flight.FlightError):
                exc = UserError(f"{self.scenario_file}: executor: Flight server "
                                f"{self.locations[st.server]} failed a stream: {_short(exc, 600)}")
            put(exc)

    def abort(self) -> None:
        """The trainer gave up on this run (``measure.watchdog``): cancel every stream now,
        from the trainer's thread, so the thread reading this run's items can end."""
        self._close_run()

    def _close_run(self) -> None:
        if self._run is not None:
            self._end_streams(self._run, wait=True)

    @staticmethod
    def _end_streams(r: _RunState, wait: bool) -> bool:
        """Tell a run's stream threads to stop (each reader cancelled); with ``wait``, join
        them within ``_JOIN_S`` in all. True when every thread has ended."""
        r.stop.set()
        for st in r.streams:
            if st.reader is not None:
                try:
                    st.reader.cancel()
                except Exception:  # noqa: BLE001
                    pass
        deadline = time.monotonic() + _JOIN_S
        for st in r.streams:
            if wait and st.thread is not None and st.thread.is_alive():
                st.thread.join(timeout=max(deadline - time.monotonic(), 0.0))
        return not any(st.thread is not None and st.thread.is_alive() for st in r.streams)

    def _settle(self) -> None:
        """The last run's bookkeeping, once: its threads joined, the link's counters read
        (``ss``: a process start, tens of ms; up to its 10 s timeout), its figures built.
        Not in ``run``'s ``finally``, which runs inside the trainer's last ``next()`` (before
        its ``StopIteration``), i.e. inside the measured epoch: ``measured_run`` asks for
        ``late_stage_times()`` and ``run_figures()`` after it has stopped its clock."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        plan, r = pending
        ended = self._end_streams(r, wait=True)
        link1 = self._finish(plan, r)
        # The next run's start count, if no stream of this one still reads (a thread left
        # alive past the bound could still receive: then the next run reads its own)
        self._link_base = link1 if ended else _UNREAD

    def _drop_pending(self) -> None:
        """A run whose figures will not be asked for (the warm-up, one never settled): its
        threads joined (bounded), nothing read or built."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._end_streams(pending[1], wait=True)

    def _finish(self, plan: Plan, r: _RunState) -> int | None:
        """The run's figures; returns the link's counter read at its end."""
        link1 = link.bytes_received(self.peers)
        got = (link1 - r.link0) if (link1 is not None and r.link0 is not None) else None
        pid = int(self.served[0].get("pid", -1)) if self.served else -1
        self._late = StageTimes(wire_bytes=max(got, 0), worker=pid) if got is not None else None
        firsts = [st.first_chunk_s for st in r.streams if st.first_chunk_s is not None]
        self._last = {"flight": {
            "servers": list(self.locations),
            "local_servers": not self.remote,     # a rank attached to the job's own too
            "streams": len(r.streams),
            "streams_per_server": self.spec.flight_streams_per_server,
            "server_pids": [s.get("pid") for s in self.served],
            "server_cores": [s.get("cores") for s in self.served],
            "producer_threads": self.producer_threads(),
            "compression": plan.config.loader.compression,
            "ipc_compression": (f"zstd level {plan.config.loader.compression_level}"
                                if plan.config.loader.compression == "zstd" else "none"),
            "startup": dict(self._startup),
            "first_chunk_s": min(firsts) if firsts else None,
            "link_bytes_received": got,
            "link_bytes_source": ("tcp_info bytes_received of the trainer's sockets (ss)"
                                  if got is not None else
                                  "not measured (no ss here): wire_bytes is the uncompressed "
                                  "Arrow IPC size the servers sent"),
            "work_items": r.delivered,
            "complete": r.complete,
        }}
        return link1

    # ----------------------------------------------------------------------------- figures
    def worker_pids(self) -> list[int]:
        return self.local.pids() if self.local is not None else []

    def producer_cpu_s(self, plan: Plan) -> float | None:
        if self.local is None or plan.ablation.compute_only:
            return None
        return self.local.cpu_s()

    def late_stage_times(self) -> StageTimes | None:
        """The bytes the link carried, known once the run has ended (no stage time)."""
        self._settle()
        return self._late

    def run_figures(self) -> dict[str, Any]:
        self._settle()
        return self._last

    def notes(self, transfer_notes: dict[str, str]) -> dict[str, str]:
        lc = self.config.loader
        out = {k: v for k, v in super().notes(transfer_notes).items() if k != "compression"}
        wire = protocol.wire_format(self.config)
        if wire != "arrow":
            out["batch_format"] = (f"{lc.batch_format!r} as Arrow record batches: the feature "
                                   f"columns, sequences as Arrow list arrays (values + offsets, "
                                   f"every id kept), built into the jagged batch by the trainer")
        elif lc.batch_format != "arrow":
            out["batch_format"] = (f"{lc.batch_format!r} not used: Flight streams Arrow record "
                                   f"batches (the \"arrow\" format; collate = {lc.collate!r})")
        if lc.num_workers:
            out["num_workers"] = "not used: the producers are the Flight servers"
        if lc.compression == "zstd":
            out["compression"] = (f"Arrow IPC body compression (zstd level "
                                  f"{lc.compression_level}) on the Flight stream")
        return out


def _short(exc: BaseException, n: int = 200) -> str:
    # gRPC appends the server's Python traceback ("Detail: Python exception: Traceback ...")
    # or its status and debug context ("Detail: Unavailable. gRPC client debug context: ...")
    # to the server's own message: the message says it, the rest stays on the server
    text = " ".join(str(exc).split(". Detail: ")[0].split())
    return cut(text, n)


_NOT_JSON = object()   # a ping answer that did not parse
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")


def _remote_token(config: Config, scenario_file: str) -> str | None:
    """The token for ``flight_servers`` from the variable ``flight_token_env`` names (None
    when unset); a ScenarioError naming the key, never quoting the value, otherwise."""
    name = config.executor.flight_token_env
    if name is None:
        return None
    from . import auth

    token = auth.token_from_env(name)
    if token is None:
        raise ScenarioError(scenario_file, "executor.flight_token_env",
                            f"the environment variable {name} is not set (or empty); it must "
                            f"hold the token the servers were started with")
    if not auth.valid_token(token):
        raise ScenarioError(scenario_file, "executor.flight_token_env",
                            f"the token in ${name} must be {auth.TOKEN_RULE}")
    return token


def _count(x: Any) -> bool:
    """A count a ping answer may carry: a JSON integer (not a bool), exact in a float."""
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2 ** 53


def _is_ping_answer(info: Any) -> bool:
    """A stallbench server's ping answer, checked as data before any key is used: an object
    whose protocol version ``v`` is a whole number (any: another version is a stallbench
    server of another release, said as such) and whose ``variants`` (if any) map keys to
    ``{"shards": int, "rows": int}``."""
    if not isinstance(info, dict):
        return False
    v = info.get("v")
    if not isinstance(v, int) or isinstance(v, bool):
        return False
    if not all(_count(info[k]) for k in ("pid", "cores", "pyarrow_threads") if k in info):
        return False     # recorded in the result (server_pids, server_cores): whole counts
    variants = info.get("variants", {})
    if not isinstance(variants, dict):
        return False
    for v in variants.values():
        if not isinstance(v, dict) or not all(
                isinstance(v.get(k), int) and not isinstance(v.get(k), bool) and v.get(k) >= 0
                for k in ("shards", "rows")):
            return False
    return True
