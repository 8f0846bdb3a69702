"""Result files: load (any supported version, validated), find, and publish atomically.

A result is written only whole: a temp file in the target directory, fsynced, then linked
under its final name (never replacing an existing file), so a crash or Ctrl-C never leaves a
half-written result and two concurrent runs cannot clobber each other.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import interrupts
from ..errors import ResultError, UserError, escape_controls
from . import codec, migrate
from .schema import SCHEMA_VERSION, SUPPORTED_VERSIONS, Result, TuneResult


def to_dict(result: Result) -> dict[str, Any]:
    return codec.to_json(result)


def from_dict(d: Any, source: str = "<result>") -> Result:
    """A parsed result file of any supported version as a typed, validated ``Result``."""
    if not isinstance(d, dict):
        raise ResultError(f"{source}: expected a JSON object")
    codec.check_depth(d, source)
    version = d.get("schema_version")
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        raise ResultError(f"{source}: schema_version: expected one of {list(SUPPORTED_VERSIONS)}, "
                          f"got {version!r}")
    d = migrate.to_current(d, version, SCHEMA_VERSION, source)
    result = codec.from_json(Result, d, source + ":")
    # Names are printed by every verb (terminal, markdown, CI annotations, plots): a newline
    # in one would start a line of its own (a GitHub "::error" command). Read from a file,
    # they are shown with such characters escaped, everywhere alike (scenarios refuse them).
    result.scenario.name = escape_controls(result.scenario.name)
    seen: set[str] = set()
    for i, v in enumerate(result.variants):
        v.name = escape_controls(v.name)
        if v.name in seen:        # the gate and report key variants by name: one would win
            raise ResultError(f"{source}: variants[{i}].name: {v.name!r} appears twice; "
                              f"variant names are unique")
        seen.add(v.name)
        for lo in (v.profile.loaders if v.profile is not None else []):
            lo.name = escape_controls(lo.name)      # a profiled job's Dataset class's name
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a result may hold")


MAX_RESULT_BYTES = 256 * 2**20   # results are tens of KB to a few MB; parsing JSON costs ~10x


def load(path: str | Path) -> Result:
    """A result file, refused before reading when it cannot be one: not a regular file (a
    FIFO would block, a device never end) or larger than ``MAX_RESULT_BYTES``."""
    p = Path(path)
    try:
        st = os.stat(p)
        if stat.S_ISDIR(st.st_mode):
            raise ResultError(f"{path}: expected a result file, got a directory")
        if not stat.S_ISREG(st.st_mode):
            raise ResultError(f"{path}: not a regular file (a device, FIFO or socket): "
                              "not a stallbench result")
        if st.st_size > MAX_RESULT_BYTES:
            raise ResultError(f"{path}: {st.st_size / 2**20:,.0f} MB; a stallbench result is at "
                              f"most {MAX_RESULT_BYTES // 2**20} MB: refusing to read it")
        with open(p, "rb") as fh:
            raw = fh.read(MAX_RESULT_BYTES + 1)
        if len(raw) > MAX_RESULT_BYTES:
            raise ResultError(f"{path}: grew past {MAX_RESULT_BYTES // 2**20} MB while read: "
                              "refusing it")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise ResultError(f"{path}: no such result file") from None
    except IsADirectoryError:
        raise ResultError(f"{path}: expected a result file, got a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultError(f"{path}: cannot read ({exc})") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ResultError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:       # NaN / Infinity literals
        raise ResultError(f"{path}: {exc}") from None
    except RecursionError:
        raise ResultError(f"{path}: nested too deeply: not a stallbench result") from None
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


def newest_by_scenario(loaded: list[tuple[Path, Result]]) -> list[tuple[Path, Result]]:
    """The newest result (by ``created_utc``, then file name) of each scenario, in the order
    the scenarios first appear: a results directory with history still reads as "now"."""
    best: dict[str, tuple[Path, Result]] = {}
    for path, r in loaded:
        cur = best.get(r.scenario.name)
        if cur is None or (r.created_utc, str(path)) >= (cur[1].created_utc, str(cur[0])):
            best[r.scenario.name] = (path, r)
    return list(best.values())


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


def longest_name(scenario_name: str) -> str:
    """The longest result file name ``save`` may use for a scenario (checked up front)."""
    return f"{result_stem(scenario_name)}-999.json"


def save(result: Result, out_dir: Path,
         also: tuple[tuple[Path, str, str], ...] = ()) -> Path:
    """Atomically publish ``<scenario>-<UTC time>.json`` in ``out_dir``, never replacing an
    existing file: the complete temp file is hard-linked under the first free name (link
    fails if the name exists, so two concurrent runs cannot clobber each other). A signal
    received before the link means no result (``interrupts.check``).

    ``also``: files published with the result, (path, text, flag) each (``profile --trace``):
    every one is written whole to a temp file first, so a write that fails or a signal before
    the link publishes nothing; then the result is linked and each replaced by a rename.

    The payload is read back with the strict reader first: a file ``report`` and ``gate``
    would refuse (a figure outside its stated range) is a stallbench bug, said now, by the
    run that made it, not by every later command that reads it."""
    payload = json.dumps(to_dict(result), indent=1) + "\n"
    try:
        from_dict(json.loads(payload), f"the {result.scenario.name} result being written")
    except ResultError as exc:
        raise ResultError(f"stallbench bug, nothing written: {exc}") from None
    return _publish(Path(out_dir), result_stem(result.scenario.name), payload, also)


def _publish(out_dir: Path, base: str, payload: str,
             also: tuple[tuple[Path, str, str], ...] = ()) -> Path:
    """The one way a result file (a run's, a tune's) is published: whole, under a new name,
    and not at all once a signal has arrived; with the files of ``also`` (see ``save``)."""
    try:
        tmp = _write_temp(out_dir, base, payload)
    except OSError as exc:
        raise UserError(f"--out: {out_dir}: cannot write the result "
                        f"({exc.strerror or exc})") from None
    temps: list[tuple[str, Path, str]] = []
    try:
        for other, text, flag in also:
            try:
                temps.append((_write_temp(other.parent, other.name, text), other, flag))
            except OSError as exc:
                raise UserError(f"{flag}: {other}: cannot write it ({exc.strerror or exc}); "
                                "no result written") from None
        n = 0
        while True:
            path = out_dir / (f"{base}.json" if n == 0 else f"{base}-{n}.json")
            interrupts.check()
            try:
                os.link(tmp, path)
                break
            except FileExistsError:
                n += 1
        for t, other, flag in temps:
            try:
                os.replace(t, other)
            except OSError as exc:
                raise UserError(f"{flag}: {other}: cannot write it ({exc.strerror or exc}); "
                                f"the result was published: {path}") from None
        return path
    finally:
        _unlink(tmp)
        for t, _, _ in temps:
            _unlink(t)


TUNE_DIR = "tune"


def save_tune(result: TuneResult, out_dir: Path) -> Path:
    """Publish a ``stallbench tune`` result as ``<out_dir>/tune/<scenario>-tune-<UTC time>.json``,
    atomically and never replacing a file, like ``save``; in its own directory so that readers
    of run results (report, whatif, gate) never meet it."""
    return _publish(Path(out_dir) / TUNE_DIR, result_stem(result.scenario.name + "-tune"),
                    json.dumps(codec.to_json(result), indent=1) + "\n")


def load_tune(path: str | Path) -> TuneResult:
    """A tune result, checked as strictly as a run's."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"), parse_constant=_reject_constant)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ResultError(f"{path}: cannot read a tune result ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != "tune":
        raise ResultError(f"{path}: kind: expected \"tune\"")
    codec.check_depth(data, str(path))
    return codec.from_json(TuneResult, data, f"{path}:")


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
