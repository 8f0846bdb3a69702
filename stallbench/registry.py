"""Name -> implementation registries.

A new variant (a transform, a batch format, a model, an executor) is one new file that
registers itself; nothing else is edited. Lookups of unknown names fail with the valid names,
so a scenario error can say what would have worked.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Callable, Generic, Iterable, Iterator, TypeVar

T = TypeVar("T")


def closest(name: str, options: Iterable[str]) -> str | None:
    """The valid name a typo most likely meant, or None: the one rule behind every "did you
    mean" (registry names, scenario keys and values, Parquet columns)."""
    match = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return match[0] if match else None


def did_you_mean(name: str, options: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` to append to an error, or ``""`` when nothing is close."""
    match = closest(name, options)
    return f"; did you mean {match!r}?" if match is not None else ""


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            return obj
        return deco

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(self.unknown(name)) from None

    def unknown(self, name: str, also: str | None = None) -> str:
        """The message for a name that is not registered: the closest name, and every valid
        one (``also``: another accepted form, e.g. ``"pkg.module:factory"``)."""
        hint = did_you_mean(name, self._items)
        valid = ", ".join([*sorted(self._items), *([also] if also else [])])
        return f"unknown {self.kind} {name!r}{hint} (valid: {valid})"

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))


def import_object(path: str) -> object:
    """Resolve ``"pkg.module:attr"``; ImportError/AttributeError carry a readable message."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ImportError(f"expected \"package.module:name\", got {path!r}")
    mod = importlib.import_module(module)
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ImportError(f"module {module!r} has no attribute {attr!r}") from None
