"""Scenario files: TOML -> validated, frozen dataclasses -> concrete variants.

The key names are a public contract (users' CI files depend on them). Each section is a
dataclass whose fields *are* the schema: validation, defaults, the key reference in docs/scenarios.md and the
"did you mean" suggestions are all derived from these fields, so a new knob is one new field.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import stat
import itertools
import json
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ScenarioError, has_control, starts_command
from .registry import did_you_mean


def knob(default: Any, doc: str, *, min: float | None = None, max: float | None = None,
         choices: tuple[Any, ...] | None = None, exclusive_min: bool = False,
         registry: str | None = None) -> Any:
    """A scenario key: its default, its one-line documentation and its constraints.

    Every number has a finite ``min`` and ``max`` (for a list of numbers: of each element);
    docs/scenarios.md shows them as the key's range, ``_build_section`` refuses NaN, infinity and
    anything outside, and ``tests/reliability/test_numbers.py`` fails for a numeric knob
    without both bounds. A bound is an absurdity guard, not a tuning hint: what a value
    implies on this machine (memory, disk) is checked by ``stallbench.run.preflight``.

    ``registry``: the value names an implementation registered under that kind ("executor",
    "model", "batch format"). Those registries live with their implementations, which import
    this module, so the names are checked by ``stallbench.run.preflight`` after parsing, not here.
    """
    meta = {"doc": doc, "min": min, "max": max, "choices": choices, "exclusive_min": exclusive_min,
            "registry": registry}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class DatasetSpec:
    path: str | None = knob(None, "Existing Parquet file, directory or glob. Unset: a synthetic "
                                  "recommender table is generated (and cached) from the keys below.")
    label_column: str = knob("label", "Label column of an existing dataset.")
    dense_columns: list[str] | None = knob(None, "Existing dataset: dense columns (default: every "
                                                 "floating-point column but the label).")
    sparse_columns: list[str] | None = knob(None, "Existing dataset: categorical id columns (default: "
                                                  "integer, string and dictionary columns).")
    sequence_columns: list[str] | None = knob(None, "Existing dataset: list-of-id columns (default: "
                                                    "every list<int> / list<string> column).")
    rows: int = knob(100_000, "Synthetic rows.", min=1, max=10**10)
    dense_features: int = knob(13, "Synthetic dense float features.", min=0, max=10_000)
    sparse_features: int = knob(8, "Synthetic categorical id features.", min=0, max=10_000)
    sparse_cardinality: int = knob(100_000, "Distinct ids per sparse feature (Zipf-like).",
                                   min=1, max=2**62)
    sequence_features: int = knob(2, "Synthetic variable-length id sequences.", min=0, max=1_000)
    sequence_max_len: int = knob(20, "Longest synthetic sequence; also the padded length of `seq` "
                                     "tensors (padded formats cut longer sequences, and results warn "
                                     "how many ids that lost; `jagged`, the default, keeps every id "
                                     "and pads a model of your own to at least this length).",
                                 min=1, max=100_000)
    row_group_rows: int = knob(16_384, "Rows per Parquet row group (the unit of one fetch).",
                               min=1, max=10**8)
    files: int = knob(2, "Number of Parquet files.", min=1, max=10_000)
    codec: str = knob("snappy", "Parquet compression codec.",
                      choices=("none", "snappy", "zstd", "gzip", "lz4", "brotli"))
    seed: int = knob(0, "Generator seed: same seed, same bytes.", min=0, max=2**63 - 1)


@dataclass(frozen=True)
class StorageSpec:
    bandwidth_mb_s: float | None = knob(None, "EMULATED remote storage bandwidth in MB/s "
                                              "(compressed bytes of each row group). Unset: local disk.",
                                        min=0, max=10**7, exclusive_min=True)
    latency_ms: float = knob(0.0, "EMULATED latency per storage request (one row group).",
                             min=0, max=60_000)


@dataclass(frozen=True)
class TransformSpec:
    name: str
    params: dict[str, Any]


@dataclass(frozen=True)
class PreprocessSpec:
    transforms: list[Any] = knob([], "Ordered transforms: a name (\"log_dense\") or a table "
                                     "({name = \"hash_ids\", buckets = 1000}) or \"pkg.mod:fn\".")
    cpu_cost_us_per_row: float = knob(0.0, "Calibrated busy CPU cost per row in microseconds "
                                           "(thread CPU time, so known by construction).",
                                           min=0, max=10**6)

    @property
    def transform_specs(self) -> list[TransformSpec]:
        out = []
        for t in self.transforms:
            if isinstance(t, str):
                out.append(TransformSpec(t, {}))
            else:
                params = {k: v for k, v in t.items() if k != "name"}
                out.append(TransformSpec(t["name"], params))
        return out


@dataclass(frozen=True)
class ModelSpec:
    kind: str = knob("dlrm", "\"dlrm\" (real torch model), \"emulated\" (fixed step_ms), or "
                             "\"pkg.mod:factory\" for your own.", registry="model")
    step_ms: float = knob(0.0, "EMULATED compute per batch (kind = \"emulated\").",
                          min=0, max=60_000)
    embedding_dim: int = knob(16, "DLRM embedding width.", min=1, max=65_536)
    embedding_rows: int = knob(100_000, "DLRM rows per embedding table (ids are taken modulo).",
                               min=1, max=10**10)
    bottom_mlp: list[int] = knob([64, 16], "DLRM dense MLP widths.", min=1, max=65_536)
    top_mlp: list[int] = knob([64, 1], "DLRM top MLP widths (last must be 1).",
                          min=1, max=65_536)
    lr: float = knob(0.01, "SGD learning rate.", min=0, max=1000, exclusive_min=True)
    torch_threads: int = knob(1, "torch intra-op threads in the trainer (leave cores to the loader).",
                              min=1, max=1024)


@dataclass(frozen=True)
class LoaderSpec:
    batch_size: int = knob(4096, "Rows per batch.", min=1, max=10**7)
    num_workers: int = knob(0, "Loader worker processes (0: everything in the trainer process).",
                            min=0, max=256)
    prefetch_factor: int = knob(2, "Batches (row groups) each worker keeps ready.", min=1, max=1024)
    epochs: int = knob(1, "Passes over the data per measured run.", min=1, max=10_000)
    max_batches: int = knob(0, "Stop each run after this many batches (0: no limit).",
                            min=0, max=10**9)
    execution: str = knob("streaming", "\"streaming\" overlaps stages with bounded buffers; \"bulk\" "
                                       "prepares the whole epoch before training.",
                          choices=("streaming", "bulk"))
    batch_format: str = knob("jagged", "What producers hand over: \"jagged\" (one buffer, sequences "
                                       "as values + offsets: no padding, no id cut; a model of your "
                                       "own still gets `seq`, padded to the batch's longest), "
                                       "\"rows\" (row dicts), \"columnar\" (arrays), "
                                       "\"single_buffer\" (one buffer) or \"arrow\" (an Arrow "
                                       "record batch); the padded ones cut sequences at "
                                       "`dataset.sequence_max_len`.",
                             registry="batch format")
    compression: str = knob("none", "Compression of what crosses a process boundary.",
                            choices=("none", "zstd"))
    compression_level: int = knob(1, "zstd level.", min=1, max=22)
    collate: str = knob("producer", "Where rows become tensors: \"producer\" or \"trainer\".",
                        choices=("producer", "trainer"))
    pin_memory: bool = knob(False, "GPU trainer: a pin thread stages each batch in a reused ring of "
                                   "pinned host buffers (or uses the loader's pinned shared-memory "
                                   "pool as is) so the copy is an asynchronous DMA (a labelled no-op "
                                   "without a GPU).")
    prefetch_batches: int = knob(0, "Trainer-side receive thread keeping N batches ready (decompressed, "
                                    "decoded, pinned).", min=0, max=64)
    fetch_ahead: int = knob(0, "num_workers = 0: work items (row groups) whose fetch (read and decode) "
                               "runs ahead in a background thread of the trainer's process, "
                               "overlapping the next decode with this item's preprocessing and "
                               "packing (costs that many decoded row groups of memory; a labelled "
                               "no-op with loader workers, which overlap items already).",
                            min=0, max=8)
    persistent_workers: bool = knob(False, "num_workers > 0, local executor: keep the loader "
                                           "workers alive across a variant's runs (a "
                                           "DataLoader's `persistent_workers`), so a run does not "
                                           "pay their fork, start-up, first row group's page "
                                           "faults and exit (false: forked for every run, as a "
                                           "DataLoader without it pays every epoch; a labelled "
                                           "no-op elsewhere).")
    device_prefetch: int = knob(0, "GPU trainer: batches whose host-to-device copy is launched ahead "
                                   "on a side CUDA stream while the current batch computes (0: each "
                                   "copy runs on the compute stream just before its step; a labelled "
                                   "no-op without a GPU).", min=0, max=8)
    wire_bandwidth_mb_s: float | None = knob(None, "EMULATED producer->trainer link bandwidth in MB/s "
                                                   "(e.g. preprocessing on another node).",
                                             min=0, max=10**7, exclusive_min=True)
    producer_threads: int | None = knob(None, "Thread budget of each producer process (loader "
                                              "worker, Ray task, Flight server): pyarrow's CPU pool, "
                                              "torch intra-op, OMP/MKL. Unset: the machine's cores "
                                              "split between the producers that share them (at least "
                                              "1); 0: no budget (library defaults).",
                                        min=0, max=1024)
    trainer_threads: int | None = knob(None, "Thread budget of the trainer process (each trainer "
                                             "rank): pyarrow's CPU pool and OMP/MKL (torch intra-op "
                                             "is model.torch_threads). Unset: library defaults.",
                                       min=1, max=1024)


@dataclass(frozen=True)
class ExecutorSpec:
    kind: str = knob("local", "\"local\" (torch DataLoader on the trainer), \"ray\" (Ray Data) or "
                             "\"flight\" (Arrow Flight servers over real sockets).",
                     registry="executor")
    ray_address: str | None = knob(None, "Existing Ray cluster: \"auto\", \"host:port\" (its GCS) "
                                         "or \"ray://host:10001\" (Ray Client); a token comes from "
                                         "RAY_AUTH_MODE=token + RAY_AUTH_TOKEN (or its file), as "
                                         "Ray documents. Unset: a local Ray started for the run.")
    cpus: int | None = knob(None, "CPUs of the local Ray (default: all).", min=1, max=4096)
    simulated_nodes: int = knob(0, "Simulated CPU nodes on this machine (ray.cluster_utils.Cluster).",
                                min=0, max=64)
    cpus_per_node: int = knob(1, "CPUs per simulated node.", min=1, max=1024)
    object_store_mb: int = knob(512, "Object store per local Ray node (MB).", min=64, max=2**20)
    ray_mode: str = knob("stallbench", "\"stallbench\" (single buffer, collate in Ray workers) or "
                                       "\"stock\" (read_parquet -> map_batches -> iter_torch_batches).",
                         choices=("stallbench", "stock"))
    concurrency: int | None = knob(None, "Ray preprocessing tasks in flight (default: CPUs available).",
                                   min=1, max=4096)
    ray_pool: str = knob("tasks", "Ray Data compute for the producer operator: \"tasks\" (a task "
                                  "pool) or \"actors\" (a fixed actor pool of `concurrency` actors).",
                         choices=("tasks", "actors"))
    connect_timeout_s: float = knob(20.0, "Seconds to wait for the cluster at `ray_address` (or each "
                                          "of `flight_servers`) before giving up with an error.",
                                    min=1, max=3600)
    flight_servers: list[str] | None = knob(None, "Existing Flight servers (\"grpc://host:port\", "
                                                  "each started with `stallbench serve`); unset: "
                                                  "`flight_local_servers` are started on this machine.")
    flight_local_servers: int = knob(2, "Flight server processes stallbench starts on this machine "
                                        "(loopback) when `flight_servers` is unset.", min=1, max=64)
    flight_streams_per_server: int = knob(1, "Streams (do_get calls) the trainer reads at once from "
                                             "each Flight server; each owns a share of its row groups.",
                                          min=1, max=16)
    flight_token_env: str | None = knob(None, "Name of the environment variable holding the bearer "
                                              "token of `flight_servers` (started with `stallbench "
                                              "serve --token-env/--token-file`), sent with every "
                                              "call; never the token itself. Unset: no token. Local "
                                              "servers get a private token of their own.")


@dataclass(frozen=True)
class TrainersSpec:
    ranks: int = knob(1, "Data-parallel trainer ranks, each a process with its own shard and a "
                         "synchronous step (torch.distributed); 1: the trainer runs in stallbench's "
                         "own process, as without this section.", min=1, max=64)
    straggler_rank: int | None = knob(None, "EMULATED straggler: the rank that gets "
                                            "`straggler_delay_ms` per work item it receives.",
                                      min=0, max=63)
    straggler_delay_ms: float = knob(0.0, "EMULATED latency added in the straggler rank's "
                                          "process to every work item (row group) delivered to "
                                          "it, before its batches reach its trainer loop.",
                                     min=0, max=10_000)


@dataclass(frozen=True)
class AnalysisSpec:
    differential: bool = knob(True, "Run ablations and attribute the epoch time to stages.")
    method: str = knob("chain", "\"chain\" (DS-Analyzer order, 4 runs) or \"shapley\" (all 8 "
                                "ablation subsets, order-free).", choices=("chain", "shapley"))
    confidence: float = knob(0.9, "Confidence level of the intervals.", min=0.5, max=0.999)


@dataclass(frozen=True)
class RunSpec:
    repeats: int = knob(1, "Measured runs per variant (CLI --repeats overrides).", min=1, max=1000)
    warmup_batches: int = knob(0, "Batches excluded from steady-state throughput.", min=0, max=10**9)
    sample_interval_s: float = knob(0.1, "Resource sampler period.", min=0.01, max=60)
    progress_timeout_s: float = knob(
        300.0, "No wait without an end: while the trainer waits for a batch and no producer "
        "completes any work for this long, the run ends (exit 2, no result) naming the "
        "executor and what it waited for.", min=1, max=86400)


SECTIONS: dict[str, type] = {
    "dataset": DatasetSpec,
    "storage": StorageSpec,
    "preprocess": PreprocessSpec,
    "model": ModelSpec,
    "loader": LoaderSpec,
    "executor": ExecutorSpec,
    "trainers": TrainersSpec,
    "analysis": AnalysisSpec,
    "run": RunSpec,
}
TOP_LEVEL = ("name", "description", "matrix", *SECTIONS)
# Sections added after the first results were recorded (see ``Scenario.fingerprint``).
LATER_SECTIONS = ("trainers",)
# The keys every fingerprint stored so far was computed over (frozen: never edit). A key
# added since is hashed only where a scenario sets it to something other than its default,
# so adding a key never changes a stored fingerprint and no baseline needs re-recording.
FINGERPRINT_KEYS: dict[str, tuple[str, ...]] = {
    "dataset": ("path", "label_column", "dense_columns", "sparse_columns", "sequence_columns",
                "rows", "dense_features", "sparse_features", "sparse_cardinality",
                "sequence_features", "sequence_max_len", "row_group_rows", "files", "codec",
                "seed"),
    "storage": ("bandwidth_mb_s", "latency_ms"),
    "preprocess": ("transforms", "cpu_cost_us_per_row"),
    "model": ("kind", "step_ms", "embedding_dim", "embedding_rows", "bottom_mlp", "top_mlp",
              "lr", "torch_threads"),
    "loader": ("batch_size", "num_workers", "prefetch_factor", "epochs", "max_batches",
               "execution", "batch_format", "compression", "compression_level", "collate",
               "pin_memory", "prefetch_batches", "device_prefetch", "wire_bandwidth_mb_s",
               "producer_threads", "trainer_threads"),
    "executor": ("kind", "ray_address", "cpus", "simulated_nodes", "cpus_per_node",
                 "object_store_mb", "ray_mode", "concurrency", "ray_pool", "connect_timeout_s",
                 "flight_servers", "flight_local_servers", "flight_streams_per_server"),
    "trainers": ("ranks", "straggler_rank", "straggler_delay_ms"),
    "analysis": ("differential", "method", "confidence"),
    "run": ("repeats", "warmup_batches", "sample_interval_s"),
}
# Keys that never change the work, only where a secret is found: left out of every fingerprint,
# so a baseline stays comparable when its servers start asking for a token.
UNHASHED_KEYS: dict[str, tuple[str, ...]] = {"executor": ("flight_token_env",)}


@dataclass(frozen=True)
class Config:
    """One fully resolved set of knobs: what a single variant runs with."""

    dataset: DatasetSpec
    storage: StorageSpec
    preprocess: PreprocessSpec
    model: ModelSpec
    loader: LoaderSpec
    executor: ExecutorSpec
    analysis: AnalysisSpec
    run: RunSpec
    trainers: TrainersSpec = field(default_factory=TrainersSpec)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **sections: Any) -> "Config":
        return dataclasses.replace(self, **sections)

    def get(self, dotted: str) -> Any:
        section, key = dotted.split(".", 1)
        return getattr(getattr(self, section), key)

    def emulated(self) -> list[str]:
        """Which figures of a run come from an emulation rather than the real thing (the
        executor adds its own: ``Executor.emulated_keys``)."""
        out = []
        if self.storage.bandwidth_mb_s is not None:
            out.append("storage.bandwidth_mb_s")
        if self.storage.latency_ms:
            out.append("storage.latency_ms")
        if self.loader.wire_bandwidth_mb_s is not None:
            out.append("loader.wire_bandwidth_mb_s")
        if self.model.kind == "emulated":
            out.append("model.step_ms")
        if self.preprocess.cpu_cost_us_per_row:
            out.append("preprocess.cpu_cost_us_per_row")
        if self.trainers.straggler_delay_ms and self.trainers.straggler_rank is not None:
            out.append("trainers.straggler_delay_ms")
        return out


@dataclass(frozen=True)
class Variant:
    name: str
    knobs: dict[str, Any]
    config: Config


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    path: str
    text: str
    sha256: str
    matrix: dict[str, list[Any]]
    base: Config
    variants: list[Variant]

    @property
    def fingerprint(self) -> str:
        """What must match for two runs to be comparable: the scenario minus cosmetic text.

        Hashes the resolved base config and the matrix, so comments, key order and the
        description do not break comparability, but any knob that changes the work does.
        """
        base = self.base.to_dict()
        for name, section in base.items():
            frozen = FINGERPRINT_KEYS.get(name, ())
            defaults = dataclasses.asdict(SECTIONS[name]())
            for key in [k for k in section if k not in frozen]:
                if section[key] == defaults.get(key) or key in UNHASHED_KEYS.get(name, ()):
                    del section[key]
        for name in LATER_SECTIONS:
            # A section added after results existed, left at its defaults, must not change the
            # fingerprint: committed baselines of scenarios that do not use it stay comparable.
            defaults = {k: v for k, v in dataclasses.asdict(SECTIONS[name]()).items()
                        if k in FINGERPRINT_KEYS.get(name, ())}
            if base.get(name) == defaults:
                del base[name]
        blob = json.dumps({"base": base, "matrix": self.matrix}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- validation

def _type_name(tp: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args)
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        return "a list" if arg is Any else f"a list of {_type_name(arg).split(' ', 1)[-1]}s"
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _show(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _check_type(value: Any, tp: Any) -> tuple[bool, Any]:
    """Return (ok, coerced value). Ints are accepted where floats are expected, never bools."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None):
                if value is None:
                    return True, None
                continue
            ok, v = _check_type(value, arg)
            if ok:
                return True, v
        return False, value
    if origin is list:
        if not isinstance(value, list):
            return False, value
        (arg,) = typing.get_args(tp) or (Any,)
        if arg is Any:
            return True, list(value)
        out = []
        for item in value:
            ok, v = _check_type(item, arg)
            if not ok:
                return False, value
            out.append(v)
        return True, out
    if tp is Any:
        return True, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if tp is str:
        return isinstance(value, str), value
    return isinstance(value, tp), value


def _build_section(cls: type, table: Any, file: str, section: str) -> Any:
    if not isinstance(table, dict):
        raise ScenarioError(file, section, f"expected a table [{section}], got {_show(table)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in table:
        if key not in fields:
            raise ScenarioError(file, f"{section}.{key}",
                                f"unknown key{did_you_mean(key, fields)} (valid: {', '.join(fields)})")
    values = {}
    for name, f in fields.items():
        if name not in table:
            continue
        dotted = f"{section}.{name}"
        ok, value = _check_type(table[name], hints[name])
        if not ok:
            raise ScenarioError(file, dotted,
                                f"expected {_type_name(hints[name])}, got {_show(table[name])}")
        meta = f.metadata
        for item in (value if isinstance(value, list) else [value]):
            _check_number(item, meta, file, dotted)
        if meta.get("choices") and value not in meta["choices"]:
            valid = ", ".join(_show(c) for c in meta["choices"])
            raise ScenarioError(file, dotted, f"expected one of {valid}, got {_show(value)}"
                                f"{did_you_mean(str(value), [str(c) for c in meta['choices']])}")
        values[name] = value
    try:
        return cls(**values)
    except TypeError as exc:  # pragma: no cover - dataclass mismatch is a bug
        raise ScenarioError(file, section, str(exc)) from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_number(value: Any, meta: Any, file: str, dotted: str) -> None:
    """The one rule for scenario numbers: finite, and within the knob's [min, max]."""
    if not _is_number(value):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ScenarioError(file, dotted, f"expected a finite number, got {_show(value)}")
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and (value < lo or (meta.get("exclusive_min") and value <= lo)):
        bound = f"> {lo:g}" if meta.get("exclusive_min") else f">= {lo:g}"
        raise ScenarioError(file, dotted, f"expected a value {bound}, got {_show(value)}")
    if hi is not None and value > hi:
        raise ScenarioError(file, dotted, f"expected a value <= {_bound(hi)}, got {_show(value)}")


def _bound(x: float) -> str:
    """A bound as people write it: 10**10 as 1e+10 would read as a float."""
    if isinstance(x, int) and x >= 10**6:
        exp = round(math.log10(x))
        if 10**exp == x:
            return f"10**{exp}"
        exp2 = round(math.log2(x + 1))
        if 2**exp2 - 1 == x:
            return f"2**{exp2} - 1"
        if 2**round(math.log2(x)) == x:
            return f"2**{round(math.log2(x))}"
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _range_doc(meta: Any) -> str:
    lo, hi = meta.get("min"), meta.get("max")
    if lo is None and hi is None:
        return ""
    left = "(" if meta.get("exclusive_min") else "["
    return f" Range: {left}{_bound(lo)}, {_bound(hi)}]."


def _check_transforms(spec: PreprocessSpec, file: str) -> None:
    for i, t in enumerate(spec.transforms):
        key = f"preprocess.transforms[{i}]"
        if isinstance(t, str):
            if not t:
                raise ScenarioError(file, key, "expected a transform name, got \"\"")
        elif isinstance(t, dict):
            if not isinstance(t.get("name"), str):
                raise ScenarioError(file, key, "expected a table with a string key 'name'")
        else:
            raise ScenarioError(file, key, f"expected a name or a table, got {_show(t)}")


MAX_LIST_IDS = 2**31 - 1     # ids of one list column in one row group (Arrow list offsets)


def _check_cross(cfg: Config, file: str) -> None:
    """Rules that span keys; kept here so every variant is checked before anything runs.
    Rules of one implementation (an executor's, a model's) live with it: ``stallbench.run.preflight``."""
    ds = cfg.dataset
    if ds.path is None and (ds.dense_features + ds.sparse_features + ds.sequence_features) == 0:
        raise ScenarioError(file, "dataset", "a synthetic dataset needs at least one feature")
    tr = cfg.trainers
    if tr.straggler_rank is not None and tr.straggler_rank >= tr.ranks:
        raise ScenarioError(file, "trainers.straggler_rank",
                            f"expected a rank below trainers.ranks = {tr.ranks}, "
                            f"got {tr.straggler_rank}")
    if tr.straggler_delay_ms and tr.straggler_rank is None:
        raise ScenarioError(file, "trainers.straggler_delay_ms",
                            "needs trainers.straggler_rank (which rank gets the delay)")
    if ds.path is None and ds.sequence_features and \
            ds.row_group_rows * ds.sequence_max_len > MAX_LIST_IDS:
        raise ScenarioError(file, "dataset.sequence_max_len",
                            f"row_group_rows x sequence_max_len = "
                            f"{ds.row_group_rows * ds.sequence_max_len:,} ids in one row group's "
                            f"sequence column; at most {MAX_LIST_IDS:,} (lower either)")


def _resolve(raw: dict[str, Any], file: str) -> Config:
    sections = {}
    for name, cls in SECTIONS.items():
        table = raw.get(name, {})
        sections[name] = _build_section(cls, table, file, name)
    cfg = Config(**sections)
    _check_transforms(cfg.preprocess, file)
    _check_cross(cfg, file)
    return cfg


def config_from_dict(raw: dict[str, Any], file: str = "<config>") -> Config:
    """A ``Config`` from ``Config.to_dict()``'s form, validated like a scenario's sections
    (what crosses a process or machine boundary as JSON, e.g. to a Flight server)."""
    if not isinstance(raw, dict) or set(raw) - set(SECTIONS):
        raise ScenarioError(file, None, "expected a table of scenario sections")
    return _resolve(raw, file)


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    section, key = dotted.split(".", 1)
    raw.setdefault(section, {})
    raw[section][key] = value


LABEL = "label"   # optional name of a section-axis table; not a knob
MAX_VARIANTS = 1000        # variants one scenario's matrix may expand to
MAX_NAME = 128             # characters of a scenario name (it names the result file)


def name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as the name of a result (a scenario's ``name``, ``stallbench
    profile --name``), or None: one rule for every name that names a result file and starts
    printed lines (the gate's and history's rows). Refused at entry rather than escaped later:
    a usable file name (no ``/``, ``\\``, NUL, no leading ``.``), at most ``MAX_NAME``
    characters, no control character (a newline would start a line of its own), and no leading
    ``::`` (a line starting with it is a GitHub Actions workflow command)."""
    if not name.strip():
        return f"expected a non-empty name, got {_show(name)}"
    if any(c in name for c in "/\\\0") or name.startswith("."):
        return f"expected a name usable as a file name, got {_show(name)}"
    if len(name) > MAX_NAME:
        return f"expected at most {MAX_NAME} characters (it names the result file), got {len(name)}"
    if has_control(name):
        return (f"expected printable text (no newline or other control character: it is "
                f"printed and names a file), got {_show(name)}")
    if starts_command(name):
        return (f"expected a name that does not start with '::' (it starts printed lines, and "
                f"a line starting with '::' is a GitHub Actions command), got {_show(name)}")
    return None


def _check_section_axis(file: str, mkey: str, section: str, values: Any) -> None:
    """A section axis: ``executor = [{kind = "local"}, {kind = "ray", simulated_nodes = 2}]``
    gives one variant per table (keys varied together, not as a product)."""
    if not isinstance(values, list) or not values or not all(isinstance(v, dict) for v in values):
        raise ScenarioError(file, mkey, f"expected a non-empty list of tables of [{section}] keys, "
                                        f"got {_show(values)}")
    names = [f.name for f in dataclasses.fields(SECTIONS[section])]
    labels = [t.get(LABEL) for t in values]
    if any(lab is not None for lab in labels) and not all(
            isinstance(lab, str) and lab.strip() and "," not in lab for lab in labels):
        raise ScenarioError(file, f"{mkey}[].{LABEL}", "expected a label on every table of the axis "
                                                       f"(non-empty strings without commas), got "
                                                       f"{_show(labels)}")
    if len(set(labels)) != len(labels) and labels[0] is not None:
        raise ScenarioError(file, f"{mkey}[].{LABEL}", f"expected distinct labels, got {_show(labels)}")
    for i, table in enumerate(values):
        if not {k for k in table if k != LABEL}:
            raise ScenarioError(file, f"{mkey}[{i}]", "expected at least one key")
        for key in table:
            if key != LABEL and key not in names:
                raise ScenarioError(file, f"{mkey}[{i}].{key}",
                                    f"unknown key {section}.{key}{did_you_mean(key, names)}")


def _flatten_axes(knobs: dict[str, Any], matrix: dict[str, Any], base: "Config") -> dict[str, Any]:
    """Section-axis values -> dotted knobs; every variant of an axis names the same keys
    (those missing from its table take the base value), so results compare like with like."""
    out: dict[str, Any] = {}
    for k, v in knobs.items():
        if "." in k:
            out[k] = v
            continue
        union = list(dict.fromkeys(key for table in matrix[k] for key in table if key != LABEL))
        for key in union:
            out[f"{k}.{key}"] = v.get(key, base.get(f"{k}.{key}"))
    return out


def _variant_name(combo: dict[str, Any], knobs: dict[str, Any]) -> str:
    """``key=value`` parts, except that a labelled section-axis table is named by its label
    (a ladder of five loader settings reads better as "naive" .. "preload" than as five
    ``key=value`` pairs each)."""
    if not knobs:
        return "default"
    labelled = {k: v[LABEL] for k, v in combo.items() if isinstance(v, dict) and LABEL in v}
    rest = {k: v for k, v in knobs.items() if k.split(".", 1)[0] not in labelled}
    short = [k.split(".", 1)[1] for k in rest]
    names = short if len(set(short)) == len(short) else list(rest)
    parts = iter(f"{n}={format_value(v)}" for n, v in zip(names, rest.values()))
    out, done = [], set()
    for k in knobs:           # keep matrix order: labels where their axis stands
        sec = k.split(".", 1)[0]
        if sec in labelled:
            if sec not in done:
                out.append(labelled[sec])
                done.add(sec)
        else:
            out.append(next(parts))
    return ",".join(out)


def format_value(v: Any) -> str:
    """A knob value as variant names and tune's messages write it (TOML's booleans, 2 not 2.0)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return f"{v:g}"
    return str(v)


def parse(text: str, file: str = "<scenario>") -> Scenario:
    """Parse scenario text; every problem is a ScenarioError naming file and key."""
    deep = nesting_depth(text, MAX_TOML_DEPTH)
    if deep is not None:
        line = text.count("\n", 0, deep) + 1
        raise ScenarioError(file, None, f"line {line}: arrays or tables nested deeper than "
                                        f"{MAX_TOML_DEPTH} levels: not a scenario")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(file, None, f"TOML syntax error: {exc}") from None
    for key in raw:
        if key not in TOP_LEVEL:
            raise ScenarioError(file, key, f"unknown key{did_you_mean(key, TOP_LEVEL)} "
                                           f"(valid: {', '.join(TOP_LEVEL)})")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ScenarioError(file, "name", f"expected a non-empty string, got "
                                          f"{_show(name) if name is not None else 'nothing'}")
    problem = name_problem(name)
    if problem:
        raise ScenarioError(file, "name", problem)
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ScenarioError(file, "description", f"expected a string, got {_show(description)}")
    base = _resolve(raw, file)

    matrix = raw.get("matrix", {})
    if not isinstance(matrix, dict):
        raise ScenarioError(file, "matrix", "expected a table of \"section.key\" = [values]")
    for dotted, values in matrix.items():
        mkey = f"matrix.{dotted!r}" if "." in dotted else f"matrix.{dotted}"
        if "." not in dotted and dotted in SECTIONS:
            _check_section_axis(file, mkey, dotted, values)
            continue
        if "." not in dotted or dotted.split(".", 1)[0] not in SECTIONS:
            raise ScenarioError(file, mkey, "expected a quoted dotted key like \"loader.num_workers\" "
                                            f"with a section of {', '.join(SECTIONS)}")
        section, key = dotted.split(".", 1)
        names = [f.name for f in dataclasses.fields(SECTIONS[section])]
        if key not in names:
            raise ScenarioError(file, mkey, f"unknown key {dotted!r}{did_you_mean(key, names)}")
        if not isinstance(values, list) or not values:
            raise ScenarioError(file, mkey, f"expected a non-empty list of values, got {_show(values)}")

    variants = []
    keys = list(matrix)
    count = math.prod(len(matrix[k]) for k in keys)     # before expanding: 10**8 would hang
    if count > MAX_VARIANTS:
        sizes = " x ".join(str(len(matrix[k])) for k in keys)
        raise ScenarioError(file, "matrix", f"{sizes} = {count:,} variants; at most "
                                            f"{MAX_VARIANTS:,} per scenario")
    for combo in itertools.product(*(matrix[k] for k in keys)):
        knobs = _flatten_axes(dict(zip(keys, combo)), matrix, base)
        vraw = copy.deepcopy(raw)
        for k, v in knobs.items():
            _set_dotted(vraw, k, v)
        try:
            cfg = _resolve(vraw, file)
        except ScenarioError as exc:
            raise ScenarioError(file, exc.key, f"{exc.message} (from [matrix])") from None
        variants.append(Variant(_variant_name(dict(zip(keys, combo)), knobs), knobs, cfg))
    seen = set()
    for v in variants:
        if v.name in seen:
            raise ScenarioError(file, "matrix", f"duplicate variant {v.name!r}: repeated values")
        if has_control(v.name):    # a label or value with a newline: a line of its own
            raise ScenarioError(file, "matrix", f"variant {_show(v.name)}: expected printable "
                                                f"labels and values (no newline or other control "
                                                f"character: variant names are printed)")
        if starts_command(v.name):   # it starts the run's table rows: a GitHub Actions command
            raise ScenarioError(file, "matrix", f"variant {_show(v.name)}: expected a label that "
                                                f"does not start with '::' (it starts printed "
                                                f"lines, and a line starting with '::' is a "
                                                f"GitHub Actions command)")
        seen.add(v.name)
    return Scenario(
        name=name, description=description, path=file, text=text,
        sha256=hashlib.sha256(text.encode()).hexdigest(), matrix=matrix, base=base,
        variants=variants,
    )



# ----------------------------------------------------------- input files, read bounded

class NotReadable(ValueError):
    """A path named as an input file that must not be read (not a regular file, too large)."""


def read_text(path: str | os.PathLike, limit: int) -> str:
    """A UTF-8 input file (a scenario, a calibration), refused *before* reading when it is not
    a regular file (a FIFO would block forever, ``/dev/zero`` never ends) or is larger than
    ``limit`` bytes, and read at most ``limit + 1`` bytes (a file growing while read).
    FileNotFoundError/IsADirectoryError/OSError/UnicodeDecodeError pass through."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(str(path))
    if not stat.S_ISREG(st.st_mode):
        raise NotReadable("not a regular file (a device, FIFO or socket)")
    if st.st_size > limit:
        raise NotReadable(f"{st.st_size / 2**20:,.1f} MB, more than the {limit / 2**20:g} MB "
                          f"such a file can be")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))   # never blocks on open
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())             # what was opened (a swapped-in FIFO: refused)
        if not stat.S_ISREG(st.st_mode):
            raise NotReadable("not a regular file (a device, FIFO or socket)")
        raw = fh.read(limit + 1)
    if len(raw) > limit:
        raise NotReadable(f"grew past {limit / 2**20:g} MB while read")
    return raw.decode("utf-8")


def nesting_depth(text: str, limit: int) -> int | None:
    """The first position where TOML ``[``/``{`` nesting exceeds ``limit`` (outside strings and
    comments), else None: checked without recursion before a recursive parser sees the text
    (tomllib raises RecursionError, a 3,000-line traceback, at about 500 levels)."""
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c in "\"'":
            triple = text.startswith(c * 3, i)
            quote = c * 3 if triple else c
            j = i + len(quote)
            while j < n:
                if c == '"' and text[j] == "\\":
                    j += 2
                    continue
                if text.startswith(quote, j):
                    break
                if not triple and text[j] == "\n":
                    break
                j += 1
            i = j + len(quote)
            continue
        if c in "[{":
            depth += 1
            if depth > limit:
                return i
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1
    return None


MAX_SCENARIO_BYTES = 4 * 2**20   # scenarios are a few KB; a bigger file is not one
MAX_TOML_DEPTH = 32              # nesting of arrays/tables; real scenarios need 3


def expand_files(patterns: list[str]) -> list[str]:
    """Scenario paths and globs, in the order given (a glob sorted); a glob that matches
    nothing is bad input. Shared by every verb that runs scenario files (``run``, ``gate
    --against``): a rule of scenario files, not of one verb."""
    import glob

    from .errors import UserError
    out = []
    for pat in patterns:
        hits = sorted(glob.glob(pat)) if any(c in pat for c in "*?[") else [pat]
        if not hits:
            raise UserError(f"{pat}: no scenario file matches")
        out.extend(hits)
    return out


def load(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = read_text(p, MAX_SCENARIO_BYTES)
    except NotReadable as exc:
        raise ScenarioError(str(path), None, f"{exc}: not a scenario file") from None
    except FileNotFoundError:
        raise ScenarioError(str(path), None, "no such scenario file") from None
    except IsADirectoryError:
        raise ScenarioError(str(path), None, "expected a .toml file, got a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(str(path), None, f"cannot read: {exc}") from None
    return parse(text, str(path))


def reference_markdown(registered: dict[str, list[str]] | None = None) -> str:
    """The scenario key reference of docs/scenarios.md, generated from the dataclasses above.

    ``registered``: the valid names of each registry (see ``knob``), listed for the keys that
    name one; ``stallbench.run.preflight.reference_markdown`` passes the live registries."""
    lines = []
    for section, cls in SECTIONS.items():
        lines.append(f"\n### `[{section}]`\n\n| key | default | meaning |\n|---|---|---|")
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            d = "unset" if default is None else _show(default)
            extra = f.metadata.get("doc", "")
            valid = f.metadata.get("choices") or (registered or {}).get(f.metadata.get("registry"))
            if valid:
                extra += " One of: " + ", ".join(_show(c) for c in valid) + "."
            rng = _range_doc(f.metadata)
            extra += rng.replace("Range:", "Range of each:") if isinstance(default, list) else rng
            lines.append(f"| `{f.name}` | `{d}` | {extra} |")
    return "\n".join(lines) + "\n"
