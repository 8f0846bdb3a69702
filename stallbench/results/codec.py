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


def from_json(tp: Any, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as an instance of ``tp``; ResultError naming ``where`` if not."""
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
        return [from_json(arg, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ResultError(f"{where}: expected an object, got {_show(value)}")
        _, arg = typing.get_args(tp)
        return {k: from_json(arg, v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _dataclass(tp, value, where)
    if tp is float:
        if value is None:
            return math.nan
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ResultError(f"{where}: expected a number, got {_show(value)}")
        if not math.isfinite(value):
            raise ResultError(f"{where}: expected a finite number, got {_show(value)}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ResultError(f"{where}: expected an integer, got {_show(value)}")
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
        key = f"{where}.{f.name}"
        if f.name in value:
            kwargs[f.name] = from_json(hints[f.name], value[f.name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ResultError(f"{key}: missing")
    return cls(**kwargs)


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
