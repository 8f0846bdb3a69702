"""Fetch: read one Parquet row group, optionally through emulated remote storage.

The local read is real (pyarrow decode). Remote storage is emulated as a wait of
``latency + compressed_bytes / bandwidth`` per row group before the decode, because the network
part of a remote read leaves the CPU idle while the decode does not. Figures from such runs are
labelled emulated in results (see ``Config.emulated``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from ..data.schema import Shard
from ..scenario import StorageSpec
from .costs import precise_wait

if TYPE_CHECKING:
    from ..data.parquet import Dataset


class Fetch:
    """Shard -> normalized Arrow table. Holds only picklable state so workers can run it."""

    def __init__(self, dataset: "Dataset", storage: StorageSpec) -> None:
        self.dataset = dataset
        self.storage = storage

    def emulated_io_s(self, shard: Shard) -> float:
        s = self.storage
        wait = s.latency_ms / 1000.0
        if s.bandwidth_mb_s:
            wait += shard.compressed_bytes / (s.bandwidth_mb_s * 1e6)
        return wait

    def __call__(self, shard: Shard) -> pa.Table:
        precise_wait(self.emulated_io_s(shard))
        return self.dataset.read_shard(shard)
