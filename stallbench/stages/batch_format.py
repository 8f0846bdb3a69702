"""Batch formats: how a preprocessed Arrow table becomes what the trainer's model eats.

Whatever the format, the trainer ends with a ``TensorBatch``: ``dense`` float32 (B, D),
``sparse`` int64 (B, S), ``label`` float32 (B,) and the id sequences either *padded*, ``seq``
int64 (B, Q, L) with -1 after each sequence's end (L = ``dataset.sequence_max_len``: a longer
sequence loses its tail, and results say how many did), or *jagged* (``jagged`` format):
``seq_values`` int64 (N,), every id of every sequence, feature-major, and ``seq_offsets`` int64
(Q*B + 1,), where sequence ``j`` of row ``i`` is ``seq_values[seq_offsets[j*B+i] :
seq_offsets[j*B+i+1]]``: TorchRec's ``KeyedJaggedTensor`` layout (values + offsets, keys
outermost), which ``nn.EmbeddingBag(input, offsets)`` consumes with no padding at all. Formats
differ only in where the work happens and what crosses the process boundary, which is exactly
what the field's optimisations change:

- ``rows``: per-row dicts, ``torch.utils.data.default_collate`` (the naive PyTorch baseline);
- ``columnar``: numpy columns -> tensors (zero-copy ``from_numpy``);
- ``single_buffer``: every tensor of a batch packed into one contiguous buffer with a small
  header (Pinterest/Yelp's trick), unpacked by the trainer as zero-copy views;
- ``jagged``: a single buffer whose sequences are values + offsets instead of padded: no
  padding to write in the producer, fewer bytes on every copy, and no id ever cut;
- ``arrow``: one Arrow record batch (what the Flight executor streams; Arrow's IPC moves it
  between processes without a per-column Python step).

``collate`` says where rows become the four batch tensors. With ``collate = "producer"`` the
producer hands over finished tensors; with ``"trainer"`` it hands over one array per feature
column (sequences as offsets + values) and the trainer stacks and pads them. That holds for
``single_buffer`` too: the buffer then carries the uncollated columns (still one buffer, still
zero-copy to unpack), and the trainer pays for collation, which is what that variant measures.

The conversions are on the hot path of every variant, so they avoid per-column copies: Arrow
columns of the canonical types are read as zero-copy numpy views, and the single buffer is
allocated first (in shared memory inside a loader worker) so collation writes each value
exactly once, straight into the buffer that crosses the process boundary.
"""

from __future__ import annotations

import json
import math
import struct
import threading
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..data.schema import FeatureSchema
from ..errors import PayloadError
from ..registry import Registry
from .buffers import PooledBuffer, SlotAllocator
from .sizes import align_up

TensorBatch = dict[str, torch.Tensor]
FORMATS: Registry[type["BatchFormat"]] = Registry("batch format")
PAD_ID = -1
COLLATED = ("dense", "sparse", "seq", "label")
JAGGED = ("dense", "sparse", "label", "seq_offsets", "seq_values")

_ARROW_TYPES = {np.dtype(np.float32): pa.float32(), np.dtype(np.int64): pa.int64()}


# ------------------------------------------------------------------- arrow -> numpy helpers

def flat(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One contiguous Arrow array (no copy when the column has a single chunk, the usual case)."""
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def column_numpy(col: pa.ChunkedArray | pa.Array, dtype: Any) -> np.ndarray:
    """A numpy view of a primitive column: zero-copy (read-only) when the column already has
    ``dtype`` and no nulls, as normalized tables always do; a converted copy otherwise."""
    arr = flat(col)
    dt = np.dtype(dtype)
    if arr.null_count == 0 and arr.type == _ARROW_TYPES.get(dt):
        return primitive_view(arr, dt)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dt)


def primitive_view(arr: pa.Array, dt: np.dtype) -> np.ndarray:
    """Read-only numpy view of a null-free fixed-width Arrow array's data buffer.

    Straight from the buffer rather than ``Array.to_numpy``: no per-call conversion checks,
    and no lazy import of pandas (which ``to_numpy`` triggers on first use, costing every
    freshly forked loader worker ~0.5 s before its first batch)."""
    buf = arr.buffers()[1]
    if buf is None or len(arr) == 0:
        return np.empty(0, dtype=dt)
    return np.frombuffer(buf, dtype=dt, count=len(arr), offset=arr.offset * dt.itemsize)


def seq_parts(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of a list column, offsets int64 relative to the returned values.

    Zero-copy for the values of a null-free list<int64> (the canonical sequence type); only
    the n+1 offsets are rebased.
    """
    arr = flat(col)
    if (arr.null_count == 0 and pa.types.is_list(arr.type)
            and arr.type.value_type == pa.int64()):
        raw = primitive_view(arr.offsets, np.dtype(np.int32))
        if raw.size == 0:
            return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
        lo, hi = int(raw[0]), int(raw[-1])
        child = arr.values
        values = column_numpy(child.slice(lo, hi - lo), np.int64)
        return raw.astype(np.int64) - lo, values
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.asarray(pc.list_flatten(arr).to_numpy(zero_copy_only=False), dtype=np.int64)
    return offsets, values


def sequence_lengths(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Items per row of a list column (nulls: 0), int64; from the offsets when canonical."""
    arr = flat(col)
    if arr.null_count == 0 and pa.types.is_list(arr.type):
        return np.diff(primitive_view(arr.offsets, np.dtype(np.int32))).astype(np.int64)
    return np.asarray(pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False),
                      dtype=np.int64)


@dataclass
class SequenceCounts:
    """What padding to ``seq_len`` does to a table's sequences: how many are longer (and lose
    their tail) and how many ids that drops. Counted by producers, summed per run."""

    seq_len: int
    sequences: int = 0
    cut: int = 0
    ids: int = 0
    ids_cut: int = 0
    longest: int = 0

    @classmethod
    def of(cls, table: pa.Table, schema: FeatureSchema) -> "SequenceCounts":
        c = cls(schema.seq_len)
        for name in schema.sequence:
            lengths = sequence_lengths(table.column(name))
            if not lengths.size:
                continue
            over = lengths - schema.seq_len
            c.sequences += int(lengths.size)
            c.ids += int(lengths.sum())
            c.cut += int(np.count_nonzero(over > 0))
            c.ids_cut += int(over[over > 0].sum())
            c.longest = max(c.longest, int(lengths.max()))
        return c

    def add(self, other: "SequenceCounts | None") -> None:
        if other is None:
            return
        self.sequences += other.sequences
        self.cut += other.cut
        self.ids += other.ids
        self.ids_cut += other.ids_cut
        self.longest = max(self.longest, other.longest)


_POSITIONS = np.arange(4096, dtype=np.int64)


def pad_sequences(offsets: np.ndarray, values: np.ndarray, seq_len: int, out: np.ndarray,
                  prefilled: bool = False) -> None:
    """Scatter variable-length rows into ``out`` (rows, seq_len), keeping each row's first
    ``seq_len`` items and padding with ``PAD_ID``; vectorised (no Python loop over rows).

    ``out`` may be a strided view (one sequence feature of a (B, Q, L) batch), so padding
    writes straight into the final tensor; ``prefilled`` says it already holds ``PAD_ID``
    (one contiguous fill of the whole block is cheaper than one strided fill per feature).
    When no row is longer than ``seq_len`` (the usual case) a boolean mask places the values
    in row-major order in one pass (measured fastest of mask, index scatter, sliding-window
    gather); otherwise the overlong rows' tails are dropped first.
    """
    if not prefilled:
        out.fill(PAD_ID)
    n = out.shape[0]
    if n == 0 or values.size == 0:
        return
    lengths = np.diff(offsets)
    pos = _POSITIONS[:seq_len] if seq_len <= _POSITIONS.size else np.arange(seq_len)
    if int(lengths.max()) > seq_len:
        row = np.repeat(np.arange(n), lengths)
        within = np.arange(values.size) - offsets[:-1][row]
        values = values[within < seq_len]
        lengths = np.minimum(lengths, seq_len)
    out[pos < lengths[:, None]] = values


def collated_fields(schema: FeatureSchema, rows: int) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """Name, dtype and shape of each tensor of a collated batch of ``rows`` rows."""
    return [("dense", np.dtype(np.float32), (rows, len(schema.dense))),
            ("sparse", np.dtype(np.int64), (rows, len(schema.sparse))),
            ("seq", np.dtype(np.int64), (rows, len(schema.sequence), schema.seq_len)),
            ("label", np.dtype(np.float32), (rows,))]


_SCRATCH = threading.local()


def _stack(columns: list[np.ndarray], out: np.ndarray) -> None:
    """``out[:, j] = columns[j]`` for a row-major (rows, k) ``out``, via a reused column-major
    scratch and one transposing copy, so the (cold, shared) destination is written in one
    sequential pass instead of once per column with a stride."""
    n, k = out.shape
    if n == 0 or k == 0:
        return
    bufs = _SCRATCH.__dict__.setdefault("bufs", {})
    scratch = bufs.get(out.dtype)
    if scratch is None or scratch.size < k * n:
        scratch = bufs[out.dtype] = np.empty(k * n, dtype=out.dtype)
    tmp = scratch[:k * n].reshape(k, n)
    for j, c in enumerate(columns):
        tmp[j] = c
    out[...] = tmp.T


def fill_collated(table: pa.Table, schema: FeatureSchema, out: dict[str, np.ndarray]) -> None:
    """Collate ``table`` into preallocated arrays (e.g. views into a shared single buffer).

    Source columns are zero-copy views of the Arrow buffers; nothing is allocated per batch
    (dense and sparse go through a reused per-thread scratch, sequences are padded in place).
    """
    _stack([column_numpy(table.column(c), np.float32) for c in schema.dense], out["dense"])
    _stack([column_numpy(table.column(c), np.int64) for c in schema.sparse], out["sparse"])
    seq = out["seq"]
    seq.fill(PAD_ID)
    for j, c in enumerate(schema.sequence):
        off, vals = seq_parts(table.column(c))
        pad_sequences(off, vals, schema.seq_len, seq[:, j, :], prefilled=True)
    out["label"][:] = column_numpy(table.column(schema.label), np.float32)


def to_arrays(table: pa.Table, schema: FeatureSchema) -> dict[str, np.ndarray]:
    """The collated numpy form of a batch (what ``TensorBatch`` wraps); arrays are writable."""
    out = {name: np.empty(shape, dtype=dt) for name, dt, shape in
           collated_fields(schema, table.num_rows)}
    fill_collated(table, schema, out)
    return out


def to_columns(table: pa.Table, schema: FeatureSchema) -> dict[str, Any]:
    """Uncollated columns: one numpy array per feature, sequences as (offsets, values).

    Arrays are zero-copy, read-only views of the Arrow buffers where possible; collation
    (or pickling across a process boundary) makes the copies.
    """
    cols: dict[str, Any] = {}
    for c in schema.dense:
        cols[c] = column_numpy(table.column(c), np.float32)
    for c in schema.sparse:
        cols[c] = column_numpy(table.column(c), np.int64)
    for c in schema.sequence:
        cols[c] = seq_parts(table.column(c))
    cols[schema.label] = column_numpy(table.column(schema.label), np.float32)
    return cols


def collate_columns(cols: dict[str, Any], schema: FeatureSchema) -> dict[str, np.ndarray]:
    """Stack and pad uncollated columns into the four collated arrays (fresh, writable)."""
    label = np.array(cols[schema.label], dtype=np.float32)   # copy: tensors may be written
    n = len(label)
    dense = np.empty((n, len(schema.dense)), dtype=np.float32)
    for j, c in enumerate(schema.dense):
        dense[:, j] = cols[c]
    sparse = np.empty((n, len(schema.sparse)), dtype=np.int64)
    for j, c in enumerate(schema.sparse):
        sparse[:, j] = cols[c]
    seq = np.full((n, len(schema.sequence), schema.seq_len), PAD_ID, dtype=np.int64)
    for j, c in enumerate(schema.sequence):
        pad_sequences(*cols[c], schema.seq_len, seq[:, j, :], prefilled=True)
    return {"dense": dense, "sparse": sparse, "seq": seq, "label": label}


def tensors(arrays: dict[str, np.ndarray]) -> TensorBatch:
    return {k: torch.from_numpy(v) for k, v in arrays.items()}


def nbytes(obj: Any) -> int:
    """Bytes of array data in a payload (pickle framing excluded)."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if isinstance(obj, PooledBuffer):
        return obj.nbytes
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.generic):
        return obj.nbytes
    if isinstance(obj, pa.RecordBatch):
        return pa.ipc.get_record_batch_size(obj)     # what its IPC message carries
    if isinstance(obj, pa.Table):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 8


# --------------------------------------------------------------------------- single buffer
#
# Layout: b"SBB1" | uint32 little-endian header length | JSON header | zero padding to 64 |
# data. The header names the batch and lists each field's name, dtype, shape, offset (from
# the data start, 64-byte aligned) and nbytes, plus the total data length. Unpacking checks
# all of it, so a damaged or truncated payload is an error naming the batch, never a tensor
# of garbage. (Bit flips inside the data area of an *uncompressed* buffer are not detectable
# without a checksum over every byte, which would cost as much as the copy the format
# avoids; compressed payloads carry zstd's frame checksum.)

_MAGIC = b"SBB1"
_PREFIX = 8
_ALIGN = 64
_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64,
                                   "int32": torch.int32, "int64": torch.int64,
                                   "uint8": torch.uint8}
_ITEMSIZE = {name: torch.empty(0, dtype=dt).element_size() for name, dt in _DTYPES.items()}
_NP_DTYPES = {name: np.dtype(name) for name in _DTYPES}
_DTYPE_NAME = {np.dtype(name): name for name in _DTYPES}   # np.dtype -> its name, looked up
_FIELDS = COLLATED


def _aligned(n: int) -> int:
    return align_up(n, _ALIGN)


Buffer = Union[torch.Tensor, PooledBuffer]


def allocate(fields: Iterable[tuple[str, Any, tuple[int, ...]]], batch_id: str,
             shared: bool | SlotAllocator = False) -> tuple[Buffer, dict[str, np.ndarray]]:
    """A single buffer with its header written, and writable numpy views of each field.

    Callers fill the views in place (``fill_collated`` writes collated tensors straight into
    them), so packing costs no intermediate arrays. Where the buffer lives:

    - ``shared=False``: ordinary memory (the trainer packs for itself, or compression follows);
    - ``shared=True``: a fresh shared-memory buffer, so handing it to another process costs a
      file descriptor, not a copy of every tensor (which is what torch does for ordinary
      tensors);
    - a ``SlotAllocator``: a reusable slot of a ``BufferPool`` mapped before the workers forked
      (no page faults, no descriptor passing); the returned handle is then a tiny
      ``PooledBuffer`` reference. Falls back to fresh memory (shared or not, as the allocator
      says) when no slot is free.
    """
    entries, places, offset = [], [], 0
    for name, dtype, shape in fields:
        dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        dt_name = _DTYPE_NAME.get(dt)      # a dict, not ``dt.name``: that property is slow
        if dt_name is None:
            raise ValueError(f"single buffer cannot hold dtype {np.dtype(dt).name} "
                             f"(field {name!r})")
        shape = [int(s) for s in shape]
        nb = int(math.prod(shape)) * dt.itemsize
        entries.append({"name": name, "dtype": dt_name, "shape": shape, "offset": offset,
                        "nbytes": nb})
        places.append((name, dt, shape, offset, nb))
        offset += _aligned(nb)
    header = json.dumps({"batch": batch_id, "fields": entries, "data_bytes": offset},
                        separators=(",", ":")).encode()
    start = _aligned(_PREFIX + len(header))
    total = start + offset
    handle: Buffer
    raw = None
    if isinstance(shared, SlotAllocator):
        got = shared.take(total)
        if got is not None:
            raw, handle = got
        shared = shared.fallback_shared
    if raw is None:
        if shared:
            handle = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(total))
        else:
            handle = torch.empty(total, dtype=torch.uint8)
        raw = handle.numpy()
    raw[:4] = np.frombuffer(_MAGIC, dtype=np.uint8)
    raw[4:8] = np.frombuffer(struct.pack("<I", len(header)), dtype=np.uint8)
    raw[8:8 + len(header)] = np.frombuffer(header, dtype=np.uint8)
    raw[8 + len(header):start] = 0
    views = {}
    for name, dt, shape, off, nb in places:
        lo = start + off
        views[name] = raw[lo:lo + nb].view(dt).reshape(shape)
    return handle, views


@dataclass
class LocalBatch:
    """A batch packed for the trainer's own process (``num_workers = 0``): the model-ready
    tensors themselves, views into one buffer, with nothing to decode on the trainer side.

    Why: the single buffer's header, and the trainer's parsing and checking of it
    (``unpack_fields``, ``check_jagged``), exist for a payload that crosses a process or a
    wire, where it may arrive damaged; a batch the trainer packed for itself never does, and
    those steps cost ~0.2 ms per batch (most of a 1,024-row batch's trainer-side time) that a
    plain DataLoader does not pay. What remains is the one copy of each value into the
    buffer, which the batch dict's layout needs (``dense`` is one (B, D) tensor; Arrow holds
    D separate columns). ``nbytes``: the buffer's size; ``pooled``: it is a trainer-local
    pool slot (freed when the last tensor over it is gone) rather than fresh memory."""

    batch: TensorBatch
    nbytes: int
    pooled: bool


def allocate_local(fields: Iterable[tuple[str, np.dtype, tuple[int, ...]]],
                   shared: bool | SlotAllocator = False,
                   ) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor], int, bool]:
    """``allocate`` for a batch that stays in this process: no header, and besides the
    writable numpy views the tensors the model gets (views of the same memory). Returns
    (numpy views, tensors, buffer bytes, pooled). Memory: a slot of the trainer-local pool
    when ``shared`` is its ``SlotAllocator`` and one is free (the tensors hold the slot
    until they are gone, as ``BufferPool.resolve`` does), ordinary memory otherwise."""
    places, offset = [], 0
    for name, dt, shape in fields:
        nb = int(math.prod(shape)) * dt.itemsize
        places.append((name, dt, shape, offset, nb))
        offset += _aligned(nb)
    total = max(offset, 1)
    base = None
    if isinstance(shared, SlotAllocator):
        got = shared.take(total)
        if got is not None:
            base = shared.pool.resolve(got[1])
    pooled = base is not None
    if base is None:
        base = torch.empty(total, dtype=torch.uint8)
    raw = base.numpy()      # its ``base`` is the tensor, which holds the slot's memory
    views, out = {}, {}
    for name, dt, shape, off, nb in places:
        # One ``from_numpy`` per field (3x cheaper than slicing and viewing the tensor); the
        # tensor keeps the numpy view, the view ``raw``, ``raw`` the buffer tensor, and so
        # the slot stays taken while any of the batch's tensors lives.
        v = views[name] = raw[off:off + nb].view(dt).reshape(shape)
        out[name] = torch.from_numpy(v)
    return views, out, total, pooled


def pack(arrays: dict[str, np.ndarray], batch_id: str,
         shared: bool | SlotAllocator = False) -> Buffer:
    """All arrays of a batch in one uint8 tensor (see ``allocate`` for the layout)."""
    buf, views = allocate(((k, a.dtype, a.shape) for k, a in arrays.items()), batch_id, shared)
    for k, a in arrays.items():
        views[k][...] = a
    return buf


def _as_buffer(buf: Any, batch_id: str) -> torch.Tensor:
    if isinstance(buf, PooledBuffer):
        try:
            buf = buf.resolve()
        except LookupError as exc:
            raise PayloadError(f"batch {batch_id}: {exc}") from None
    if isinstance(buf, torch.Tensor):
        if buf.dtype != torch.uint8 or buf.dim() != 1 or not buf.is_contiguous():
            raise PayloadError(f"batch {batch_id}: single-buffer payload is not a flat byte "
                               f"buffer (got {buf.dtype} of shape {tuple(buf.shape)})")
        return buf
    if isinstance(buf, (bytes, bytearray, memoryview)):
        if not len(buf):
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(bytearray(buf), dtype=torch.uint8)
    raise PayloadError(f"batch {batch_id}: single-buffer payload is a {type(buf).__name__}, "
                       f"not a byte buffer")


def _int(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(x)
    return x


def unpack_fields(buf: Buffer | bytes | bytearray | memoryview,
                  batch_id: str = "?") -> dict[str, torch.Tensor]:
    """Zero-copy tensor views of every field in a single buffer, after checking its structure.

    Every check fails loudly with a ``PayloadError`` naming the batch: magic, header length,
    header JSON, the batch id it was packed for, total length (truncated or extra bytes),
    each field's dtype/shape/size, fields overflowing the data or overlapping each other.
    """
    buf = _as_buffer(buf, batch_id)
    n = buf.numel()
    raw = buf.numpy()
    if n < _PREFIX or raw[:4].tobytes() != _MAGIC:
        raise PayloadError(f"batch {batch_id}: single-buffer payload has a bad magic number")
    (hlen,) = struct.unpack("<I", raw[4:8].tobytes())
    if _PREFIX + hlen > n:
        raise PayloadError(f"batch {batch_id}: header length {hlen} exceeds the payload of "
                           f"{n} bytes (truncated?)")
    try:
        header = json.loads(raw[8:8 + hlen].tobytes().decode("utf-8"))
        fields = header["fields"]
        data_bytes = _int(header["data_bytes"])
        packed_for = header["batch"]
        if not isinstance(fields, list) or not isinstance(packed_for, str):
            raise TypeError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise PayloadError(f"batch {batch_id}: single-buffer header is not valid") from None
    if batch_id != "?" and packed_for != batch_id:
        raise PayloadError(f"batch {batch_id}: payload was packed for batch {packed_for!r}")
    start = _aligned(_PREFIX + hlen)
    if start + data_bytes != n:
        what = "truncated" if n < start + data_bytes else "extra bytes"
        raise PayloadError(f"batch {batch_id}: payload is {n} bytes but its header says "
                           f"{start + data_bytes} ({what})")
    out: dict[str, torch.Tensor] = {}
    spans = []
    for f in fields:
        try:
            name = f["name"]
            dtype = f["dtype"]
            shape = [_int(s) for s in f["shape"]]
            off, nb = _int(f["offset"]), _int(f["nbytes"])
            if not isinstance(name, str) or dtype not in _DTYPES:
                raise TypeError
        except (KeyError, TypeError, ValueError):
            raise PayloadError(f"batch {batch_id}: bad field entry {f!r} in header") from None
        if name in out:
            raise PayloadError(f"batch {batch_id}: field {name!r} appears twice in the header")
        size = _ITEMSIZE[dtype]
        if (any(s < 0 for s in shape) or nb != math.prod(shape) * size or off < 0
                or off % size or off + nb > data_bytes):
            raise PayloadError(f"batch {batch_id}: field {name!r} ({dtype} {shape} at offset "
                               f"{off}, {nb} bytes) does not fit the {data_bytes}-byte payload")
        spans.append((off, off + nb, name))
        lo = start + off
        # A numpy view and one ``from_numpy``: a third of the cost of slicing and viewing the
        # tensor (three torch calls per field). ``raw``'s base is ``buf``, so the tensor
        # keeps the buffer (and a pool slot's release) alive just the same.
        out[name] = torch.from_numpy(raw[lo:lo + nb].view(_NP_DTYPES[dtype]).reshape(shape))
    spans.sort()
    for (_, end, a), (lo, _, b) in zip(spans, spans[1:]):
        if lo < end:
            raise PayloadError(f"batch {batch_id}: fields {a!r} and {b!r} overlap")
    return out


def unpack(buf: Buffer | bytes | bytearray | memoryview, batch_id: str = "?") -> TensorBatch:
    """The four collated tensors of a single buffer, as zero-copy views into ``buf``."""
    fields = unpack_fields(buf, batch_id)
    missing = [k for k in _FIELDS if k not in fields]
    if missing:
        raise PayloadError(f"batch {batch_id}: single-buffer payload lacks {missing}")
    return {k: fields[k] for k in _FIELDS}


def check_batch(batch: TensorBatch, schema: FeatureSchema, batch_id: str,
                rows: int | None = None) -> TensorBatch:
    """The decoded batch has exactly the dtypes and shapes the schema promises (cheap: shapes
    only), so a payload that decodes but does not fit is an error, not a model crash."""
    n = rows if rows is not None else (int(batch["label"].shape[0]) if "label" in batch else -1)
    for name, dt, shape in collated_fields(schema, n):
        t = batch.get(name)
        want = _DTYPES[dt.name]
        if not isinstance(t, torch.Tensor) or t.dtype != want or tuple(t.shape) != shape:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise PayloadError(f"batch {batch_id}: {name!r} is {got}, expected {want} {shape}")
    return batch


# --------------------------------------------------------------------------------- formats

class BatchFormat:
    """``encode`` runs in the producer, ``decode`` in the trainer; both are timed as transfer.

    ``decode`` must return the collated ``TensorBatch`` or raise ``PayloadError``.

    A format declares what its payload is, so the code that moves payloads (compression, the
    loader's buffer pool, Ray's wire codec) asks the format instead of knowing format names:

    - ``contiguous_buffer``: the payload is one flat uint8 buffer (a 1-D uint8 tensor, or a
      ``PooledBuffer`` reference to one), and ``decode`` also accepts its bytes. It can be
      compressed and sent as raw bytes, in place, without pickling.
    - ``poolable``: ``encode`` can pack the payload into a ``BufferPool`` slot (``shared`` a
      ``SlotAllocator``); ``slot_bytes`` then sizes the slots.
    - ``pads_sequences``: sequences become ``seq`` (B, Q, L) padded to ``schema.seq_len``, so a
      longer sequence loses its tail (``Transfer`` counts those, results say so); False: the
      format keeps every id (jagged).
    """

    name: ClassVar[str]
    contiguous_buffer: ClassVar[bool] = False
    poolable: ClassVar[bool] = False
    pads_sequences: ClassVar[bool] = True

    def __init__(self, schema: FeatureSchema, collate: str) -> None:
        self.schema = schema
        self.collate = collate

    def encode(self, table: pa.Table, batch_id: str, shared: bool | SlotAllocator) -> Any:
        """``shared``: the payload will cross to another process (True, or a pool partition
        to pack into); formats that can place their payload in shared memory do."""
        raise NotImplementedError

    def encode_table(self, table: pa.Table, batch_size: int, prefix: str,
                     shared: bool | SlotAllocator,
                     local: bool = False) -> list[tuple[int, Any]] | None:
        """Every batch of ``table`` (``batch_size`` rows, ids ``prefix:i``) as (rows,
        payload), byte for byte what ``encode`` gives each slice; None: this format encodes
        batch by batch. A format overrides it when it can look its columns up once per table
        instead of once per batch (a per-column Python step per batch that a plain loader
        does not pay). ``local``: the batches stay in this process (0 loader workers, no
        compression); a format that can then hands over ``LocalBatch`` payloads, the
        model's tensors with no header to write or decode, and ignores it otherwise."""
        return None

    def decode(self, data: Any, batch_id: str, rows: int | None = None) -> TensorBatch:
        raise NotImplementedError

    def slot_bytes(self, rows: int) -> int:
        """Bytes of a pool slot that holds this format's payload of a ``rows``-row batch (a
        payload that does not fit falls back to fresh memory). Only for ``poolable`` formats."""
        raise NotImplementedError(f"batch format {self.name!r} is not poolable")


def _as_tensors(data: Any, batch_id: str) -> TensorBatch:
    """A collated dict whose values may have become numpy arrays on the way (pickled)."""
    if not isinstance(data, dict):
        raise PayloadError(f"batch {batch_id}: expected a dict of tensors, got "
                           f"{type(data).__name__}")
    out = {}
    for k, v in data.items():
        if isinstance(v, np.ndarray):
            v = torch.from_numpy(v)
        out[k] = v
    return out


@FORMATS.register("rows")
class RowsFormat(BatchFormat):
    """Per-row dicts keyed by feature, as a typical map-style PyTorch Dataset returns them."""

    name = "rows"

    def _rows(self, table: pa.Table) -> list[dict[str, Any]]:
        s = self.schema
        cols = to_columns(table, s)
        seq = {}
        for c in s.sequence:
            padded = np.empty((table.num_rows, s.seq_len), dtype=np.int64)
            pad_sequences(*cols[c], s.seq_len, padded)
            seq[c] = padded
        flat_cols = {**{c: cols[c] for c in (*s.dense, *s.sparse, s.label)}, **seq}
        names = list(flat_cols)
        arrays = [flat_cols[c] for c in names]
        return [{k: a[i] for k, a in zip(names, arrays)} for i in range(table.num_rows)]

    def _assemble(self, per_feature: dict[str, torch.Tensor]) -> TensorBatch:
        s = self.schema
        n = per_feature[s.label].shape[0]

        def stack(names: tuple[str, ...], dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
            if not names:
                return torch.empty(shape, dtype=dtype)
            return torch.stack([per_feature[c] for c in names], dim=1)

        return {
            "dense": stack(s.dense, torch.float32, (n, 0)),
            "sparse": stack(s.sparse, torch.int64, (n, 0)),
            "seq": stack(s.sequence, torch.int64, (n, 0, s.seq_len)),
            "label": per_feature[s.label],
        }

    def encode(self, table: pa.Table, batch_id: str, shared: bool | SlotAllocator) -> Any:
        rows = self._rows(table)
        if self.collate == "producer":
            return self._assemble(torch.utils.data.default_collate(rows))
        return rows

    def decode(self, data: Any, batch_id: str, rows: int | None = None) -> TensorBatch:
        if self.collate == "producer":
            return check_batch(_as_tensors(data, batch_id), self.schema, batch_id, rows)
        if not isinstance(data, list) or not data:
            raise PayloadError(f"batch {batch_id}: expected a non-empty list of rows")
        try:
            batch = self._assemble(torch.utils.data.default_collate(data))
        except (KeyError, TypeError, RuntimeError) as exc:
            raise PayloadError(f"batch {batch_id}: rows do not collate ({exc})") from None
        return check_batch(batch, self.schema, batch_id, rows)


@FORMATS.register("columnar")
class ColumnarFormat(BatchFormat):
    name = "columnar"

    def encode(self, table: pa.Table, batch_id: str, shared: bool | SlotAllocator) -> Any:
        if self.collate == "producer":
            return tensors(to_arrays(table, self.schema))
        return to_columns(table, self.schema)

    def decode(self, data: Any, batch_id: str, rows: int | None = None) -> TensorBatch:
        if self.collate == "producer":
            return check_batch(_as_tensors(data, batch_id), self.schema, batch_id, rows)
        try:
            batch = tensors(collate_columns(data, self.schema))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise PayloadError(f"batch {batch_id}: columns do not collate ({exc!r})") from None
        return check_batch(batch, self.schema, batch_id, rows)


def column_key(column: str, part: str | None = None) -> str:
    """Field name of an uncollated column in a single buffer. The prefixes keep a column's
    name from ever colliding with a sequence part (``seq:<name>:offsets|values``)."""
    return f"col:{column}" if part is None else f"seq:{column}:{part}"


@FORMATS.register("single_buffer")
class SingleBufferFormat(BatchFormat):
    """One contiguous buffer per batch: collated tensors (collate = "producer") or one field
    per feature column (collate = "trainer", sequences as offsets + values)."""

    name = "single_buffer"
    contiguous_buffer = True
    poolable = True

    # Header room on top of the collated data: a JSON header of a few hundred bytes per
    # field, generous for wide uncollated tables (a payload that does not fit falls back).
    SLOT_HEADER_BYTES: ClassVar[int] = 64 * 1024

    def slot_bytes(self, rows: int) -> int:
        data = sum(_aligned(dt.itemsize * math.prod(shape))
                   for _, dt, shape in collated_fields(self.schema, rows))
        return data + self.SLOT_HEADER_BYTES

    def encode(self, table: pa.Table, batch_id: str, shared: bool | SlotAllocator) -> Any:
        s = self.schema
        if self.collate == "producer":
            buf, views = allocate(collated_fields(s, table.num_rows), batch_id, shared)
            fill_collated(table, s, views)
            return buf
        cols = to_columns(table, s)
        arrays: dict[str, np.ndarray] = {}
        for c in (*s.dense, *s.sparse, s.label):
            arrays[column_key(c)] = cols[c]
        for c in s.sequence:
            arrays[column_key(c, "offsets")], arrays[column_key(c, "values")] = cols[c]
        return pack(arrays, batch_id, shared)

    def decode(self, data: Any, batch_id: str, rows: int | None = None) -> TensorBatch:
        s = self.schema
        if self.collate == "producer":
            return check_batch(unpack(data, batch_id), s, batch_id, rows)
        cols = self._columns(data, batch_id, rows)
        return check_batch(tensors(collate_columns(cols, s)), s, batch_id, rows)

    def _columns(self, data: Any, batch_id: str, rows: int | None) -> dict[str, Any]:
        """The uncollated columns of a ``collate = "trainer"`` buffer, checked (views)."""
        s = self.schema
        fields = unpack_fields(data, batch_id)
        n = rows if rows is not None else -1
        cols: dict[str, Any] = {}
        try:
            kinds = [(c, torch.float32) for c in s.dense] + \
                [(c, torch.int64) for c in s.sparse] + [(s.label, torch.float32)]
            for c, want in kinds:
                t = fields[column_key(c)]
                if t.dtype != want or t.dim() != 1 or (n >= 0 and t.shape[0] != n):
                    raise ValueError(f"column {c!r} is {t.dtype} {tuple(t.shape)}, expected "
                                     f"{want} ({n if n >= 0 else 'B'},)")
                n = t.shape[0]
                cols[c] = t.numpy()
            for c in s.sequence:
                off = fields[column_key(c, "offsets")].numpy()
                vals = fields[column_key(c, "values")].numpy()
                if (off.dtype != np.int64 or vals.dtype != np.int64 or vals.ndim != 1
                        or off.shape != (n + 1,) or off[0] != 0
                        or off[-1] != vals.size or (n and np.diff(off).min() < 0)):
                    raise ValueError(f"sequence {c!r} has inconsistent offsets")
                cols[c] = (off, vals)
        except KeyError as exc:
            raise PayloadError(f"batch {batch_id}: single-buffer payload lacks field "
                               f"{exc.args[0]!r}") from None
        except ValueError as exc:
            raise PayloadError(f"batch {batch_id}: {exc}") from None
        return cols


# ---------------------------------------------------------------------------------- jagged

def jagged_fields(schema: FeatureSchema, rows: int,
                  n_values: int) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """Name, dtype and stored shape of each field of a jagged buffer (``JAGGED`` order).
    ``dense`` and ``sparse`` are stored feature-major, (D, B) and (S, B), as every column
    already is in Arrow: packing one is a plain copy per column (no transposition), and the
    trainer sees the (B, D) / (B, S) tensors as transposed views (``decode``)."""
    return [("dense", np.dtype(np.float32), (len(schema.dense), rows)),
            ("sparse", np.dtype(np.int64), (len(schema.sparse), rows)),
            ("label", np.dtype(np.float32), (rows,)),
            ("seq_offsets", np.dtype(np.int64), (len(schema.sequence) * rows + 1,)),
            ("seq_values", np.dtype(np.int64), (n_values,))]


def fill_jagged_sequences(parts: list[tuple[np.ndarray, np.ndarray]], offsets: np.ndarray,
                          values: np.ndarray) -> None:
    """Write each feature's (offsets, values) into the feature-major ``offsets`` (Q*B + 1)
    and ``values``: one copy of the ids, one add per offset; nothing is padded."""
    offsets[0] = 0
    base = 0
    at = 0
    for off, vals in parts:
        n = off.size - 1
        np.add(off[1:], base, out=offsets[at + 1:at + n + 1])
        values[base:base + vals.size] = vals
        base += vals.size
        at += n


def check_jagged(batch: TensorBatch, schema: FeatureSchema, batch_id: str,
                 rows: int | None = None) -> TensorBatch:
    """The decoded jagged batch has the promised dtypes and shapes, and its offsets are a
    valid partition of its values (start at 0, never decrease, end at the last value)."""
    n = rows if rows is not None else (int(batch["label"].shape[0]) if "label" in batch else -1)
    want = {"dense": (torch.float32, (n, len(schema.dense))),
            "sparse": (torch.int64, (n, len(schema.sparse))), "label": (torch.float32, (n,)),
            "seq_offsets": (torch.int64, (len(schema.sequence) * n + 1,))}
    for name, (dt, shape) in want.items():
        t = batch.get(name)
        if not isinstance(t, torch.Tensor) or t.dtype != dt or tuple(t.shape) != shape:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise PayloadError(f"batch {batch_id}: {name!r} is {got}, expected {dt} {shape}")
    vals = batch.get("seq_values")
    if not isinstance(vals, torch.Tensor) or vals.dtype != torch.int64 or vals.dim() != 1:
        raise PayloadError(f"batch {batch_id}: 'seq_values' is not a 1-D int64 tensor")
    off = batch["seq_offsets"]
    if off.device.type == "cpu":
        o = off.numpy()
        scratch = _SCRATCH.__dict__.setdefault("ge", np.empty(0, dtype=bool))
        if scratch.size < o.size:
            scratch = _SCRATCH.ge = np.empty(o.size, dtype=bool)
        ok = np.greater_equal(o[1:], o[:-1], out=scratch[:o.size - 1]).all() if o.size > 1 else True
        if o[0] != 0 or o[-1] != vals.shape[0] or not ok:
            raise PayloadError(f"batch {batch_id}: 'seq_offsets' do not partition the "
                               f"{vals.shape[0]} sequence values")
    return batch


def padded_from_jagged(offsets: torch.Tensor, values: torch.Tensor, features: int, rows: int,
                       min_len: int) -> torch.Tensor:
    """The padded ``seq`` (B, Q, L) of a jagged batch, on the batch's device, with nothing cut:
    L = max(``min_len``, the batch's longest sequence), ``PAD_ID`` after each sequence's end.

    Built in one masked scatter: the mask's True cells, enumerated in (Q, B, L) order, are
    exactly the positions of ``values`` in their feature-major order, and the (Q, B, L) view
    writes straight into a contiguous (B, Q, L) tensor. Reading the longest length back is
    one host sync on a GPU."""
    lengths = offsets[1:] - offsets[:-1]
    width = max(min_len, int(lengths.max()) if lengths.numel() else 0)
    out = torch.full((rows, features, width), PAD_ID, dtype=torch.int64, device=values.device)
    if values.numel():
        pos = torch.arange(width, device=values.device)
        mask = pos < lengths.view(features, rows, 1)
        out.permute(1, 0, 2)[mask] = values
    return out


class PaddedOnDemand(dict):
    """A jagged batch that also answers the documented ``seq`` key (B, Q, L), built from
    ``seq_values`` + ``seq_offsets`` the first time it is asked for (``padded_from_jagged``:
    padded to at least ``sequence_max_len``, so a model sized for it keeps its shapes while no
    sequence is longer, and to the batch's longest otherwise: no id is cut).

    Why on demand: ``jagged`` is the default format because it keeps every id, and a model of
    the user's own written for the documented dict (``dense``, ``sparse``, ``seq``, ``label``)
    must keep working; a model that reads the jagged keys instead pays no padding at all. The
    padding, when asked for, runs inside the model's step and is timed as compute."""

    def __init__(self, batch: TensorBatch, schema: FeatureSchema) -> None:
        super().__init__(batch)
        self._features = len(schema.sequence)
        self._min_len = schema.seq_len

    def __missing__(self, key: str) -> torch.Tensor:
        if key != "seq":
            raise KeyError(key)
        seq = padded_from_jagged(dict.__getitem__(self, "seq_offsets"),
                                 dict.__getitem__(self, "seq_values"), self._features,
                                 int(dict.__getitem__(self, "label").shape[0]), self._min_len)
        self["seq"] = seq
        return seq

    def __contains__(self, key: object) -> bool:
        return key == "seq" or dict.__contains__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default


def documented(batch: TensorBatch, schema: FeatureSchema) -> TensorBatch:
    """``batch`` as a model written for the documented keys expects it: a jagged batch gains
    ``seq`` on demand (``PaddedOnDemand``); a padded one is returned as is."""
    if "seq_values" in batch and "seq" not in batch:
        return PaddedOnDemand(batch, schema)
    return batch


def collate_jagged(cols: dict[str, Any], schema: FeatureSchema) -> dict[str, np.ndarray]:
    """Uncollated columns (sequences as (offsets, values)) -> the jagged arrays (fresh;
    ``dense`` and ``sparse`` feature-major underneath, (B, D) / (B, S) as seen)."""
    label = np.array(cols[schema.label], dtype=np.float32)
    n = len(label)
    dense = np.empty((len(schema.dense), n), dtype=np.float32)
    for j, c in enumerate(schema.dense):
        dense[j] = cols[c]
    sparse = np.empty((len(schema.sparse), n), dtype=np.int64)
    for j, c in enumerate(schema.sparse):
        sparse[j] = cols[c]
    parts = [cols[c] for c in schema.sequence]
    offsets = np.empty(len(parts) * n + 1, dtype=np.int64)
    values = np.empty(sum(int(v.size) for _, v in parts), dtype=np.int64)
    fill_jagged_sequences(parts, offsets, values)
    return {"dense": dense.T, "sparse": sparse.T, "label": label, "seq_offsets": offsets,
            "seq_values": values}


@FORMATS.register("jagged")
class JaggedFormat(SingleBufferFormat):
    """One contiguous buffer per batch, like ``single_buffer``, with the sequences jagged:
    values + offsets (TorchRec's KeyedJaggedTensor layout) instead of padded to
    ``sequence_max_len``. Nothing is cut and nothing is padded, so a batch carries only its
    ids: on data with short sequences most of a padded ``seq`` tensor is padding, and writing
    it is most of a producer's collation. Dense and id features are stored feature-major as
    Arrow holds them (one copy per column, no transposition; the trainer's ``dense`` and
    ``sparse`` are (B, D) / (B, S) views with strides (1, B)), so packing a batch costs about
    one ``memcpy`` of its bytes: the one copy the batch dict's layout needs (``dense`` is one
    tensor, Arrow holds one buffer per column; ``seq_values`` joins the sequence columns).
    With 0 loader workers the batch stays in the trainer's process and is handed over as
    those tensors (``encode_table(local=True)``, a ``LocalBatch``): no header is written and
    the trainer decodes and re-checks nothing. ``collate = "trainer"`` hands over the
    uncollated columns as ``single_buffer`` does and the trainer builds the jagged arrays."""

    name = "jagged"
    pads_sequences = False

    def slot_bytes(self, rows: int) -> int:
        """Sized for sequences averaging up to ``sequence_max_len`` ids (the bound a padded
        batch would have); a batch with more falls back to fresh memory (counted in results
        as ``fresh_*_batches``)."""
        s = self.schema
        q = len(s.sequence)
        values = q * rows * s.seq_len
        data = sum(_aligned(dt.itemsize * math.prod(shape))
                   for _, dt, shape in jagged_fields(s, rows, values))
        return data + q * _ALIGN + self.SLOT_HEADER_BYTES

    def encode(self, table: pa.Table, batch_id: str, shared: bool | SlotAllocator) -> Any:
        s = self.schema
        if self.collate != "producer":
            return super().encode(table, batch_id, shared)
        n = table.num_rows
        parts = [seq_parts(table.column(c)) for c in s.sequence]
        total = sum(int(v.size) for _, v in parts)
        buf, views = allocate(jagged_fields(s, n, total), batch_id, shared)
        dense, sparse = views["dense"], views["sparse"]
        for j, c in enumerate(s.dense):
            dense[j] = column_numpy(table.column(c), np.float32)
        for j, c in enumerate(s.sparse):
            sparse[j] = column_numpy(table.column(c), np.int64)
        views["label"][:] = column_numpy(table.column(s.label), np.float32)
        fill_jagged_sequences(parts, views["seq_offsets"], views["seq_values"])
        return buf

    def encode_table(self, table: pa.Table, batch_size: int, prefix: str,
                     shared: bool | SlotAllocator,
                     local: bool = False) -> list[tuple[int, Any]] | None:
        """The batches of a table with its columns looked up once: zero-copy numpy views of
        the whole table's columns, sliced per batch (a slice is a view, no Arrow call per
        column per batch), and each sequence feature's offsets rebased straight into the
        buffer. What each batch costs is then its one copy into its buffer.

        ``local`` (0 workers): each batch is a ``LocalBatch``, the same bytes in the same
        layout without the header, its tensors the dict ``decode`` would give (``dense`` and
        ``sparse`` the same transposed views), so the trainer decodes nothing."""
        s = self.schema
        if self.collate != "producer":
            return None
        dense = [column_numpy(table.column(c), np.float32) for c in s.dense]
        sparse = [column_numpy(table.column(c), np.int64) for c in s.sparse]
        label = column_numpy(table.column(s.label), np.float32)
        parts = [seq_parts(table.column(c)) for c in s.sequence]
        out = []
        for i, lo in enumerate(range(0, table.num_rows, batch_size)):
            hi = min(lo + batch_size, table.num_rows)
            n = hi - lo
            spans = [(int(off[lo]), int(off[hi])) for off, _ in parts]
            total = sum(b - a for a, b in spans)
            if local:
                views, ts, size, pooled = allocate_local(jagged_fields(s, n, total), shared)
            else:
                buf, views = allocate(jagged_fields(s, n, total), f"{prefix}:{i}", shared)
            # Feature-major (D, n) is the concatenation of each column's rows: one C-level
            # call per block instead of a numpy assignment per column.
            rows = slice(lo, hi)
            if dense:
                np.concatenate([c[rows] for c in dense], out=views["dense"].reshape(-1))
            if sparse:
                np.concatenate([c[rows] for c in sparse], out=views["sparse"].reshape(-1))
            views["label"][:] = label[lo:hi]
            offsets, values = views["seq_offsets"], views["seq_values"]
            offsets[0] = 0
            base = at = 0
            for (off, vals), (a, b) in zip(parts, spans):
                np.add(off[lo + 1:hi + 1], base - a, out=offsets[at + 1:at + n + 1])
                values[base:base + b - a] = vals[a:b]
                base += b - a
                at += n
            if local:
                batch = {"dense": ts["dense"].t(), "sparse": ts["sparse"].t(),
                         "label": ts["label"], "seq_offsets": ts["seq_offsets"],
                         "seq_values": ts["seq_values"]}
                out.append((n, LocalBatch(batch, size, pooled)))
            else:
                out.append((n, buf))
        return out

    def decode(self, data: Any, batch_id: str, rows: int | None = None) -> TensorBatch:
        s = self.schema
        if self.collate == "producer":
            fields = unpack_fields(data, batch_id)
            missing = [k for k in JAGGED if k not in fields]
            if missing:
                raise PayloadError(f"batch {batch_id}: jagged payload lacks {missing}")
            batch = {k: fields[k] for k in JAGGED}
            for k in ("dense", "sparse"):       # stored feature-major: (B, D) views of (D, B)
                if batch[k].dim() != 2:
                    raise PayloadError(f"batch {batch_id}: {k!r} is not 2-D")
                batch[k] = batch[k].t()
            return check_jagged(batch, s, batch_id, rows)
        cols = self._columns(data, batch_id, rows)
        return check_jagged(tensors(collate_jagged(cols, s)), s, batch_id, rows)


# ----------------------------------------------------------------------------- Arrow batches

def arrow_schema(schema: FeatureSchema, collate: str) -> pa.Schema:
    """The Arrow schema of an ``arrow`` payload (also the schema of a Flight stream).

    ``collate = "producer"``: the collated tensors as fixed-size lists, one value per tensor
    row (``dense``: D float32, ``sparse``: S int64, ``seq``: Q * L int64, ``label``: float32);
    a tensor of width 0 is left out (Arrow has no fixed-size list of size 0) and rebuilt empty.
    ``"trainer"``: the preprocessed feature columns in their canonical types."""
    if collate == "producer":
        fields = [pa.field(name, pa.list_(pa.from_numpy_dtype(dt), math.prod(shape[1:])), False)
                  for name, dt, shape in collated_fields(schema, 0)
                  if name != "label" and math.prod(shape[1:]) > 0]
        return pa.schema([*fields, pa.field("label", pa.float32(), False)])
    return pa.schema([*(pa.field(c, pa.float32()) for c in schema.dense),
                      *(pa.field(c, pa.int64()) for c in schema.sparse),
                      *(pa.field(c, pa.list_(pa.int64())) for c in schema.sequence),
                      pa.field(schema.label, pa.float32())])


def _one_batch(table: pa.Table | pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    if isinstance(table, pa.RecordBatch):
        batches = [table]
    else:
        table = table.select(target.names)
        batches = table.to_batches()
        if len(batches) != 1:
            batches = table.combine_chunks().to_batches() or [pa.RecordBatch.from_pylist([], target)]
    rb = batches[0].select(target.names)
    return rb if rb.schema.equals(target) else rb.cast(target)


def _record_batch(data: Any, target: pa.Schema, batch_id: str) -> pa.RecordBatch:
    """``data`` as one record batch of exactly ``target``'s schema, or a ``PayloadError``."""
    if isinstance(data, pa.Table):
        data = _one_batch(data, target)
    if not isinstance(data, pa.RecordBatch):
        raise PayloadError(f"batch {batch_id}: expected an Arrow record batch, got "
                           f"{type(data).__name__}")
    if not data.schema.equals(target):
        raise PayloadError(f"batch {batch_id}: record batch schema {data.schema} is not "
                           f"the expected {target}")
    return data


@FORMATS.register("arrow")
class ArrowFormat(BatchFormat):
    """One Arrow record batch per batch: what a Flight server streams, and what Arrow's IPC
    (pickling a batch included) moves without a per-row or per-column Python step. With
    ``collate = "producer"`` it holds the collated tensors (fixed-size lists) and the trainer
    copies each tensor out in one pass (received Arrow buffers are read-only, and the model
    may write its inputs); with ``"trainer"`` it holds the feature columns and the trainer
    collates them (vectorised, ``to_arrays``)."""

    name = "arrow"

    def __init__(self, schema: FeatureSchema, collate: str) -> None:
        super().__init__(schema, collate)
        self.arrow = arrow_schema(schema, collate)

    def encode(self, table: pa.Table, batch_id: str, shared: bool | SlotAllocator) -> Any:
        if self.collate != "producer":
            return _one_batch(table, self.arrow)
        arrays = to_arrays(table, self.schema)
        cols = []
        for f in self.arrow:
            a = arrays[f.name]
            if f.name == "label":
                cols.append(pa.array(a))
            else:
                cols.append(pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)),
                                                              f.type.list_size))
        return pa.RecordBatch.from_arrays(cols, schema=self.arrow)

    def decode(self, data: Any, batch_id: str, rows: int | None = None) -> TensorBatch:
        data = _record_batch(data, self.arrow, batch_id)
        if self.collate != "producer":
            return check_batch(tensors(to_arrays(data, self.schema)), self.schema, batch_id,
                               rows)
        n = data.num_rows
        out: TensorBatch = {}
        for name, dt, shape in collated_fields(self.schema, n):
            if name == "label":
                arr = column_numpy(data.column("label"), np.float32)
            elif math.prod(shape[1:]) == 0:
                arr = np.empty(shape, dtype=dt)
            else:
                arr = column_numpy(data.column(name).flatten(), dt).reshape(shape)
            out[name] = torch.from_numpy(np.array(arr, dtype=dt, copy=True))
        return check_batch(out, self.schema, batch_id, rows)


class ArrowJaggedFormat(ArrowFormat):
    """The lossless Arrow wire: what an executor whose wire is Arrow (Flight) streams when the
    loader's format keeps every id (``jagged``, the default). The record batch holds the
    preprocessed feature columns, sequences as Arrow list arrays, which already are values +
    offsets: nothing is padded or cut on the way, and the trainer builds the ``jagged`` batch
    (``collate_jagged``: one copy per column, the ids concatenated feature-major with their
    offsets rebased), the dict a ``jagged`` loader hands the model. With either ``collate``
    the wire is the same (there is nothing to collate before the columns are jagged).

    Not a ``loader.batch_format`` a scenario chooses (``WIRE_FORMATS``, not ``FORMATS``):
    the user's choice is ``jagged``; this is how it crosses an Arrow wire."""

    name = "arrow_jagged"
    pads_sequences = False

    def __init__(self, schema: FeatureSchema, collate: str) -> None:
        BatchFormat.__init__(self, schema, collate)
        self.arrow = arrow_schema(schema, "trainer")

    def encode(self, table: pa.Table, batch_id: str, shared: bool | SlotAllocator) -> Any:
        return _one_batch(table, self.arrow)

    def decode(self, data: Any, batch_id: str, rows: int | None = None) -> TensorBatch:
        s = self.schema
        data = _record_batch(data, self.arrow, batch_id)
        cols: dict[str, Any] = {c: column_numpy(data.column(c), np.float32) for c in s.dense}
        cols.update({c: column_numpy(data.column(c), np.int64) for c in s.sparse})
        cols.update({c: seq_parts(data.column(c)) for c in s.sequence})
        cols[s.label] = column_numpy(data.column(s.label), np.float32)
        return check_jagged(tensors(collate_jagged(cols, s)), s, batch_id, rows)


# Formats only an executor's wire uses, never a scenario's ``loader.batch_format`` (so not in
# ``FORMATS``, which lists the user's choices): looked up by ``format_class``.
WIRE_FORMATS: dict[str, type[BatchFormat]] = {ArrowJaggedFormat.name: ArrowJaggedFormat}


def format_class(name: str) -> type[BatchFormat]:
    """The format called ``name``: a scenario's (``FORMATS``) or a wire's (``WIRE_FORMATS``)."""
    return WIRE_FORMATS[name] if name in WIRE_FORMATS else FORMATS.get(name)


def arrow_wire(batch_format: str) -> str:
    """The format an Arrow wire (Flight) carries for a loader's ``batch_format``: ``arrow``
    (padded, as the padded formats are) or, for a format that keeps every id, the lossless
    ``arrow_jagged``; one rule for server and trainer."""
    return "arrow" if FORMATS.get(batch_format).pads_sequences else ArrowJaggedFormat.name
