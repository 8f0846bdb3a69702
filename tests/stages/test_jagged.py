"""The jagged batch format: sequences as values + offsets, never cut, never padded.

Ground truth is built row by row in plain Python from the Arrow table (feature-major values,
offsets per feature and row), independently of the format's vectorised code. The padded and
jagged forms must carry the same ids wherever no sequence is cut, and the DLRM must pool them
to the same vectors; a dataset whose sequences a padded format cuts must say so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from stallbench import scenario
from stallbench.report import tables
from stallbench.data.schema import FeatureSchema
from stallbench.errors import PayloadError
from stallbench.run.runner import RunOptions, run_scenario
from stallbench.scenario import LoaderSpec, ModelSpec
from stallbench.stages import batch_format as bf
from stallbench.stages.buffers import BufferPool, PooledBuffer
from stallbench.stages.compute import DLRM
from stallbench.stages.transfer import Transfer

SCHEMA = FeatureSchema(dense=("d0", "d1"), sparse=("s0",), sequence=("q0", "q1", "q2"),
                       label="y", seq_len=6)


def _table(n: int = 9, max_len: int = 6, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    seqs = {q: [[int(x) for x in rng.integers(0, 10**6, rng.integers(0, max_len + 1))]
                for _ in range(n)] for q in SCHEMA.sequence}
    return pa.table({
        "d0": pa.array(rng.random(n, dtype=np.float32)),
        "d1": pa.array(rng.random(n, dtype=np.float32)),
        "s0": pa.array(rng.integers(0, 1000, n)),
        **{q: pa.array(v, pa.list_(pa.int64())) for q, v in seqs.items()},
        "y": pa.array((np.arange(n) % 2).astype(np.float32)),
    })


def _expected(table: pa.Table) -> dict[str, np.ndarray]:
    rows = table.to_pylist()
    values, offsets = [], [0]
    for q in SCHEMA.sequence:
        for r in rows:
            values.extend(r[q])
            offsets.append(len(values))
    return {"dense": np.array([[r["d0"], r["d1"]] for r in rows], dtype=np.float32),
            "sparse": np.array([[r["s0"]] for r in rows], dtype=np.int64),
            "label": np.array([r["y"] for r in rows], dtype=np.float32),
            "seq_offsets": np.array(offsets, dtype=np.int64),
            "seq_values": np.array(values, dtype=np.int64)}


def _host(batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.cpu().numpy() for k, v in batch.items()}


@pytest.mark.parametrize("collate", ["producer", "trainer"])
@pytest.mark.parametrize("where", ["private", "shared", "pool"])
def test_jagged_batches_match_row_by_row_truth(collate: str, where: str) -> None:
    fmt = bf.FORMATS.get("jagged")(SCHEMA, collate)
    assert fmt.contiguous_buffer and fmt.poolable and not fmt.pads_sequences
    table = _table(n=9, max_len=14)          # longer than seq_len: jagged keeps every id
    pool = BufferPool(1, 2, fmt.slot_bytes(9)) if where == "pool" else None
    shared = pool.allocator(0) if pool else where == "shared"
    data = fmt.encode(table, "3:1", shared)
    assert isinstance(data, PooledBuffer) == (where == "pool")
    got = _host(fmt.decode(data, "3:1", 9))
    want = _expected(table)
    assert set(got) == set(want) == set(bf.JAGGED)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    assert got["seq_values"].size > 9 * 3 * SCHEMA.seq_len * 0.5   # not cut to 6 per row


@pytest.mark.parametrize("collate", ["producer", "trainer"])
def test_the_arrow_jagged_wire_matches_row_by_row_truth(collate: str) -> None:
    """What Flight streams for the default format: an Arrow record batch that survives IPC
    (written and read back, as the socket does) and decodes to the jagged batch, every id,
    into fresh writable tensors (received Arrow buffers are read-only)."""
    fmt = bf.format_class("arrow_jagged")(SCHEMA, collate)
    assert "arrow_jagged" not in bf.FORMATS and not fmt.pads_sequences
    assert bf.arrow_wire("jagged") == "arrow_jagged" and bf.arrow_wire("columnar") == "arrow"
    table = _table(n=9, max_len=14)
    sink = pa.BufferOutputStream()
    rb = fmt.encode(table.slice(2, 7), "3:1", True)
    with pa.ipc.new_stream(sink, rb.schema) as w:
        w.write_batch(rb)
    received = pa.ipc.open_stream(sink.getvalue()).read_next_batch()
    batch = fmt.decode(received, "3:1", 7)
    got, want = _host(batch), _expected(table.slice(2, 7))
    assert set(got) == set(want)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    batch["seq_values"][0] = -5                         # writable, not the wire's memory
    with pytest.raises(PayloadError, match="3:2.*schema"):
        fmt.decode(bf.FORMATS.get("arrow")(SCHEMA, "producer").encode(table, "3:2", False), "3:2")


def test_padded_and_jagged_carry_the_same_ids_where_nothing_is_cut() -> None:
    table = _table(n=40, max_len=SCHEMA.seq_len, seed=3)     # no sequence longer than seq_len
    padded = _host(bf.FORMATS.get("single_buffer")(SCHEMA, "producer").decode(
        bf.FORMATS.get("single_buffer")(SCHEMA, "producer").encode(table, "0:0", False), "0:0"))
    jf = bf.FORMATS.get("jagged")(SCHEMA, "producer")
    jagged = _host(jf.decode(jf.encode(table, "0:0", False), "0:0"))
    n, q = 40, len(SCHEMA.sequence)
    off, vals = jagged["seq_offsets"], jagged["seq_values"]
    for j in range(q):
        for i in range(n):
            ids = vals[off[j * n + i]:off[j * n + i + 1]]
            row = padded["seq"][i, j]
            np.testing.assert_array_equal(row[:ids.size], ids)
            assert (row[ids.size:] == bf.PAD_ID).all()
    assert (padded["seq"] != bf.PAD_ID).sum() == vals.size
    for k in ("dense", "sparse", "label"):
        np.testing.assert_array_equal(padded[k], jagged[k])
    # the jagged copy is smaller: it carries the ids, not the padding
    assert jagged["seq_values"].nbytes + jagged["seq_offsets"].nbytes < padded["seq"].nbytes


def test_dlrm_pools_padded_and_jagged_batches_alike() -> None:
    """Same ids in, same logits out: the model takes the jagged form directly (EmbeddingBag
    with offsets) and the padded one with the padding excluded from the mean."""
    table = _table(n=32, max_len=SCHEMA.seq_len, seed=5)
    sb = bf.FORMATS.get("single_buffer")(SCHEMA, "producer")
    jf = bf.FORMATS.get("jagged")(SCHEMA, "producer")
    padded = sb.decode(sb.encode(table, "0:0", False), "0:0")
    jagged = jf.decode(jf.encode(table, "0:0", False), "0:0")
    torch.manual_seed(0)
    model = DLRM(ModelSpec(embedding_rows=1000, embedding_dim=8), SCHEMA)
    a, b = model(padded), model(jagged)
    torch.testing.assert_close(a, b)
    # and the gradients reach the same embedding rows
    a.sum().backward()
    grad_p = model.seq.weight.grad.coalesce()
    model.zero_grad(set_to_none=True)
    model(jagged).sum().backward()
    grad_j = model.seq.weight.grad.coalesce()
    assert torch.equal(grad_p.indices(), grad_j.indices())
    torch.testing.assert_close(grad_p.values(), grad_j.values())


def _bad_offsets(change: str) -> bytes:
    arrays = {k: v.copy() for k, v in _expected(_table()).items()}
    if change == "decreasing":
        arrays["seq_offsets"][3], arrays["seq_offsets"][4] = arrays["seq_offsets"][4] + 1, 0
    elif change == "short":
        arrays["seq_offsets"][-1] -= 1
    elif change == "start":
        arrays["seq_offsets"][0] = 1
    elif change == "missing":
        del arrays["seq_values"]
    return bytes(bf.pack(arrays, "7:0").numpy())


@pytest.mark.parametrize("change", ["decreasing", "short", "start", "missing"])
def test_inconsistent_jagged_payload_raises_naming_the_batch(change: str) -> None:
    fmt = bf.FORMATS.get("jagged")(SCHEMA, "producer")
    with pytest.raises(PayloadError, match="batch 7:0"):
        fmt.decode(_bad_offsets(change), "7:0")


# ------------------------------------------------------------- cut sequences are reported

def _long_sequences(tmp_path: Path) -> Path:
    """Existing data (not stallbench's generator): lengths uniform in 0..29, as in files
    where the default sequence_max_len = 20 silently cut the tails."""
    rng = np.random.default_rng(7)
    n = 2048
    table = pa.table({
        "f": pa.array(rng.random(n, dtype=np.float32)),
        "cat": pa.array(rng.integers(0, 100, n)),
        "hist": pa.array([rng.integers(0, 1000, rng.integers(0, 30)).tolist() for _ in range(n)],
                         pa.list_(pa.int64())),
        "label": pa.array((rng.random(n) < 0.3).astype(np.float32)),
    })
    path = tmp_path / "long.parquet"
    pq.write_table(table, path, row_group_size=1024)
    return path


def test_a_padded_run_that_cuts_sequences_says_so(tmp_path: Path) -> None:
    data = _long_sequences(tmp_path)
    text = f"""
name = "cut"
[dataset]
path = "{data}"
[model]
kind = "emulated"
[loader]
batch_size = 512
[analysis]
differential = false
[matrix]
"loader.batch_format" = ["single_buffer", "jagged"]
"""
    result = run_scenario(scenario.parse(text, "cut.toml"), RunOptions(cache_dir=tmp_path,
                                                                       progress=False))
    padded, jagged = result.variants
    cut = padded.repeats[0].sequence_cut
    lengths = np.diff(pq.read_table(data)["hist"].combine_chunks().offsets.to_numpy())
    assert cut is not None and cut.seq_len == 20
    assert (cut.sequences, cut.sequences_cut, cut.ids, cut.ids_cut, cut.longest) == (
        lengths.size, int((lengths > 20).sum()), int(lengths.sum()),
        int((lengths - 20).clip(0).sum()), int(lengths.max()))
    note = padded.notes["dataset.sequence_max_len"]
    assert note.startswith("WARNING") and "dataset.sequence_max_len = 20" in note
    assert f"{cut.sequences_cut:,} of {cut.sequences:,}" in note
    assert jagged.repeats[0].sequence_cut is None and "dataset.sequence_max_len" not in jagged.notes
    lines = tables.warnings(result)
    assert len(lines) == 1 and lines[0].startswith("batch_format=single_buffer: WARNING")


def test_jagged_transfer_round_trip_through_zstd() -> None:
    t = Transfer(LoaderSpec(batch_size=64, batch_format="jagged", compression="zstd"), SCHEMA)
    table = _table(n=64, max_len=30)
    p = t.send(table, "1:0", shared=False)
    assert p.compressed
    got = _host(t.receive(p))
    for k, v in _expected(table).items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.mark.parametrize("batch", [1, 4, 7, 40])
def test_a_table_encoded_at_once_is_byte_identical_to_batch_by_batch(batch: int) -> None:
    """``encode_table`` (columns looked up once per table) gives exactly the buffers that
    ``encode`` gives each slice, header included: for a table of two chunks, a ragged last
    batch, empty sequences and a batch larger than the table."""
    t = pa.concat_tables([_table(n=9, max_len=14, seed=1), _table(n=14, max_len=3, seed=2)])
    assert t.column("q0").num_chunks == 2
    fmt = bf.FORMATS.get("jagged")(SCHEMA, "producer")
    whole = fmt.encode_table(t, batch, "5", False)
    parts = [fmt.encode(t.slice(lo, batch), f"5:{i}", False)
             for i, lo in enumerate(range(0, t.num_rows, batch))]
    assert [r for r, _ in whole] == [min(batch, t.num_rows - lo) for lo in range(0, t.num_rows, batch)]
    assert len(whole) == len(parts)
    for i, ((_, a), b) in enumerate(zip(whole, parts)):
        fa, fb = bf.unpack_fields(a, f"5:{i}"), bf.unpack_fields(b, f"5:{i}")
        head = 8 + int.from_bytes(b.numpy()[4:8].tobytes(), "little")
        assert a.numpy()[:head].tobytes() == b.numpy()[:head].tobytes() and a.numel() == b.numel()
        assert fa.keys() == fb.keys()
        for k in fa:      # every field's bytes (alignment gaps between fields are never read)
            assert fa[k].numpy().tobytes() == fb[k].numpy().tobytes(), k
    t2 = Transfer(LoaderSpec(batch_size=batch, batch_format="jagged"), SCHEMA)
    sent = t2.send_table(t, "5", shared=False)
    assert [(p.batch_id, p.rows, p.raw_bytes) for p in sent] == [
        (p.batch_id, p.rows, p.raw_bytes) for p in
        (t2.send(b, f"5:{i}", shared=False) for i, b in enumerate(t2.split(t)))]
    assert bf.FORMATS.get("jagged")(SCHEMA, "trainer").encode_table(t, batch, "5", False) is None


@pytest.mark.parametrize("batch", [1, 7, 40])
def test_a_local_batch_is_the_decoded_batch_with_nothing_to_decode(batch: int) -> None:
    """With 0 workers (``local``), ``encode_table`` hands over the very dict ``decode`` gives
    for the packed buffer (same keys in the same order, dtypes, shapes, strides and values;
    ``dense``/``sparse`` the same transposed views), as a final payload the trainer returns
    untouched; compressed, the payload stays a buffer. A pool slot is held while any of the
    batch's tensors lives and freed when the last one goes."""
    t = pa.concat_tables([_table(n=9, max_len=14, seed=1), _table(n=14, max_len=3, seed=2)])
    fmt = bf.FORMATS.get("jagged")(SCHEMA, "producer")
    packed = fmt.encode_table(t, batch, "5", False)
    local = fmt.encode_table(t, batch, "5", False, local=True)
    assert [r for r, _ in local] == [r for r, _ in packed]
    for i, ((_, buf), (_, lb)) in enumerate(zip(packed, local)):
        assert isinstance(lb, bf.LocalBatch) and not lb.pooled
        want = fmt.decode(buf, f"5:{i}")
        assert list(lb.batch) == list(want)
        for k, v in want.items():
            got = lb.batch[k]
            assert (got.dtype, got.shape, got.stride()) == (v.dtype, v.shape, v.stride()), k
            assert torch.equal(got, v), k
    tr = Transfer(LoaderSpec(batch_size=batch, batch_format="jagged"), SCHEMA)
    for p, (_, lb) in zip(tr.send_table(t, "5", shared=False, local=True), local):
        assert p.final and not p.compressed and p.raw_bytes == p.wire_bytes == lb.nbytes
        got = tr.receive_host(p)
        assert all(torch.equal(got[k], v) for k, v in lb.batch.items())
    zt = Transfer(LoaderSpec(batch_size=batch, batch_format="jagged", compression="zstd"), SCHEMA)
    assert not any(p.final for p in zt.send_table(t, "5", shared=False, local=True))

    pool = BufferPool(1, 2, 1 << 16)
    try:
        (_, lb), (_, lb2) = fmt.encode_table(t.slice(0, 8), 4, "6",
                                             pool.allocator(0, fallback_shared=False), local=True)
        assert lb.pooled and lb2.pooled and pool.state.tolist() == [1, 1]
        keep = lb.batch["seq_values"]
        del lb
        assert pool.state.tolist() == [1, 1]     # a tensor of the first batch still lives
        del keep
        assert pool.state.tolist() == [0, 1]
        (_, lb3), = fmt.encode_table(t.slice(0, 4), 4, "7",
                                     pool.allocator(0, fallback_shared=False), local=True)
        assert lb3.pooled and pool.state.tolist() == [1, 1]
        (_, lb4), = fmt.encode_table(t.slice(0, 4), 4, "8",
                                     pool.allocator(0, fallback_shared=False), local=True)
        assert not lb4.pooled     # no free slot: ordinary memory, never a wait
    finally:
        pool.close()
