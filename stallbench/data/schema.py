"""The feature layout every stage agrees on.

Recommender tables have three kinds of features; stages and models only need to know which
column is which kind, so one small frozen record carries that through the pipeline (and across
process boundaries, so it must stay picklable and cheap).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class FeatureSchema:
    dense: tuple[str, ...]
    sparse: tuple[str, ...]
    sequence: tuple[str, ...]
    label: str
    seq_len: int
    # Largest id + 1 per sparse/sequence column when known (synthetic data), else None:
    # models take ids modulo their table size anyway.
    cardinality: int | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def with_(self, **changes) -> "FeatureSchema":
        return replace(self, **changes)

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.dense, *self.sparse, *self.sequence, self.label)


@dataclass(frozen=True)
class Shard:
    """One unit of fetch: a Parquet row group. Small, picklable, sent to workers."""

    index: int          # position in the dataset's global shard order
    file: str
    row_group: int
    rows: int
    compressed_bytes: int
    uncompressed_bytes: int
