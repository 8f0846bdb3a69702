"""The wire codec of Ray's stallbench mode: a ``ShardOutput`` <-> rows of one Arrow block.

*What is a block.* One input block is one work item (a Parquet row group of the plan, so
epochs are items too); the map task turns it into one output block with **one row per trainer
batch**: ``item, shard, part, parts, batches, rows, kind, batch_id, raw, wire``, the encoded
batch as ``large_binary`` ``payload`` and, on part 0, the producer's stage times as ``meta``.
A payload is the batch format's contiguous buffer as raw bytes (``KIND_BUFFER``), a zstd frame
(``KIND_COMPRESSED``) or a pickle of anything else (``KIND_PICKLED``); the column is built
from one contiguous buffer (one copy), and the trainer reads each batch straight out of the
object store as a tensor view (no copy on the same node).

*Order and exactly-once.* Rows are numbered ``(item, part)``; the trainer side accepts each
exactly once and in order (``Sequencer``): a duplicate (a replayed task) is dropped and
counted, a gap is an error.
"""

from __future__ import annotations

import pickle
import warnings
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import torch

from ...pipeline import ShardOutput, StageTimes
from ...stages.transfer import Payload, as_numpy

KIND_BUFFER, KIND_COMPRESSED, KIND_PICKLED, KIND_NONE = 0, 1, 2, 3
_COLUMNS = ("item", "shard", "part", "parts", "batches", "rows", "kind", "batch_id", "raw", "wire")


# ============================================================================ producer side

def _chunk(p: Payload, contiguous_buffer: bool) -> tuple[int, memoryview]:
    """(kind, bytes) of one payload. ``contiguous_buffer``: the batch format's payload is one
    flat uint8 buffer (``BatchFormat.contiguous_buffer``), sent as its raw bytes."""
    if p.compressed:
        return KIND_COMPRESSED, memoryview(p.data).cast("B")
    if contiguous_buffer:
        return KIND_BUFFER, memoryview(p.data.numpy())
    return KIND_PICKLED, memoryview(pickle.dumps(as_numpy(p.data), protocol=pickle.HIGHEST_PROTOCOL))


def encode(out: ShardOutput, node: str, contiguous_buffer: bool) -> pa.Table:
    """A shard's output as one Arrow table, one row per batch (see the module docstring)."""
    meta = pickle.dumps((out.times, node), protocol=pickle.HIGHEST_PROTOCOL)
    if out.payloads is None:
        n, kinds, ids, rows, raw, wire = 1, [KIND_NONE], [""], [out.rows], [0], [0]
        chunks: list[Any] = [b""]
    else:
        n = len(out.payloads)
        kinds, ids, rows, raw, wire, chunks = [], [], [], [], [], []
        for p in out.payloads:
            kind, chunk = _chunk(p, contiguous_buffer)
            kinds.append(kind)
            chunks.append(chunk)
            ids.append(p.batch_id)
            rows.append(p.rows)
            raw.append(p.raw_bytes)
            wire.append(p.wire_bytes)
    sizes = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
    offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    for c, lo, hi in zip(chunks, offsets[:-1], offsets[1:]):
        if hi > lo:
            data[lo:hi] = np.frombuffer(c, dtype=np.uint8)
    payload = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(chunks), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return pa.table({
        "item": pa.array([out.item] * n, pa.int64()),
        "shard": pa.array([out.shard] * n, pa.int64()),
        "part": pa.array(range(n), pa.int32()),
        "parts": pa.array([n] * n, pa.int32()),
        "batches": pa.array([out.batches] * n, pa.int32()),
        "rows": pa.array(rows, pa.int64()),
        "kind": pa.array(kinds, pa.int8()),
        "batch_id": pa.array(ids, pa.string()),
        "raw": pa.array(raw, pa.int64()),
        "wire": pa.array(wire, pa.int64()),
        "payload": payload,
        "meta": pa.array([meta] + [b""] * (n - 1), pa.binary()),
    })


# ============================================================================= trainer side

class Sequencer:
    """Every (item, part) exactly once and in order; duplicates (a replayed task) dropped."""

    def __init__(self, n_items: int) -> None:
        self.n_items = n_items
        self.item = 0
        self.part = 0
        self.duplicates = 0

    def accept(self, item: int, part: int, parts: int) -> bool:
        if (item, part) < (self.item, self.part):
            self.duplicates += 1
            return False
        if (item, part) != (self.item, self.part):
            raise RuntimeError(f"Ray delivered batch {part} of work item {item} while batch "
                               f"{self.part} of item {self.item} was due: a batch was lost")
        self.part += 1
        if self.part >= parts:
            self.item += 1
            self.part = 0
        return True

    @property
    def complete(self) -> bool:
        return self.item >= self.n_items


def payload_views(col: pa.ChunkedArray) -> list[tuple[pa.Buffer | None, int, int]]:
    """(data buffer, start, end) of every value of a large_binary column, without copies."""
    out = []
    for chunk in col.chunks:
        bufs = chunk.buffers()
        offs = np.frombuffer(bufs[1], dtype=np.int64)[chunk.offset:chunk.offset + len(chunk) + 1]
        data = bufs[2]
        for lo, hi in zip(offs[:-1], offs[1:]):
            out.append((data, int(lo), int(hi)))
    return out


def tensor_view(data: pa.Buffer, lo: int, hi: int) -> torch.Tensor:
    if hi <= lo:
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        # The object store's memory is read-only; the trainer only reads batches.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.frombuffer(data, dtype=np.uint8, count=hi - lo, offset=lo))


def decode(block: pa.Table, seq: Sequencer) -> Iterator[tuple[ShardOutput, str | None]]:
    """The ``ShardOutput``s of one block (its rows of one item joined), each with the
    producer's node. Rows ``seq`` has already seen are dropped. A shard whose output Ray split
    over two blocks arrives as two ShardOutputs of the same item, the second without stage
    times and with node None (only part 0 carries them): the trainer needs no more."""
    cols = {name: block.column(name).to_pylist() for name in _COLUMNS}
    metas = block.column("meta").to_pylist()
    views = payload_views(block.column("payload"))
    current: ShardOutput | None = None
    node: str | None = None
    for k in range(block.num_rows):
        item, part, parts = cols["item"][k], cols["part"][k], cols["parts"][k]
        if not seq.accept(item, part, parts):
            continue
        times, row_node = StageTimes(), None
        if metas[k]:
            times, row_node = pickle.loads(metas[k])
        kind = cols["kind"][k]
        rows = cols["rows"][k]
        payloads = None
        if kind != KIND_NONE:
            data_buf, lo, hi = views[k]
            if kind == KIND_BUFFER:
                data: Any = tensor_view(data_buf, lo, hi)
            elif kind == KIND_COMPRESSED:
                data = memoryview(data_buf)[lo:hi]
            else:
                data = pickle.loads(memoryview(data_buf)[lo:hi])
            payloads = [Payload(cols["batch_id"][k], rows, data, kind == KIND_COMPRESSED,
                                cols["wire"][k], cols["raw"][k])]
        if current is not None and current.item == item:
            current.payloads = (current.payloads or []) + (payloads or [])
            current.rows += rows
            continue
        if current is not None:
            yield current, node
        current, node = ShardOutput(item, cols["shard"][k], payloads, cols["batches"][k], rows,
                                    times), row_node
    if current is not None:
        yield current, node
