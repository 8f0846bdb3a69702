"""Name -> implementation registries.

A new variant (a transform, a batch format, a model, an executor) is one new file that
registers itself; nothing else is edited. Lookups of unknown names fail with the valid names,
so a scenario error can say what would have worked.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
import types
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


# Where a scenario's own code is found (README "Trust", docs/reliability-rules.md): the
# scenario file's directory, then the working directory, then the import path. A module found
# in one of those directories is loaded *by its file path*, under a private name, and nothing
# is added to ``sys.path``: no other file there (a ``cython.py``, a ``uarray.py``) becomes
# importable by stallbench or by the libraries it loads while they probe optional modules.
_PRIVATE = "_stallbench_user"


SIDE_TREE = "STALLBENCH_SIDE_TREE"   # "<working tree>:<side's tree>", set by gate --against
# The directory of the scenario a derived scenario file was written from (``tune``'s
# recommendation lands in ``OUT/tune/``, away from the user's ``mytf.py``): searched right
# after the scenario file's own directory. In the environment, so that a process that
# rebuilds the stages (a local Flight server) finds the same file.
CODE_FROM = "STALLBENCH_CODE_FROM"


@contextlib.contextmanager
def code_from(scenario_file: str) -> Iterator[None]:
    """While it lasts, the user's modules are also looked for in ``scenario_file``'s directory
    (``user_dirs``): a scenario stallbench wrote from that one names the same code."""
    old = os.environ.get(CODE_FROM)
    if scenario_file and not scenario_file.startswith("<"):
        os.environ[CODE_FROM] = os.path.dirname(os.path.abspath(scenario_file))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(CODE_FROM, None)
        else:
            os.environ[CODE_FROM] = old


def user_dirs(scenario_file: str | None) -> list[str]:
    """The directories searched before the import path, in order, absolute.

    Under ``gate --against REF`` (``gate.pairs.side_env``) REF's runs read the working tree's
    scenario files in the working tree's directory, but their code is REF's: each directory
    inside the working tree is mapped to the same place in REF's checkout, so a module REF
    lacks is an error naming REF, never the working tree's file."""
    dirs: list[str] = []
    if scenario_file and not scenario_file.startswith("<"):
        dirs.append(os.path.dirname(os.path.abspath(scenario_file)))
    if os.environ.get(CODE_FROM):
        dirs.append(os.environ[CODE_FROM])
    dirs.append(os.getcwd())
    work, _, side = os.environ.get(SIDE_TREE, "").partition(os.pathsep)
    if work and side:
        mapped = []
        for d in dirs:
            rel = os.path.relpath(d, work)
            mapped.append(d if rel.startswith("..") else os.path.normpath(os.path.join(side, rel)))
        dirs = mapped
    return list(dict.fromkeys(dirs))


def locate(module: str, dirs: list[str]) -> str | None:
    """The file of ``module``'s top-level name (``a.py`` or ``a/__init__.py``) in the first
    of ``dirs`` that has it; None: look on the import path."""
    top = module.split(".")[0]
    if not top.isidentifier():
        return None
    for d in dirs:
        for cand in (os.path.join(d, top + ".py"), os.path.join(d, top, "__init__.py")):
            if os.path.isfile(cand):
                return cand
    return None


def _private_name(origin: str, top: str) -> str:
    tag = hashlib.sha256(origin.encode()).hexdigest()[:12]
    return f"{_PRIVATE}_{tag}_{top}"


def load_by_path(module: str, origin: str) -> types.ModuleType:
    """``module`` (dotted) whose top-level name is the file ``origin``: the top is executed
    from its file under a private name; a dotted rest is imported through that package's own
    ``__path__`` (not ``sys.path``). Loaded once per process."""
    top, _, rest = module.partition(".")
    name = _private_name(origin, top)
    mod = sys.modules.get(name)
    if mod is None:
        is_pkg = os.path.basename(origin) == "__init__.py"
        spec = importlib.util.spec_from_file_location(
            name, origin,
            submodule_search_locations=[os.path.dirname(origin)] if is_pkg else None)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {origin}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod           # dataclasses and pickle look modules up by name
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(name, None)
            raise
    if rest:
        mod = importlib.import_module(f"{name}.{rest}")
    return mod


def import_object(path: str, origin: str | None = None,
                  searched: list[str] | None = None) -> object:
    """Resolve ``"pkg.module:attr"``: from the file ``origin`` (``locate``) when given, else
    from the import path (``searched``: the directories already looked in, for the message).
    ImportError/AttributeError carry a readable message; a module the user's file imports
    that exists nowhere says how to make a module's siblings importable."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ImportError(f"expected \"package.module:name\", got {path!r}")
    if origin is None:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if searched and exc.name and module.split(".")[0] == exc.name:
                raise ModuleNotFoundError(
                    f"No module named {exc.name!r} (looked in {', '.join(searched)} "
                    f"and the import path)", name=exc.name) from None
            raise
    else:
        try:
            mod = load_by_path(module, origin)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing and not missing.startswith(_PRIVATE):
                raise ModuleNotFoundError(
                    f"No module named {missing!r}, imported by {os.path.basename(origin)} "
                    f"(loaded by its path; stallbench adds nothing to the import path): to "
                    f"import its siblings, set PYTHONPATH={os.path.dirname(origin)}",
                    name=missing) from None
            raise ModuleNotFoundError(f"No module named {module!r} (its top-level package "
                                      f"is {origin})", name=module) from None
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ImportError(f"module {module!r} has no attribute {attr!r}") from None
