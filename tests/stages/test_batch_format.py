"""Batch formats: correct conversion, zero-copy single buffers, and loud failure on corruption.

A corrupt single-buffer payload must raise ``PayloadError`` naming the batch; it must never
decode into a tensor of garbage. Each corruption below is built byte by byte from a good
payload, so the test knows exactly what is wrong with it.
"""

from __future__ import annotations

import json
import os
import pickle
import struct

import numpy as np
import pyarrow as pa
import pytest
import torch

from stallbench.data.schema import FeatureSchema
from stallbench.errors import PayloadError
from stallbench.stages import batch_format as bf
from stallbench.stages import buffers
from stallbench.stages.buffers import BufferPool, PooledBuffer

SCHEMA = FeatureSchema(dense=("d0", "d1"), sparse=("s0",), sequence=("q0", "q1"), label="y",
                       seq_len=3)


def _table(n: int = 6, offset: int = 0) -> pa.Table:
    """A canonical table; sequences of lengths 0..4 (some longer than seq_len = 3)."""
    rng = np.random.default_rng(0)
    seqs = [[int(x) for x in rng.integers(0, 100, i % 5)] for i in range(n + offset)]
    t = pa.table({
        "d0": pa.array(np.arange(n + offset, dtype=np.float32)),
        "d1": pa.array(np.arange(n + offset, dtype=np.float32) * 10),
        "s0": pa.array(np.arange(n + offset, dtype=np.int64) + 1000),
        "q0": pa.array(seqs, pa.list_(pa.int64())),
        "q1": pa.array(seqs[::-1], pa.list_(pa.int64())),
        "y": pa.array((np.arange(n + offset) % 2).astype(np.float32)),
    })
    return t.slice(offset, n)


def _expected(table: pa.Table) -> dict[str, np.ndarray]:
    """Row-by-row Python: the independent truth."""
    rows = table.to_pylist()
    seq = np.full((len(rows), 2, 3), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        for j, c in enumerate(("q0", "q1")):
            items = r[c][:3]
            seq[i, j, :len(items)] = items
    return {"dense": np.array([[r["d0"], r["d1"]] for r in rows], dtype=np.float32).reshape(-1, 2),
            "sparse": np.array([[r["s0"]] for r in rows], dtype=np.int64).reshape(-1, 1),
            "seq": seq, "label": np.array([r["y"] for r in rows], dtype=np.float32)}


def _same(batch: dict[str, torch.Tensor], want: dict[str, np.ndarray]) -> None:
    assert set(batch) == set(want)
    for k, v in want.items():
        assert batch[k].dtype == torch.from_numpy(v).dtype, k
        np.testing.assert_array_equal(batch[k].numpy(), v, err_msg=k)


# ----------------------------------------------------------------------------- conversion

@pytest.mark.parametrize("offset", [0, 3])     # sliced tables: Arrow offsets must be honoured
def test_to_arrays_matches_row_by_row_truth(offset: int) -> None:
    t = _table(7, offset)
    _same(bf.tensors(bf.to_arrays(t, SCHEMA)), _expected(t))


def test_multi_chunk_and_non_canonical_columns_convert_too() -> None:
    t = _table(8)
    chunked = pa.Table.from_batches(t.to_batches(max_chunksize=3))
    assert chunked.column("q0").num_chunks == 3
    _same(bf.tensors(bf.to_arrays(chunked, SCHEMA)), _expected(t))
    as_f64 = t.set_column(0, "d0", t.column("d0").cast(pa.float64()))
    _same(bf.tensors(bf.to_arrays(as_f64, SCHEMA)), _expected(t))


def test_pad_sequences_pads_and_truncates() -> None:
    offsets = np.array([0, 0, 2, 7], dtype=np.int64)
    values = np.arange(7, dtype=np.int64)
    out = np.empty((3, 4), dtype=np.int64)
    bf.pad_sequences(offsets, values, 4, out)
    assert out.tolist() == [[-1, -1, -1, -1], [0, 1, -1, -1], [2, 3, 4, 5]]
    strided = np.zeros((3, 2, 4), dtype=np.int64)
    bf.pad_sequences(offsets, values, 4, strided[:, 1, :])
    assert strided[:, 1, :].tolist() == out.tolist() and not strided[:, 0, :].any()


def test_zero_copy_columns_and_empty_tables() -> None:
    t = _table(5)
    arr = t.column("d0").chunk(0)
    view = bf.column_numpy(t.column("d0"), np.float32)
    assert view.ctypes.data == arr.buffers()[1].address     # no copy of canonical columns
    empty = bf.to_arrays(t.slice(0, 0), SCHEMA)
    assert empty["seq"].shape == (0, 2, 3) and empty["label"].shape == (0,)


@pytest.mark.parametrize("fmt", ["rows", "columnar", "single_buffer", "arrow"])
@pytest.mark.parametrize("collate", ["producer", "trainer"])
def test_every_format_and_collate_side_decodes_to_the_truth(fmt: str, collate: str) -> None:
    t = _table(9, 2)
    f = bf.FORMATS.get(fmt)(SCHEMA, collate)
    data = f.encode(t, "7:1", shared=False)
    data = pickle.loads(pickle.dumps(data))          # as if it crossed a process boundary
    batch = f.decode(data, "7:1", rows=9)
    _same(batch, _expected(t))
    for v in batch.values():                          # the model may write its inputs
        assert v.numpy().flags.writeable


def test_single_buffer_collates_where_asked() -> None:
    """producer: the buffer holds the four batch tensors; trainer: one field per column."""
    t = _table(4)
    prod = bf.unpack_fields(bf.FORMATS.get("single_buffer")(SCHEMA, "producer").encode(t, "b", False))
    assert sorted(prod) == ["dense", "label", "seq", "sparse"]
    train = bf.unpack_fields(bf.FORMATS.get("single_buffer")(SCHEMA, "trainer").encode(t, "b", False))
    assert "col:d0" in train and "seq:q0:offsets" in train and "seq:q0:values" in train
    assert "dense" not in train


def test_unpack_is_zero_copy() -> None:
    buf = bf.pack(bf.to_arrays(_table(4), SCHEMA), "b")
    out = bf.unpack(buf, "b")
    lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel()
    assert all(lo <= t.data_ptr() < hi for t in out.values())
    assert all(t.data_ptr() % 64 == 0 for t in out.values())


def test_pooled_buffers_recycle_their_slot() -> None:
    pool = BufferPool(partitions=1, slots=2, slot_bytes=1 << 16)
    alloc = pool.allocator(0, fallback_shared=False)
    f = bf.FORMATS.get("single_buffer")(SCHEMA, "producer")
    refs = [f.encode(_table(4), f"b{i}", alloc) for i in range(3)]
    assert isinstance(refs[0], PooledBuffer) and isinstance(refs[1], PooledBuffer)
    assert isinstance(refs[2], torch.Tensor)         # pool full: ordinary memory, no waiting
    batch = f.decode(refs[0], "b0", 4)
    _same(batch, _expected(_table(4)))
    assert pool.state[refs[0].slot] == 1
    del batch
    assert pool.state[refs[0].slot] == 0             # released with its last tensor
    assert isinstance(f.encode(_table(4), "b3", alloc), PooledBuffer)
    pool.close()
    with pytest.raises(PayloadError, match="batch b1"):
        f.decode(refs[1], "b1", 4)


def _mapped_kb(pool: BufferPool) -> int:
    """Resident KiB of the pool's mapping in this process's page tables (/proc/self/smaps)."""
    start = pool.data.ctypes.data - (len(pool._map) - pool.data.nbytes)
    with open("/proc/self/smaps") as fh:
        lines = fh.read().splitlines()
    for i, line in enumerate(lines):
        lo = line.split("-", 1)[0]
        if " " not in lo and int(lo, 16) == start:
            for rss in lines[i + 1:]:
                if rss.startswith("Rss:"):
                    return int(rss.split()[1])
    raise AssertionError("the pool's mapping is not in /proc/self/smaps")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux /proc")
@pytest.mark.parametrize("how", ["madvise", "a read per page"])
def test_a_slot_is_mapped_in_a_forked_worker_before_it_is_written(
        how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork does not copy a shared mapping's page-table entries, so a freshly forked loader
    worker used to fault in every 4 KiB page of a slot as it wrote it; ``take`` maps the
    slot's pages in one call first (``MADV_POPULATE_READ``; where the kernel refuses it, a
    read per page). Ground truth from the kernel: the child's resident pages of the pool
    before and after ``take``, nothing written."""
    if how != "madvise":
        monkeypatch.setattr(buffers, "_MADV_POPULATE_READ", -1)   # refused: EINVAL
    pool = BufferPool(partitions=1, slots=2, slot_bytes=1 << 22)
    pool.data[:] = 1                                   # the trainer's pages exist (a past run)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # a loader worker, forked afresh
        code = 1
        try:
            before = _mapped_kb(pool)
            _, ref = pool.take(0, 1 << 20)
            small = _mapped_kb(pool)
            pool._release(ref.slot)                    # the same slot again, for a bigger batch
            view, ref2 = pool.take(0, 3 << 20)
            assert ref2.slot == ref.slot
            after = _mapped_kb(pool)
            os.write(w, f"{before} {small} {after} {view.nbytes // 1024}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    got = os.read(r, 100).decode().split()
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, got
    before, small, after, taken = map(int, got)
    assert before < taken // 8                         # the fork mapped (almost) nothing
    assert 1024 <= small - before < taken              # what the batch needs, not the slot
    assert after - before >= taken                     # then the rest, before any write
    pool.close()


# ------------------------------------------------------------------------------ corruption

def _good(batch_id: str = "3:2") -> bytes:
    return bf.pack(bf.to_arrays(_table(4), SCHEMA), batch_id).numpy().tobytes()


def _split(raw: bytes) -> tuple[dict, bytes]:
    (hlen,) = struct.unpack("<I", raw[4:8])
    header = json.loads(raw[8:8 + hlen])
    start = -(-(8 + hlen) // 64) * 64
    return header, raw[start:]


def _join(header: dict, data: bytes) -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    start = -(-(8 + len(h)) // 64) * 64
    return b"SBB1" + struct.pack("<I", len(h)) + h + bytes(start - 8 - len(h)) + data


def _edit_field(raw: bytes, field: str, **changes: object) -> bytes:
    header, data = _split(raw)
    for f in header["fields"]:
        if f["name"] == field:
            f.update(changes)
    return _join(header, data)


def test_the_test_helpers_rebuild_a_good_payload() -> None:
    raw = _good()
    assert _join(*_split(raw)) == raw
    _same(bf.unpack(raw, "3:2"), _expected(_table(4)))


CORRUPTIONS = {
    "bad magic": (lambda r: b"XXXX" + r[4:], "bad magic"),
    "empty": (lambda r: b"", "bad magic"),
    "header length beyond payload": (lambda r: r[:4] + struct.pack("<I", 10**9) + r[8:],
                                     "header length"),
    "header not JSON": (lambda r: r[:8] + b"#" + r[9:], "header is not valid"),
    "header not UTF-8": (lambda r: r[:8] + b"\xff" + r[9:], "header is not valid"),
    "header missing fields": (lambda r: _join({"batch": "3:2", "data_bytes": 0}, b""),
                              "header is not valid"),
    "truncated": (lambda r: r[:-8], "truncated"),
    "extra bytes": (lambda r: r + b"\0" * 64, "extra bytes"),
    "field beyond data": (lambda r: _edit_field(r, "label", offset=10**6), "does not fit"),
    "field size lies": (lambda r: _edit_field(r, "dense", nbytes=8), "does not fit"),
    "negative dim": (lambda r: _edit_field(r, "label", shape=[-4]), "does not fit"),
    "bool as int": (lambda r: _edit_field(r, "label", offset=True), "bad field"),
    "unknown dtype": (lambda r: _edit_field(r, "label", dtype="complex64"), "bad field"),
    "misaligned offset": (lambda r: _edit_field(r, "label", offset=2), "does not fit"),
    "overlapping fields": (lambda r: _edit_field(r, "label", offset=0), "overlap"),
    "duplicate field": (lambda r: _edit_field(r, "label", name="dense"), "twice"),
    "missing field": (lambda r: _edit_field(r, "label", name="other"), "lacks"),
    "wrong batch": (lambda r: bytes(bf.pack(bf.to_arrays(_table(4), SCHEMA), "9:9").numpy()),
                    "packed for batch '9:9'"),
    "shape disagrees with schema": (lambda r: _edit_field(r, "dense", shape=[2, 4]),
                                    "expected torch.float32"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_single_buffer_raises_naming_the_batch(case: str) -> None:
    corrupt, message = CORRUPTIONS[case]
    raw = corrupt(_good())
    f = bf.FORMATS.get("single_buffer")(SCHEMA, "producer")
    for data in (raw, torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else raw):
        with pytest.raises(PayloadError, match=message) as err:
            f.decode(data, "3:2", rows=4)
        assert "batch 3:2" in str(err.value)


def test_corrupt_uncollated_single_buffer_is_refused() -> None:
    f = bf.FORMATS.get("single_buffer")(SCHEMA, "trainer")
    raw = bytes(f.encode(_table(4), "1:0", False).numpy())
    header, data = _split(raw)
    off = next(x for x in header["fields"] if x["name"] == "seq:q0:offsets")
    bad = bytearray(data)
    bad[off["offset"] + 8:off["offset"] + 16] = struct.pack("<q", 999)   # offsets jump
    with pytest.raises(PayloadError, match="batch 1:0.*inconsistent offsets"):
        f.decode(_join(header, bytes(bad)), "1:0", rows=4)
    with pytest.raises(PayloadError, match="batch 1:0.*lacks field 'col:d1'"):
        f.decode(_edit_field(raw, "col:d1", name="col:zz"), "1:0", rows=4)
    with pytest.raises(PayloadError, match="batch 1:0: column .d0."):
        f.decode(raw, "1:0", rows=5)                  # rows disagree with the payload
    with pytest.raises(PayloadError, match="batch 1:0: column .d0."):
        f.decode(_edit_field(raw, "col:d0", dtype="int32", nbytes=16), "1:0", rows=4)


def test_non_buffer_payloads_are_refused() -> None:
    f = bf.FORMATS.get("single_buffer")(SCHEMA, "producer")
    for bad in ({"dense": 1}, torch.zeros(3, dtype=torch.float32), torch.zeros((2, 8), dtype=torch.uint8)):
        with pytest.raises(PayloadError, match="batch 5:5"):
            f.decode(bad, "5:5")
    for fmt in ("columnar", "rows"):
        g = bf.FORMATS.get(fmt)(SCHEMA, "producer")
        with pytest.raises(PayloadError, match="batch 5:5"):
            g.decode([1, 2], "5:5", rows=2)
        with pytest.raises(PayloadError, match="batch 5:5"):
            g.decode({"dense": torch.zeros(2, 2)}, "5:5", rows=2)
    with pytest.raises(PayloadError, match="batch 5:5"):
        bf.FORMATS.get("rows")(SCHEMA, "trainer").decode([], "5:5")


# ---------------------------------------------------------------------------------- arrow

def test_arrow_batches_carry_collated_tensors_or_the_columns() -> None:
    t = _table(5, 1)
    prod = bf.FORMATS.get("arrow")(SCHEMA, "producer").encode(t, "b", False)
    assert prod.schema.names == ["dense", "sparse", "seq", "label"]
    assert prod.schema.field("seq").type == pa.list_(pa.int64(), 2 * 3)   # Q * L per row
    train = bf.FORMATS.get("arrow")(SCHEMA, "trainer").encode(t, "b", False)
    assert train.schema.names == ["d0", "d1", "s0", "q0", "q1", "y"] and train.num_rows == 5
    # what crosses a process boundary: Arrow IPC, measured as the IPC message's size
    assert bf.nbytes(prod) == pa.ipc.get_record_batch_size(prod) > 5 * (2 * 4 + 8 + 6 * 8)


def test_arrow_without_dense_or_sequences_rebuilds_empty_tensors() -> None:
    schema = FeatureSchema(dense=(), sparse=("s0",), sequence=(), label="y", seq_len=3)
    t = _table(4).select(["s0", "y"])
    f = bf.FORMATS.get("arrow")(schema, "producer")
    batch = f.decode(f.encode(t, "b", False), "b", rows=4)
    assert batch["dense"].shape == (4, 0) and batch["seq"].shape == (4, 0, 3)
    np.testing.assert_array_equal(batch["sparse"].numpy()[:, 0], np.arange(4) + 1000)


def test_arrow_payloads_of_another_shape_are_refused() -> None:
    f = bf.FORMATS.get("arrow")(SCHEMA, "producer")
    good = f.encode(_table(4), "b", False)
    with pytest.raises(PayloadError, match="batch 2:0: record batch schema"):
        f.decode(good.drop_columns(["seq"]), "2:0", rows=4)
    with pytest.raises(PayloadError, match="batch 2:0: expected an Arrow record batch"):
        f.decode({"dense": torch.zeros(2, 2)}, "2:0", rows=2)
    with pytest.raises(PayloadError, match="batch 2:0: 'dense' is .* expected .*\(5, 2\)"):
        f.decode(good, "2:0", rows=5)                  # rows disagree with the payload
