"""The agent's entry in a process of the job: read the settings, load the doors, patch each
library right after the job imported it, and write the figures at exit, at a fork, at an exec.

Rules it keeps, and why:

- **Standard library only** at import, torch only once the job imported torch's DataLoader,
  Ray only once the job imported Ray Data: an agent that imported torch first would change
  what the job measures (its start-up) and what it can run (a CPU-only job importing CUDA).
  ``_PostImport`` is a ``sys.meta_path`` finder that patches a module right after the job's
  own import of it executed.
- **One module per loader kind** (issue 40): what each loader library needs patched lives in
  its door under ``doors/``, loaded here (``load_doors``) by the one door list
  (``doors.names``), each bound to the core's interface (``core.CORE``) and version-checked
  the same way (``doors._base``). The core names no loader kind.
- **Siblings by the package's own name**: this folder is loaded by path as a package
  (``_stallbench_profile_agent``, by the bootstrap); a module loaded later (the doors, the
  replay of an ablation run) is a sibling of that package (``sibling``), never
  ``stallbench.profile.agent``: the job's Python may not have stallbench installed.

``stallbench.watch`` / ``stallbench.stage`` (``profile/markers.py``) find this module by its
name in ``sys.modules`` and use ``active``, ``watch`` and ``stage``.

On a Ray cluster (``raycluster``): a driver that joins one ships this package to the
cluster's workers in the job's ``runtime_env``; there ``raysink.setup`` runs ``install``,
with settings that name the run's collector actor instead of a run directory (``sink``).
"""

from __future__ import annotations

import atexit
import importlib
import importlib.abc
import importlib.util
import os
import sys

from . import beats, core, doors, frames, passes, stages, state, util, windows, wire, writer
from .doors._base import bind, routes

TARGETS: dict = {}      # a module the job imports -> the door function patching it


def sibling(name: str):
    """A module of this package by its name inside it (``replay``, ``doors.ray_data``),
    loaded once, as the bootstrap loaded the package (by path: see the module docstring)."""
    return importlib.import_module(f"{__package__}.{name}")


def load_doors() -> list:
    """Every door module of ``doors/`` (the order of ``doors.names``: sorted file names),
    bound to the core, its ``PATCHES`` added to ``TARGETS``. Once per process; a door that
    fails to load is said once and left out (its loaders go unseen)."""
    if state.DOORS:
        return state.DOORS
    try:
        names = doors.names()
    except OSError as exc:
        util.say(f"no loader doors ({exc}); nothing is hooked")
        return state.DOORS
    for name in names:
        try:
            mod = sibling(f"doors.{name}")
            bind(mod, core.CORE)
            TARGETS.update(routes(mod))
            state.DOORS.append(mod)
        except Exception as exc:  # noqa: BLE001 - that door's loaders go unseen, said
            util.say(f"the {name} door did not load ({type(exc).__name__}: {exc}); its "
                     "loaders are not seen")
    return state.DOORS


def active() -> bool:
    """Whether the agent measures this process (``markers`` asks before it hands over)."""
    return state.SETTINGS.active


def watch(iterable, name: str | None = None):
    """``stallbench.watch`` (``markers.watch`` calls this): the door that defines ``watch``
    wraps the iterable; the iterable itself where none does."""
    for mod in load_doors():
        fn = getattr(mod, "watch", None)
        if fn is not None:
            return fn(iterable, name)
    return iterable


def stage(name: str) -> stages.Stage:
    """``stallbench.stage(name)`` (``markers.stage`` calls this)."""
    return stages.Stage(name)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, then) -> None:
        self.inner, self.then = inner, then

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        try:
            self.then(module)
        except Exception as exc:  # noqa: BLE001 - a hook that fails leaves the job unhooked
            util.say(f"could not hook {module.__name__} ({type(exc).__name__}: {exc}); "
                     "the job runs unmeasured there")


class _PostImport(importlib.abc.MetaPathFinder):
    """Patches a target module right after the job's own import of it executed."""

    def __init__(self) -> None:
        self.busy: set = set()

    def find_spec(self, name, path, target=None):
        if name not in TARGETS or name in self.busy:
            return None
        self.busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy.discard(name)
        if spec is None or spec.loader is None:
            return spec
        if isinstance(spec.loader, _Loader):
            # ``importlib.reload``: ``find_spec`` hands back the module's own spec, whose
            # loader is already ours; wrapped again, the new classes were patched twice (two
            # streams per loader, each batch timed twice: "iterated from two threads")
            spec.loader = spec.loader.inner
        spec.loader = _Loader(spec.loader, TARGETS[name])
        return spec


def _load_replay(plan: wire.ReplayPlan) -> None:
    """The replay module (issue 28), only for an ablation run: a plain profile never runs
    a line of it."""
    try:
        mod = sibling("replay")
        mod.setup(plan)
        state.REPLAY = mod
    except Exception as exc:  # noqa: BLE001 - the run goes on unablated, and says so
        util.say(f"replay not loaded ({type(exc).__name__}: {exc}); this ablation run is void")


def _forked() -> None:
    """In a forked child: the parent's streams are not this process's (a loader worker
    clears them again in its worker loop); a new image, so its files are its own."""
    state.new_image()
    writer.new_image()
    if state.SINK is not None and not getattr(state.SINK, "fork_safe", True):
        state.SINK = sibling("raysink").Nowhere()       # no working Ray in a forked child
    if state.NODE[0] is None:
        state.NODE[0] = ""          # never asked of a forked Ray
    util.each_door("at_fork")       # the doors' own tables (a queue's feed, a watched object)


def _at_exit() -> None:
    """Each door's ``at_exit`` (before the final flush: atexit runs last-in first)."""
    util.each_door("at_exit")


def _patch_exec() -> None:
    """``os.execv``/``os.execve`` (``execl*``/``execvp*`` go through them) write the figures
    first: the new image replaces this one without ``atexit``, and its own parts have a new
    image name, so an exec'd second training adds to the figures instead of overwriting."""
    import functools
    for name in ("execv", "execve"):
        orig = getattr(os, name, None)
        if orig is None:
            continue

        def make(orig, with_env):
            @functools.wraps(orig)
            def exec_(*a, **k):
                env = (k.get("env", a[2] if len(a) > 2 else None) if with_env
                       else os.environ)
                beats.exec_lost(_exec_drops(env))
                writer.flush(force=True)
                return orig(*a, **k)
            return exec_
        setattr(os, name, make(orig, name == "execve"))


_BOOT = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]    # the launcher put it first


def _exec_drops(env) -> str:
    """What an exec's environment drops of what starts the agent in the new image: the
    bootstrap's ``PYTHONPATH`` entry, the settings variable ("" when it keeps both, or
    cannot be read). The launcher says it when no figures came back: the exec, not a loader
    stallbench does not know, is why (``stallbench.watch`` cannot help there)."""
    try:
        lost = []
        if _BOOT and _BOOT not in str(env.get("PYTHONPATH") or "").split(os.pathsep):
            lost.append("PYTHONPATH")
        if not env.get(wire.ENV):
            lost.append(wire.ENV)
        return " and ".join(lost)
    except Exception:  # noqa: BLE001 - an odd mapping: nothing said
        return ""


def install() -> None:
    """Read the settings, hook the targets (now if already imported), flush at exit."""
    state.SETTINGS = wire.Settings.from_env(os.environ)
    if not state.SETTINGS.active:
        return
    if state.SETTINGS.collector:        # a Ray cluster's worker: figures to the collector
        state.SINK = sibling("raysink").Collected(state.SETTINGS.collector)
    if state.SETTINGS.replay is not None:
        _load_replay(state.SETTINGS.replay)
    load_doors()
    if state.SETTINGS.run_dir:          # a driver that may join a Ray cluster (``raycluster``)
        TARGETS.update(sibling("raycluster").PATCHES)
    for name, patch in TARGETS.items():
        mod = sys.modules.get(name)
        if mod is not None:
            try:
                patch(mod)
            except Exception as exc:  # noqa: BLE001 - as ``_Loader.exec_module`` says it
                util.say(f"could not hook {name} ({type(exc).__name__}: {exc}); "
                         "the job runs unmeasured there")
    sys.meta_path.insert(0, _PostImport())
    frames.install()                    # the job's tracebacks without the agent's frames
    atexit.register(beats.beat_exit)    # atexit runs last-in first: after the final flush
    atexit.register(writer.flush)
    atexit.register(windows.stop_writer)    # --live's thread: before the final flush
    atexit.register(_at_exit)           # before the final flush (atexit runs last-in first)
    atexit.register(passes.close_complete)
    beats.beat(force=True)              # the launcher's sign that the agent runs here
    os.register_at_fork(after_in_child=_forked)
    _patch_exec()
