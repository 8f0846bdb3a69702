"""Bootstrap of ``stallbench profile`` (the directory holding this file is put first on the
job's ``PYTHONPATH`` by the launcher; ddtrace-run does the same).

Python imports ``sitecustomize`` once its site set-up is done, in every Python process that
sees that ``PYTHONPATH``: the job, its DataLoader workers under fork, spawn or forkserver,
torchrun's ranks, Ray's workers, and any other Python a helper of the job runs. Here it:

1. removes its own directory from ``sys.path`` at once, so the job's import path is exactly
   the one Python gives it unprofiled (``os.environ["PYTHONPATH"]`` keeps it, so that the
   processes the job starts are hooked as well; their ``sys.path`` is cleaned the same way);
2. where ``STALLBENCH_PROFILE`` is set, loads the agent (the folder above this one) by path
   as the package ``_stallbench_profile_agent`` and runs its ``install``, which adds nothing
   to ``sys.path`` and imports only the standard library; only on Python 3.7+ (what the
   agent is written in): an older Python a helper runs (3.6, 2.7) gets no hooks and no word;
3. runs the ``sitecustomize`` the environment had without us, if any (the next one on the
   cleaned ``sys.path``: the user's own on ``PYTHONPATH``, a distribution's), under the same
   name, so a site's own customisation still happens, on every Python version.

This file is read by every Python that sees the ``PYTHONPATH``, so its syntax is Python 2.7's
and 3.x's alike: no f-strings, no annotations.
"""

import os
import sys


def _chain_py2(path):
    """The next ``sitecustomize`` on Python 2 (no importlib.util there)."""
    try:
        import imp
        found = imp.find_module("sitecustomize", path)
    except ImportError:
        return
    try:
        sys.modules.pop("sitecustomize", None)
        imp.load_module("sitecustomize", *found)
    finally:
        if found[0] is not None:
            found[0].close()


def _boot():
    here = os.path.normcase(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path
                   if os.path.normcase(os.path.abspath(p or os.curdir)) != here or not p]
    if sys.version_info < (3, 4):
        _chain_py2(sys.path)
        return
    import importlib.machinery
    import importlib.util

    if sys.version_info >= (3, 7):
        _hooks()
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is not None and spec.loader is not None:
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = mod
        spec.loader.exec_module(mod)


AGENT = "_stallbench_profile_agent"


def _hooks():
    """The agent, loaded as a package by path (the job's Python may not have stallbench
    installed), installed. Whatever the settings say is the agent's to read (its wire): here
    only whether any were sent."""
    import importlib
    import importlib.util

    if not os.environ.get("STALLBENCH_PROFILE") or AGENT in sys.modules:
        return
    agent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        spec = importlib.util.spec_from_file_location(
            AGENT, os.path.join(agent, "__init__.py"), submodule_search_locations=[agent])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[AGENT] = mod
        spec.loader.exec_module(mod)
        importlib.import_module(AGENT + ".install").install()
    except Exception as exc:  # noqa: BLE001 - never break the job for a hook
        for name in [n for n in sys.modules if n == AGENT or n.startswith(AGENT + ".")]:
            sys.modules.pop(name, None)
        sys.stderr.write("stallbench profile: hooks not installed (%s: %s)\n"
                         % (type(exc).__name__, exc))


_boot()
del _boot
