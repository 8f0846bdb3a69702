"""What one node's launcher hands node rank 0's launcher of a multi-node job: how its run ended
(``NodeRun``) and that run's files, packed for the wire between machines (``pack`` /
``unpack``), or, on a shared ``--out``, the same record as a marker beside the files
(``NodeRun.MARKER``).

Why here, in the wire: the files are the agent's part files and beats, read on node rank 0 by
``read`` and ``read_beats`` as if its own job had written them; the envelope around them is
wall data too (a JSON header), and JSON from the wall is parsed in the wire only. Standard
library only, like the rest of the wire.

Why a stream of named files and not one JSON document: node rank 0 writes each file as it
comes out of the decompressor, so its memory does not grow with a long run's per-batch lists,
and every bound (the packed bytes, the unpacked bytes, the number of files, each name's shape)
is checked before anything lands on its disk. Names are the wall's own (``part-``,
``epochs-``, ``stage-``, ``replay-``, ``beat-``, ``lost-``), one path component each: a
sender cannot write outside the folder it is given.

Format, zlib-compressed: ``MAGIC``, then a line with the header's length and the header
(``NodeRun.to_json``), then per file a line ``<name> <length>`` and its bytes; an empty line
ends it.
"""

from __future__ import annotations

import io
import json
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple   # Python 3.7

from .fields import VERSION, current, num, whole

MAGIC = b"stallbench-node-run 1\n"
# The wall's files a node sends: parts, epochs, a worker's stages, the replay's part, beats,
# lost markers; one path component, no leading dot (the writer's temporaries are ".tmp-...").
_NAME = re.compile(r"(part|epochs|stage|replay|beat|lost)-[A-Za-z0-9_.@+-]{1,240}")
MAX_PACKED_BYTES = 256 * 2**20      # what one node sends for one run, compressed
MAX_UNPACKED_BYTES = 2 * 2**30      # ... and written out on node rank 0
MAX_FILES = 100_000
MAX_ORDER_BYTES = 1 << 20       # one NodeOrder as JSON (its replay plan's counts)
_CHUNK = 1 << 20


class Refused(ValueError):
    """A packed run that breaks a rule (its shape, a name, a bound): nothing of it is kept."""


@dataclass(frozen=True)
class NodeRun:
    """How one node's run of the job ended, as its launcher saw it: which node (stallbench's
    node rank, of ``nodes``), its host, the run (``v<variant>r<repeat>``), the profile it
    belongs to (``fingerprint``: the redacted command, matrix and batch cap), the job's exit
    code there, the cores its ranks ran on, and ``why`` where it brought no figures (the line
    its launcher said: a ``--progress-timeout``, a job that died). ``nonce``: fresh for every
    run, so a marker left by an earlier profile on a shared ``--out`` is never taken for this
    one's (no clock of another machine is compared). ``stopped``: node rank 0 ended this run
    (a tune's trial, once its rate was known: ``NodeOrder.stopped``), so an exit by signal,
    or by the peers' loss, is that stop and the figures up to it count."""

    node: int
    nodes: int
    host: str
    run: str
    fingerprint: str
    exit_code: int = 0
    cores: float = 0.0
    why: str = ""
    nonce: str = ""
    stopped: str = ""

    MARKER = "node-run.json"

    def to_json(self) -> Dict[str, Any]:
        return {"v": VERSION, "node": self.node, "nodes": self.nodes, "host": self.host,
                "run": self.run, "fingerprint": self.fingerprint,
                "exit_code": self.exit_code, "cores": self.cores, "why": self.why,
                "nonce": self.nonce, "stopped": self.stopped}

    @classmethod
    def from_json(cls, d: Any) -> Optional["NodeRun"]:
        """The record; None for anything that is not one of this version."""
        if not current(d) or not isinstance(d, dict):
            return None
        return cls(node=whole(d.get("node"), -1), nodes=whole(d.get("nodes")),
                   host=str(d.get("host", ""))[:255], run=str(d.get("run", ""))[:64],
                   fingerprint=str(d.get("fingerprint", ""))[:64],
                   exit_code=whole(d.get("exit_code")), cores=num(d.get("cores")),
                   why=str(d.get("why", ""))[:2000], nonce=str(d.get("nonce", ""))[:64],
                   stopped=str(d.get("stopped", ""))[:2000])

    @classmethod
    def read(cls, folder: Any) -> Optional["NodeRun"]:
        """The marker a node left beside its files on a shared ``--out``; None when there is
        none (yet), or it is not readable as one."""
        try:
            with open(os.path.join(folder, cls.MARKER)) as fh:
                return cls.from_json(json.load(fh))
        except (OSError, ValueError):
            return None


@dataclass(frozen=True)
class NodeOrder:
    """What node rank 0's launcher asks the other nodes' launchers to run next, where it
    chooses the runs as it goes (``stallbench tune``: each trial from the ones before): the
    ``seq``-th run, named ``run`` (``t<n>``), with the ``--set`` ``overrides`` its hooks get
    and the ``replay`` plan (``ReplayPlan.to_json``; None: the job as it is), in words
    ``label``. ``stopped``: node rank 0 ended this run (its rule, said), so the node ends its
    job as well; ``done``: there is no next run, and ``why_done`` "" where the tune ended well,
    else the line node rank 0 ended with. One record both ways: the answer to every ask."""

    seq: int = 0
    run: str = ""
    overrides: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    replay: Optional[Dict[str, Any]] = None
    label: str = ""
    stopped: str = ""
    done: bool = False
    why_done: str = ""

    def to_json(self) -> Dict[str, Any]:
        return {"v": VERSION, "seq": self.seq, "run": self.run, "overrides": self.overrides,
                "replay": self.replay, "label": self.label, "stopped": self.stopped,
                "done": self.done, "why_done": self.why_done}

    @classmethod
    def from_json(cls, d: Any) -> Optional["NodeOrder"]:
        """The record; None for anything that is not one of this version (a section of
        ``overrides`` that is not a mapping is dropped: the hooks read mappings only)."""
        if not current(d) or not isinstance(d, dict):
            return None
        over = d.get("overrides") if isinstance(d.get("overrides"), dict) else {}
        replay = d.get("replay")
        return cls(seq=whole(d.get("seq")), run=str(d.get("run", ""))[:64],
                   overrides={str(k): dict(v) for k, v in over.items() if isinstance(v, dict)},
                   replay=replay if isinstance(replay, dict) else None,
                   label=str(d.get("label", ""))[:500], stopped=str(d.get("stopped", ""))[:2000],
                   done=bool(d.get("done")), why_done=str(d.get("why_done", ""))[:2000])

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json()).encode()

    @classmethod
    def from_bytes(cls, body: bytes) -> Optional["NodeOrder"]:
        """An answer's body as the record; None for anything else (bounded by the caller:
        ``MAX_ORDER_BYTES``)."""
        try:
            return cls.from_json(json.loads(body))
        except (ValueError, UnicodeError):
            return None


def wall_files(run_dir: Any) -> List[str]:
    """The names of the files of ``run_dir`` a node sends (the wall's own, sorted)."""
    try:
        return sorted(n for n in os.listdir(run_dir) if _NAME.fullmatch(n)
                      and os.path.isfile(os.path.join(run_dir, n)))
    except OSError:
        return []


def pack(rec: NodeRun, run_dir: Any, max_packed: int = MAX_PACKED_BYTES) -> bytes:
    """The run's wall files with ``rec`` in front, compressed; ``Refused`` when the packed run
    would be larger than ``max_packed`` (the receiver refuses more) or hold too many files."""
    names = wall_files(run_dir)
    if len(names) > MAX_FILES:
        raise Refused(f"{len(names)} files, more than {MAX_FILES}")
    z = zlib.compressobj(6)
    out = io.BytesIO()
    head = json.dumps(rec.to_json()).encode()
    out.write(z.compress(MAGIC + b"%d\n" % len(head) + head))
    total = 0
    for name in names:
        try:
            with open(os.path.join(run_dir, name), "rb") as fh:
                data = fh.read()
        except OSError:
            continue            # gone meanwhile (a beat rewritten): its writer's loss
        total += len(data)
        if total > MAX_UNPACKED_BYTES:
            raise Refused(f"more than {MAX_UNPACKED_BYTES >> 20} MiB of figures")
        out.write(z.compress(b"%s %d\n" % (name.encode(), len(data)) + data))
        if out.tell() > max_packed:
            raise Refused(f"more than {max_packed >> 20} MiB packed")
    out.write(z.compress(b"\n") + z.flush())
    if out.tell() > max_packed:
        raise Refused(f"more than {max_packed >> 20} MiB packed")
    return out.getvalue()


class _Inflated:
    """The decompressed bytes of a packed run, read as lines and exact lengths, never more
    than ``limit`` of them in all."""

    def __init__(self, chunks: Iterable[bytes], limit: int) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._z = zlib.decompressobj()
        self._buf = b""
        self._limit = limit
        self.total = 0

    def _more(self) -> bool:
        while True:
            if self._z.unconsumed_tail:
                raw = self._z.unconsumed_tail
            else:
                raw = next(self._chunks, b"")
                if not raw:
                    try:
                        tail = self._z.flush()
                    except zlib.error:
                        raise Refused("not a packed node run (not zlib)") from None
                    self._take(tail)
                    return bool(tail)
            try:
                got = self._z.decompress(raw, _CHUNK)
            except zlib.error:
                raise Refused("not a packed node run (not zlib)") from None
            if got:
                self._take(got)
                return True

    def _take(self, got: bytes) -> None:
        self.total += len(got)
        if self.total > self._limit:
            raise Refused(f"more than {self._limit >> 20} MiB unpacked")
        self._buf += got

    def line(self, most: int = 512) -> bytes:
        while b"\n" not in self._buf[:most + 1]:
            if len(self._buf) > most or not self._more():
                raise Refused("not a packed node run (a line is missing)")
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def exact(self, n: int) -> Iterator[bytes]:
        """``n`` bytes, in pieces as they come."""
        while n > 0:
            if not self._buf and not self._more():
                raise Refused("not a packed node run (it ends inside a file)")
            piece, self._buf = self._buf[:n], self._buf[n:]
            n -= len(piece)
            yield piece


def unpack(chunks: Iterable[bytes], into: Any, max_unpacked: int = MAX_UNPACKED_BYTES
           ) -> Tuple[NodeRun, int]:
    """Write the files of a packed run into folder ``into`` (made here, empty); its record and
    how many files. ``Refused`` for anything that breaks the format or a bound; the caller
    removes ``into`` then (what was written is not a whole run)."""
    src = _Inflated(chunks, max_unpacked)
    if src.line(64) + b"\n" != MAGIC:
        raise Refused("not a packed node run")
    try:
        size = int(src.line(16))
        rec = NodeRun.from_json(json.loads(b"".join(src.exact(size))))
    except ValueError:
        raise Refused("its header is not a node run's") from None
    if rec is None:
        raise Refused("its header is not a node run of this version")
    os.makedirs(into, exist_ok=False)
    files = 0
    while True:
        line = src.line(300)
        if not line:
            return rec, files
        try:
            name_b, size_b = line.rsplit(b" ", 1)
            name, size = name_b.decode("ascii"), int(size_b)
        except (ValueError, UnicodeDecodeError):
            raise Refused("a file's line is not <name> <length>") from None
        if not _NAME.fullmatch(name) or size < 0:
            raise Refused("a file's name is not one of the wall's")
        files += 1
        if files > MAX_FILES:
            raise Refused(f"more than {MAX_FILES} files")
        fd = os.open(os.path.join(into, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            for piece in src.exact(size):
                fh.write(piece)
