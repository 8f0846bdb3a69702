"""Class 7 of issue 13: upper bounds on what a scenario implies, refused up front.

The rules: each knob's bound (``scenario.knob``), the matrix size counted before it is
expanded (``scenario.MAX_VARIANTS``), and what a variant implies on this machine
(``stallbench/run/preflight.py``: generated data vs free disk, embedding tables, one batch, row
groups in flight, a bulk epoch, ablation caches and Ray object stores vs memory), each one
line naming file and key, exit 2, before any data is written. An existing Parquet is
checked from its footer (row-group sizes) before it is read, and its string ids are hashed
in bounded blocks (a 10 MB file of 1 MiB strings peaked at 7.4 GB).

The cases are chosen to be absurd on any machine (terabytes), so they hold on a 2-core VM
and on a 128 GB GPU box alike.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from reliability_helpers import TINY, no_files, one_error_line, sb, write

from stallbench import scenario
from stallbench.errors import ScenarioError


def _refused(tmp_path: Path, env: dict, text: str, key: str, *parts: str) -> str:
    write(tmp_path, text)
    cache = Path(env["STALLBENCH_CACHE"])
    before = set((cache / "datasets").glob("*")) if (cache / "datasets").exists() else set()
    t0 = time.monotonic()
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path, timeout=120)
    line = one_error_line(r, f"s.toml: {key}: ", *parts)
    assert time.monotonic() - t0 < 90
    assert no_files(tmp_path / "out")
    after = set((cache / "datasets").glob("*")) if (cache / "datasets").exists() else set()
    assert after == before, "data was written before the refusal"
    return line


def test_rows_beyond_the_knob_bound(tmp_path: Path, env: dict) -> None:
    """rows = 10**23 wrote 4 GB of temp Parquet in 2 minutes."""
    _refused(tmp_path, env, TINY.replace("rows = 4096", "rows = 100000000000000000000000"),
             "dataset.rows", "<= 10**10")


def test_rows_beyond_the_free_disk(tmp_path: Path, env: dict) -> None:
    text = TINY.replace("rows = 4096", "rows = 10000000000").replace(
        "dense_features = 3", "dense_features = 200")
    _refused(tmp_path, env, text, "dataset.rows", "GB free")


def test_matrix_counted_before_it_is_expanded() -> None:
    """8 axes x 10 values (10**8 variants) used to hang silently while expanding."""
    axes = ["dataset.seed", "loader.batch_size", "loader.prefetch_factor", "loader.epochs",
            "model.embedding_dim", "run.warmup_batches", "loader.prefetch_batches",
            "dataset.files"]
    text = 'name = "m"\n[matrix]\n' + "".join(f'"{a}" = {list(range(1, 11))}\n' for a in axes)
    t0 = time.monotonic()
    with pytest.raises(ScenarioError) as info:
        scenario.parse(text, "m.toml")
    assert time.monotonic() - t0 < 2
    assert info.value.key == "matrix"
    assert "100,000,000 variants" in str(info.value) and "at most 1,000" in str(info.value)


def test_matrix_bound_through_the_cli(tmp_path: Path, env: dict) -> None:
    axes = ["dataset.seed", "loader.batch_size", "loader.epochs", "model.embedding_dim"]
    text = TINY + "[matrix]\n" + "".join(f'"{a}" = {list(range(1, 11))}\n' for a in axes)
    _refused(tmp_path, env, text, "matrix", "10 x 10 x 10 x 10 = 10,000 variants")


def test_embedding_rows_beyond_the_knob_bound(tmp_path: Path, env: dict) -> None:
    """embedding_rows = 10**11 was an allocation traceback."""
    text = TINY.replace('kind = "emulated"', 'kind = "dlrm"\nembedding_rows = 100000000000')
    _refused(tmp_path, env, text, "model.embedding_rows", "<= 10**10")


def test_embedding_memory_beyond_this_machine(tmp_path: Path, env: dict) -> None:
    text = TINY.replace('kind = "emulated"',
                        'kind = "dlrm"\nembedding_rows = 10000000000\nembedding_dim = 64')
    _refused(tmp_path, env, text, "model.embedding_rows", "of embeddings; this machine has")


def test_padded_sequences_beyond_memory_name_their_key(tmp_path: Path, env: dict) -> None:
    text = TINY.replace("rows = 4096", "rows = 1000000").replace(
        "sequence_features = 1", "sequence_features = 100").replace(
        "sequence_max_len = 4", "sequence_max_len = 20000").replace(
        "row_group_rows = 512", "row_group_rows = 100").replace(
        "batch_size = 512", "batch_size = 100000")
    _refused(tmp_path, env, text, "dataset.sequence_max_len", "padded sequences")


def test_sequence_column_beyond_arrow_offsets(tmp_path: Path, env: dict) -> None:
    """Used to exit 2 without naming the scenario file or key (a generator error)."""
    text = TINY.replace("sequence_max_len = 4", "sequence_max_len = 100000").replace(
        "row_group_rows = 512", "row_group_rows = 100000").replace("rows = 4096", "rows = 200000")
    _refused(tmp_path, env, text, "dataset.sequence_max_len", "row_group_rows x sequence_max_len")


def test_bulk_epoch_beyond_memory(tmp_path: Path, env: dict) -> None:
    text = TINY.replace("rows = 4096", "rows = 10000000000").replace(
        "batch_size = 512", 'batch_size = 512\nexecution = "bulk"')
    _refused(tmp_path, env, text, "loader.execution", "whole epoch")


def test_ablation_caches_beyond_memory(tmp_path: Path, env: dict) -> None:
    text = TINY.replace("rows = 4096", "rows = 10000000000").replace(
        "differential = false", "differential = true")
    _refused(tmp_path, env, text, "analysis.differential", "--no-analyze")


def test_ray_object_store_beyond_memory(tmp_path: Path, env: dict) -> None:
    pytest.importorskip("ray")
    text = TINY + '[executor]\nkind = "ray"\nsimulated_nodes = 4\nobject_store_mb = 1000000\n'
    _refused(tmp_path, env, text, "executor.object_store_mb", "5 node(s)")


# ----------------------------------------------------------------------- existing Parquet

def _long_strings(path: Path, rows: int = 100, size: int = 2**20) -> None:
    """``rows`` strings of ``size`` bytes (compressible: tiny on disk) in one row group."""
    values = [(f"{i:08d}" * (size // 8 + 1))[:size] for i in range(rows)]
    table = pa.table({"label": pa.array([float(i % 2) for i in range(rows)], pa.float32()),
                      "user": pa.array(values)})
    pq.write_table(table, path, compression="zstd", row_group_size=rows)


_PEAK = ("import resource, subprocess, sys\n"
         "r = subprocess.run([sys.executable, '-m', 'stallbench', 'run', 's.toml', '--out',"
         " 'out', '--no-progress'], capture_output=True, text=True)\n"
         "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
         "print(r.returncode, round(peak)); sys.stderr.write(r.stderr)\n")


def _peak_rss_mb(d: Path, env: dict, size: int) -> int:
    """Peak RSS of a whole ``stallbench run`` over 100 string ids of ``size`` bytes each."""
    d.mkdir()
    _long_strings(d / "big.parquet", size=size)
    write(d, 'name = "strings"\n[dataset]\npath = "big.parquet"\n[model]\n'
             'kind = "emulated"\n[loader]\nbatch_size = 50\n[analysis]\n'
             'differential = false\n')
    r = subprocess.run([sys.executable, "-c", _PEAK], cwd=d, env=env, capture_output=True,
                       text=True, timeout=300)
    rc, peak_mb = (int(x) for x in r.stdout.split())
    assert rc == 0, r.stderr[-3000:]
    return peak_mb


def test_parquet_of_long_strings_in_bounded_memory(tmp_path: Path, env: dict) -> None:
    """100 string ids of 1 MiB (a 100 MB row group): the hashing used to need ~40 bytes of
    temporaries per byte (about +3 GB here, measured against the same run with 8-byte
    strings); now blocks of 2 MB, so the long strings cost about their table and dictionary
    (~0.2 GB). Measured against the short-string run on the same machine, so torch, CUDA
    or the core count do not move the bound."""
    short = _peak_rss_mb(tmp_path / "short", env, size=8)
    long = _peak_rss_mb(tmp_path / "long", env, size=2**20)
    assert long - short < 1000, f"peak RSS {long} MB with 1 MiB strings, {short} MB with 8 B"


def test_parquet_row_groups_beyond_memory_refused_from_the_footer(tmp_path: Path,
                                                                 env: dict) -> None:
    _long_strings(tmp_path / "big.parquet")
    write(tmp_path, 'name = "strings"\n[dataset]\npath = "big.parquet"\n[model]\n'
                    'kind = "emulated"\n[loader]\nbatch_size = 50\nnum_workers = 200\n'
                    'prefetch_factor = 1000\n[analysis]\ndifferential = false\n')
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path, timeout=120)
    one_error_line(r, "s.toml: dataset.path: ", "row groups in flight",
                   "write the files with smaller row groups")
    assert no_files(tmp_path / "out")
