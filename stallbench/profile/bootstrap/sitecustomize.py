"""Bootstrap of ``stallbench profile`` (the directory holding this file is put first on the
job's ``PYTHONPATH`` by the launcher; ddtrace-run does the same).

Python imports ``sitecustomize`` once its site set-up is done, in every Python process that
sees that ``PYTHONPATH``: the job, its DataLoader workers under fork, spawn or forkserver,
torchrun's ranks, Ray's workers. Here it:

1. removes its own directory from ``sys.path`` at once, so the job's import path is exactly
   the one Python gives it unprofiled (``os.environ["PYTHONPATH"]`` keeps it, so that the
   processes the job starts are hooked as well; their ``sys.path`` is cleaned the same way);
2. loads the hooks by file path (``STALLBENCH_PROFILE`` names it), which adds nothing to
   ``sys.path`` and imports only the standard library;
3. runs the ``sitecustomize`` the environment had without us, if any (the next one on the
   cleaned ``sys.path``), under the same name, so a site's own customisation still happens.
"""

import os
import sys


def _boot() -> None:
    here = os.path.normcase(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path
                   if os.path.normcase(os.path.abspath(p or os.curdir)) != here or not p]
    import json
    import importlib.machinery
    import importlib.util

    try:
        hooks_path = json.loads(os.environ.get("STALLBENCH_PROFILE", "{}")).get("hooks")
    except ValueError:
        hooks_path = None
    if hooks_path and "_stallbench_profile_hooks" not in sys.modules:
        try:
            spec = importlib.util.spec_from_file_location("_stallbench_profile_hooks", hooks_path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
            mod.install()
        except Exception as exc:  # noqa: BLE001 - never break the job for a hook
            sys.modules.pop("_stallbench_profile_hooks", None)
            print(f"stallbench profile: hooks not installed ({type(exc).__name__}: {exc})",
                  file=sys.stderr)
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is not None and spec.loader is not None:
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = mod
        spec.loader.exec_module(mod)


_boot()
del _boot
