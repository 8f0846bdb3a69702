"""Ray's stock mode, what users write first: ``read_parquet -> map_batches(normalize +
preprocess, pyarrow) -> iter_torch_batches(batch_size, collate_fn=<numpy dict -> tensors>)``.
The collate builds the batch dict of the loader's format: for one that keeps every id
(``jagged``, the default) the jagged dict (``seq_values`` + ``seq_offsets``: the rows' id arrays
concatenated feature-major), for a padded one ``seq`` padded in a Python loop, cutting at
``dataset.sequence_max_len`` as the padded formats do, and counting what it cut
(``STOCK_CUT_KEY``, results' ``sequence_cut``).

The UDFs here run in Ray workers; the collate runs in the trainer. The preprocess UDF times
itself and carries its time to the trainer in an extra column (``STOCK_PREP_COL``, a per-row
share), because the producers run Ray's code, not stallbench's timed stages.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .worker import Job, PlanCache, cached_tables

STOCK_PREP_COL = "_stallbench_prep_s"   # per-row share of the preprocess time
# What a padded collate cut (sequences, cut, ids, ids cut, longest), popped by the driver
STOCK_CUT_KEY = "_stallbench_sequence_cut"


def stock_preprocess(table: pa.Table, job: Job) -> pa.Table:
    """Stock UDF after read_parquet: normalize types (the decode half of fetch) + preprocess."""
    from ...data.parquet import normalize

    plan = PlanCache.get(job)
    table = normalize(table, plan.dataset.schema)
    t0 = time.perf_counter()
    out = plan.preprocess(table, -1)
    return _with_prep_time(out, time.perf_counter() - t0)


def stock_shard(batch: dict[str, np.ndarray], job: Job) -> pa.Table:
    """Stock mode under a fetch/preprocess ablation: one block per shard from the caches."""
    plan = PlanCache.get(job)
    out = []
    for item in batch["id"]:
        shard = plan.items[int(item)]
        c = cached_tables(job, shard.index)
        a = plan.ablation
        table = None
        if not a.fetch:
            table = plan.fetch(shard)     # real even when preprocess is ideal, as in produce()
        elif not a.preprocess:
            table = c.fetched[shard.index]
        t0 = time.perf_counter()
        table = c.prepped[shard.index] if a.preprocess else plan.preprocess(table, shard.index)
        out.append(_with_prep_time(table, time.perf_counter() - t0))
    return out[0] if len(out) == 1 else pa.concat_tables(out)


def _with_prep_time(table: pa.Table, seconds: float) -> pa.Table:
    share = seconds / table.num_rows if table.num_rows else 0.0
    table = table.select([c for c in table.column_names if c != STOCK_PREP_COL])
    return table.append_column(STOCK_PREP_COL, pa.array(np.full(table.num_rows, share)))


@functools.lru_cache(maxsize=None)
def collate_class() -> Any:
    """The straightforward collate a user writes for iter_torch_batches. Made on first use
    (it subclasses a Ray class, and this module must import without Ray); one class per
    process."""
    from ray.data.collate_fn import NumpyBatchCollateFn

    from ...stages.batch_format import PAD_ID

    class StockCollate(NumpyBatchCollateFn):
        def __init__(self, schema: Any, jagged: bool = True) -> None:
            self.s = schema
            self.jagged = jagged

        def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
            s = self.s
            n = len(batch[s.label])
            dense = (np.stack([np.asarray(batch[c], dtype=np.float32) for c in s.dense], axis=1)
                     if s.dense else np.empty((n, 0), np.float32))
            sparse = (np.stack([np.asarray(batch[c], dtype=np.int64) for c in s.sparse], axis=1)
                      if s.sparse else np.empty((n, 0), np.int64))
            out = {"dense": torch.from_numpy(dense), "sparse": torch.from_numpy(sparse),
                   "label": torch.from_numpy(np.array(batch[s.label], dtype=np.float32))}
            if self.jagged:
                out.update(_jagged(batch, s, n))
            else:
                seq = np.full((n, len(s.sequence), s.seq_len), PAD_ID, dtype=np.int64)
                for j, c in enumerate(s.sequence):
                    for i, v in enumerate(batch[c]):
                        if v is None:
                            continue
                        v = v[:s.seq_len]
                        seq[i, j, :len(v)] = v
                out["seq"] = torch.from_numpy(seq)
                out[STOCK_CUT_KEY] = _cut(batch, s)
            if STOCK_PREP_COL in batch:
                out[STOCK_PREP_COL] = torch.tensor(float(np.sum(batch[STOCK_PREP_COL])))
            return out

    return StockCollate


def _jagged(batch: dict[str, np.ndarray], schema: Any, n: int) -> dict[str, torch.Tensor]:
    """``seq_values`` + ``seq_offsets`` (feature-major, TorchRec's layout) of a numpy batch whose
    sequence columns hold one id array per row (None: empty): every id kept."""
    lengths = np.zeros(len(schema.sequence) * n, dtype=np.int64)
    parts = []
    for j, c in enumerate(schema.sequence):
        for i, v in enumerate(batch[c]):
            if v is not None and len(v):
                lengths[j * n + i] = len(v)
                parts.append(np.asarray(v, dtype=np.int64))
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return {"seq_offsets": torch.from_numpy(offsets), "seq_values": torch.from_numpy(values)}


def _cut(batch: dict[str, np.ndarray], schema: Any) -> torch.Tensor:
    """What padding to ``seq_len`` cut from a numpy batch's sequences: (sequences, cut, ids,
    ids cut, longest), ``SequenceCounts``' order. stallbench's count, not the user's collate:
    one length per row, then vectorised, so the baseline's own loop is not slowed."""
    if not schema.sequence:
        return torch.zeros(5, dtype=torch.int64)
    lengths = np.array([0 if v is None else len(v) for c in schema.sequence for v in batch[c]],
                       dtype=np.int64)
    over = lengths - schema.seq_len
    cut = over[over > 0]
    return torch.tensor([lengths.size, cut.size, int(lengths.sum()), int(cut.sum()),
                         int(lengths.max()) if lengths.size else 0], dtype=torch.int64)
