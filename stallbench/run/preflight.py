"""Preflight: everything checked about a scenario before anything runs.

Two kinds of check, both refused as one ``ScenarioError`` naming the file and the key (exit 2):

**Names of implementations** (``check_scenario``, ``check_config``). ``scenario.py`` validates structure (types, ranges, plain choices) and cannot import the
implementations (they import it). Keys whose value names an implementation (``knob(...,
registry=...)``: the executor, the model, the batch format) are checked here, against the live
registries, for every variant, with the implementation's own cross-key rules
(``Executor.validate``, ``Compute.validate``). ``stallbench run`` calls ``check_scenario`` on
every scenario before the first one runs.

**What a variant implies on this machine** (``check``: memory, disk). Each scenario number is bounded by its knob (``scenario.knob``); these checks refuse values
that pass alone but cannot work here together, before the first variant starts, each as one
``ScenarioError`` naming the file and the key to change (exit 2). The estimates are simple
products, stated in the message, and deliberately generous: they catch the absurd (a 4 TB
temp dataset, a 300 GB embedding table), not the merely large. Memory means the machine's
total memory, or a container's lower cgroup limit (what is free changes by the second);
disk means the free space where the dataset cache lives.

- ``dataset.rows``: the synthetic files (uncompressed size, an upper bound) must fit on the
  cache's file system (skipped when the dataset is already cached);
- ``model.embedding_rows``: DLRM's tables, rows x dim x 4 bytes x (sparse + sequence
  features), must fit in memory;
- ``loader.batch_size``: one batch's tensors (sequences padded to their length) must fit in
  a quarter of memory;
- ``dataset.row_group_rows`` (``dataset.path`` for existing files): the row groups in flight
  at once ((workers x prefetch_factor + 2) x one row group's table and tensors) must fit;
- ``loader.execution = "bulk"``: the whole epoch's tensors must fit;
- ``analysis.differential``: the ablation caches keep every row group's fetched and
  preprocessed table and final batches in memory, so those must fit;
- ``executor.object_store_mb``: the object stores of a Ray cluster started on this machine
  (one per node) must fit in memory.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ScenarioError
from ..executors import EXECUTORS
from ..scenario import Config, Scenario
from ..scenario import reference_markdown as _reference
from ..stages.batch_format import FORMATS
from ..stages.compute import MODELS

GB = 2**30


@dataclass(frozen=True)
class Machine:
    memory_bytes: int

    @classmethod
    def here(cls) -> "Machine":
        """The machine's memory, or this container's limit where a cgroup sets a lower one."""
        import psutil

        total = int(psutil.virtual_memory().total)
        for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
            try:
                text = Path(path).read_text().strip()
            except OSError:
                continue
            if text.isdigit() and 0 < int(text) < total:
                total = int(text)
        return cls(memory_bytes=total)


def _gb(x: float) -> str:
    return f"{x / GB:,.1f} GB"


def _row_tensor_bytes(dense: int, sparse: int, sequence: int, seq_len: int) -> int:
    """One row as the trainer gets it: float32 dense and label, int64 ids, padded sequences."""
    return 4 * (dense + 1) + 8 * sparse + 8 * sequence * seq_len


def _row_table_bytes(cfg: Config) -> float:
    """One synthetic row as an Arrow table / uncompressed Parquet (sequences at mean length)."""
    d = cfg.dataset
    return 4 * (d.dense_features + 1) + 8 * d.sparse_features + \
        d.sequence_features * (4 + 8 * (d.sequence_max_len + 1) / 2)


def _fail(file: str, key: str, text: str) -> ScenarioError:
    return ScenarioError(file, key, text)


def check(cfg: Config, file: str, *, analyze: bool, cache_dir: Path | None = None,
          plan: Any = None, machine: Machine | None = None) -> None:
    """Refuse a variant whose implied memory or disk cannot fit here. ``plan``: its built
    plan, once the dataset is open (real column counts and row-group sizes of existing
    files); without it, what the synthetic spec says."""
    m = machine or Machine.here()
    mem = m.memory_bytes
    lc, d = cfg.loader, cfg.dataset
    if plan is not None:
        s = plan.schema
        row = _row_tensor_bytes(len(s.dense), len(s.sparse), len(s.sequence), s.seq_len)
        seq_bytes, seq_len = 8 * len(s.sequence) * s.seq_len, s.seq_len
        tables = len(s.sparse) + len(s.sequence)
        shards = plan.dataset.shards
        group_rows = max((sh.rows for sh in shards), default=0)
        group_table = max((sh.uncompressed_bytes for sh in shards), default=0)
        total_rows = plan.dataset.rows
        epoch_rows = sum(sh.rows for sh in plan.items)
    elif d.path is None:
        row = _row_tensor_bytes(d.dense_features, d.sparse_features, d.sequence_features,
                                d.sequence_max_len)
        seq_bytes, seq_len = 8 * d.sequence_features * d.sequence_max_len, d.sequence_max_len
        tables = d.sparse_features + d.sequence_features
        group_rows = min(d.row_group_rows, d.rows)
        group_table = int(group_rows * _row_table_bytes(cfg))
        total_rows = d.rows
        epoch_rows = d.rows * lc.epochs
        if lc.max_batches:
            epoch_rows = min(epoch_rows, lc.max_batches * lc.batch_size)
    else:
        return                     # existing files: checked once their footers are read
    if cfg.model.kind == "dlrm":
        emb = cfg.model.embedding_rows * cfg.model.embedding_dim * 4 * tables
        if emb > mem:
            raise _fail(file, "model.embedding_rows",
                        f"{cfg.model.embedding_rows:,} rows x {cfg.model.embedding_dim} dims x 4 "
                        f"bytes x {tables} tables = {_gb(emb)} of embeddings; this machine has "
                        f"{_gb(mem)} of memory")
    batch = min(lc.batch_size, max(total_rows, 1)) * row
    if batch > mem / 4:
        # Name the key that makes a row big when padded sequences dominate it.
        key = "dataset.sequence_max_len" if seq_bytes * 2 > row else "loader.batch_size"
        raise _fail(file, key,
                    f"one batch is {min(lc.batch_size, total_rows):,} rows (loader.batch_size) x "
                    f"{row:,} bytes ({seq_bytes:,} of them padded sequences, "
                    f"dataset.sequence_max_len = {seq_len:,}) = {_gb(batch)} of tensors; at "
                    f"most a quarter of this machine's {_gb(mem)} of memory")
    in_flight = lc.num_workers * lc.prefetch_factor + 2
    group = group_table + group_rows * row
    if in_flight * group > mem:
        key = "dataset.path" if d.path is not None else "dataset.row_group_rows"
        raise _fail(file, key,
                    f"{in_flight} row groups in flight (loader.num_workers x prefetch_factor + 2) "
                    f"x {_gb(group)} each (a row group of {group_rows:,} rows, as a table and as "
                    f"tensors) = {_gb(in_flight * group)}; this machine has {_gb(mem)} of memory"
                    + (": write the files with smaller row groups" if d.path is not None else ""))
    if lc.execution == "bulk" and epoch_rows * row > mem:
        raise _fail(file, "loader.execution",
                    f"\"bulk\" keeps the whole epoch's tensors, {epoch_rows:,} rows x {row:,} "
                    f"bytes = {_gb(epoch_rows * row)}; this machine has {_gb(mem)} of memory")
    if analyze:
        per_row_cached = 2 * (group_table / max(group_rows, 1)) + row
        cached = total_rows * per_row_cached
        if cached > mem:
            raise _fail(file, "analysis.differential",
                        f"the ablation caches keep every row group's tables and batches in "
                        f"memory, about {_gb(cached)} for {total_rows:,} rows; this machine has "
                        f"{_gb(mem)}: set analysis.differential = false (or --no-analyze) or use "
                        f"fewer rows")
    _check_reserved_memory(cfg, file, mem)
    if plan is None:
        _check_disk(cfg, file, cache_dir)


def _check_reserved_memory(cfg: Config, file: str, mem: int) -> None:
    """What the executor reserves up front (Ray's object stores), against this machine's memory:
    the executor says how much and which key sets it."""
    if cfg.executor.kind not in EXECUTORS:
        return                     # named by check_config
    held = EXECUTORS.get(cfg.executor.kind).reserved_memory(cfg)
    if held is None:
        return
    need, key, what = held
    if need > mem:
        raise _fail(file, key, f"{what} = {_gb(need)}; this machine has {_gb(mem)} of memory")


def _check_disk(cfg: Config, file: str, cache_dir: Path | None) -> None:
    if cache_dir is None:
        return
    from ..data.synthetic import complete_files, dataset_key

    root = Path(cache_dir) / "datasets"
    if complete_files(root / dataset_key(cfg.dataset)) is not None:
        return
    need = cfg.dataset.rows * _row_table_bytes(cfg)
    probe = Path(os.path.abspath(root))
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return
    if need > free:
        raise _fail(file, "dataset.rows",
                    f"the synthetic dataset would take about {_gb(need)} ({cfg.dataset.rows:,} "
                    f"rows, uncompressed); {probe} has {_gb(free)} free")


USER_MODEL = '"pkg.module:factory"'    # the other accepted form of model.kind


def check_config(cfg: Config, file: str = "<scenario>") -> None:
    """One variant's registry-backed keys; ScenarioError(file, key, ...) naming valid values."""
    if cfg.loader.batch_format not in FORMATS:
        raise ScenarioError(file, "loader.batch_format", FORMATS.unknown(cfg.loader.batch_format))
    kind = cfg.model.kind
    if ":" not in kind:
        if kind not in MODELS:
            raise ScenarioError(file, "model.kind", MODELS.unknown(kind, also=USER_MODEL))
        MODELS.get(kind).validate(cfg.model, file)
    if cfg.executor.kind not in EXECUTORS:
        raise ScenarioError(file, "executor.kind", EXECUTORS.unknown(cfg.executor.kind))
    EXECUTORS.get(cfg.executor.kind).validate(cfg, file)


def check_scenario(sc: Scenario) -> None:
    """The base config, then every variant (whose errors say they come from the matrix)."""
    check_config(sc.base, sc.path)
    for v in sc.variants:
        try:
            check_config(v.config, sc.path)
        except ScenarioError as exc:
            raise ScenarioError(sc.path, exc.key, f"{exc.message} (from [matrix])") from None


def registered_names() -> dict[str, list[str]]:
    """Valid names per registry kind, as ``knob(registry=...)`` names them."""
    return {EXECUTORS.kind: list(EXECUTORS), MODELS.kind: [*MODELS, USER_MODEL.strip('"')],
            FORMATS.kind: list(FORMATS)}


def reference_markdown() -> str:
    """The key reference of docs/scenarios.md, with the registries' names for registry-backed keys."""
    return _reference(registered_names())
