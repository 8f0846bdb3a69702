"""The result schema: the one place that says what a stallbench result file holds.

Results are data (asv's lesson): report and gate read these files and nothing else, so the
schema is versioned, every figure keeps its raw repeats, and loading checks the version before
anything trusts a field. Bump ``SCHEMA_VERSION`` on any incompatible change and commit an example
under ``results/examples/`` for it.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import ResultError

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = (1,)


@dataclass
class Summary:
    """A figure over repeats: raw values kept so later statistics (gate, CI) can be redone."""

    median: float
    min: float
    max: float
    values: list[float]

    @classmethod
    def of(cls, values: list[float]) -> "Summary":
        vals = [float(v) for v in values]
        if not vals:
            return cls(math.nan, math.nan, math.nan, [])
        return cls(statistics.median(vals), min(vals), max(vals), vals)


@dataclass
class RepeatFigures:
    """Everything measured in one run of one variant (or of one of its ablations)."""

    epoch_s: float                  # wall time of the measured run (all epochs)
    samples: int                    # rows the trainer consumed
    batches: int
    throughput_samples_s: float     # samples / epoch_s
    steady_throughput_samples_s: float  # excluding warm-up batches and time to first batch
    stall_s: float                  # trainer time not spent computing: wait + trainer-side data work
    wait_s: float                   # trainer blocked waiting for the next batch
    trainer_transfer_s: float       # trainer-side unpack / decompress / collate / pin / copy
    compute_s: float                # model steps
    time_to_first_batch_s: float
    peak_rss_mb: float              # trainer + loader workers (+ Ray workers), sampled
    startup_s: float = 0.0          # executor start (e.g. Ray runtime), excluded from epoch_s
    trainer_cpu_s: float = 0.0      # CPU time of the trainer process (all its threads) in the run
    # CPU time of every process producing outside the trainer, over the run (forked loader
    # workers: all their threads, start-up and hand-off; a Ray cluster on this machine: its
    # workers, raylets and daemons); None where not measurable (none, or a remote cluster).
    worker_cpu_s: float | None = None
    stage_s: dict[str, float] = field(default_factory=dict)    # producer time per stage, summed
    stage_rows: dict[str, int] = field(default_factory=dict)   # rows each stage processed
    bytes: dict[str, int] = field(default_factory=dict)        # raw_bytes, wire_bytes, storage_bytes
    workers: int = 0                # producer processes that did the work
    extra: dict[str, Any] = field(default_factory=dict)        # executor-specific (Ray op stats, faults)


@dataclass
class VariantResult:
    name: str
    knobs: dict[str, Any]
    config: dict[str, Any]
    emulated: list[str]
    throughput_samples_s: Summary
    epoch_s: Summary
    stall_s: Summary
    stall_share: Summary
    time_to_first_batch_s: Summary
    peak_rss_mb: Summary
    repeats: list[RepeatFigures]
    # Per-stage rates per producer worker (rows/s of CPU-worker time) and storage MB/s:
    # inputs of the what-if model.
    stage_rates: dict[str, float] = field(default_factory=dict)
    bytes: dict[str, float] = field(default_factory=dict)
    ablations: dict[str, list[RepeatFigures]] = field(default_factory=dict)
    analysis: dict[str, Any] = field(default_factory=dict)
    timeline: dict[str, list[float]] = field(default_factory=dict)   # one repeat, per batch
    resources: dict[str, Any] = field(default_factory=dict)          # one repeat, sampled series


@dataclass
class Result:
    schema_version: int
    tool: dict[str, str]
    created_utc: str
    scenario: dict[str, Any]        # name, path, sha256, fingerprint, text, matrix
    machine: dict[str, Any]
    settings: dict[str, Any]        # repeats, analyze, command line
    dataset: dict[str, Any]
    variants: list[VariantResult]
    analysis: dict[str, Any] = field(default_factory=dict)   # scenario level: verdict, what-if
    status: str = "complete"

    def variant(self, name: str) -> VariantResult:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return _clean(asdict(self))


def _clean(obj: Any) -> Any:
    """JSON has no NaN/inf; store them as null so every reader can load the file."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


# ------------------------------------------------------------------------------ load / save

def _summary(d: Any, where: str) -> Summary:
    if not isinstance(d, dict) or "values" not in d:
        raise ResultError(f"{where}: expected {{median, min, max, values}}")
    nan = math.nan
    return Summary(d.get("median") if d.get("median") is not None else nan,
                   d.get("min") if d.get("min") is not None else nan,
                   d.get("max") if d.get("max") is not None else nan,
                   [v if v is not None else nan for v in d["values"]])


def _repeat(d: dict[str, Any]) -> RepeatFigures:
    known = RepeatFigures.__dataclass_fields__
    return RepeatFigures(**{k: (math.nan if v is None else v) if not isinstance(v, (dict, list)) else v
                            for k, v in d.items() if k in known})


def from_dict(d: Any, source: str = "<result>") -> Result:
    if not isinstance(d, dict):
        raise ResultError(f"{source}: expected a JSON object")
    version = d.get("schema_version")
    if version not in SUPPORTED_VERSIONS:
        raise ResultError(f"{source}: schema_version: expected one of {list(SUPPORTED_VERSIONS)}, "
                          f"got {version!r}")
    try:
        variants = []
        for i, v in enumerate(d["variants"]):
            where = f"{source}: variants[{i}]"
            variants.append(VariantResult(
                name=v["name"], knobs=v["knobs"], config=v["config"], emulated=v.get("emulated", []),
                throughput_samples_s=_summary(v["throughput_samples_s"], f"{where}.throughput_samples_s"),
                epoch_s=_summary(v["epoch_s"], f"{where}.epoch_s"),
                stall_s=_summary(v["stall_s"], f"{where}.stall_s"),
                stall_share=_summary(v["stall_share"], f"{where}.stall_share"),
                time_to_first_batch_s=_summary(v["time_to_first_batch_s"],
                                               f"{where}.time_to_first_batch_s"),
                peak_rss_mb=_summary(v["peak_rss_mb"], f"{where}.peak_rss_mb"),
                repeats=[_repeat(r) for r in v["repeats"]],
                stage_rates=v.get("stage_rates", {}),
                bytes=v.get("bytes", {}),
                ablations={k: [_repeat(r) for r in rs] for k, rs in v.get("ablations", {}).items()},
                analysis=v.get("analysis", {}),
                timeline=v.get("timeline", {}),
                resources=v.get("resources", {}),
            ))
        return Result(
            schema_version=version, tool=d["tool"], created_utc=d["created_utc"],
            scenario=d["scenario"], machine=d["machine"], settings=d["settings"],
            dataset=d.get("dataset", {}), variants=variants, analysis=d.get("analysis", {}),
            status=d.get("status", "complete"),
        )
    except ResultError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ResultError(f"{source}: not a stallbench result ({type(exc).__name__}: {exc})") from None


def load(path: str | Path) -> Result:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultError(f"{path}: no such result file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultError(f"{path}: cannot read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ResultError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    return from_dict(data, str(path))


def find(paths: list[str | Path]) -> list[Path]:
    """Result files named by the user: files as given, directories searched one level deep.

    One level only, so ``results/`` does not pick up ``results/baseline/`` by accident.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.glob("*.json") if q.is_file()))
        elif p.exists():
            out.append(p)
        else:
            raise ResultError(f"{p}: no such result file or directory")
    return out


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _write_temp(directory: Path, name: str, payload: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)   # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_atomic(path: Path, payload: str) -> None:
    """Write via a temp file in the same directory + rename: a crash never leaves half a file."""
    tmp = _write_temp(path.parent, path.name, payload)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def result_stem(scenario_name: str, created: datetime | None = None) -> str:
    created = created or datetime.now(timezone.utc)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", scenario_name)
    return f"{stem}-{created.strftime('%Y%m%dT%H%M%SZ')}"


def save(result: Result, out_dir: Path) -> Path:
    """Atomically publish ``<scenario>-<UTC time>.json`` in ``out_dir``, never replacing an
    existing file: the complete temp file is hard-linked under the first free name (link
    fails if the name exists, so two concurrent runs cannot clobber each other)."""
    out_dir = Path(out_dir)
    base = result_stem(result.scenario["name"])
    tmp = _write_temp(out_dir, base, json.dumps(result.to_dict(), indent=1) + "\n")
    try:
        n = 0
        while True:
            path = out_dir / (f"{base}.json" if n == 0 else f"{base}-{n}.json")
            try:
                os.link(tmp, path)
                return path
            except FileExistsError:
                n += 1
    finally:
        _unlink(tmp)


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
