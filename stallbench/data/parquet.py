"""Parquet datasets: find the files, decide which column is which, and normalize batches.

Everything downstream (collate, models, payloads) relies on one canonical typed table, so the
messy parts of real-world files (nulls, strings, dictionaries, negative ids, odd widths) are
dealt with here once: dense and label become float32, ids become non-negative int64, sequences
become list<int64>. Anything that cannot be made into one of those is refused up front with a
message naming the file and column, never half-read at batch 10 000.

Id conventions (documented because they change which ids collide):
  * null dense / label values -> 0.0; bool -> 0.0 / 1.0;
  * null ids -> 0 (so a null shares id 0);
  * negative integer ids -> their two's-complement bits with the sign bit cleared
    (``x & (2**63 - 1)``), which is non-negative, vectorised and overflow-free;
  * strings -> a stable 63-bit hash of their UTF-8 bytes (defined in this file, identical in
    every process and version; never Python's ``hash()``), computed once per distinct value;
  * null sequences -> empty lists; null items -> 0.

Finding a negative id takes a pass over every id of every row group; where the file's Parquet
statistics already say an INT64 id column's minimum is >= 0 (pyarrow and most writers store
them), that row group's column is trusted and not read, as query engines trust them to skip
row groups. Normalizing an already canonical table touches only what changes (no rebuild).
"""

from __future__ import annotations

import glob
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import DataError
from ..registry import closest
from ..scenario import DatasetSpec
from .schema import FeatureSchema, Shard
from .synthetic import dataset_key, generate

_SIGN_MASK = 2**63 - 1
_GLOB_CHARS = set("*?[")
_UNREADABLE = (pa.ArrowException, OSError, ValueError)


@dataclass
class Dataset:
    files: list[str]
    shards: list[Shard]
    schema: FeatureSchema
    synthetic: bool
    source: str
    rows: int
    compressed_bytes: int
    dataset_key: str | None = None
    # Where the dataset was named ("s.toml: dataset.path"), so an error reading a row group,
    # in whichever process, names the scenario file and key too.
    origin: str = ""
    # Parsed footers, so reading a row group does not re-parse the file's footer each time.
    # Per process: dropped when pickled (workers rebuild their own lazily).
    _footers: dict[str, Any] = field(default_factory=dict, init=False, repr=False,
                                     compare=False)
    # Per (file, row group): the id columns whose Parquet statistics already say no id is
    # negative (``_nonneg_from_stats``), read from the footers once at open and shipped to
    # workers with the dataset, so normalizing those columns skips its pass over every id.
    _stats_nonneg: dict[tuple[str, int], frozenset[str]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    # The file this thread read last, kept open (``_reader``): per thread and process, not
    # pickled.
    _open: threading.local = field(default_factory=threading.local, init=False, repr=False,
                                   compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_footers"] = {}
        state.pop("_open", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open = threading.local()

    def _reader(self, file: str) -> pq.ParquetFile:
        """An open reader of ``file``: the one this thread used last when it is the same file,
        unchanged on disk (inode, size, modification time), in the same process.

        Why: a plan reads a file's row groups one after another, and opening the file again
        for each (``ParquetFile`` with its parsed footer) cost 0.25-0.85 ms of CPU per row
        group here (open, reader set-up; medians of 40 interleaved reads at load 4-6): 2-5% of
        reading an 8,192- or 16,384-row group of the held-out data, which a reader kept open
        for the next row group does not pay. One file per thread stays
        open (a thread's fetches are sequential; a forked process opens its own, as its
        pid differs), closed when the thread moves to another file."""
        st = os.stat(file)
        key = (os.getpid(), file, st.st_ino, st.st_size, st.st_mtime_ns)
        held = getattr(self._open, "held", None)
        if held is not None and held[0] == key:
            return held[1]
        if held is not None:
            self.close_reader()
        footer = self._footers.get(file)
        pf = pq.ParquetFile(file, metadata=footer)
        self._footers.setdefault(file, pf.metadata)
        self._open.held = (key, pf)
        return pf

    def close_reader(self) -> None:
        """Close the reader this thread holds open (``_reader``), if any: after a failed
        read, and where a long-lived dataset (a Flight server's) is done with a stream."""
        held = getattr(self._open, "held", None)
        self._open.held = None
        if held is not None and held[0][0] == os.getpid():
            try:
                held[1].close()
            except Exception:  # noqa: BLE001 - a reader that cannot close is dropped anyway
                pass

    def read_shard(self, shard: Shard, columns: Iterable[str] | None = None) -> pa.Table:
        """Read one row group and return it normalized (no storage emulation here)."""
        names = _ordered(self.schema, columns)
        try:
            table = self._reader(shard.file).read_row_group(shard.row_group, columns=list(names))
        except _UNREADABLE as exc:
            self.close_reader()
            raise DataError(f"{self._where()}{shard.file}: row group {shard.row_group} is not "
                            f"readable ({_reason(exc)})") from None
        return _normalize_columns(table, self.schema, names, self._where() + shard.file,
                                  self._stats_nonneg.get((shard.file, shard.row_group),
                                                         frozenset()))

    def _where(self) -> str:
        return f"{self.origin}: " if self.origin else ""


def open_dataset(spec: DatasetSpec, cache_dir: Path, scenario_file: str = "<scenario>") -> Dataset:
    """Open the scenario's dataset: generate-and-cache a synthetic one or inspect real files."""
    if spec.path is None:
        return _open_synthetic(spec, Path(cache_dir))
    files = _find_files(spec.path, scenario_file)
    footers = {f: _read_footer(f, scenario_file) for f in files}
    first = footers[files[0]].schema.to_arrow_schema()
    schema = infer_schema(first, spec, scenario_file, files[0])
    _check_same_schema(footers, first, schema, scenario_file)
    return _build(files, footers, schema, synthetic=False, source=spec.path, key=None,
                  origin=f"{scenario_file}: dataset.path")


def normalize(table: pa.Table, schema: FeatureSchema, file: str = "?") -> pa.Table:
    """The canonical typed table every downstream stage relies on, in schema.columns order."""
    return _normalize_columns(table, schema, schema.columns, file)


def describe(ds: Dataset) -> dict[str, Any]:
    """Json-able dataset summary for results metadata (what was measured, how big)."""
    out: dict[str, Any] = {
        "source": ds.source,
        "synthetic": ds.synthetic,
        "files": len(ds.files),
        "rows": ds.rows,
        "shards": len(ds.shards),
        "compressed_bytes": ds.compressed_bytes,
        "uncompressed_bytes": sum(s.uncompressed_bytes for s in ds.shards),
        "dense_columns": len(ds.schema.dense),
        "sparse_columns": len(ds.schema.sparse),
        "sequence_columns": len(ds.schema.sequence),
        "label": ds.schema.label,
        "seq_len": ds.schema.seq_len,
        "cardinality": ds.schema.cardinality,
    }
    if ds.synthetic:
        out["dataset_key"] = ds.dataset_key
    return out


# --- opening ---------------------------------------------------------------------------------


def _open_synthetic(spec: DatasetSpec, cache_dir: Path) -> Dataset:
    paths = generate(spec, cache_dir)
    files = [str(p) for p in paths]
    footers = {f: _read_footer(f, "<synthetic>") for f in files}
    schema = FeatureSchema(
        dense=tuple(f"dense_{i}" for i in range(spec.dense_features)),
        sparse=tuple(f"sparse_{i}" for i in range(spec.sparse_features)),
        sequence=tuple(f"seq_{i}" for i in range(spec.sequence_features)),
        label="label",
        seq_len=spec.sequence_max_len,
        cardinality=spec.sparse_cardinality,
    )
    source = str(paths[0].parent)
    return _build(files, footers, schema, synthetic=True, source=source, key=dataset_key(spec))


def _find_files(path: str, scenario_file: str) -> list[str]:
    """A file, a directory (every *.parquet below it) or a glob; relative to the CWD first.

    If nothing matches relative to the working directory, the path is tried relative to the
    scenario file's directory, so scenarios stored next to their data work from anywhere.
    """
    found = _match(os.path.expanduser(path))
    base = Path(scenario_file).parent
    if not found and not os.path.isabs(path) and Path(scenario_file).is_file():
        found = _match(str(base / path))
    if not found:
        raise DataError(f"{scenario_file}: dataset.path: no Parquet files found at {path!r}")
    return found


def _match(path: str) -> list[str]:
    if any(c in _GLOB_CHARS for c in path):
        hits = sorted(glob.glob(path, recursive=True))
        out: list[str] = []
        for h in hits:
            out += _below(h) if os.path.isdir(h) else [h]
        return [os.path.abspath(p) for p in out if os.path.isfile(p)]
    if os.path.isdir(path):
        return [os.path.abspath(p) for p in _below(path)]
    return [os.path.abspath(path)] if os.path.isfile(path) else []


def _below(directory: str) -> list[str]:
    """*.parquet below a directory, skipping hidden and _-prefixed entries (Spark/Hive markers)."""
    out = []
    for p in sorted(Path(directory).rglob("*.parquet")):
        rel = p.relative_to(directory).parts
        if p.is_file() and not any(part.startswith((".", "_")) for part in rel):
            out.append(str(p))
    return out


def _read_footer(file: str, scenario_file: str) -> pq.FileMetaData:
    try:
        with pq.ParquetFile(file) as pf:
            return pf.metadata
    except _UNREADABLE as exc:
        raise DataError(f"{scenario_file}: dataset.path: {file} is not a readable Parquet file "
                        f"({_reason(exc)})") from exc


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _check_same_schema(footers: dict[str, pq.FileMetaData], first: pa.Schema,
                       schema: FeatureSchema, scenario_file: str) -> None:
    """Every file must have each used column with the first file's type (extras are ignored)."""
    for file, footer in footers.items():
        arrow = footer.schema.to_arrow_schema()
        for name in schema.columns:
            expected = first.field(name).type
            idx = arrow.get_field_index(name)
            if idx < 0:
                raise DataError(f"{scenario_file}: dataset.path: {file} has no column {name!r}, "
                                f"which the first file has; all files must share the schema")
            if arrow.field(idx).type != expected:
                raise DataError(f"{scenario_file}: dataset.path: {file}: column {name!r} has "
                                f"type {arrow.field(idx).type}, but {expected} in the first file; "
                                f"all files must share the schema")


def _build(files: list[str], footers: dict[str, pq.FileMetaData], schema: FeatureSchema, *,
           synthetic: bool, source: str, key: str | None, origin: str = "") -> Dataset:
    shards: list[Shard] = []
    stats_nonneg: dict[tuple[str, int], frozenset[str]] = {}
    used = set(schema.columns)
    for file in files:
        footer = footers[file]
        leaf_owner = _leaf_owners(footer)
        for rg in range(footer.num_row_groups):
            meta = footer.row_group(rg)
            if meta.num_rows == 0:
                continue
            chunks = [meta.column(i) for i in range(meta.num_columns) if leaf_owner[i] in used]
            nonneg = _nonneg_from_stats(chunks, [o for o in leaf_owner if o in used],
                                        schema.sparse + schema.sequence)
            if nonneg:
                stats_nonneg[(file, rg)] = nonneg
            shards.append(Shard(
                index=len(shards), file=file, row_group=rg, rows=meta.num_rows,
                compressed_bytes=sum(c.total_compressed_size for c in chunks),
                uncompressed_bytes=sum(c.total_uncompressed_size for c in chunks),
            ))
    rows = sum(s.rows for s in shards)
    if rows == 0:
        where = f"{origin}: " if origin else ""
        raise DataError(f"{where}{source!r} has no rows ({len(files)} file(s), "
                        f"{sum(f.num_row_groups for f in footers.values())} row group(s)): "
                        "nothing to measure")
    ds = Dataset(files=files, shards=shards, schema=schema, synthetic=synthetic, source=source,
                 rows=rows, compressed_bytes=sum(s.compressed_bytes for s in shards),
                 dataset_key=key, origin=origin)
    ds._footers.update(footers)
    ds._stats_nonneg.update(stats_nonneg)
    return ds


def _nonneg_from_stats(chunks: list[Any], owners: list[str], ids: tuple[str, ...]) -> frozenset[str]:
    """The id columns of one row group whose every leaf is INT64 with Parquet statistics
    saying min >= 0: normalizing them needs no pass over their ids to find a negative one.

    Why trust the statistics: they are what every query engine's predicate push-down trusts,
    written by the file's writer from the very values; reading them here costs a few
    microseconds per column at open, against a read of every id of every row group on the
    hot path (one pass over ~160 MB per 262k rows of the held-out data). A column without
    statistics (or with a negative min) is checked as before."""
    want = set(ids)
    ok: dict[str, bool] = {}
    for c, owner in zip(chunks, owners):
        if owner not in want or ok.get(owner) is False:
            continue
        good = False
        try:
            st = c.statistics if c.is_stats_set else None
            good = (st is not None and c.physical_type == "INT64" and st.has_min_max
                    and isinstance(st.min, int) and st.min >= 0)
        except (ValueError, TypeError, pa.ArrowException):
            good = False
        ok[owner] = good
    return frozenset(k for k, v in ok.items() if v)


def _leaf_owners(footer: pq.FileMetaData) -> list[str]:
    """Top-level column owning each Parquet leaf (so only used columns' bytes are counted)."""
    top = footer.schema.to_arrow_schema().names
    owners = []
    for i in range(footer.num_columns):
        path = footer.schema.column(i).path
        matches = [n for n in top if path == n or path.startswith(n + ".")]
        owners.append(max(matches, key=len) if matches else path)
    return owners


# --- schema inference ------------------------------------------------------------------------


_KEYS = {"dense": "dataset.dense_columns", "sparse": "dataset.sparse_columns",
         "sequence": "dataset.sequence_columns"}


def infer_schema(arrow: pa.Schema, spec: DatasetSpec, scenario_file: str = "<scenario>",
                 file: str = "?") -> FeatureSchema:
    """Decide the kind of each column: explicit lists win, the rest is inferred from types.

    A kind whose list is None is inferred from the columns no list mentions ([] means none).
    Columns of unusable types are an error only when no list at all was given: then the user
    has not yet said which columns matter, and silently dropping one would hide a feature.
    """
    names = arrow.names
    label = _check_label(arrow, spec.label_column, scenario_file, file)
    explicit = {"dense": spec.dense_columns, "sparse": spec.sparse_columns,
                "sequence": spec.sequence_columns}
    claimed: dict[str, str] = {}
    for kind, cols in explicit.items():
        for col in cols or []:
            _check_explicit(arrow, col, kind, label, claimed, scenario_file, file)
            claimed[col] = kind
    any_explicit = any(cols is not None for cols in explicit.values())
    inferred: dict[str, list[str]] = {"dense": [], "sparse": [], "sequence": []}
    for name in names:
        if name == label or name in claimed:
            continue
        kind = _default_kind(arrow.field(name).type)
        if kind is None and not any_explicit:
            raise DataError(
                f"{scenario_file}: dataset.path: {file}: column {name!r} has type "
                f"{arrow.field(name).type}, which stallbench cannot use; list the columns to use "
                f"in dataset.dense_columns/sparse_columns/sequence_columns")
        if kind is not None:
            inferred[kind].append(name)
    chosen = {k: tuple(explicit[k]) if explicit[k] is not None else tuple(inferred[k])
              for k in explicit}
    return FeatureSchema(dense=chosen["dense"], sparse=chosen["sparse"],
                         sequence=chosen["sequence"], label=label, seq_len=spec.sequence_max_len,
                         cardinality=None)


def _check_label(arrow: pa.Schema, label: str, scenario_file: str, file: str) -> str:
    if arrow.get_field_index(label) < 0:
        raise DataError(f"{scenario_file}: dataset.label_column: {file} has no column {label!r}"
                        f"{_suggest(label, arrow.names)}; available columns: "
                        f"{_listing(arrow.names)}")
    typ = arrow.field(label).type
    if not _is_numeric(typ):
        raise DataError(f"{scenario_file}: dataset.label_column: column {label!r} in {file} has "
                        f"type {typ}; a label must be numeric or boolean")
    return label


def _check_explicit(arrow: pa.Schema, col: str, kind: str, label: str, claimed: dict[str, str],
                    scenario_file: str, file: str) -> None:
    key = _KEYS[kind]
    if arrow.get_field_index(col) < 0:
        raise DataError(f"{scenario_file}: {key}: {file} has no column {col!r}"
                        f"{_suggest(col, arrow.names)}; available columns: "
                        f"{_listing(arrow.names)}")
    if col == label:
        raise DataError(f"{scenario_file}: {key}: {col!r} is the label column "
                        f"(dataset.label_column) and cannot also be a feature")
    if col in claimed:
        raise DataError(f"{scenario_file}: {key}: column {col!r} is already listed in "
                        f"{_KEYS[claimed[col]]}")
    typ = arrow.field(col).type
    if not _ACCEPTS[kind](typ):
        raise DataError(f"{scenario_file}: {key}: column {col!r} in {file} has type {typ}, "
                        f"which stallbench cannot use as a {kind} feature "
                        f"(allowed: {_ALLOWED[kind]})")


def _suggest(name: str, options: list[str]) -> str:
    close = closest(name, options)
    return f" (did you mean {close!r}?)" if close is not None else ""


def _listing(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _is_numeric(t: pa.DataType) -> bool:
    return (pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_boolean(t)
            or pa.types.is_decimal(t))


def _is_id(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _is_id(t.value_type)
    return pa.types.is_integer(t) or _is_string(t)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_id_list(t: pa.DataType) -> bool:
    lists = (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))
    return lists and _is_id(t.value_type)


def _default_kind(t: pa.DataType) -> str | None:
    if pa.types.is_floating(t) or pa.types.is_boolean(t):
        return "dense"
    if _is_id(t):
        return "sparse"
    if _is_id_list(t):
        return "sequence"
    return None


_ACCEPTS = {"dense": _is_numeric, "sparse": _is_id, "sequence": _is_id_list}
_ALLOWED = {"dense": "float, integer, boolean, decimal",
            "sparse": "integer, string, dictionary",
            "sequence": "list of integer or string"}


# --- normalization (runs on every batch: vectorised only) -------------------------------------


def _ordered(schema: FeatureSchema, columns: Iterable[str] | None) -> tuple[str, ...]:
    if columns is None:
        return schema.columns
    wanted = set(columns)
    unknown = wanted - set(schema.columns)
    if unknown:
        raise KeyError(f"columns not in the dataset schema: {sorted(unknown)}")
    return tuple(c for c in schema.columns if c in wanted)


def _normalize_columns(table: pa.Table, schema: FeatureSchema, names: tuple[str, ...],
                       file: str, nonneg: frozenset[str] = frozenset()) -> pa.Table:
    """``nonneg``: id columns known to hold no negative id (``_nonneg_from_stats``).

    Runs once per row group on the fetch stage's path, so it touches only what changes: a
    column already canonical is kept as it is, and when the columns come in order the table
    is patched column by column (``set_column``) instead of rebuilt (measured: rebuilding a
    65-column table, or even listing its column names, costs 50-170 us, more than checking
    every column)."""
    dense = set(schema.dense) | {schema.label}
    sparse = set(schema.sparse)
    have = table.schema.names
    index = {n: i for i, n in enumerate(have)}
    arrays = []
    replaced = []
    for name in names:
        i = index.get(name)
        if i is None:
            raise DataError(f"{file}: column {name!r} is missing")
        col = table.column(i)
        if name in dense:
            convert = _to_float32
        elif name in sparse:
            convert = _to_ids
        else:
            convert = _to_id_lists
        try:
            if col.num_chunks == 1:         # what a row group read gives: no list to build
                c = col.chunk(0)
                o = convert(c, name in nonneg)
                same, out = o is c, [o]
            else:
                chunks = col.chunks
                out = [convert(c, name in nonneg) for c in chunks]
                same = all(a is b for a, b in zip(out, chunks))
            if same:
                arrays.append(col)
            else:
                col = pa.chunked_array(out, type=_OUT_TYPE[convert])
                arrays.append(col)
                replaced.append((len(arrays) - 1, name, col))
        except (pa.ArrowException, TypeError) as exc:
            raise DataError(f"{file}: column {name!r} of type {col.type} cannot be converted "
                            f"({_reason(exc)})") from None
        except DataError as exc:
            raise DataError(f"{file}: column {name!r}: {exc}") from None
    if have != list(names):
        return pa.Table.from_arrays(arrays, names=list(names))
    for i, name, col in replaced:
        table = table.set_column(i, pa.field(name, col.type), col)
    if table.schema.metadata:
        table = table.replace_schema_metadata(None)
    return table


def _to_float32(arr: pa.Array, nonneg: bool = False) -> pa.Array:
    if arr.type == pa.float32() and arr.null_count == 0:
        return arr
    out = pc.cast(arr, pa.float32(), safe=False)
    return out.fill_null(0.0) if out.null_count else out


def _nonneg_int64(arr: pa.Array, nonneg: bool = False) -> bool:
    """Already canonical ids: int64, no nulls, no negatives (checked on a zero-copy view, one
    read pass, instead of writing a masked copy of every id column of every row group;
    ``nonneg``: the file's statistics already say so, no pass)."""
    if arr.type != pa.int64() or arr.null_count:
        return False
    if len(arr) == 0 or nonneg:
        return True
    # A view of the data buffer (Array.to_numpy would import pandas in every forked worker).
    view = np.frombuffer(arr.buffers()[1], dtype=np.int64, count=len(arr), offset=arr.offset * 8)
    return bool(view.min() >= 0)


def _to_ids(arr: pa.Array, nonneg: bool = False) -> pa.Array:
    if _nonneg_int64(arr, nonneg):
        return arr
    if pa.types.is_dictionary(arr.type):
        return _via_dictionary(arr)
    if _is_string(arr.type):
        return _via_dictionary(pc.dictionary_encode(arr))
    out = pc.bit_wise_and(pc.cast(arr, pa.int64(), safe=False), pa.scalar(_SIGN_MASK, pa.int64()))
    return out.fill_null(0) if out.null_count else out


def _via_dictionary(arr: pa.DictionaryArray) -> pa.Array:
    """Convert each distinct value once, then gather by index (dictionaries are small)."""
    values = _to_ids(arr.dictionary) if not _is_string(arr.dictionary.type) else \
        pa.array(_hash_strings(arr.dictionary), type=pa.int64())
    out = values.take(arr.indices)
    return out.fill_null(0) if out.null_count else out


def _to_id_lists(arr: pa.Array, nonneg: bool = False) -> pa.Array:
    if (pa.types.is_list(arr.type) and arr.null_count == 0 and arr.offset == 0
            and _nonneg_int64(arr.values, nonneg)):
        # Canonical already but for the child field's name (Parquet says "element", Arrow
        # "item"): same buffers, so a zero-copy rebuild instead of flatten + mask + rebuild.
        return pa.ListArray.from_arrays(arr.offsets, arr.values)
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = _to_ids(pc.list_flatten(arr))  # list_flatten skips null lists' values
    if offsets[-1] >= 2**31:
        raise DataError("a sequence column holds >= 2**31 ids in one row group; "
                        "use smaller row groups")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


_OUT_TYPE = {_to_float32: pa.float32(), _to_ids: pa.int64(), _to_id_lists: pa.list_(pa.int64())}

# --- stable string hash ------------------------------------------------------------------------

_P = np.uint64(0x100000001B3)           # FNV-64 prime as the polynomial base
_M1 = np.uint64(0xBF58476D1CE4E5B9)     # splitmix64 finaliser constants
_M2 = np.uint64(0x94D049BB133111EB)
_LEN_MIX = np.uint64(0x9E3779B97F4A7C15)
_BASIS = np.uint64(0xCBF29CE484222325)    # FNV-64 offset basis
_NO_BYTES = np.zeros(0, dtype=np.uint8)


_HASH_BLOCK = 2 * 2**20    # string bytes hashed at once: temporaries are ~40 bytes per byte


def _hash_strings(arr: pa.Array) -> np.ndarray:
    """Stable 63-bit hash of each string's UTF-8 bytes, vectorised over blocks of bytes.

    Basis plus the polynomial sum of (byte + 1) * P**position mod 2**64, mixed with the
    length and finished with splitmix64. Defined here (not by a library) so ids never change
    across processes, machines or library versions. Null entries get id 0, like null int ids.
    Memory is bounded whatever the strings: rows are hashed in groups of at most
    ``_HASH_BLOCK`` bytes, and a longer string on its own, block by block (a 10 MB Parquet of
    1 MiB strings used to need ~40 bytes of temporaries per string byte: 7 GB).
    """
    arr = pc.cast(arr, pa.large_string()) if not pa.types.is_large_string(arr.type) else arr
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[arr.offset: arr.offset + n + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else _NO_BYTES
    lengths = np.diff(offsets)
    h = np.full(n, _BASIS, dtype=np.uint64)  # non-zero: "" must not hash like null
    total = int(lengths.sum())
    if total > _HASH_BLOCK:
        _sum_blocked(h, data, offsets, lengths)
    elif total:
        starts = offsets[:-1]
        first = np.repeat(starts, lengths)
        pos_in_string = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        powers = np.cumprod(np.full(int(lengths.max()), _P, dtype=np.uint64))
        byte_values = data[first + pos_in_string].astype(np.uint64) + np.uint64(1)
        contrib = byte_values * powers[pos_in_string]
        nonempty = lengths > 0
        segment_starts = (np.cumsum(lengths) - lengths)[nonempty]
        h[nonempty] += np.add.reduceat(contrib, segment_starts)
    _finish(h, lengths)
    out = (h & np.uint64(_SIGN_MASK)).astype(np.int64)
    if arr.null_count:
        out[~arr.is_valid().to_numpy(zero_copy_only=False)] = 0
    return out


def _sum_blocked(h: np.ndarray, data: np.ndarray, offsets: np.ndarray,
                 lengths: np.ndarray) -> None:
    """The polynomial sums of ``_hash_strings`` for rows [i, j) of at most ``_HASH_BLOCK``
    bytes at a time (the same arithmetic on slices), and of a longer string in blocks of its
    bytes: P**(k*B + i + 1) = P**(k*B) * P**(i + 1) mod 2**64."""
    ends = np.cumsum(lengths)
    i, n = 0, len(lengths)
    while i < n:
        if lengths[i] > _HASH_BLOCK:
            own = _long_string_sum(data[offsets[i]: offsets[i + 1]])
            h[i] = np.uint64((int(h[i]) + own) % 2**64)
            i += 1
            continue
        base = ends[i] - lengths[i]
        j = int(np.searchsorted(ends, base + _HASH_BLOCK, side="right"))
        j = max(j, i + 1)
        while j > i + 1 and lengths[j - 1] > _HASH_BLOCK:
            j -= 1
        seg = lengths[i:j]
        total = int(seg.sum())
        if total:
            starts = offsets[i:j] - offsets[i]
            chunk = data[offsets[i]: offsets[j]]
            first = np.repeat(starts, seg)
            pos = np.arange(total) - np.repeat(np.cumsum(seg) - seg, seg)
            powers = np.cumprod(np.full(int(seg.max()), _P, dtype=np.uint64))
            contrib = (chunk[first + pos].astype(np.uint64) + np.uint64(1)) * powers[pos]
            nonempty = seg > 0
            h[i:j][nonempty] += np.add.reduceat(contrib, (np.cumsum(seg) - seg)[nonempty])
        i = j


def _long_string_sum(s: np.ndarray) -> int:
    powers = np.cumprod(np.full(_HASH_BLOCK, _P, dtype=np.uint64))
    acc = 0
    for k in range(0, len(s), _HASH_BLOCK):
        block = s[k: k + _HASH_BLOCK].astype(np.uint64) + np.uint64(1)
        part = int((block * powers[: len(block)]).sum(dtype=np.uint64))
        acc = (acc + part * pow(int(_P), k, 2**64)) % 2**64
    return acc


def _finish(h: np.ndarray, lengths: np.ndarray) -> None:
    h ^= lengths.astype(np.uint64) * _LEN_MIX
    h ^= h >> np.uint64(30)
    h *= _M1
    h ^= h >> np.uint64(27)
    h *= _M2
    h ^= h >> np.uint64(31)
