"""Result objects <-> JSON values, driven by the schema's type hints.

Writing: a dataclass becomes a dict of its fields in order; a non-finite float becomes
``null`` (JSON has no NaN), so every JSON reader can load the file. Reading is strict, because
a result is input like any other: every value must have its field's type (a number where a
number is expected, finite, never a string or a bool), a required key must be present, and
nesting is bounded. A violation is a ``ResultError`` naming the file and the key path (exit 2),
never a traceback and never a silently wrong figure. ``null`` in a ``float`` field reads as NaN
("not measured"); unknown keys are ignored (an additive change stays readable by older code).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from typing import Any, TypeVar

from ..errors import ResultError

T = TypeVar("T")
MAX_DEPTH = 64      # deepest nesting a result file may have (the schema needs < 12)


def to_json(obj: Any) -> Any:
    """A schema object (or any mix of dataclasses, dicts, lists and scalars) as JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    return obj


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def join(where: str, key: str) -> str:
    """The path of ``key`` inside ``where``. A file's root is ``"file.json:"`` (what callers
    pass), so every message reads like the others: ``file.json: created_utc: expected ...``,
    ``file.json: variants[0].epoch_s.median: ...`` (``file.json:.created_utc`` was printed)."""
    return f"{where} {key}" if where.endswith(":") else f"{where}.{key}"


def index(where: str, i: int) -> str:
    """The path of item ``i`` of the list at ``where`` (``join``'s rule)."""
    return f"{where} [{i}]" if where.endswith(":") else f"{where}[{i}]"


def from_json(tp: Any, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as an instance of ``tp``; ResultError naming ``where`` if not.
    ``where`` is ``"file.json:"`` at the root (keys are added with ``join``/``index``)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return from_json(inner[0], value, where)
        for a in inner:       # e.g. str | None only; kept general for future fields
            try:
                return from_json(a, value, where)
            except ResultError:
                continue
        raise ResultError(f"{where}: unexpected value {_show(value)}")
    if tp is Any:
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ResultError(f"{where}: expected a list, got {_show(value)}")
        (arg,) = typing.get_args(tp)
        return [from_json(arg, v, index(where, i)) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ResultError(f"{where}: expected an object, got {_show(value)}")
        _, arg = typing.get_args(tp)
        return {k: from_json(arg, v, join(where, k)) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _dataclass(tp, value, where)
    if tp is float:
        if value is None:
            return math.nan
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ResultError(f"{where}: expected a number, got {_show(value)}")
        if not math.isfinite(value):
            raise ResultError(f"{where}: expected a finite number, got {_show(value)}")
        if abs(value) >= LIMIT:
            raise ResultError(f"{where}: {_show(value)} is beyond any measured figure "
                              f"(|x| < {LIMIT:.0e})")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ResultError(f"{where}: expected an integer, got {_show(value)}")
        if value < 0 or value >= LIMIT:   # counts (a 4,000-digit "samples" overflows floats)
            raise ResultError(f"{where}: expected a count from 0 to {LIMIT:.0e}, "
                              f"got {_show(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ResultError(f"{where}: expected true or false, got {_show(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ResultError(f"{where}: expected a string, got {_show(value)}")
        return value
    raise TypeError(f"codec: unsupported type {tp!r} at {where}")   # a schema bug, not input


def _dataclass(cls: type[T], value: Any, where: str) -> T:
    if not isinstance(value, dict):
        raise ResultError(f"{where}: expected an object, got {_show(value)}")
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):   # type: ignore[arg-type]
        key = join(where, f.name)
        if f.name in value:
            kwargs[f.name] = from_json(hints[f.name], value[f.name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ResultError(f"{key}: missing")
        if f.name in kwargs and f"{cls.__name__}.{f.name}" not in SIGNED:
            check_range(f.name, kwargs[f.name], key)
    obj = cls(**kwargs)
    derived = getattr(obj, "derived", None)     # figures derived from others (``Summary``)
    if callable(derived):
        for name, want in derived().items():
            check_derived(getattr(obj, name), want, join(where, name))
    return obj


# A figure derived from others is written from the same float arithmetic that reads it back
# (JSON keeps a float's repr exactly), so any difference beyond rounding is an edit.
DERIVED_REL_TOL = 1e-9


def check_derived(got: float, want: float, where: str) -> None:
    """``got`` (a summary figure read from the file) equal to ``want`` (what the values it
    summarises give), within float tolerance; ResultError naming the key if not (exit 2)."""
    if math.isnan(got) and math.isnan(want):
        return
    if not math.isclose(got, want, rel_tol=DERIVED_REL_TOL, abs_tol=1e-12):
        name = where.rsplit(".", 1)[-1].rsplit(" ", 1)[-1]
        raise ResultError(f"{where}: expected the {name} of its values ({_show(want)}), "
                          f"got {_show(got)}")


# The physical range of each figure, by the name the schema gives it (one rule for results,
# tune results and calibration files): magnitudes below LIMIT, counts (every int) >= 0, times,
# rates, sizes and spreads >= 0, shares and probabilities in [0, 1]; changes, differences,
# errors, interval ends and attributed (differential) figures keep their sign.
LIMIT = 1e15
SHARES = frozenset({"stall_share", "steady_stall_share", "au", "last_step_share", "alpha",
                    "wait_share", "steady_wait_share",
                    "power", "power_confirmed", "false_alarm_rate", "false_alarm_rate_confirmed",
                    "power_target", "coverage"})
NON_NEGATIVE_SUFFIXES = ("epoch_s", "wait_s", "_cpu_s", "_mb", "_bytes", "samples_s", "rows_s",
                         "gb_s", "mb_s")
NON_NEGATIVE = frozenset({"time_to_first_batch_s", "executor_start_s", "trainer_transfer_s",
                          "compute_s", "stall_s", "sync_s", "steady_s", "startup_s", "seconds",
                          "noise_sd", "noise_robust_sd", "threshold", "detect", "wall_s",
                          "peak_pss_mb", "step_ms_median", "h2d_s", "h2d_ms_median"})
# Differences that share a name with a non-negative figure: they keep their sign (named by
# class, so the name rule still holds for every other field of that name).
SIGNED = frozenset({"ProfileAblation.stall_s",      # full - the run with one stage served
                    "RankSummary.others_wait_s"})   # the others' sync - the candidate's
# Rounding slack: a share computed as a ratio of sums of clock readings can land a few ulps
# past 1, a difference of equal medians a few ulps below 0; neither is out of range.
SLACK = 1e-9
SUMMARY_FIELDS = frozenset({"median", "min", "max", "values"})
MAX_FUTURE = 86400.0    # created_utc may be ahead of this machine's clock by at most a day


def check_range(name: str, value: Any, where: str) -> None:
    """``value`` of the field ``name`` within its physical range; ResultError if not (exit 2).
    A figure out of range would not crash only later (a negative throughput in a plot): it
    would be trusted (a future ``created_utc`` shadows the newest real result)."""
    if name == "created_utc":
        check_created(value, where)
        return
    if name in SUMMARY_FIELDS:     # a Summary's median/min/max/values: its figure's range
        parts = re.split(r"\.|: ", where)      # the key path (``join``): parent, then name
        parent = re.sub(r"\[\d+\]$", "", parts[-2]) if len(parts) >= 2 else ""
        name = parent or name
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                (isinstance(v, float) and math.isnan(v)):
            continue
        if name in SHARES and not -SLACK <= v <= 1.0 + SLACK:
            raise ResultError(f"{where}: expected a share from 0 to 1, got {_show(v)}")
        if (name in NON_NEGATIVE or name.endswith(NON_NEGATIVE_SUFFIXES)) and v < -SLACK:
            raise ResultError(f"{where}: expected a figure >= 0, got {_show(v)}")
        if name == "detect" and v == 0:
            raise ResultError(f"{where}: expected a slowdown > 0, got {_show(v)}")


def check_created(value: Any, where: str) -> None:
    """A real UTC timestamp (ISO 8601 with a zero offset), at most ``MAX_FUTURE`` ahead of now:
    the newest result of a scenario is chosen by it, so ``9999-12-31`` would win forever."""
    from datetime import datetime, timedelta, timezone

    if not isinstance(value, str):
        raise ResultError(f"{where}: expected an ISO 8601 UTC timestamp, got {_show(value)}")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ResultError(f"{where}: expected an ISO 8601 UTC timestamp, got "
                          f"{_show(value)}") from None
    if when.tzinfo is None or when.utcoffset() != timedelta(0):
        raise ResultError(f"{where}: expected a UTC timestamp (+00:00), got {_show(value)}")
    if when > datetime.now(timezone.utc) + timedelta(seconds=MAX_FUTURE):
        raise ResultError(f"{where}: {_show(value)} is in the future (more than a day ahead "
                          f"of this machine's clock)")


def check_depth(value: Any, where: str, limit: int = MAX_DEPTH) -> None:
    """Refuse absurdly nested JSON up front (iteratively: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            raise ResultError(f"{where}: nested deeper than {limit} levels: not a stallbench result")
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
