"""Transfer: zstd on what producers hand over, byte accounting, and corrupt frames.

A damaged compressed payload (flipped bits, truncated, trailing bytes, not zstd at all, a
header claiming an absurd size) must raise ``PayloadError`` naming the batch, for every batch
format: the frame checksum is what guarantees "never a garbage tensor" here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
import torch
import zstandard

from stallbench.data.schema import FeatureSchema
from stallbench.errors import PayloadError
from stallbench.scenario import LoaderSpec
from stallbench.stages import transfer as tr
from stallbench.stages.batch_format import to_arrays

SCHEMA = FeatureSchema(dense=("d0",), sparse=("s0",), sequence=("q0",), label="y", seq_len=8)
FORMATS = ["rows", "columnar", "single_buffer"]        # padded: compared with to_arrays
ALL_FORMATS = [*FORMATS, "jagged"]


def _table(n: int = 64) -> pa.Table:
    """Compressible like real data: small ids, repeated values, short sequences."""
    return pa.table({
        "d0": pa.array((np.arange(n) % 7).astype(np.float32)),
        "s0": pa.array((np.arange(n) % 5).astype(np.int64)),
        "q0": pa.array([[i % 3] * (i % 4) for i in range(n)], pa.list_(pa.int64())),
        "y": pa.array((np.arange(n) % 2).astype(np.float32)),
    })


def _transfer(fmt: str, collate: str = "producer", compression: str = "zstd", **kw) -> tr.Transfer:
    spec = LoaderSpec(batch_size=64, batch_format=fmt, collate=collate, compression=compression,
                      **kw)
    return tr.Transfer(spec, SCHEMA)


def _same(a: dict[str, torch.Tensor], b: dict[str, np.ndarray]) -> None:
    """Compared on the host: ``receive`` puts batches on the trainer's device (a GPU if any)."""
    assert set(a) == set(b)
    for k in b:
        np.testing.assert_array_equal(a[k].cpu().numpy(), b[k], err_msg=k)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("collate", ["producer", "trainer"])
def test_zstd_round_trip_and_compression_ratio(fmt: str, collate: str) -> None:
    t = _transfer(fmt, collate)
    p = t.send(_table(), "4:0", shared=False)
    assert p.compressed and isinstance(p.data, bytes)
    assert p.wire_bytes == len(p.data) and p.raw_bytes > 2 * p.wire_bytes   # ratio shows
    _same(t.receive(p), to_arrays(_table(), SCHEMA))


@pytest.mark.parametrize("fmt", FORMATS)
def test_uncompressed_bytes_are_the_payload(fmt: str) -> None:
    t = _transfer(fmt, compression="none")
    p = t.send(_table(), "4:0", shared=False)
    assert not p.compressed and p.raw_bytes == p.wire_bytes > 0
    _same(t.receive(p), to_arrays(_table(), SCHEMA))


def test_decompressed_buffer_is_fresh_and_writable() -> None:
    """The host half (before any device copy): decompression gives fresh, writable memory."""
    t = _transfer("single_buffer")
    p = t.send(_table(), "4:0", shared=False)
    batch = t.receive_host(p)
    for v in batch.values():
        assert v.device.type == "cpu" and v.numpy().flags.writeable
    batch["dense"].add_(1)                           # the frame itself is untouched
    _same(t.receive_host(p), to_arrays(_table(), SCHEMA))
    _same(t.receive(p), to_arrays(_table(), SCHEMA))   # and on the trainer's device


def _flip(data: bytes, where: float) -> bytes:
    b = bytearray(data)
    i = int(len(b) * where)
    b[i] ^= 0x5A
    return bytes(b)


def _huge_frame(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(b"")[:4] + b"\xff" * 16


CORRUPT = {
    "flipped byte mid-frame": (lambda d: _flip(d, 0.5), "corrupt|checksum"),
    "flipped checksum": (lambda d: _flip(d, 0.999), "corrupt|checksum"),
    "truncated frame": (lambda d: d[: len(d) // 2], "truncated|corrupt"),
    "trailing bytes": (lambda d: d + b"\x00" * 12, "trailing|corrupt"),
    "not zstd at all": (lambda d: b"garbage!" * 8, "corrupt"),
    "empty": (lambda d: b"", "corrupt"),
    "absurd content size": (_huge_frame, "corrupt"),
}


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_zstd_frame_raises_naming_the_batch(fmt: str, case: str) -> None:
    t = _transfer(fmt)
    good = t.send(_table(), "12:3", shared=False)
    corrupt, message = CORRUPT[case]
    bad = dataclasses.replace(good, data=corrupt(good.data))
    with pytest.raises(PayloadError, match=message) as err:
        t.receive(bad)
    assert str(err.value).startswith("batch 12:3:")


def test_compressed_payload_of_the_wrong_type_is_refused() -> None:
    t = _transfer("single_buffer")
    good = t.send(_table(), "1:1", shared=False)
    with pytest.raises(PayloadError, match="batch 1:1"):
        t.receive(dataclasses.replace(good, data=torch.zeros(4)))


def test_a_valid_frame_of_garbage_is_refused_by_the_format() -> None:
    """A well-formed zstd frame whose content is not a payload: the format's checks catch it."""
    junk = zstandard.ZstdCompressor(write_checksum=True).compress(b"not a payload" * 10)
    for fmt in ALL_FORMATS:
        t = _transfer(fmt)
        good = t.send(_table(), "2:0", shared=False)
        with pytest.raises(PayloadError, match="batch 2:0"):
            t.receive(dataclasses.replace(good, data=junk))


def test_notes_say_what_had_no_effect() -> None:
    notes = _transfer("single_buffer", pin_memory=True, num_workers=0, device_prefetch=2).notes()
    gpu = torch.cuda.is_available()
    for key in ("pin_memory", "device_copy", "device_prefetch"):
        assert (key in notes) == (not gpu), (key, notes)
    assert "compression" in notes                    # nothing crosses a process with 0 workers
    assert "compression" not in _transfer("single_buffer", num_workers=2).notes()


@pytest.mark.parametrize("fmt", FORMATS)
def test_padded_formats_count_the_ids_they_cut(fmt: str) -> None:
    """Rows of _table() have 0..3 ids; a padded length of 2 cuts every row with 3."""
    schema = dataclasses.replace(SCHEMA, seq_len=2)
    t = tr.Transfer(LoaderSpec(batch_size=64, batch_format=fmt), schema)
    p = t.send(_table(), "0:0", shared=False)
    lengths = np.arange(64) % 4
    c = p.sequences
    assert (c.sequences, c.cut, c.ids, c.ids_cut, c.longest) == (
        64, int((lengths > 2).sum()), int(lengths.sum()), int((lengths - 2).clip(0).sum()), 3)
    assert t.send(_table(), "0:0", shared=False).sequences.cut == c.cut      # deterministic
    jagged = tr.Transfer(LoaderSpec(batch_size=64, batch_format="jagged"), schema)
    assert jagged.send(_table(), "0:0", shared=False).sequences is None    # keeps every id
