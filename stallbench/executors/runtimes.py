"""Runtimes kept across the variants of one scenario (a Ray cluster costs seconds to start).

An executor whose runtime is expensive asks this module for it instead of building its own:
``acquire(key, make)`` returns the runtime cached under ``key`` (its *cluster shape*: every
setting that makes one runtime differ from another) or a new one from ``make()``, and
``release(runtime)`` hands it back. Outside a ``RuntimeScope`` nothing is cached: ``release``
closes the runtime at once, as before. Inside one (``runner.run_scenario`` opens one per
scenario), a released runtime stays open for the next variant with the same key and is closed
when the scope ends, whatever ends it: the last variant, an error, Ctrl-C or SIGTERM (which
the Ray runtime turns into KeyboardInterrupt), so "everything stallbench started is stopped"
still holds. ``group``: runtimes of one group cannot coexist in a process (Ray allows one per
process), so acquiring a different key closes the cached one of the same group first.

A runtime is any object with ``open()`` and ``close()``; ``open`` is the caller's to call
(``acquire`` says whether the runtime is new). One may also have ``failed(exc)``: a scope
that ends on an error calls it before ``close`` (the Ray runtime keeps its scratch log then,
and names it on the error, ``RayRuntime.failed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable


@dataclass
class _Entry:
    key: Hashable
    group: str
    runtime: Any
    in_use: bool = True


@dataclass
class RuntimeScope:
    """Runtimes cached for the variants run inside ``with RuntimeScope():``."""

    entries: list[_Entry] = field(default_factory=list)

    def __enter__(self) -> "RuntimeScope":
        _SCOPES.append(self)
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        try:
            self.close_all(exc if isinstance(exc, Exception) else None)
        finally:
            if _SCOPES and _SCOPES[-1] is self:
                _SCOPES.pop()

    def close_all(self, failed: Exception | None = None) -> None:
        """Close every runtime; ``failed``: the error that ends the scope (an interrupt is
        not one: the user stopped the run), told to each runtime that listens first."""
        errors = []
        while self.entries:
            e = self.entries.pop()
            try:
                on_failure = getattr(e.runtime, "failed", None)
                if failed is not None and callable(on_failure):
                    on_failure(failed)
                e.runtime.close()
            except Exception as exc:  # noqa: BLE001 - close the others, then report
                errors.append(exc)
        if errors:
            raise errors[0]


_SCOPES: list[RuntimeScope] = []


def active() -> RuntimeScope | None:
    return _SCOPES[-1] if _SCOPES else None


def acquire(key: Hashable, make: Callable[[], Any], group: str) -> tuple[Any, bool]:
    """(runtime, reused). Reused: an open runtime of the same key from an earlier variant."""
    scope = active()
    if scope is None:
        return make(), False
    for e in scope.entries:
        if e.key == key and e.group == group and not e.in_use:
            e.in_use = True
            return e.runtime, True
    # one runtime per group per process: close the other one of this group first
    for e in [e for e in scope.entries if e.group == group]:
        if e.in_use:
            raise RuntimeError(f"a {group} runtime is still in use by another executor")
        scope.entries.remove(e)
        e.runtime.close()
    rt = make()
    scope.entries.append(_Entry(key, group, rt))
    return rt, False


def release(runtime: Any, healthy: bool = True) -> None:
    """Hand a runtime back: kept for the next variant inside a scope (when ``healthy``),
    closed otherwise."""
    scope = active()
    if scope is not None:
        for e in scope.entries:
            if e.runtime is runtime:
                if healthy:
                    e.in_use = False
                    return
                scope.entries.remove(e)
                break
    runtime.close()
