"""Held-out Parquet files for the trainer-path benchmarks: written here with pyarrow, not by
stallbench's generator, so stallbench reads them as any existing dataset (``dataset.path``).

The shape of the files the GPU measurements of issue 15 used: 65,536 rows per file (one row
group each), 40 float dense features, 20 int64 categorical ids, 4 id sequences whose lengths
are uniform in 0..29 (longer than the default ``sequence_max_len = 20``: a padded batch cuts
them, a jagged one does not), a float label; snappy. Deterministic per seed; written once
into the stallbench cache and reused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS_PER_FILE = 65_536
DENSE, SPARSE, SEQUENCES, MAX_LEN = 40, 20, 4, 29


def _table(rows: int, rng: np.random.Generator, max_len: int = MAX_LEN) -> pa.Table:
    cols: dict[str, pa.Array] = {}
    for i in range(DENSE):
        cols[f"f{i}"] = pa.array(rng.random(rows, dtype=np.float32))
    for i in range(SPARSE):
        cols[f"c{i}"] = pa.array(rng.zipf(1.2, rows).astype(np.int64) % 1_000_000)
    for i in range(SEQUENCES):
        lengths = rng.integers(0, max_len + 1, rows)
        offsets = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = rng.integers(0, 1_000_000, int(offsets[-1]), dtype=np.int64)
        cols[f"h{i}"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    cols["label"] = pa.array((rng.random(rows) < 0.25).astype(np.float32))
    return pa.table(cols)


def heldout_files(cache_dir: Path, files: int = 16, seed: int = 7, *,
                  rows_per_file: int = ROWS_PER_FILE, row_group_rows: int | None = None,
                  max_len: int = MAX_LEN) -> Path:
    """A directory of ``files`` held-out Parquet files (written on first use). The keyword
    arguments shape them unlike the default (other row-group sizes and sequence lengths), so
    a benchmark can check its figures do not hold for one shape only."""
    spec = {"files": files, "rows": rows_per_file, "dense": DENSE, "sparse": SPARSE,
            "sequences": SEQUENCES, "max_len": max_len, "seed": seed, "v": 1}
    if row_group_rows is not None and row_group_rows != rows_per_file:
        spec["row_group_rows"] = row_group_rows      # only when set: default keys unchanged
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    out = Path(cache_dir) / f"heldout-{key}"
    done = out / "_COMPLETE"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        rng = np.random.default_rng([seed, f])
        pq.write_table(_table(rows_per_file, rng, max_len), out / f"part-{f:03d}.parquet",
                       row_group_size=row_group_rows or rows_per_file, compression="snappy")
    done.write_text(json.dumps(spec))
    return out


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from stallbench.run.runner import default_cache_dir

    print(heldout_files(default_cache_dir()))
