"""Built-in preprocessing transforms for recommender tables.

Each is real, vectorised work of the kind production pipelines do (Meta DPP, Pinterest's
last-mile processing): dense log/normalize, id hashing, sequence truncation, negative
downsampling, row filters and a map-side join. Every transform is deterministic given the shard
index, so batches do not depend on which worker ran them.
"""

from __future__ import annotations

import math
import operator
import traceback
from typing import Any, Callable, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..data.schema import FeatureSchema
from .. import interrupts
from ..errors import NoProgress, UserCodeError, describe_exception, user_code, user_frame
from ..registry import Registry, import_object, locate, user_dirs

TRANSFORMS: Registry[type["Transform"]] = Registry("transform")


class Transform:
    """One step of preprocessing: a schema in, a schema out, a table function."""

    name: ClassVar[str]
    params: ClassVar[dict[str, Any]] = {}   # accepted params and their defaults

    def __init__(self, schema: FeatureSchema, seed: int = 0, **params: Any) -> None:
        unknown = set(params) - set(self.params)
        if unknown:
            valid = ", ".join(self.params) or "none"
            raise ValueError(f"unknown parameter {sorted(unknown)[0]!r} (valid: {valid})")
        self.schema_in = schema
        self.seed = seed
        self.p = {**self.params, **params}
        check_finite(self.p)
        self.check()

    def check(self) -> None:
        """Validate parameters early, before any run starts."""

    def output_schema(self) -> FeatureSchema:
        return self.schema_in

    def __call__(self, table: pa.Table, shard_index: int) -> pa.Table:
        raise NotImplementedError


def check_finite(params: dict[str, Any]) -> None:
    """Every number in a transform's parameters is finite (TOML allows nan and inf)."""
    for k, v in params.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{k}: expected a finite number, got {v}")


def _int_param(p: dict[str, Any], name: str, lo: int, hi: int) -> None:
    v = p[name]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{name}: expected a whole number in [{lo:,}, {hi:,}], got {v!r}")


def _replace(table: pa.Table, name: str, arr: pa.Array | np.ndarray) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, pa.array(arr) if isinstance(arr, np.ndarray) else arr)


def _flat(col: pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


@TRANSFORMS.register("log_dense")
class LogDense(Transform):
    """log1p of non-negative dense values: tames the heavy tails of counts."""

    name = "log_dense"

    def __call__(self, table: pa.Table, shard_index: int) -> pa.Table:
        for c in self.schema_in.dense:
            x = _flat(table[c]).to_numpy(zero_copy_only=False)
            table = _replace(table, c, np.log1p(np.maximum(x, 0, dtype=np.float32)))
        return table


@TRANSFORMS.register("normalize_dense")
class NormalizeDense(Transform):
    """Standardise dense columns with given or per-shard statistics (per-shard is documented
    as an approximation: it keeps the transform stateless and worker-independent)."""

    name = "normalize_dense"
    params = {"mean": None, "std": None, "clip": 5.0}

    def check(self) -> None:
        for k in ("mean", "std", "clip"):
            v = self.p[k]
            if v is None and k != "clip":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{k}: expected a number, got {v!r}")
        if not self.p["clip"] > 0:
            raise ValueError(f"clip: expected a number > 0, got {self.p['clip']!r}")

    def __call__(self, table: pa.Table, shard_index: int) -> pa.Table:
        clip = float(self.p["clip"])
        for c in self.schema_in.dense:
            x = _flat(table[c]).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
            mean = float(self.p["mean"]) if self.p["mean"] is not None else float(x.mean()) if x.size else 0.0
            std = float(self.p["std"]) if self.p["std"] is not None else float(x.std()) if x.size else 1.0
            y = (x - np.float32(mean)) / np.float32(std if std > 0 else 1.0)
            table = _replace(table, c, np.clip(y, -clip, clip).astype(np.float32))
        return table


_PRIME = np.int64(0x9E3779B1)


def hash_ids(ids: np.ndarray, buckets: int, salt: int) -> np.ndarray:
    """Multiplicative hashing into [0, buckets): cheap, deterministic, spreads Zipf heads."""
    h = (ids.astype(np.int64) * _PRIME + np.int64(salt)) & np.int64(0x7FFFFFFFFFFFFFFF)
    return h % np.int64(buckets)


@TRANSFORMS.register("hash_ids")
class HashIds(Transform):
    """Hash sparse and sequence ids into a fixed number of buckets (the embedding table size)."""

    name = "hash_ids"
    params = {"buckets": 100_000}

    def check(self) -> None:
        _int_param(self.p, "buckets", 1, 2**62)

    def output_schema(self) -> FeatureSchema:
        return self.schema_in.with_(cardinality=int(self.p["buckets"]))

    def __call__(self, table: pa.Table, shard_index: int) -> pa.Table:
        b = int(self.p["buckets"])
        for i, c in enumerate(self.schema_in.sparse):
            ids = _flat(table[c]).to_numpy(zero_copy_only=False)
            table = _replace(table, c, hash_ids(ids, b, i + 1))
        for i, c in enumerate(self.schema_in.sequence):
            arr = _flat(table[c])
            values = pc.list_flatten(arr).to_numpy(zero_copy_only=False)
            offsets = _offsets(arr)
            hashed = pa.array(hash_ids(values, b, 1000 + i))
            table = _replace(table, c, pa.ListArray.from_arrays(pa.array(offsets), hashed))
        return table


def _offsets(arr: pa.Array) -> np.ndarray:
    """Offsets of a list array relative to its flattened values (handles sliced arrays)."""
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    out = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=out[1:])
    return out


@TRANSFORMS.register("truncate_sequences")
class TruncateSequences(Transform):
    """Keep the most recent ``max_len`` items of each sequence (the tail: recency matters)."""

    name = "truncate_sequences"
    params = {"max_len": 16}

    def check(self) -> None:
        _int_param(self.p, "max_len", 1, 100_000)

    def output_schema(self) -> FeatureSchema:
        return self.schema_in.with_(seq_len=min(int(self.p["max_len"]), self.schema_in.seq_len))

    def __call__(self, table: pa.Table, shard_index: int) -> pa.Table:
        n = int(self.p["max_len"])
        for c in self.schema_in.sequence:
            arr = _flat(table[c])
            lengths = pc.fill_null(pc.list_value_length(arr), 0)
            start = pc.max_element_wise(pc.subtract(lengths, n), 0)
            values = pc.list_flatten(arr).to_numpy(zero_copy_only=False)
            offsets = _offsets(arr)
            s = start.to_numpy(zero_copy_only=False)
            new_len = offsets[1:] - offsets[:-1] - s
            keep = np.ones(values.size, dtype=bool)
            if s.any():
                # drop the first s[i] items of row i, vectorised over rows
                row = np.repeat(np.arange(len(s)), offsets[1:] - offsets[:-1])
                pos = np.arange(values.size) - offsets[:-1][row]
                keep = pos >= s[row]
            new_off = np.zeros(len(s) + 1, dtype=np.int32)
            np.cumsum(new_len, out=new_off[1:])
            table = _replace(table, c, pa.ListArray.from_arrays(pa.array(new_off),
                                                                 pa.array(values[keep])))
        return table


@TRANSFORMS.register("negative_downsample")
class NegativeDownsample(Transform):
    """Keep every positive and a ``rate`` share of negatives (click-through data is skewed)."""

    name = "negative_downsample"
    params = {"rate": 0.5}

    def check(self) -> None:
        r = self.p["rate"]
        if not isinstance(r, (int, float)) or not 0 < r <= 1:
            raise ValueError("rate: expected a number in (0, 1]")

    def __call__(self, table: pa.Table, shard_index: int) -> pa.Table:
        label = _flat(table[self.schema_in.label]).to_numpy(zero_copy_only=False)
        rng = np.random.default_rng([self.seed, shard_index, 17])
        keep = (label > 0) | (rng.random(label.size) < float(self.p["rate"]))
        return table.filter(pa.array(keep))


_OPS: dict[str, Callable[[Any, Any], Any]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
    "==": operator.eq, "!=": operator.ne,
}


@TRANSFORMS.register("filter")
class Filter(Transform):
    """Keep rows where ``column op value`` (e.g. drop bot traffic, stale events)."""

    name = "filter"
    params = {"column": None, "op": ">", "value": 0}

    def check(self) -> None:
        if self.p["column"] not in self.schema_in.columns:
            raise ValueError(f"column: expected one of the dataset's columns, got {self.p['column']!r}")
        if self.p["op"] not in _OPS:
            raise ValueError(f"op: expected one of {', '.join(_OPS)}, got {self.p['op']!r}")

    def __call__(self, table: pa.Table, shard_index: int) -> pa.Table:
        x = _flat(table[self.p["column"]]).to_numpy(zero_copy_only=False)
        return table.filter(pa.array(_OPS[self.p["op"]](x, self.p["value"])))


@TRANSFORMS.register("join")
class MapSideJoin(Transform):
    """Join a small side table (e.g. item statistics) on an id column, map-side: the table is
    generated deterministically and small enough to sit in every worker's memory."""

    name = "join"
    params = {"key": None, "table_rows": 10_000, "features": 4}

    def check(self) -> None:
        _int_param(self.p, "table_rows", 1, 10**7)      # the side table lives in every worker
        _int_param(self.p, "features", 1, 1_000)
        if self.p["table_rows"] * self.p["features"] > 10**8:
            raise ValueError("table_rows x features: expected at most 10**8 values (400 MB in "
                             "every worker)")
        key = self.p["key"] or (self.schema_in.sparse[0] if self.schema_in.sparse else None)
        if key not in self.schema_in.sparse:
            raise ValueError(f"key: expected a sparse column, got {key!r}")
        self.key = key
        rng = np.random.default_rng([self.seed, 99])
        self.side = rng.gamma(2.0, 1.0, size=(int(self.p["table_rows"]),
                                             int(self.p["features"]))).astype(np.float32)
        self.names = tuple(f"join_{key}_{j}" for j in range(int(self.p["features"])))

    def output_schema(self) -> FeatureSchema:
        s = self.schema_in
        return s.with_(dense=(*s.dense, *self.names))

    def __call__(self, table: pa.Table, shard_index: int) -> pa.Table:
        ids = _flat(table[self.key]).to_numpy(zero_copy_only=False)
        rows = self.side[ids % self.side.shape[0]]
        label_idx = table.schema.get_field_index(self.schema_in.label)
        for j, name in enumerate(self.names):
            table = table.add_column(label_idx + j, name, pa.array(rows[:, j]))
        return table


def is_real_signal(exc: BaseException) -> bool:
    """A ``KeyboardInterrupt`` that a real SIGINT/SIGTERM caused (it ends the command with
    130/143) rather than one the user's code raised itself (reported as its error, exit 2)."""
    if isinstance(exc, NoProgress):     # the progress watchdog ending a stuck wait: ours too
        return True
    return isinstance(exc, interrupts.Interrupted) or (
        isinstance(exc, KeyboardInterrupt) and interrupts.pending() is not None)


def at_user_frame(exc: BaseException) -> str:
    """`` at file:line in fn``: where in the user's own files it happened (if it did)."""
    where = user_frame(exc.__traceback__)
    return f" at {where}" if where else ""


class UserTransform(Transform):
    """A user's own ``fn(table, **params) -> table`` by import path; schema assumed unchanged.

    Whatever goes wrong in the user's code (the import, the call, the type it returns) is a
    ``UserCodeError`` naming the transform, the scenario file and its key, in whichever
    process it ran (the trainer, a loader worker, a Ray worker)."""

    name = "user"

    def __init__(self, schema: FeatureSchema, path: str, seed: int = 0,
                 params: dict[str, Any] | None = None, file: str = "<scenario>",
                 key: str = "preprocess.transforms") -> None:
        self.path = path
        self.file, self.key = file, key
        self.kwargs = dict(params or {})
        check_finite(self.kwargs)
        self.schema_in = schema
        self.seed = seed
        # Found here, in the trainer, and shipped as a file path: a loader or Ray worker
        # loads the same file whatever its working directory and import path.
        self.searched = user_dirs(file)
        self.origin = locate(path.partition(":")[0], self.searched)
        self.fn = self._load()

    def _error(self, problem: str, tb: str = "") -> UserCodeError:
        return UserCodeError(self.file, self.key, f"transform {self.path!r}", problem,
                             traceback_text=tb)

    def _load(self) -> Callable[..., Any]:
        try:
            with user_code():
                fn = import_object(self.path, self.origin, self.searched)
        except BaseException as exc:  # noqa: BLE001 - a user module may raise anything at import
            if is_real_signal(exc):
                raise
            raise self._error(f"cannot be imported: {describe_exception(exc)}"
                              f"{at_user_frame(exc)}", traceback.format_exc()) from None
        if not callable(fn):
            raise self._error(f"is not callable (it is a {type(fn).__name__})")
        return fn  # type: ignore[return-value]

    def __getstate__(self) -> dict[str, Any]:
        # Shipped by name and imported on first use where it runs (a Ray worker), so an
        # import failure there is this transform's error, not a deserialization error.
        state = dict(self.__dict__)
        state["fn"] = None
        return state

    def __call__(self, table: pa.Table, shard_index: int) -> pa.Table:
        if self.fn is None:
            self.fn = self._load()
        try:
            with user_code():
                out = self.fn(table, **self.kwargs)
        except BaseException as exc:  # noqa: BLE001 - the user's code: reported, never a traceback
            # sys.exit() and a KeyboardInterrupt the code raised itself included: they would
            # end the process silently (rc 0 or 3, no result); a real signal still wins.
            if is_real_signal(exc):
                raise
            raise self._error(f"raised {describe_exception(exc)}{at_user_frame(exc)}",
                              traceback.format_exc()) from None
        if not isinstance(out, pa.Table):
            raise self._error(f"returned {type(out).__name__}, expected a pyarrow.Table")
        missing = [c for c in self.schema_in.columns if c not in out.column_names]
        if missing:
            raise self._error(f"returned a table without column(s) {', '.join(map(repr, missing))}"
                              f"; a transform must keep the columns it is given")
        return out
