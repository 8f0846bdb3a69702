"""Batch formats: how a preprocessed Arrow table becomes what the trainer's model eats.

Whatever the format, the trainer ends with the same ``TensorBatch``:
``dense`` float32 (B, D), ``sparse`` int64 (B, S), ``seq`` int64 (B, Q, L) padded with -1,
``label`` float32 (B,). Formats differ only in where the work happens and what crosses the
process boundary, which is exactly what the field's optimisations change:

- ``rows``: per-row dicts, ``torch.utils.data.default_collate`` (the naive PyTorch baseline);
- ``columnar``: numpy columns -> tensors (zero-copy ``from_numpy``);
- ``single_buffer``: every tensor of a batch packed into one contiguous buffer with a small
  header (Pinterest/Yelp's trick), unpacked by the trainer as zero-copy views.
"""

from __future__ import annotations

import json
import struct
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..data.schema import FeatureSchema
from ..errors import PayloadError
from ..registry import Registry

TensorBatch = dict[str, torch.Tensor]
FORMATS: Registry[type["BatchFormat"]] = Registry("batch format")
PAD_ID = -1


# ------------------------------------------------------------------- arrow -> numpy helpers

def _np(col: pa.ChunkedArray | pa.Array, dtype: Any) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def seq_parts(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of a list column, offsets relative to the returned values."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.asarray(pc.list_flatten(arr).to_numpy(zero_copy_only=False), dtype=np.int64)
    return offsets, values


def pad_sequences(offsets: np.ndarray, values: np.ndarray, seq_len: int, out: np.ndarray) -> None:
    """Scatter variable-length rows into ``out`` (rows, seq_len), keeping each row's first
    ``seq_len`` items; vectorised (no Python loop over rows)."""
    out.fill(PAD_ID)
    lengths = np.diff(offsets)
    if values.size == 0:
        return
    row = np.repeat(np.arange(lengths.size), lengths)
    pos = np.arange(values.size) - offsets[:-1][row]
    keep = pos < seq_len
    out[row[keep], pos[keep]] = values[keep]


def to_arrays(table: pa.Table, schema: FeatureSchema) -> dict[str, np.ndarray]:
    """The collated numpy form of a batch (what ``TensorBatch`` wraps)."""
    n = table.num_rows
    dense = np.empty((n, len(schema.dense)), dtype=np.float32)
    for j, c in enumerate(schema.dense):
        dense[:, j] = _np(table[c], np.float32)
    sparse = np.empty((n, len(schema.sparse)), dtype=np.int64)
    for j, c in enumerate(schema.sparse):
        sparse[:, j] = _np(table[c], np.int64)
    seq = np.empty((n, len(schema.sequence), schema.seq_len), dtype=np.int64)
    for j, c in enumerate(schema.sequence):
        off, vals = seq_parts(table[c])
        pad_sequences(off, vals, schema.seq_len, seq[:, j, :])
    label = np.array(_np(table[schema.label], np.float32))  # writable: tensors may be written
    return {"dense": dense, "sparse": sparse, "seq": seq, "label": label}


def to_columns(table: pa.Table, schema: FeatureSchema) -> dict[str, Any]:
    """Uncollated columns: one numpy array per feature, sequences as (offsets, values)."""
    cols: dict[str, Any] = {}
    for c in schema.dense:
        cols[c] = _np(table[c], np.float32)
    for c in schema.sparse:
        cols[c] = _np(table[c], np.int64)
    for c in schema.sequence:
        cols[c] = seq_parts(table[c])
    cols[schema.label] = np.array(_np(table[schema.label], np.float32))
    return cols


def collate_columns(cols: dict[str, Any], schema: FeatureSchema) -> dict[str, np.ndarray]:
    n = len(cols[schema.label])
    dense = np.empty((n, len(schema.dense)), dtype=np.float32)
    for j, c in enumerate(schema.dense):
        dense[:, j] = cols[c]
    sparse = np.empty((n, len(schema.sparse)), dtype=np.int64)
    for j, c in enumerate(schema.sparse):
        sparse[:, j] = cols[c]
    seq = np.empty((n, len(schema.sequence), schema.seq_len), dtype=np.int64)
    for j, c in enumerate(schema.sequence):
        pad_sequences(*cols[c], schema.seq_len, seq[:, j, :])
    return {"dense": dense, "sparse": sparse, "seq": seq, "label": cols[schema.label]}


def tensors(arrays: dict[str, np.ndarray]) -> TensorBatch:
    return {k: torch.from_numpy(v) for k, v in arrays.items()}


def nbytes(obj: Any) -> int:
    """Bytes of array data in a payload (pickle framing excluded)."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.generic):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 8


# --------------------------------------------------------------------------------- formats

class BatchFormat:
    """``encode`` runs in the producer, ``decode`` in the trainer; both are timed as transfer."""

    name: ClassVar[str]

    def __init__(self, schema: FeatureSchema, collate: str) -> None:
        self.schema = schema
        self.collate = collate

    def encode(self, table: pa.Table, batch_id: str, shared: bool) -> Any:
        raise NotImplementedError

    def decode(self, data: Any, batch_id: str) -> TensorBatch:
        raise NotImplementedError


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
        flat = {**{c: cols[c] for c in (*s.dense, *s.sparse, s.label)}, **seq}
        names = list(flat)
        arrays = [flat[c] for c in names]
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

    def encode(self, table: pa.Table, batch_id: str, shared: bool) -> Any:
        rows = self._rows(table)
        if self.collate == "producer":
            return self._assemble(torch.utils.data.default_collate(rows))
        return rows

    def decode(self, data: Any, batch_id: str) -> TensorBatch:
        if isinstance(data, dict):
            return data
        if not isinstance(data, list) or not data:
            raise PayloadError(f"batch {batch_id}: expected a non-empty list of rows")
        return self._assemble(torch.utils.data.default_collate(data))


@FORMATS.register("columnar")
class ColumnarFormat(BatchFormat):
    name = "columnar"

    def encode(self, table: pa.Table, batch_id: str, shared: bool) -> Any:
        if self.collate == "producer":
            return tensors(to_arrays(table, self.schema))
        return to_columns(table, self.schema)

    def decode(self, data: Any, batch_id: str) -> TensorBatch:
        if self.collate == "producer":
            return data
        return tensors(collate_columns(data, self.schema))


_MAGIC = b"SBB1"
_ALIGN = 64
_FIELDS = ("dense", "sparse", "seq", "label")
_DTYPES = {"float32": torch.float32, "int64": torch.int64}


def pack(arrays: dict[str, np.ndarray], batch_id: str, shared: bool = False) -> torch.Tensor:
    """All arrays of a batch in one uint8 tensor: magic, header length, JSON header, data.

    With ``shared`` the buffer is allocated in shared memory up front, so handing it to another
    process costs a file descriptor, not a copy of every tensor.
    """
    fields, offset = [], 0
    for name in _FIELDS:
        a = arrays[name]
        fields.append({"name": name, "dtype": str(a.dtype), "shape": list(a.shape),
                       "offset": offset, "nbytes": a.nbytes})
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
    header = json.dumps({"batch": batch_id, "fields": fields, "data_bytes": offset}).encode()
    start = -(-(8 + len(header)) // _ALIGN) * _ALIGN
    total = start + offset
    if shared:
        buf = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(total))
    else:
        buf = torch.empty(total, dtype=torch.uint8)
    view = buf.numpy()
    view[:4] = np.frombuffer(_MAGIC, dtype=np.uint8)
    view[4:8] = np.frombuffer(struct.pack("<I", len(header)), dtype=np.uint8)
    view[8:8 + len(header)] = np.frombuffer(header, dtype=np.uint8)
    for f, name in zip(fields, _FIELDS):
        a = np.ascontiguousarray(arrays[name])
        lo = start + f["offset"]
        view[lo:lo + f["nbytes"]] = a.reshape(-1).view(np.uint8)
    return buf


def unpack(buf: torch.Tensor | bytes | bytearray | memoryview, batch_id: str = "?") -> TensorBatch:
    """Zero-copy tensor views into ``buf``; every structural check fails loudly, naming the
    batch, rather than producing a garbage tensor."""
    if not isinstance(buf, torch.Tensor):
        buf = torch.frombuffer(bytearray(buf), dtype=torch.uint8) if len(buf) else torch.empty(0, dtype=torch.uint8)
    n = buf.numel()
    raw = buf.numpy()
    if n < 8 or raw[:4].tobytes() != _MAGIC:
        raise PayloadError(f"batch {batch_id}: single-buffer payload has a bad magic number")
    (hlen,) = struct.unpack("<I", raw[4:8].tobytes())
    if 8 + hlen > n:
        raise PayloadError(f"batch {batch_id}: header length {hlen} exceeds payload of {n} bytes")
    try:
        header = json.loads(raw[8:8 + hlen].tobytes())
        fields = header["fields"]
    except (ValueError, KeyError, TypeError):
        raise PayloadError(f"batch {batch_id}: single-buffer header is not valid") from None
    bid = header.get("batch", batch_id)
    start = -(-(8 + hlen) // _ALIGN) * _ALIGN
    if start + int(header.get("data_bytes", -1)) != n:
        raise PayloadError(f"batch {bid}: payload is {n} bytes, header says "
                           f"{start + int(header.get('data_bytes', 0))}")
    out: TensorBatch = {}
    for f in fields:
        try:
            dtype = _DTYPES[f["dtype"]]
            shape = [int(x) for x in f["shape"]]
            lo, nb = start + int(f["offset"]), int(f["nbytes"])
        except (KeyError, TypeError, ValueError):
            raise PayloadError(f"batch {bid}: bad field entry {f!r} in header") from None
        count = int(np.prod(shape)) if shape else 1
        if nb != count * torch.empty(0, dtype=dtype).element_size() or lo < start or lo + nb > n:
            raise PayloadError(f"batch {bid}: field {f.get('name')!r} does not fit the payload")
        out[f["name"]] = buf[lo:lo + nb].view(dtype).view(shape)
    missing = set(_FIELDS) - set(out)
    if missing:
        raise PayloadError(f"batch {bid}: single-buffer payload lacks {sorted(missing)}")
    return out


@FORMATS.register("single_buffer")
class SingleBufferFormat(BatchFormat):
    name = "single_buffer"

    def encode(self, table: pa.Table, batch_id: str, shared: bool) -> Any:
        return pack(to_arrays(table, self.schema), batch_id, shared=shared)

    def decode(self, data: Any, batch_id: str) -> TensorBatch:
        return unpack(data, batch_id)
