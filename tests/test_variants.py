"""Every pipeline variant delivers the same batches (issue 4's checksum test).

The knobs of ``[loader]`` change where work happens and what crosses a process boundary,
never the data: across execution x batch_format x compression x collate x pin_memory x
prefetch_batches x device_prefetch x num_workers, the trainer must see byte-identical tensors in
the same order (compared on the host: on a GPU machine the trainer's batches live on the GPU).
The reference is built independently of stallbench's stages (per-row Python over
``pyarrow`` rows), so "all variants agree" cannot mean "all variants are equally wrong".

The full product runs with ``num_workers = 0``; with 2 worker processes (forking costs ~0.1 s
per run) a reduced product keeps every value of every knob covered at least once.
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from stallbench import scenario
from stallbench.executors import EXECUTORS
from stallbench.measure.probe import measured_run
from stallbench.pipeline import Plan, dataset_for

# 2 files of 280 rows -> row groups of 160 and 120 -> batches of 64, 64, 32 and 64, 56
ROWS, RG, BATCH = 560, 160, 64
SEQ_LEN = 5

BASE = f"""
name = "variants"
[dataset]
rows = {ROWS}
row_group_rows = {RG}
files = 2
dense_features = 3
sparse_features = 2
sparse_cardinality = 97
sequence_features = 2
sequence_max_len = {SEQ_LEN}
seed = 11
[model]
kind = "emulated"
step_ms = 0
[loader]
batch_size = {BATCH}
"""

KNOBS: dict[str, list[Any]] = {
    "execution": ["streaming", "bulk"],
    "batch_format": ["rows", "columnar", "single_buffer"],
    "compression": ["none", "zstd"],
    "collate": ["producer", "trainer"],
    "pin_memory": [False, True],
    "prefetch_batches": [0, 2],
    "device_prefetch": [0, 2],          # alternated, not multiplied (a no-op on a CPU trainer)
}
ALTERNATED = ("device_prefetch",)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f'"{v}"' if isinstance(v, str) else str(v)


def digest(batch: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes."""
    h = hashlib.sha256()
    for name in sorted(batch):
        t = batch[name].contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.cpu().numpy().tobytes())   # compared on the host: batches may be on a GPU
    return h.hexdigest()


class HashCompute:
    """Stands in for the model: hashes every batch, in the order the trainer sees them."""

    def __init__(self) -> None:
        self.digests: list[str] = []

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        self.digests.append(digest(batch))

    def sync(self) -> None:
        pass


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("variants-cache")


def _config(knobs: dict[str, Any], workers: int) -> Any:
    loader = "".join(f"{k} = {_toml(v)}\n" for k, v in knobs.items())
    text = BASE + loader + f"num_workers = {workers}\n"
    return scenario.parse(text, "variants.toml").base


def _run(cfg: Any, cache: Path) -> list[str]:
    plan = Plan.create(cfg, dataset_for(cfg, cache, "variants.toml"), scenario_file="variants.toml")
    executor = EXECUTORS.get("local")(cfg, "variants.toml")
    compute = HashCompute()
    with executor:
        fig, _, _ = measured_run(plan, executor, compute)
    assert fig.samples == ROWS and fig.batches == len(compute.digests)
    return compute.digests


@pytest.fixture(scope="module")
def reference(cache: Path) -> list[str]:
    """Expected digests, built row by row in plain Python from the Parquet files."""
    cfg = _config({}, 0)
    ds = dataset_for(cfg, cache, "variants.toml")
    s = ds.schema
    digests = []
    for shard in ds.shards:
        rows = pq.ParquetFile(shard.file).read_row_group(shard.row_group).to_pylist()
        for lo in range(0, len(rows), BATCH):
            chunk = rows[lo:lo + BATCH]
            seq = np.full((len(chunk), len(s.sequence), SEQ_LEN), -1, dtype=np.int64)
            for i, r in enumerate(chunk):
                for j, c in enumerate(s.sequence):
                    items = r[c][:SEQ_LEN]
                    seq[i, j, :len(items)] = items
            digests.append(digest({
                "dense": torch.tensor([[r[c] for c in s.dense] for r in chunk], dtype=torch.float32),
                "sparse": torch.tensor([[r[c] for c in s.sparse] for r in chunk], dtype=torch.int64),
                "seq": torch.from_numpy(seq),
                "label": torch.tensor([r[s.label] for r in chunk], dtype=torch.float32),
            }))
    return digests


def _all_combos() -> list[dict[str, Any]]:
    keys = [k for k in KNOBS if k not in ALTERNATED]
    out = []
    for i, vals in enumerate(itertools.product(*(KNOBS[k] for k in keys))):
        combo = dict(zip(keys, vals))
        for k in ALTERNATED:
            combo[k] = KNOBS[k][i % len(KNOBS[k])]
        out.append(combo)
    return out


def _worker_combos() -> list[dict[str, Any]]:
    """Every execution x batch_format x compression x collate, with pin_memory and
    prefetch_batches alternating so each of their values also runs with workers."""
    out = []
    core = ["execution", "batch_format", "compression", "collate"]
    for i, vals in enumerate(itertools.product(*(KNOBS[k] for k in core))):
        combo = dict(zip(core, vals))
        combo["pin_memory"] = KNOBS["pin_memory"][i % 2]
        combo["prefetch_batches"] = KNOBS["prefetch_batches"][(i // 2) % 2]
        combo["device_prefetch"] = KNOBS["device_prefetch"][(i // 4) % 2]
        out.append(combo)
    return out


def test_reference_layout(reference: list[str], cache: Path) -> None:
    cfg = _config({}, 0)
    ds = dataset_for(cfg, cache, "variants.toml")
    assert [s.rows for s in ds.shards] == [160, 120, 160, 120]   # partial groups and batches
    assert len(reference) == 10 and len(set(reference)) == 10


def test_every_variant_in_the_trainer_delivers_identical_batches(reference: list[str],
                                                                cache: Path) -> None:
    bad = []
    for combo in _all_combos():
        if _run(_config(combo, 0), cache) != reference:
            bad.append(combo)
    assert not bad, f"{len(bad)} variants differ, e.g. {bad[0]}"


def test_every_knob_value_with_worker_processes_delivers_identical_batches(
        reference: list[str], cache: Path) -> None:
    combos = _worker_combos()
    for key, values in KNOBS.items():        # the reduced product still covers every value
        assert {c[key] for c in combos} == set(values), key
    bad = []
    for combo in combos:
        if _run(_config(combo, 2), cache) != reference:
            bad.append(combo)
    assert not bad, f"{len(bad)} variants differ with 2 workers, e.g. {bad[0]}"
