"""Opening datasets: shards, schema inference, normalization and clear refusals."""

from __future__ import annotations

import json
import os
import pickle
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stallbench.data.parquet import describe, normalize, open_dataset
from stallbench.data.schema import FeatureSchema
from stallbench.data.synthetic import dataset_key
from stallbench.errors import DataError, UserError
from stallbench.scenario import DatasetSpec

SYN = DatasetSpec(rows=2500, files=2, row_group_rows=400, dense_features=3, sparse_features=2,
                  sparse_cardinality=50, sequence_features=1, sequence_max_len=5, seed=1)
SCENARIO = "bench.toml"


def _write(path: Path, table: pa.Table, **kwargs: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **kwargs)
    return path


def _real_table() -> pa.Table:
    """A messy real-world table: nulls everywhere, strings, a dictionary, negatives."""
    return pa.table({
        "clicked": pa.array([1, 0, None, 1], pa.int8()),
        "price": pa.array([1.5, None, 3.0, 4.0], pa.float64()),
        "is_new": pa.array([True, None, False, True]),
        "user": pa.array([10, None, -3, 2**40], pa.int64()),
        "country": pa.array(["de", None, "fr", "de"]),
        "device": pa.array(["de", "ios", None, "de"]).dictionary_encode(),
        "history": pa.array([[1, None], None, [], [5, 6, 7]], pa.list_(pa.int32())),
        "tags": pa.array([["a"], ["de", None], None, []], pa.list_(pa.string())),
    })


def _spec(path: Path | str, **kw: object) -> DatasetSpec:
    return DatasetSpec(path=str(path), label_column=kw.pop("label_column", "clicked"), **kw)


def _error(spec: DatasetSpec, tmp_path: Path) -> str:
    with pytest.raises(DataError) as info:
        open_dataset(spec, tmp_path / "cache", SCENARIO)
    assert isinstance(info.value, UserError)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- synthetic --------------------------------------------------------------------------------


def test_synthetic_shards_add_up(tmp_path: Path) -> None:
    ds = open_dataset(SYN, tmp_path)
    assert ds.synthetic and ds.rows == 2500 and len(ds.files) == 2
    assert [s.rows for s in ds.shards] == [400, 400, 400, 50] * 2
    assert [s.index for s in ds.shards] == list(range(8))
    assert [(Path(s.file).name, s.row_group) for s in ds.shards[3:5]] == [
        ("part-00000.parquet", 3), ("part-00001.parquet", 0)]
    assert ds.compressed_bytes == sum(s.compressed_bytes for s in ds.shards) > 0
    assert all(s.uncompressed_bytes > 0 for s in ds.shards)
    assert ds.schema == FeatureSchema(dense=("dense_0", "dense_1", "dense_2"),
                                      sparse=("sparse_0", "sparse_1"), sequence=("seq_0",),
                                      label="label", seq_len=5, cardinality=50)


def test_synthetic_read_shard_is_normalized(tmp_path: Path) -> None:
    ds = open_dataset(SYN, tmp_path)
    table = ds.read_shard(ds.shards[3])
    assert table.num_rows == 50
    assert tuple(table.column_names) == ds.schema.columns
    assert table.schema.field("seq_0").type == pa.list_(pa.int64())
    sub = ds.read_shard(ds.shards[0], columns=["label", "sparse_1", "dense_0"])
    assert sub.column_names == ["dense_0", "sparse_1", "label"]  # schema order


def test_dataset_pickles_for_workers(tmp_path: Path) -> None:
    ds = open_dataset(SYN, tmp_path)
    ds.read_shard(ds.shards[0])
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.read_shard(clone.shards[5]).equals(ds.read_shard(ds.shards[5]))


def test_reader_kept_open_sees_a_rewritten_file(tmp_path: Path) -> None:
    """A thread's reader of the file it read last is kept open for its next row group, and
    dropped when the file on disk changed: a rewritten file is read anew, never from the
    reader of the old one."""
    def table(offset: int) -> pa.Table:
        return pa.table({"clicked": pa.array([1, 0, 1, 0], pa.int8()),
                         "user": pa.array([offset + i for i in range(4)], pa.int64())})

    path = _write(tmp_path / "d.parquet", table(0), row_group_size=2)
    ds = open_dataset(_spec(path), tmp_path / "cache", SCENARIO)
    assert ds.read_shard(ds.shards[0]).column("user").to_pylist() == [0, 1]
    held = ds._reader(str(path))
    assert ds._reader(str(path)) is held               # the next row group: same reader
    assert ds.read_shard(ds.shards[1]).column("user").to_pylist() == [2, 3]
    # Replaced by a rename (a new inode): the held reader would still read the old one.
    os.replace(_write(tmp_path / "new.parquet", table(100), row_group_size=2), path)
    assert ds.read_shard(ds.shards[0]).column("user").to_pylist() == [100, 101]
    assert ds._reader(str(path)) is not held
    clone = pickle.loads(pickle.dumps(ds))             # a worker's copy opens its own
    assert clone.read_shard(clone.shards[1]).column("user").to_pylist() == [102, 103]


def test_describe_is_json(tmp_path: Path) -> None:
    info = describe(open_dataset(SYN, tmp_path))
    json.dumps(info)
    assert info["dataset_key"] == dataset_key(SYN)
    assert info["rows"] == 2500 and info["shards"] == 8 and info["files"] == 2
    assert info["dense_columns"] == 3 and info["synthetic"] is True
    assert info["uncompressed_bytes"] > 0 and info["compressed_bytes"] > 0


# --- real files: inference and normalization --------------------------------------------------


def test_real_file_inference_and_normalization(tmp_path: Path) -> None:
    path = _write(tmp_path / "data.parquet", _real_table())
    ds = open_dataset(_spec(path, sequence_max_len=8), tmp_path / "cache", SCENARIO)
    s = ds.schema
    assert (s.dense, s.sparse, s.sequence, s.label) == (
        ("price", "is_new"), ("user", "country", "device"), ("history", "tags"), "clicked")
    assert s.seq_len == 8 and s.cardinality is None and not ds.synthetic
    assert ds.source == str(path) and ds.rows == 4

    t = ds.read_shard(ds.shards[0]).to_pydict()
    assert t["clicked"] == [1.0, 0.0, 0.0, 1.0]
    assert t["price"] == [1.5, 0.0, 3.0, 4.0]
    assert t["is_new"] == [1.0, 0.0, 0.0, 1.0]
    assert t["user"] == [10, 0, (-3) & (2**63 - 1), 2**40]
    assert t["history"] == [[1, 0], [], [], [5, 6, 7]]
    de = t["country"][0]
    assert t["country"] == [de, 0, t["country"][2], de] and de > 0
    assert t["device"][0] == de and t["device"][3] == de      # dictionary hashes like string
    assert t["tags"][1] == [de, 0] and t["tags"][2] == []
    assert all(v >= 0 for col in ("user", "country", "device") for v in t[col])


def test_ids_checked_only_where_the_file_statistics_do_not_vouch_for_them(tmp_path: Path) -> None:
    """A row group whose Parquet statistics say an id column has min >= 0 skips the pass
    over its ids; a negative min, a nullable or a converted column, or a file written without
    statistics is checked as before, and every way gives the same table. Ground truth: the
    ids written, with the documented sign-bit mask applied to the one negative."""
    table = pa.table({
        "y": pa.array([1.0, 0.0, 1.0, 0.0], pa.float32()),
        "good": pa.array([3, 0, 7, 2**40], pa.int64()),
        "neg": pa.array([3, -5, 7, 1], pa.int64()),
        "small": pa.array([1, 2, 3, 4], pa.int32()),
        "seq": pa.array([[1, 2], [], [9], [0, 4, 4]], pa.list_(pa.int64())),
        "negseq": pa.array([[1, -2], [], [9], [0]], pa.list_(pa.int64())),
    })
    spec = _spec("x", label_column="y", sparse_columns=["good", "neg", "small"],
                 sequence_columns=["seq", "negseq"], dense_columns=[])
    want = {"good": [3, 0, 7, 2**40], "neg": [3, (-5) & (2**63 - 1), 7, 1],
            "small": [1, 2, 3, 4], "seq": [[1, 2], [], [9], [0, 4, 4]],
            "negseq": [[1, (-2) & (2**63 - 1)], [], [9], [0]]}
    with_stats = _write(tmp_path / "a" / "s.parquet", table, row_group_size=2)
    without = _write(tmp_path / "b" / "s.parquet", table, row_group_size=2,
                     write_statistics=False)
    got = {}
    for name, path in (("stats", with_stats), ("none", without)):
        ds = open_dataset(replace(spec, path=str(path)), tmp_path / "cache", SCENARIO)
        vouched = {ds._stats_nonneg.get((s.file, s.row_group), frozenset()) for s in ds.shards}
        if name == "stats":
            # the second row group's "neg" holds no negative: its statistics vouch for it;
            # "small" is INT32 (converted anyway, so never vouched for)
            assert vouched == {frozenset({"good", "seq"}),
                               frozenset({"good", "neg", "seq", "negseq"})}
        else:
            assert vouched == {frozenset()}
        read = pa.concat_tables(ds.read_shard(s) for s in ds.shards)
        got[name] = read.select(list(want)).to_pydict()
        assert got[name] == want
        assert pickle.loads(pickle.dumps(ds))._stats_nonneg == ds._stats_nonneg   # workers too


def test_string_hash_is_pinned() -> None:
    """Ids must not change between processes or releases (results compare across runs)."""
    schema = FeatureSchema(dense=(), sparse=("s",), sequence=(), label="y", seq_len=1)
    table = pa.table({"s": ["abc", "", None], "y": [1.0, 0.0, 1.0]})
    assert normalize(table, schema).column("s").to_pylist() == [
        991604145059602541, 8442584544778250395, 0]


def test_normalize_types_and_order() -> None:
    schema = FeatureSchema(dense=("a",), sparse=("b",), sequence=("c",), label="y", seq_len=3)
    table = pa.table({
        "y": pa.array([True, False]),
        "c": pa.array([[1], [2, 3]], pa.large_list(pa.uint16())),
        "b": pa.array([2**64 - 1, 5], pa.uint64()),
        "a": pa.array([1, 2], pa.int16()),
        "ignored": ["x", "y"],
    })
    out = normalize(table, schema)
    assert out.column_names == ["a", "b", "c", "y"]
    assert [f.type for f in out.schema] == [pa.float32(), pa.int64(), pa.list_(pa.int64()),
                                           pa.float32()]
    assert out.column("b").to_pylist() == [2**63 - 1, 5]
    with pytest.raises(DataError, match="f.parquet.*'a'"):
        normalize(table.drop_columns(["a"]), schema, "f.parquet")


def test_normalize_is_fast_enough() -> None:
    rng = np.random.default_rng(0)
    n = 16_384
    table = pa.table({
        **{f"d{i}": rng.random(n) for i in range(10)},
        **{f"s{i}": pa.array(rng.integers(0, 10**6, n).astype(str)) for i in range(5)},
        "q": pa.ListArray.from_arrays(pa.array(np.arange(0, 10 * n + 1, 10, dtype=np.int32)),
                                      pa.array(rng.integers(-5, 10**6, 10 * n))),
        "y": rng.random(n) < 0.3,
    })
    schema = FeatureSchema(dense=tuple(f"d{i}" for i in range(10)),
                           sparse=tuple(f"s{i}" for i in range(5)), sequence=("q",), label="y",
                           seq_len=10)
    start = time.perf_counter()
    out = normalize(table, schema)
    assert out.num_rows == n
    assert time.perf_counter() - start < 0.5  # typically ~20 ms; only catches row loops


# --- real files: explicit lists and refusals ---------------------------------------------------


def _with_struct(tmp_path: Path) -> Path:
    table = _real_table().append_column("meta", pa.array([{"k": 1}, None, {"k": 2}, {"k": 3}]))
    return _write(tmp_path / "s.parquet", table)


def test_struct_column_refused_when_inferring(tmp_path: Path) -> None:
    path = _with_struct(tmp_path)
    msg = _error(_spec(path), tmp_path)
    assert SCENARIO in msg and str(path) in msg
    assert "'meta'" in msg and "struct<k: int64>" in msg
    assert "dataset.dense_columns/sparse_columns/sequence_columns" in msg


def test_struct_column_ignored_with_explicit_lists(tmp_path: Path) -> None:
    path = _with_struct(tmp_path)
    spec = _spec(path, dense_columns=["price"], sparse_columns=["user", "country"],
                 sequence_columns=[])
    ds = open_dataset(spec, tmp_path / "cache", SCENARIO)
    assert ds.schema.columns == ("price", "user", "country", "clicked")
    assert ds.read_shard(ds.shards[0]).column_names == ["price", "user", "country", "clicked"]
    # One list given: the other kinds are still inferred, unusable columns skipped.
    ds = open_dataset(_spec(path, sparse_columns=["user"]), tmp_path / "cache", SCENARIO)
    assert ds.schema.sparse == ("user",)
    assert ds.schema.dense == ("price", "is_new") and "meta" not in ds.schema.columns


def test_explicit_integer_column_as_dense(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.parquet", _real_table())
    ds = open_dataset(_spec(path, dense_columns=["user", "price"]), tmp_path / "c", SCENARIO)
    assert ds.schema.dense == ("user", "price") and "user" not in ds.schema.sparse
    assert ds.read_shard(ds.shards[0]).column("user").type == pa.float32()


def test_explicit_unusable_column_refused(tmp_path: Path) -> None:
    path = _with_struct(tmp_path)
    msg = _error(_spec(path, dense_columns=["meta"]), tmp_path)
    assert "dataset.dense_columns" in msg and "'meta'" in msg and "struct<k: int64>" in msg


def test_list_of_floats_is_not_a_sequence(tmp_path: Path) -> None:
    table = _real_table().append_column("emb", pa.array([[0.5]] * 4, pa.list_(pa.float32())))
    path = _write(tmp_path / "f.parquet", table)
    msg = _error(_spec(path), tmp_path)
    assert "'emb'" in msg and "list<" in msg and "float" in msg


def test_explicit_missing_column_suggests(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.parquet", _real_table())
    msg = _error(_spec(path, sparse_columns=["countyr"]), tmp_path)
    assert "dataset.sparse_columns" in msg and "'countyr'" in msg and "'country'" in msg


def test_column_listed_twice_or_as_label(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.parquet", _real_table())
    msg = _error(_spec(path, dense_columns=["price"], sparse_columns=["price"]), tmp_path)
    assert "'price'" in msg and "dataset.dense_columns" in msg
    msg = _error(_spec(path, dense_columns=["clicked"]), tmp_path)
    assert "'clicked'" in msg and "label" in msg


def test_missing_label(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.parquet", _real_table())
    msg = _error(_spec(path, label_column="click"), tmp_path)
    assert "dataset.label_column" in msg and "'click'" in msg and str(path) in msg
    assert "'clicked'" in msg and "price" in msg and "history" in msg  # suggestion + listing


def test_string_label_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.parquet", _real_table())
    msg = _error(_spec(path, label_column="country"), tmp_path)
    assert "'country'" in msg and "string" in msg


# --- real files: finding and reading -----------------------------------------------------------


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "*.parquet"
    msg = _error(_spec(missing), tmp_path)
    assert msg.startswith(f"{SCENARIO}: dataset.path:") and str(missing) in msg


def test_corrupt_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"this is not parquet at all" * 10)
    msg = _error(_spec(bad), tmp_path)
    assert f"{SCENARIO}: dataset.path: {bad} is not a readable Parquet file (" in msg


def test_truncated_file_among_good_ones(tmp_path: Path) -> None:
    good = _write(tmp_path / "d" / "a.parquet", _real_table())
    data = good.read_bytes()
    cut = tmp_path / "d" / "b.parquet"
    cut.write_bytes(data[: len(data) // 2])
    msg = _error(_spec(tmp_path / "d"), tmp_path)
    assert f"{cut} is not a readable Parquet file" in msg


def test_directory_and_glob(tmp_path: Path) -> None:
    table = _real_table()
    for rel in ("d/part=2/b.parquet", "d/part=1/a.parquet", "d/c.parquet"):
        _write(tmp_path / rel, table, row_group_size=3)
    (tmp_path / "d" / "_SUCCESS").write_text("")
    (tmp_path / "d" / "_tmp").mkdir()
    (tmp_path / "d" / "_tmp" / "junk.parquet").write_bytes(b"junk")
    (tmp_path / "d" / "notes.txt").write_text("hi")
    ds = open_dataset(_spec(tmp_path / "d"), tmp_path / "cache", SCENARIO)
    names = [str(Path(f).relative_to(tmp_path / "d")) for f in ds.files]
    assert names == ["c.parquet", "part=1/a.parquet", "part=2/b.parquet"]
    assert [s.rows for s in ds.shards] == [3, 1] * 3 and ds.rows == 12
    ds = open_dataset(_spec(tmp_path / "d" / "part=*" / "*.parquet"), tmp_path / "c", SCENARIO)
    assert len(ds.files) == 2


def test_relative_path_resolves_next_to_scenario(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "proj" / "data.parquet", _real_table())
    scenario = tmp_path / "proj" / "bench.toml"
    scenario.write_text("")
    monkeypatch.chdir(tmp_path)
    ds = open_dataset(_spec("data.parquet"), tmp_path / "cache", str(scenario))
    assert ds.rows == 4


def test_files_must_share_schema(tmp_path: Path) -> None:
    _write(tmp_path / "d" / "a.parquet", _real_table())
    other = _real_table().set_column(1, "price", pa.array(["1", "2", "3", "4"]))
    odd = _write(tmp_path / "d" / "b.parquet", other)
    msg = _error(_spec(tmp_path / "d"), tmp_path)
    assert str(odd) in msg and "'price'" in msg


def test_compressed_bytes_count_only_used_columns(tmp_path: Path) -> None:
    path = _with_struct(tmp_path)
    all_cols = open_dataset(_spec(path, sparse_columns=["user"], dense_columns=["price"],
                                  sequence_columns=["history", "tags"]), tmp_path / "c", SCENARIO)
    fewer = open_dataset(_spec(path, sparse_columns=["user"], dense_columns=[],
                               sequence_columns=[]), tmp_path / "c", SCENARIO)
    assert 0 < fewer.compressed_bytes < all_cols.compressed_bytes


def test_corrupt_row_group_read_is_a_data_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.parquet", _real_table(), compression="none")
    ds = open_dataset(_spec(path), tmp_path / "cache", SCENARIO)
    data = bytearray(path.read_bytes())
    data[4:200] = b"\xff" * 196  # smash the column chunks, keep the footer
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=f"{path}: row group 0"):
        ds.read_shard(ds.shards[0])


def test_synthetic_and_real_agree_on_schema_shape(tmp_path: Path) -> None:
    """Opening the synthetic files as a 'real' dataset infers the same kinds."""
    syn = open_dataset(SYN, tmp_path)
    real = open_dataset(replace(SYN, path=syn.source), tmp_path, SCENARIO)
    assert real.schema.with_(cardinality=50) == syn.schema
    assert real.read_shard(real.shards[2]).equals(syn.read_shard(syn.shards[2]))
