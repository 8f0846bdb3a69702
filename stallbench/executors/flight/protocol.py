"""What trainer and Flight servers say to each other: JSON tickets, actions and batch metadata.

Nothing on the socket is pickled: a server may listen on a network (``stallbench serve``), so
everything it reads from the socket is JSON it validates, and it serves only the variants of
the scenario it loaded (or, for servers stallbench starts itself, the plans their parent
handed them over a pipe).

*Which variant.* A ticket names the variant by ``config_key``: a hash of the keys that decide
what a server produces (the dataset, the storage emulation, the preprocessing, and the loader
keys that shape a batch on the wire). Keys that only the trainer uses (the model, how many
batches the trainer takes, its thread budget, the executor's own keys) are left out, so a
server started with the same scenario serves every variant of it, also under
``stallbench run --max-batches``.

*A stream.* ``do_get`` with a ticket ``{"key", "ablation", "shards", "items", "threads",
"process_clock"}`` streams, for each listed shard in order, its batches as Arrow record
batches (``app_metadata``: ``{"item", "part", "rows", "id"}``), then a trailer: a record batch
of 0 rows whose metadata holds the item's stage times (``"end": true``). A shard's times
include sending its batches, so they arrive after them. An item whose transfer is ablated
sends only its trailer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from ...pipeline import Ablation, StageTimes
from ...stages.batch_format import SequenceCounts, arrow_wire
from ...scenario import Config

# 2: a stream's record batches are the lossless ``arrow_jagged`` wire when the loader's format
# keeps every id (the default), and the variant key names the wire format
VERSION = 2
SCHEMES = ("grpc", "grpc+tcp")
# Loader keys that change what a server sends (the rest are the trainer's business).
_WIRE_KEYS = ("batch_size", "collate", "compression", "compression_level", "wire_bandwidth_mb_s")


class ProtocolError(ValueError):
    """A message that does not follow the protocol (the server answers it with an error)."""


def config_key(cfg: Config) -> str:
    """The variant a server must serve for this config (see the module docstring)."""
    d = cfg.to_dict()
    blob = {"dataset": d["dataset"], "storage": d["storage"], "preprocess": d["preprocess"],
            "loader": {k: d["loader"][k] for k in _WIRE_KEYS},
            "wire_format": wire_format(cfg)}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:20]


def wire_format(cfg: Config) -> str:
    """What a stream's record batches are (``batch_format.arrow_wire``): ``arrow``, padded
    at ``dataset.sequence_max_len``, when the loader's format pads (the user chose a padded
    format, and its cut ids are counted as the local executor counts them); otherwise
    ``arrow_jagged``: the feature columns, sequences as Arrow list arrays, every id kept."""
    return arrow_wire(cfg.loader.batch_format)


def server_config(cfg: Config) -> Config:
    """What a server's own plan runs with: batches in the wire format (``wire_format``),
    uncompressed by stallbench (Arrow IPC compresses on the wire instead)."""
    return cfg.replace(loader=dataclasses.replace(cfg.loader, batch_format=wire_format(cfg),
                                                  compression="none"))


def parse_location(uri: str) -> tuple[str, int]:
    """(host, port) of ``grpc://host:port``; ValueError with the reason otherwise."""
    u = urlparse(uri)
    if u.scheme not in SCHEMES:
        raise ValueError(f"expected grpc://host:port, got {uri!r}")
    try:
        port = u.port
    except ValueError:
        port = None
    if not u.hostname or port is None or u.path not in ("", "/"):
        raise ValueError(f"expected grpc://host:port, got {uri!r}")
    return u.hostname, port


# ------------------------------------------------------------------------------- tickets

@dataclass(frozen=True)
class Ticket:
    key: str
    ablation: Ablation
    shards: tuple[int, ...]          # dataset shard indices, in the order to send them
    items: tuple[int, ...]           # the trainer's position of each (its work list)
    threads: int | None = None       # thread budget (None: the server's own default; 0: none)
    process_clock: bool = True       # the server runs this stream alone: its process clock
                                     # is the stage's CPU (else the thread's clock)

    def encode(self) -> bytes:
        return json.dumps({"v": VERSION, "key": self.key,
                           "ablation": [self.ablation.fetch, self.ablation.preprocess,
                                        self.ablation.transfer],
                           "shards": list(self.shards), "items": list(self.items),
                           "threads": self.threads,
                           "process_clock": self.process_clock}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Ticket":
        d = json_object(raw, "ticket")
        try:
            if d["v"] != VERSION:
                raise ProtocolError(f"ticket version {d['v']!r}, this server speaks {VERSION}")
            ab = d["ablation"]
            shards, items = d["shards"], d["items"]
            threads = d["threads"]
            ok = (isinstance(d["key"], str) and isinstance(ab, list) and len(ab) == 3
                  and all(isinstance(x, bool) for x in ab) and non_negative_ints(shards) and non_negative_ints(items)
                  and len(shards) == len(items) and isinstance(d["process_clock"], bool)
                  and (threads is None or (non_negative_ints([threads]) and 0 <= threads <= 1024)))
        except KeyError as exc:
            raise ProtocolError(f"ticket lacks {exc.args[0]!r}") from None
        if not ok:
            raise ProtocolError("ticket has a value of the wrong type")
        return cls(d["key"], Ablation(*ab), tuple(shards), tuple(items), threads,
                   d["process_clock"])


def non_negative_ints(xs: Any) -> bool:
    return isinstance(xs, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                        and x >= 0 for x in xs)


def json_object(raw: bytes | None, what: str) -> dict[str, Any]:
    try:
        d = json.loads(bytes(raw or b"").decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError(f"{what} is not JSON") from None
    if not isinstance(d, dict):
        raise ProtocolError(f"{what} is not a JSON object")
    return d


# ------------------------------------------------------------------------ batch metadata

_TIMES = {f.name for f in dataclasses.fields(StageTimes)}
_SEQUENCES = {f.name for f in dataclasses.fields(SequenceCounts)}


@dataclass
class Trailer:
    """The end of one work item on a stream: its stage times and counts."""

    item: int
    shard: int
    parts: int
    batches: int
    rows: int
    payload: bool
    times: StageTimes = field(default_factory=StageTimes)

    def encode(self) -> bytes:
        return json.dumps({"end": True, "item": self.item, "shard": self.shard,
                           "parts": self.parts, "batches": self.batches, "rows": self.rows,
                           "payload": self.payload,
                           "times": dataclasses.asdict(self.times)}).encode()


def batch_meta(item: int, part: int, rows: int, batch_id: str) -> bytes:
    return json.dumps({"item": item, "part": part, "rows": rows, "id": batch_id}).encode()


def decode_meta(raw: Any) -> dict[str, Any] | Trailer:
    """A batch's metadata dict, or the item's ``Trailer``."""
    d = json_object(raw.to_pybytes() if hasattr(raw, "to_pybytes") else raw, "batch metadata")
    try:
        if d.get("end"):
            t = d["times"]
            if not isinstance(t, dict) or set(t) - _TIMES:
                raise ProtocolError("trailer times have unknown keys")
            seqs = t.get("sequences")
            if seqs is not None:       # the one nested record: sequences a padded format cut
                if not isinstance(seqs, dict) or set(seqs) - _SEQUENCES:
                    raise ProtocolError("trailer sequence counts have unknown keys")
                t = {**t, "sequences": SequenceCounts(**seqs)}
            return Trailer(int(d["item"]), int(d["shard"]), int(d["parts"]), int(d["batches"]),
                           int(d["rows"]), bool(d["payload"]), StageTimes(**t))
        return {"item": int(d["item"]), "part": int(d["part"]), "rows": int(d["rows"]),
                "id": str(d["id"])}
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"batch metadata is malformed ({exc})") from None
