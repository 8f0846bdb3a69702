"""Transfer: everything between a preprocessed table and a batch on the trainer's device.

Producer side (``Transfer.send``): split into batches, encode in the batch format, optionally
compress with zstd, and, when ``wire_bandwidth_mb_s`` is set, wait as long as an EMULATED link
would take to carry the bytes. Trainer side (``Transfer.receive``): decompress, decode/collate,
pin and copy to the device when one exists. Both halves are timed as transfer.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import torch
import zstandard

from ..data.schema import FeatureSchema
from ..errors import PayloadError
from ..scenario import LoaderSpec
from .batch_format import FORMATS, BatchFormat, TensorBatch, nbytes
from .costs import precise_wait


@dataclass
class Payload:
    """One batch in flight between producer and trainer."""

    batch_id: str
    rows: int
    data: Any
    compressed: bool
    wire_bytes: int      # bytes handed over (compressed size when compressed)
    raw_bytes: int       # bytes of the encoded batch before compression


def device() -> torch.device:
    """The trainer's device: CUDA when present, else CPU (GPU paths are never required)."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class Transfer:
    def __init__(self, loader: LoaderSpec, schema: FeatureSchema) -> None:
        self.loader = loader
        self.schema = schema
        self.format: BatchFormat = FORMATS.get(loader.batch_format)(schema, loader.collate)
        self.level = loader.compression_level
        self.compress = loader.compression == "zstd"
        self.device = device()
        self.pin = loader.pin_memory and self.device.type == "cuda"

    # --------------------------------------------------------------------- producer side
    def split(self, table: pa.Table) -> list[pa.Table]:
        b = self.loader.batch_size
        return [table.slice(i, b) for i in range(0, table.num_rows, b)]

    def send(self, table: pa.Table, batch_id: str, shared: bool, emulate_wire: bool = True) -> Payload:
        data = self.format.encode(table, batch_id, shared and not self.compress)
        raw = nbytes(data)
        compressed = False
        if self.compress:
            blob = data.numpy().tobytes() if isinstance(data, torch.Tensor) else \
                pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
            raw = len(blob)
            data = zstandard.ZstdCompressor(level=self.level, write_checksum=True).compress(blob)
            compressed = True
        wire = nbytes(data)
        if emulate_wire and self.loader.wire_bandwidth_mb_s:
            precise_wait(wire / (self.loader.wire_bandwidth_mb_s * 1e6))
        return Payload(batch_id, table.num_rows, data, compressed, wire, raw)

    # ---------------------------------------------------------------------- trainer side
    def receive(self, p: Payload) -> TensorBatch:
        data = p.data
        if p.compressed:
            try:
                blob = zstandard.ZstdDecompressor().decompress(data)
            except zstandard.ZstdError as exc:
                raise PayloadError(f"batch {p.batch_id}: zstd frame is corrupt ({exc})") from None
            if self.loader.batch_format == "single_buffer":
                data = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
            else:
                try:
                    data = pickle.loads(blob)
                except Exception as exc:  # noqa: BLE001 - any unpickling failure is corruption
                    raise PayloadError(f"batch {p.batch_id}: payload does not unpickle ({exc})") from None
        batch = self.format.decode(data, p.batch_id)
        return self.to_device(batch)

    def to_device(self, batch: TensorBatch) -> TensorBatch:
        if self.device.type == "cpu":
            return batch
        if self.pin:
            batch = {k: v.pin_memory() for k, v in batch.items()}
        return {k: v.to(self.device, non_blocking=self.pin) for k, v in batch.items()}

    def notes(self) -> dict[str, str]:
        """Which requested knobs had no effect on this machine, said in results."""
        out = {}
        if self.loader.pin_memory and not self.pin:
            out["pin_memory"] = "no-op: no CUDA device on this machine"
        if self.device.type == "cpu":
            out["device_copy"] = "no-op: trainer device is the CPU"
        return out
