"""``stallbench profile --live [HOST:]PORT`` (issue 60): while the job runs, its figures per
rank, loader and node on an OpenMetrics / Prometheus endpoint, and in the terminal.

How: the agent in each trainer process writes a small ``wire.Live`` record at each of its
flushes (about once a second while batches come: its streams' running totals, the open
window); this side reads those records every ``POLL_S`` (``Board.update``), keeps the last
``SLIDE_S`` seconds of each series' totals for the sliding figures, and serves the latest
snapshot through ``prometheus_client`` (its text and OpenMetrics exposition, chosen by the
scraper's ``Accept`` header). Nothing is computed in the job beyond sums; nothing here is
held per batch: a series' memory is its history of at most ``SLIDE_S / POLL_S`` polls.

Who may scrape: the endpoint listens on loopback unless ``HOST`` says otherwise, and any
other address needs a bearer token (``--live-token-env NAME`` / ``--live-token-file
PATH``, the token rule of ``stallbench serve``: ``tokens``), compared in constant time on
every request (a scraper sends ``Authorization: Bearer <token>``: Prometheus's
``authorization`` block). The endpoint is bound before the job starts (a port in use is
exit 2 with nothing run) and closed when the profile ends, however it ends.

The metrics (``FAMILIES``; labels ``rank``, ``loader``, ``node``): counters
``stallbench_exposed_wait_seconds_total``, ``stallbench_step_seconds_total``,
``stallbench_steps_total``, ``stallbench_samples_total``, ``stallbench_passes_total``,
``stallbench_startup_wait_seconds_total``; gauges ``stallbench_steady_wait_share`` (the
share of the last ``SLIDE_S`` seconds the loop waited, passes' first batches left out),
``stallbench_time_to_first_batch_seconds``, ``stallbench_last_batch_timestamp_seconds``,
``stallbench_straggler_candidate`` (1 for the rank that waited most over the last
``SLIDE_S`` among a loader's ranks), ``stallbench_straggler_excess_seconds`` (its wait then
above the ranks' median, per loader) and ``stallbench_job_running``.
"""

from __future__ import annotations

import hmac
import math
import socket
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ..auth import tokens
from ..errors import UserError
from .agent import wire

POLL_S = 1.0            # how often the agent's live records are read
SLIDE_S = 60.0          # the sliding window of the steady wait share and the straggler
PATH = "/metrics"
LABELS = ("rank", "loader", "node")


@dataclass(frozen=True)
class LiveOptions:
    """``--live``: where the endpoint listens, its token (None: loopback only) and the
    windows the agent keeps (``wire.LiveSettings``)."""

    host: str
    port: int
    token: str | None = None
    settings: wire.LiveSettings = field(default_factory=wire.LiveSettings)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{PATH}"


def parse_address(text: str) -> tuple[str, int]:
    """``[HOST:]PORT`` (an IPv6 host in brackets: ``[::1]:9400``); loopback by default."""
    raw = text.strip()
    host, _, port = raw.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise UserError(f"--live {text}: an IPv6 address goes in brackets: [::1]:PORT")
    try:
        n = int(port)
    except ValueError:
        n = -1
    if not 0 <= n <= 65535 or not port.isdigit():
        raise UserError(f"--live {text}: expected [HOST:]PORT with PORT 0..65535 (0: any "
                        "free port)")
    return host or "127.0.0.1", n


def options(address: str, token_env: str | None, token_file: Path | None) -> LiveOptions:
    """``--live`` and its token, checked before anything runs: beyond loopback only with a
    token (``tokens``' rule, as ``stallbench serve``)."""
    host, port = parse_address(address)
    token = tokens.read_token(token_env, token_file, "--live-token-env", "--live-token-file")
    if token is None and not tokens.is_loopback(host):
        raise UserError(f"--live {address}: serving beyond this machine needs a token "
                        "(--live-token-env NAME or --live-token-file PATH), which every "
                        "scraper sends as Authorization: Bearer <token>; see docs/profile.md")
    return LiveOptions(host=host, port=port, token=token)


@dataclass
class Series:
    """One (rank, loader, node) as of the last poll: the sums of its processes' streams."""

    rank: str
    loader: str
    node: str
    passes: int = 0
    batches: int = 0
    rows: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0
    startup_wait_s: float = 0.0
    first_wait_s: float = math.nan
    last_batch_unix: float = 0.0
    steady_wait_share: float = math.nan     # over the last SLIDE_S
    slide_wait_s: float = 0.0               # its wait over the last SLIDE_S
    candidate: bool = False

    @property
    def labels(self) -> tuple[str, str, str]:
        return (self.rank, self.loader, self.node)


def _series(records: list[wire.Live]) -> dict[tuple[str, str, str], Series]:
    """Every stream of the records, summed per (rank, loader, node): the images of one
    process (an ``exec``) and the processes of one rank add up."""
    out: dict[tuple[str, str, str], Series] = {}
    for rec in records:
        h = rec.header
        for s in rec.streams:
            key = (str(h.rank if h.launched else 0), s.name, h.node or h.host)
            x = out.get(key)
            if x is None:
                x = out[key] = Series(*key)
            x.passes += s.passes
            x.batches += s.batches
            x.rows += s.rows
            x.wait_s += s.wait_s
            x.step_s += s.step_s
            x.startup_wait_s += s.startup_wait_s
            if s.first_wait_s is not None and math.isnan(x.first_wait_s):
                x.first_wait_s = s.first_wait_s
            x.last_batch_unix = max(x.last_batch_unix, s.last_batch_unix)
    return out


class Board:
    """The latest snapshot of every series and each one's recent history (for the sliding
    figures); ``update`` swaps in a new snapshot, ``snapshot`` reads it (the server's
    threads, the terminal view): one reference, replaced whole, never edited in place."""

    def __init__(self, slide_s: float = SLIDE_S) -> None:
        self.slide_s = slide_s
        self._snap: tuple[dict[tuple[str, str, str], Series], bool] = ({}, False)
        self._history: dict[tuple[str, str, str], deque] = {}
        self.excess: dict[str, float] = {}

    def snapshot(self) -> tuple[dict[tuple[str, str, str], Series], bool]:
        """(series by labels, whether the job runs)."""
        return self._snap

    def update(self, records: list[wire.Live], running: bool, now: float | None = None
               ) -> None:
        now = time.monotonic() if now is None else now
        got = _series(records)
        for key, s in got.items():
            h = self._history.setdefault(key, deque())
            h.append((now, s.wait_s - s.startup_wait_s, s.step_s, s.wait_s))
            while len(h) > 2 and h[1][0] <= now - self.slide_s:
                h.popleft()
            d_wait, d_step = h[-1][1] - h[0][1], h[-1][2] - h[0][2]
            s.steady_wait_share = (d_wait / (d_wait + d_step) if d_wait + d_step > 0
                                   else math.nan)
            s.slide_wait_s = h[-1][3] - h[0][3] if len(h) > 1 else s.wait_s
        self.excess = _straggler(got)
        self._snap = (got, running)


def _straggler(got: dict[tuple[str, str, str], Series]) -> dict[str, float]:
    """Per loader with two ranks or more: the rank that waited most over the sliding window
    is the candidate, its excess that wait above the ranks' median (``analysis.ranks``
    decides the result's straggler from every step; this is the live hint)."""
    by_loader: dict[str, list[Series]] = {}
    for s in got.values():
        by_loader.setdefault(s.loader, []).append(s)
    excess = {}
    for loader, ss in by_loader.items():
        if len({s.rank for s in ss}) < 2:
            continue
        top = max(ss, key=lambda s: s.slide_wait_s)
        excess[loader] = top.slide_wait_s - statistics.median(s.slide_wait_s for s in ss)
        top.candidate = excess[loader] > 0
    return excess


# name (without the counter's _total), kind, help, the Series attribute it reads
FAMILIES = (
    ("stallbench_exposed_wait_seconds", "counter",
     "Seconds the training loop waited for its next batch (the exposed stall)", "wait_s"),
    ("stallbench_step_seconds", "counter",
     "Seconds between a batch's return and the next request (the loop's own work)", "step_s"),
    ("stallbench_steps", "counter", "Batches the loop received", "batches"),
    ("stallbench_samples", "counter", "Samples in the batches received", "rows"),
    ("stallbench_passes", "counter", "Passes (epochs) begun over the loader", "passes"),
    ("stallbench_startup_wait_seconds", "counter",
     "Wait of each pass's first batch, from iter() (worker start-up)", "startup_wait_s"),
    ("stallbench_steady_wait_share", "gauge",
     f"Share of the last {SLIDE_S:g} s of wait + step the loop waited, passes' first "
     "batches left out", "steady_wait_share"),
    ("stallbench_time_to_first_batch_seconds", "gauge",
     "Wait of the first batch of the first pass", "first_wait_s"),
    ("stallbench_last_batch_timestamp_seconds", "gauge",
     "Unix time of the last batch received (as of the last flush)", "last_batch_unix"),
    ("stallbench_straggler_candidate", "gauge",
     f"1 for the rank that waited most over the last {SLIDE_S:g} s among a loader's ranks",
     "candidate"),
)


class Metrics:
    """A ``prometheus_client`` collector over the board's snapshot (built at each scrape
    from the snapshot as it stands: no state of its own)."""

    def __init__(self, board: Board) -> None:
        self.board = board

    def describe(self) -> list:
        return []           # nothing collected at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        got, running = self.board.snapshot()
        for name, kind, text, attr in FAMILIES:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            fam = cls(name, text, labels=LABELS)
            for s in sorted(got.values(), key=lambda s: s.labels):
                fam.add_metric(s.labels, float(getattr(s, attr)))
            yield fam
        ex = GaugeMetricFamily("stallbench_straggler_excess_seconds",
                               f"The candidate's wait over the last {SLIDE_S:g} s above the "
                               "median of the loader's ranks", labels=("loader",))
        for loader, v in sorted(self.board.excess.items()):
            ex.add_metric((loader,), v)
        yield ex
        yield GaugeMetricFamily("stallbench_job_running",
                                "1 while the profiled job runs, 0 once it ended",
                                value=1.0 if running else 0.0)


def _guarded(app: Callable, token: str | None) -> Callable:
    """The exposition app behind the bearer token (every request, constant time) and on
    ``PATH`` only."""
    want = f"Bearer {token}".encode() if token is not None else None

    def guarded(environ: dict, start: Callable) -> Any:
        if environ.get("PATH_INFO", "") not in (PATH, PATH + "/"):
            start("404 Not Found", [("Content-Type", "text/plain")])
            return [f"stallbench profile --live serves {PATH}\n".encode()]
        if want is not None:
            given = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
            if not hmac.compare_digest(given, want):
                start("401 Unauthorized", [("Content-Type", "text/plain"),
                                           ("WWW-Authenticate", "Bearer")])
                return [b"a bearer token is required\n"]
        return app(environ, start)
    return guarded


class Endpoint:
    """The HTTP server (``prometheus_client``'s WSGI app on the standard library's server,
    one thread per request), bound at construction, closed by ``close``."""

    def __init__(self, opts: LiveOptions, board: Board) -> None:
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
        from socketserver import ThreadingMixIn

        from prometheus_client import CollectorRegistry, make_wsgi_app

        class Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        class Server(ThreadingMixIn, WSGIServer):
            daemon_threads = True
            address_family = socket.AF_INET6 if ":" in opts.host else socket.AF_INET

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass        # a scraper that hung up: nothing to say on the job's terminal

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Metrics(board))
        try:
            self.server = Server((opts.host, opts.port), Quiet)
        except OSError as exc:
            raise UserError(f"--live {opts.host}:{opts.port}: cannot listen "
                            f"({exc.strerror or exc})") from None
        self.server.set_app(_guarded(make_wsgi_app(registry), opts.token))
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.2},
                                       name="stallbench-live", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5.0)


class Live:
    """``--live`` for one profile: the endpoint, the poller of the current run's directory,
    the terminal view; a context manager, closed however the profile ends."""

    def __init__(self, opts: LiveOptions, say: Callable[[str], None],
                 view: Any = None) -> None:
        self.opts, self.say = opts, say
        self.board = Board()
        self.view = view
        self.run_dir: Path | None = None
        self.running = False
        self.extra: Callable[[], list[wire.Live]] = lambda: []   # other nodes' records
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.endpoint: Endpoint | None = None
        self._poller: threading.Thread | None = None

    def __enter__(self) -> "Live":
        self.endpoint = Endpoint(self.opts, self.board)
        opts = self.opts
        shown = LiveOptions(opts.host, self.endpoint.port).url
        who = "bearer token required" if opts.token else "loopback, no token"
        self.say(f"live: serving metrics on {shown} ({who})")
        self._poller = threading.Thread(target=self._poll_loop, name="stallbench-live-poll",
                                        daemon=True)
        self._poller.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=5.0)
        if self.view is not None:
            self.view.close()
        if self.endpoint is not None:
            self.endpoint.close()

    def watch(self, run_dir: Path) -> None:
        """The run whose records are served from now on (the job starts next)."""
        with self._lock:
            self.run_dir, self.running = run_dir, True

    def ended(self) -> None:
        """The job ended: its final records (written by its exit's flush) read once more,
        served with ``stallbench_job_running`` 0 until the profile ends."""
        with self._lock:
            self.running = False
        self.poll()

    def poll(self) -> None:
        with self._lock:
            run_dir, running = self.run_dir, self.running
        if run_dir is None:
            return
        self.board.update(wire.read_live(run_dir) + self.extra(), running)
        if self.view is not None:
            self.view.show(self.board)

    def _poll_loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - a poll that failed is the next poll's
                pass
