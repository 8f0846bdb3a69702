"""Synthetic data: same spec, same bytes; cached once; never a half dataset."""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from stallbench.data import synthetic
from stallbench.data.synthetic import dataset_key, generate
from stallbench.scenario import DatasetSpec

SPEC = DatasetSpec(rows=3000, files=2, row_group_rows=500, dense_features=5, sparse_features=3,
                   sparse_cardinality=1000, sequence_features=2, sequence_max_len=6, seed=7)


def _read_all(files: list[Path]) -> pa.Table:
    return pa.concat_tables(pq.read_table(f) for f in files)


def test_key_changes_exactly_with_generator_fields() -> None:
    assert dataset_key(SPEC) == dataset_key(replace(SPEC))
    assert dataset_key(SPEC) == dataset_key(replace(SPEC, label_column="y", dense_columns=["a"]))
    for change in ({"seed": 8}, {"rows": 3001}, {"codec": "zstd"}, {"files": 3},
                   {"row_group_rows": 499}, {"sparse_cardinality": 999}, {"sequence_max_len": 5}):
        assert dataset_key(replace(SPEC, **change)) != dataset_key(SPEC), change


def test_same_spec_gives_identical_bytes(tmp_path: Path) -> None:
    a = generate(SPEC, tmp_path / "a")
    b = generate(SPEC, tmp_path / "b")
    assert [p.name for p in a] == ["part-00000.parquet", "part-00001.parquet"]
    assert [p.name for p in a] == [p.name for p in b]
    for x, y in zip(a, b):
        assert x.read_bytes() == y.read_bytes()
    other = generate(replace(SPEC, seed=8), tmp_path / "c")
    assert other[0].read_bytes() != a[0].read_bytes()


def test_files_live_under_the_key(tmp_path: Path) -> None:
    files = generate(SPEC, tmp_path)
    assert all(f.parent == tmp_path / "datasets" / dataset_key(SPEC) for f in files)
    assert (files[0].parent / synthetic.MARKER).is_file()
    assert not list((tmp_path / "datasets").glob(".tmp-*"))


def test_columns_types_and_ranges(tmp_path: Path) -> None:
    spec = replace(SPEC, rows=20_000, row_group_rows=5000)
    table = _read_all(generate(spec, tmp_path))
    assert table.num_rows == 20_000
    assert table.schema.field("label").type == pa.float32()
    assert table.schema.field("dense_4").type == pa.float32()
    assert table.schema.field("sparse_2").type == pa.int64()
    assert table.schema.field("seq_1").type.value_type == pa.int64()
    label = table["label"].to_numpy()
    assert set(np.unique(label)) <= {0.0, 1.0}
    assert 0.18 < label.mean() < 0.32
    for i in range(spec.dense_features):
        assert table[f"dense_{i}"].to_numpy().min() >= 0
    for i in range(spec.sparse_features):
        ids = table[f"sparse_{i}"].to_numpy()
        assert ids.min() >= 0 and ids.max() < spec.sparse_cardinality
        counts = np.sort(np.bincount(ids, minlength=spec.sparse_cardinality))[::-1]
        assert counts[:10].sum() > 0.1 * len(ids)  # power law: 1% of ids, >10% of rows
    for i in range(spec.sequence_features):
        seq = table[f"seq_{i}"].combine_chunks()
        lengths = pc.list_value_length(seq).to_numpy()
        assert lengths.min() == 1 and lengths.max() == spec.sequence_max_len
        values = seq.flatten().to_numpy()
        assert values.min() >= 0 and values.max() < spec.sparse_cardinality


def test_label_is_learnable_from_features(tmp_path: Path) -> None:
    spec = replace(SPEC, rows=20_000, row_group_rows=5000)
    table = _read_all(generate(spec, tmp_path))
    label = table["label"].to_numpy().astype(bool)
    logd = np.log(table["dense_0"].to_numpy())
    assert logd[label].mean() - logd[~label].mean() > 0.2  # dense_0 has a positive weight


@pytest.mark.parametrize("rows, files, rg, expected", [
    (3000, 2, 500, [[500, 500, 500], [500, 500, 500]]),
    (1001, 2, 300, [[300, 201], [300, 200]]),
    (3, 5, 10, [[1], [1], [1]]),   # never an empty file
])
def test_rows_split_over_files_and_row_groups(tmp_path: Path, rows: int, files: int, rg: int,
                                              expected: list[list[int]]) -> None:
    spec = replace(SPEC, rows=rows, files=files, row_group_rows=rg)
    paths = generate(spec, tmp_path)
    got = []
    for p in paths:
        md = pq.ParquetFile(p).metadata
        got.append([md.row_group(i).num_rows for i in range(md.num_row_groups)])
    assert got == expected


@pytest.mark.parametrize("codec, name", [("none", "UNCOMPRESSED"), ("zstd", "ZSTD")])
def test_codec(tmp_path: Path, codec: str, name: str) -> None:
    path = generate(replace(SPEC, rows=100, codec=codec), tmp_path)[0]
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == name


def test_cache_is_reused_without_rewriting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = generate(SPEC, tmp_path)
    stamps = [f.stat().st_mtime_ns for f in first]

    def boom(*_args: object) -> None:
        raise AssertionError("regenerated a cached dataset")

    monkeypatch.setattr(synthetic, "_write_files", boom)
    second = generate(SPEC, tmp_path)
    assert second == first
    assert [f.stat().st_mtime_ns for f in second] == stamps


def test_damaged_cache_is_regenerated(tmp_path: Path) -> None:
    files = generate(SPEC, tmp_path)
    original = files[1].read_bytes()
    files[1].write_bytes(original[:100])  # truncated by hand: size no longer matches marker
    again = generate(SPEC, tmp_path)
    assert again[1].read_bytes() == original


def test_crash_leaves_nothing_reusable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*_args: object) -> None:
        raise RuntimeError("killed mid-generation")

    monkeypatch.setattr(synthetic, "_write_marker", crash)
    with pytest.raises(RuntimeError):
        generate(SPEC, tmp_path)
    datasets = tmp_path / "datasets"
    assert list(datasets.iterdir()) == []  # no final dir, no temp dir left behind
    monkeypatch.undo()
    assert len(generate(SPEC, tmp_path)) == 2


def test_race_loser_uses_winners_copy(tmp_path: Path) -> None:
    files = generate(SPEC, tmp_path)
    final = files[0].parent
    loser = final.with_name(".tmp-loser")
    shutil.copytree(final, loser)
    synthetic._publish(loser, final)  # rename onto a complete dir fails; must not raise
    assert synthetic.complete_files(final) == files


def test_concurrent_generators_agree(tmp_path: Path) -> None:
    results: list[list[Path]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(generate(SPEC, tmp_path))
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results[0] == results[1]
    assert _read_all(results[0]).num_rows == SPEC.rows
    assert sorted(os.listdir(tmp_path / "datasets")) == [dataset_key(SPEC)]
