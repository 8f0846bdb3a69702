"""torchrun and Slurm across machines: which node this launcher is, and how the other nodes'
figures reach node rank 0's launcher, with or without a shared ``--out`` (issue 56).

``stallbench profile -- torchrun --nnodes N --node-rank R ...`` runs once per node (``srun``
starts it on each); every node's launcher runs its own torchrun, and node rank 0's writes the
one result. ``topology`` reads torchrun's own flags (``--nnodes``, ``--node-rank`` /
``--node_rank``, ``--master-addr`` / ``--master-port``, ``--rdzv-endpoint``; also their
``PET_*`` variables, as torchrun does), and Slurm's ``SLURM_NODEID`` (checked against
``SLURM_NNODES``) where torchrun's flags leave the node rank out (``--rdzv-backend c10d``).

**Transport** (``endpoint``): node rank 0's launcher listens for the life of the profile; each
other node's launcher sends its run's files after each run, signed with the token in
``STALLBENCH_NODE_TOKEN``, and removes them once node rank 0 took them. ``endpoint``'s
docstring says why an endpoint of its own rather than the job's rendezvous store, and how it
authenticates (the token never crosses the network; loopback only without one).

**Address and port.** Node rank 0 is the host torchrun's rendezvous names: ``--rdzv-endpoint``
host, else ``--master-addr`` (torchrun's default 127.0.0.1). The port is the rendezvous port
+ 1 (``PORT_OFFSET``: ``--rdzv-endpoint``'s port, else ``--master-port``, torchrun's defaults
29400 and 29500), so two jobs with different rendezvous ports get different stallbench
ports; ``--node-port PORT`` sets it. Node rank 0 binds that host's address, or every
interface where the name is not an address of its own (a Kubernetes service name): token
required there. It binds before its first run, so torchrun never picks that port.

**A shared ``--out`` still works**, alone or beside the endpoint: a node whose figures could
not be sent leaves them with a marker (``wire.NodeRun.MARKER``) in the shared directory; node
rank 0 takes whichever comes first, once. A marker is this profile's when its nonce is not one
node rank 0 saw before its own run began; no clock of one machine is compared with another's.

**A node that never reports, or whose job died, is named** (``NodeReport.why``), never left
out of a table that looks whole: ``session`` writes the result for the nodes that reported,
names the missing node in its notes and the terminal, and exits 3 (``jobrun.PARTIAL``).
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from .. import interrupts
from ..errors import UserError
from .agent import wire
from .endpoint import (ORDER_WAIT_S, TOKEN_ENV, Address, Collector, OrderRefused, ask_order,
                       deliver, node_token)

__all__ = ["Gather", "Link", "NODE_WAIT_S", "NodeReport", "PORT_OFFSET", "TOKEN_ENV",
           "Topology", "annotate", "cores", "merge_into", "missing_lines", "nnodes",
           "node_token", "run_cores", "topology"]

PORT_OFFSET = 1             # the nodes' endpoint: the rendezvous port + 1
NODE_WAIT_S = 120.0         # how long node rank 0 waits for a node's run after its own ended
_TORCHRUN = ("torchrun", "torch.distributed.run")


# ------------------------------------------------------------------ which node this is

@dataclass(frozen=True)
class Topology:
    """The job's nodes as this launcher sees them: how many, which one it is (and where that
    came from), node rank 0's address and the nodes' endpoint port (and the rule that gave
    it)."""

    count: int = 1
    rank: int = 0
    rank_from: str = ""
    host: str = ""
    port: int = 0
    port_from: str = ""

    @property
    def merges(self) -> bool:
        """This launcher writes the result (a single node, or node rank 0 of several)."""
        return self.count == 1 or self.rank == 0

    @property
    def address(self) -> Address:
        """Where node rank 0 listens (``endpoint``)."""
        return Address(self.host, self.port, self.port_from)

    @property
    def label(self) -> str:
        """``node rank 1 of 2 (host)``: how the lines of a multi-node run name this node."""
        return f"node rank {self.rank} of {self.count} ({socket.gethostname()})"


def _flag(argv: list[str], names: tuple[str, ...]) -> str | None:
    """torchrun's own value of a flag: after the torchrun word (``python -m
    torch.distributed.run`` too), before the script and its own arguments."""
    start = next((i + 1 for i, a in enumerate(argv[:3])
                  if Path(a).name in _TORCHRUN or a in _TORCHRUN), 0)
    argv = argv[start:]
    for i, a in enumerate(argv):
        if a.endswith(".py") or a in ("-m", "--module"):
            return None                     # the script's own arguments follow
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def _given(argv: list[str], env: Mapping[str, str], flag: str) -> tuple[str | None, str]:
    """torchrun's value of ``--flag`` (either spelling), else its ``PET_FLAG`` variable."""
    names = (flag, "--" + flag[2:].replace("-", "_"))
    got = _flag(argv, tuple(dict.fromkeys(names)))
    if got is not None:
        return got, flag
    pet = "PET_" + flag[2:].replace("-", "_").upper()
    return (env[pet], pet) if env.get(pet) else (None, "")


def nnodes(argv: list[str], env: Mapping[str, str]) -> tuple[str | None, str]:
    """torchrun's ``--nnodes`` as given (a count or an elastic ``MIN:MAX``) and where it came
    from; (None, "") when not given or not a torchrun."""
    if not is_torchrun(argv):
        return None, ""
    return _given(argv, env, "--nnodes")


def is_torchrun(argv: list[str]) -> bool:
    return any(Path(a).name in _TORCHRUN or a in _TORCHRUN for a in argv[:3])


def _integer(value: str, what: str) -> int:
    lo, colon, hi = value.partition(":")
    if colon and lo == hi:
        value = lo                  # an elastic range of one size: that size
    try:
        return int(value)
    except ValueError:
        raise UserError(f"torchrun {what} must be an integer for stallbench across nodes (an "
                        f"elastic range MIN:MAX is not supported), not {value!r}") from None


def _node_rank(argv: list[str], env: Mapping[str, str], count: int) -> tuple[int, str]:
    value, source = _given(argv, env, "--node-rank")
    if value is None and env.get("SLURM_NODEID"):
        value, source = env["SLURM_NODEID"], "SLURM_NODEID"
        slurm = env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
        if slurm and slurm.isdigit() and int(slurm) != count:
            raise UserError(f"torchrun --nnodes {count} but this Slurm step spans "
                            f"{slurm} nodes (SLURM_NNODES): SLURM_NODEID cannot say which node "
                            "this is; give torchrun --node-rank, or run one srun task per node")
    if value is None:
        raise UserError(f"torchrun --nnodes {count} without --node-rank (nor "
                        "PET_NODE_RANK, nor Slurm's SLURM_NODEID): stallbench needs each "
                        "node's launcher to know whether it is node rank 0, which writes the "
                        "result; give --node-rank or run under srun (docs/profile.md)")
    rank = _integer(value, source)
    if not 0 <= rank < count:
        raise UserError(f"node rank {rank} ({source}) is outside 0..{count - 1}")
    return rank, source


def _endpoint(argv: list[str], env: Mapping[str, str]) -> tuple[str, int, str]:
    """Node rank 0's host and the rendezvous port it is reached at (torchrun's defaults)."""
    rdzv, _ = _given(argv, env, "--rdzv-endpoint")
    if rdzv:
        host, _, port = rdzv.rpartition(":") if rdzv.rsplit(":", 1)[-1].isdigit() and \
            not rdzv.endswith("]") else (rdzv, "", "29400")
        return host.strip("[]") or "127.0.0.1", _integer(port, "--rdzv-endpoint's port"), \
            "--rdzv-endpoint"
    host, _ = _given(argv, env, "--master-addr")
    port, _ = _given(argv, env, "--master-port")
    return host or "127.0.0.1", _integer(port or "29500", "--master-port"), "--master-port"


def topology(argv: list[str], env: Mapping[str, str], node_port: int | None = None
             ) -> Topology:
    """(1 node, rank 0) for anything but a torchrun of ``--nnodes`` > 1; else this node's
    rank and node rank 0's endpoint (the module docstring says by which rule)."""
    value, source = nnodes(argv, env)
    count = _integer(value, source) if value is not None else 1
    if count <= 1:
        return Topology()
    rank, rank_from = _node_rank(argv, env, count)
    host, base, where = _endpoint(argv, env)
    if node_port is not None:
        return Topology(count, rank, rank_from, host, node_port, "--node-port")
    port = base + PORT_OFFSET
    if not 0 < port < 65536:
        raise UserError(f"the nodes' port ({where} {base} + {PORT_OFFSET}) is out of "
                        "range: give --node-port")
    return Topology(count, rank, rank_from, host, port, f"{where} {base} + {PORT_OFFSET}")


def cores() -> float:
    """The cores this node's job may run on (its ranks' and their workers')."""
    return float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)


# ------------------------------------------------------------------ what a node brought

@dataclass
class NodeReport:
    """One node's share of one run, as node rank 0 merged it or not: ``folder`` holds its
    files (read with ``wire.read``); ``why`` is "" when its figures are in, else the line
    that names it; ``failed``: its job exited with an ordinary error code (the job failed:
    ``JobFailed``, as on one machine) rather than being lost."""

    node: int
    host: str = ""
    folder: Path | None = None
    via: str = ""               # "this node", "endpoint", "shared --out"
    exit_code: int = 0
    cores: float = 0.0
    why: str = ""
    failed: bool = False

    @property
    def measured(self) -> bool:
        return not self.why


def _report(rec: wire.NodeRun, folder: Path, via: str) -> NodeReport:
    """A node's run as it reported it: in, failed (an ordinary exit code) or lost (a signal,
    no figures, or a line of its own launcher). A run node rank 0 stopped (a tune's trial)
    ended by that stop, whatever its code (the stop's signal, or its collective losing the
    peers node rank 0 stopped first): its figures up to it count."""
    r = NodeReport(node=rec.node, host=rec.host, folder=folder, via=via,
                   exit_code=rec.exit_code, cores=rec.cores)
    code = rec.exit_code
    if rec.why:
        r.why = f"no figures: {rec.why}"
    elif rec.stopped:
        r.exit_code = 0
        if not wire.read(folder).trainers:
            r.why = "no figures: its processes ended without writing"
    elif code >= 128:
        r.why = (f"left out: its job was ended by signal {code - 128} (exit {code}) in the "
                 "middle of the run, so its figures are not whole")
    elif code != 0:
        r.why, r.failed = f"its job exited with code {code}", True
    elif not wire.read(folder).trainers:
        r.why = "no figures: its processes ended without writing"
    return r


# ------------------------------------------------------------------ node rank 0: gathering

@dataclass
class Gather:
    """What node rank 0 waits for after its own run: every other node's share of it."""

    collector: Collector
    root: Path
    wait_s: float = NODE_WAIT_S
    stale: dict[int, str] = field(default_factory=dict)

    def before(self, run: str) -> None:
        """At the run's start: the markers already on a shared ``--out`` (an earlier
        profile's), so that only one written for this run is taken."""
        self.stale = {}
        for k in range(1, self.collector.nodes):
            rec = wire.NodeRun.read(self.root / run / f"node{k}")
            if rec is not None:
                self.stale[k] = rec.nonce

    def after(self, run: str, say: Callable[[str], None]) -> list[NodeReport]:
        """Each other node's report of ``run``: what it brought, or why it is missing, within
        ``wait_s`` from now."""
        count = self.collector.nodes
        deadline = time.monotonic() + self.wait_s
        out = []
        for k in range(1, count):
            got = self._one(run, k, deadline)
            if got is None:
                got = NodeReport(node=k, why=self._never(k))
            out.append(got)
        said = [r for r in out if r.measured]
        if said:
            how = sorted({r.via for r in said})
            say(f"merged the figures of {len(said) + 1} of {count} nodes "
                f"(via {', '.join(how)})")
        return out

    def _one(self, run: str, k: int, deadline: float) -> NodeReport | None:
        shared = self.root / run / f"node{k}"
        while True:
            got = self.collector.got(run, k)
            if got is not None:
                return _report(*got, "endpoint")
            rec = wire.NodeRun.read(shared)
            if rec is not None and rec.nonce != self.stale.get(k) and rec.run == run and \
                    rec.fingerprint == self.collector.fingerprint:
                return _report(rec, shared, "shared --out")
            if time.monotonic() > deadline:
                return None
            interrupts.check()
            time.sleep(0.2)

    def _never(self, k: int) -> str:
        at = self.collector.address
        refused = self.collector.refusals(k)
        if refused:
            return f"no figures: {refused[-1]}"
        how = (f"its launcher is gone, or cannot reach {at.host}:{at.port}, and no shared "
               "--out holds its run" if self.collector.listening else
               "and node rank 0 is not listening (no token, or its port was taken), so they "
               "could only come through one shared --out")
        return f"no figures: never reported within {self.wait_s:g} s ({how})"


# ------------------------------------------------------------------ one profile's link

class Link:
    """What a profile does around each run for its nodes (a context manager: whatever it
    opened is closed however the profile ends). One node: nothing. Node rank 0: listens
    (``Collector``) and, after each run, gathers the other nodes' (``Gather``). Another node:
    after each run, sends its files (``deliver``) and removes them once node rank 0 took
    them, else leaves them with a marker for a shared ``--out``."""

    def __init__(self, topo: Topology, fingerprint: str, root: Path, wait_s: float,
                 say: Callable[[str], None]) -> None:
        self.topo, self.fingerprint, self.root, self.say = topo, fingerprint, root, say
        self.token = node_token() if topo.count > 1 else None
        self.gather: Gather | None = None
        self.kept: list[tuple[Path, str]] = []       # node k: runs left in --out, and why
        self.sent = 0
        self.wait_s = wait_s
        self.live: Any = None       # --live's ``live.Live`` (issue 60), set by the profile
        self.ended = ""             # another node following orders: why it stopped early
        self._done: wire.NodeOrder | None = None     # node rank 0's "done", once heard

    def __enter__(self) -> "Link":
        if self.topo.count > 1 and self.topo.rank == 0:
            c = Collector(self.topo.address, self.topo.count, self.token, self.fingerprint,
                          self.root, self.say)
            self.gather = Gather(c.__enter__(), self.root, self.wait_s)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.gather is not None:
            self.gather.collector.__exit__(*exc)
        elif self.topo.count > 1:
            # however this node's profile ended (Ctrl-C, SIGTERM, an error): its own runs'
            # folders go, but those it left on purpose for a shared --out (node rank 0 owns
            # the rest of a shared scratch folder)
            kept = {folder for folder, _ in self.kept}
            with interrupts.deferred():
                for folder in self.root.glob(f"*/node{self.topo.rank}"):
                    if folder not in kept:
                        shutil.rmtree(folder, ignore_errors=True)
                _prune(self.root)

    @property
    def multi(self) -> bool:
        return self.topo.count > 1

    def node_dir(self, run_dir: Path) -> Path:
        return run_dir / f"node{self.topo.rank}" if self.multi else run_dir

    def before(self, run_dir: Path) -> None:
        if self.gather is not None:
            self.gather.before(run_dir.name)

    def after(self, run_dir: Path, code: int, why: str = "", stopped: str = ""
              ) -> list[NodeReport]:
        """Node rank 0: the other nodes' reports of this run; another node: its run sent
        (or left), and [] (``stopped``: node rank 0 ended it, ``wire.NodeRun.stopped``)."""
        if self.gather is not None:
            return self.gather.after(run_dir.name, self.say)
        if self.multi:
            self._send(run_dir, code, why, stopped)
        return []

    # ---- orders: runs node rank 0 chooses as it goes, the others follow (``orders``;
    # "done" is said as node rank 0's endpoint closes, ``Collector``)

    def order(self, run_dir: Path, overrides: dict[str, dict[str, Any]],
              replay: dict[str, Any] | None, label: str) -> None:
        """Node rank 0, before its own run: every other node is to run it too (``replay``:
        the plan as the order carries it, ``orders``)."""
        if self.gather is not None:
            self.gather.collector.publish(run_dir.name, overrides, replay, label)

    def stopping(self, run_dir: Path, why: str) -> None:
        """Node rank 0 ends its run (``why``): the other nodes end theirs."""
        if self.gather is not None:
            self.gather.collector.stop(run_dir.name, why)

    def late(self) -> list[int]:
        """Node rank 0: the nodes that have not taken the current run ``wait_s`` after it
        was handed out (its rendezvous would wait for them)."""
        return self.gather.collector.late(self.wait_s) if self.gather is not None else []

    def follow(self) -> Iterator[wire.NodeOrder]:
        """Another node: each run node rank 0 publishes, in order, until it says done or is
        gone (no answer for ``wait_s``, or it refused this node: ``ended`` says which)."""
        seen, lost_since = 0, None
        while True:
            if self._done is not None:      # heard while its last run was ended
                self.ended = self._done.why_done
                return
            try:
                got = ask_order(self.topo.address, self.token, self.fingerprint,
                                self.topo.rank, seen, ORDER_WAIT_S)
            except OrderRefused as exc:
                self.ended = str(exc)
                return
            if isinstance(got, str):
                lost_since = lost_since if lost_since is not None else time.monotonic()
                if time.monotonic() - lost_since > self.wait_s:
                    self.ended = (f"no order from node rank 0 for {self.wait_s:g} s: {got}")
                    return
                interrupts.check()
                time.sleep(1.0)
                continue
            lost_since = None
            if got.done:
                self.ended = got.why_done
                return
            if got.seq != seen:
                seen = got.seq
                yield got

    def stop_rule(self, order: wire.NodeOrder) -> Callable[[Path], str]:
        """``run_once``'s ``stop`` for a run node rank 0 ordered: its answer once node rank 0
        stopped that run (or moved past it); "" while it runs, or cannot be asked (the job
        then ends as its peers do)."""
        def stop(_: Path) -> str:
            return self.stopped_by_leader(order)
        return stop

    def stopped_by_leader(self, order: wire.NodeOrder) -> str:
        try:
            got = ask_order(self.topo.address, self.token, self.fingerprint, self.topo.rank,
                            order.seq, 0.0)
        except OrderRefused:
            return ""
        if isinstance(got, str):        # gone: as it said it would be, or not
            return (self._done.why_done or "node rank 0 ended") if self._done else ""
        if got.done:
            self._done = got
        if got.seq == order.seq:
            return got.stopped or (got.why_done if got.done else "")
        return f"node rank 0 moved on to its run {got.run}"

    def _send(self, run_dir: Path, code: int, why: str, stopped: str = "") -> None:
        folder = self.node_dir(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        rec = wire.NodeRun(node=self.topo.rank, nodes=self.topo.count,
                           host=socket.gethostname(), run=run_dir.name,
                           fingerprint=self.fingerprint, exit_code=code, cores=cores(),
                           why=why, nonce=uuid.uuid4().hex, stopped=stopped)
        failed = deliver(self.topo.address, self.token, rec, folder)
        if not failed:
            self.sent += 1
            shutil.rmtree(folder, ignore_errors=True)
            return
        by_design = failed.startswith(f"no ${TOKEN_ENV}")   # a shared --out is the channel
        if (code != 0 or why) and not by_design:
            # a run that is never merged (its job failed or was stopped) and node rank 0 not
            # there to be told: nothing of it is left behind
            shutil.rmtree(folder, ignore_errors=True)
            self.say(f"{self.topo.label}: {failed}; its run {run_dir.name} (exit {code}) is "
                     "not kept")
            return
        if code != 0 or why:        # the marker alone tells node rank 0 how it ended
            for name in wire.nodes.wall_files(folder):
                (folder / name).unlink(missing_ok=True)
        from ..results import write_atomic
        write_atomic(folder / wire.NodeRun.MARKER, _dumps(rec))
        self.kept.append((folder, failed))
        self.say(f"{self.topo.label}: {failed}; its figures of {run_dir.name} stay in "
                 f"{folder} for node rank 0 to read from one shared --out")

    def own(self, node_dir: Path, code: int) -> NodeReport:
        """Node rank 0's own share of the run."""
        return NodeReport(node=0, host=socket.gethostname(), folder=node_dir, via="this node",
                          exit_code=code, cores=cores())

    def left(self) -> tuple[str, int]:
        """Another node's last line and exit code: 0 when every run reached node rank 0, or
        went to a shared ``--out`` on purpose (no token beyond loopback); else 3: this node's
        figures are not in node rank 0's result unless that ``--out`` is shared."""
        head = self.topo.label
        if self.ended:
            return f"{head}: {self.ended}", 3
        if not self.kept:
            return (f"{head}: its figures went to node rank 0 at {self.topo.host}:"
                    f"{self.topo.port}; the result is written there", 0)
        folder, why = self.kept[-1]
        quiet = why.startswith(f"no ${TOKEN_ENV}")
        return (f"{head}: its figures are in {folder.parent.parent} for node rank 0 to merge "
                f"from one shared --out ({why}); the result is written there",
                0 if quiet else 3)


def _dumps(rec: wire.NodeRun) -> str:
    import json
    return json.dumps(rec.to_json())


def _prune(root: Path) -> None:
    """Another node at the end: the empty folders of its runs (sent, then removed) and the
    scratch folder itself where nothing else is in it (a shared ``--out``'s is node rank
    0's to remove)."""
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        try:
            d.rmdir()
        except OSError:
            pass
    try:
        root.rmdir()
    except OSError:
        pass


def merge_into(run: Any, reports: list[NodeReport]) -> None:
    """Node rank 0's ``JobRun`` with the figures of every node that brought them (read with
    the wire's readers), the node each process's figures came from (``Parts.cache``'s
    ``node_of``: ``merge.streams`` gives each stream its node), and every node's report,
    those that brought nothing included (``run.nodes``)."""
    node_of: dict[tuple[str, int], int] = {}
    parts, beats = wire.Parts(), []
    for r in reports:
        if r.node == 0:
            got, b = run.parts, list(run.beats)
        elif r.measured and r.folder is not None:
            got, b = wire.read(r.folder), wire.read_beats(r.folder)
        else:
            continue
        node_of.update({(p.header.host, p.header.pid): r.node for p in got.trainers})
        parts, beats = parts + got, beats + b
    parts.cache["node_of"] = node_of
    run.parts, run.beats, run.nodes = parts, beats, list(reports)


# ------------------------------------------------------------------ the result's node column

def run_cores(run: Any) -> float | None:
    """The cores a multi-node run's measured ranks had: the sum over the nodes that brought
    figures (each node's own); None on one machine (the machine's, as before)."""
    got = [r.cores for r in run.nodes if r.measured and r.cores > 0]
    return float(sum(got)) if got else None


def annotate(vr: Any, runs: list[Any], per_run: list[list[Any]], headline: str | None) -> None:
    """A multi-node variant's nodes: one ``ProfileNode`` row per node (a node that brought
    nothing named, with why), its notes, and the ranks' verdict naming the straggler's node
    and any rank that is not in the figures. Every figure used is a duration measured on its
    own node."""
    from ..results import ProfileNode
    from ..analysis.stats import finite_median
    count = max(len(r.nodes) for r in runs)
    where: dict[int, tuple[int | None, str]] = {}
    rows = []
    for k in range(count):
        reps = [next((n for n in r.nodes if n.node == k), None) for r in runs]
        waits, ranks, host = [], set(), ""
        for streams in per_run:
            mine = [s for s in streams if s.name == headline and s.node_rank == k]
            for s in mine:
                where.setdefault(s.rank, (k, s.host))
                ranks.add(s.rank)
                host = host or s.host
            if mine:
                waits.append(max(sum(s.wait) for s in mine))
        said = [n for n in reps if n is not None]
        row = ProfileNode(node=k, host=host or next((n.host for n in said if n.host), ""),
                          ranks=sorted(ranks), runs=sum(1 for n in said if n.measured),
                          of_runs=len(runs), via=next((n.via for n in reversed(said)
                                                       if n.measured), ""),
                          wait_s=finite_median(waits) if waits else math.nan,
                          exit_code=next((n.exit_code for n in reversed(said)
                                          if n.exit_code), 0),
                          cores=max((n.cores for n in said), default=0.0))
        gone = [n for n in said if not n.measured]
        if gone:
            row.missing = gone[-1].why
            vr.notes[f"node {k}"] = (f"{gone[-1].why} (in {len(gone)} of {len(runs)} runs; "
                                     "its ranks are not in the figures)")
        rows.append(row)
    if vr.profile is not None:
        vr.profile.nodes = rows
    _name_nodes(vr, runs, where, rows)


def _name_nodes(vr: Any, runs: list[Any], where: dict[int, tuple[int | None, str]],
                rows: list[Any]) -> None:
    """The straggler's node in the verdict, and the ranks the figures lack (a node missing)
    said in it, never a table that looks whole (each rank's node is its streams', ``merge``)."""
    if vr.ranks is None:
        return
    s = vr.ranks
    if s.straggler is not None and s.straggler in where:
        node, host = where[s.straggler]
        s.verdict = s.verdict.replace(f"rank {s.straggler} is the straggler",
                                      f"rank {s.straggler} (node rank {node}, {host}) is the "
                                      "straggler", 1)
        s.verdict += _whole_node(s, where, node)
    world = max((p.header.world_size for r in runs for p in r.parts.trainers), default=0)
    missing = [r for r in rows if r.missing]
    if missing and world > len(s.ranks):
        names = "; ".join(f"node rank {r.node}: {r.missing}" for r in missing)
        s.verdict += (f" (among the {len(s.ranks)} ranks measured of the job's {world}: "
                      f"{names})")


def _whole_node(s: Any, where: dict[int, tuple[int | None, str]], node: int | None) -> str:
    """Where every rank of the straggler's node waited longer than every rank elsewhere, the
    node's data path is what is slow, not one rank's: said, since the per-rank gain then
    understates it (the straggler's node-mates keep the job waiting). Each wait is measured
    on its own rank's clock."""
    mine = [r.wait_s for r in s.ranks if where.get(r.rank, (None,))[0] == node]
    rest = [r.wait_s for r in s.ranks if where.get(r.rank, (None,))[0] not in (node, None)]
    if len(mine) < 2 or not rest or not min(mine) > max(rest):
        return ""
    ranks = ", ".join(str(r.rank) for r in s.ranks if where.get(r.rank, (None,))[0] == node)
    return (f"; every rank of node rank {node} ({ranks}) waited at least {min(mine):.2f} s "
            f"for its batches, every other node's at most {max(rest):.2f} s: the node's data "
            "path is the slow one, and keeping one of its ranks at pace alone gains little")


def missing_lines(result: Any) -> list[str]:
    """``variant: node rank k (host): why`` for each node a result lacks (``jobrun``'s exit 3)."""
    return [f"{v.name}: node rank {n.node}{f' ({n.host})' if n.host else ''}: {n.missing}"
            for v in result.variants if v.profile is not None
            for n in v.profile.nodes if n.missing]
