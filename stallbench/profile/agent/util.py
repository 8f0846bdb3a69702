"""Small rules every part of the agent keeps: read an object without running its code
(``own``), say a thing once on the job's stderr (``say``, ``unmeasured``), which rank this
process is (``rank``), what the job's framework calls a loader (``framework_name``), and the
doors loaded in this process (``door_of``, ``each_door``).

Why apart: the stream clocks, the part writer, the replay and the loader all use them, and
none of them needs the others to do so.
"""

from __future__ import annotations

import os
import sys

from . import state

_said: set = set()


def own(obj, name: str, default=None):
    """An attribute from the object's own ``__dict__``: no ``getattr``, so no property,
    ``__getattr__`` or ``__getattribute__`` of the user's runs from hook code (a loader
    subclass whose ``__getattr__`` forwards to its dataset recursed before its ``__init__``)."""
    try:
        d = object.__getattribute__(obj, "__dict__")
        return dict.get(d, name, default)
    except Exception:  # noqa: BLE001 - no __dict__ (slots): nothing of ours to read
        return default


def unmeasured(label: str, what: str) -> None:
    """The last resort for an exception inside hook code: one line naming the loader and
    what was not done (never the exception's class: the user did nothing wrong)."""
    line = f"stallbench: {label}: not measured ({what})"
    if line not in _said:
        _said.add(line)
        try:
            print(line, file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - a closed stderr: nothing to say it on
            pass


def say(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(f"stallbench profile: {line}", file=sys.stderr, flush=True)


def rank() -> dict:
    env = os.environ

    def num(name: str, default: int) -> int:
        try:
            return int(env.get(name, default))
        except ValueError:
            return default
    out = {"rank": num("RANK", 0), "local_rank": num("LOCAL_RANK", 0),
           "world_size": num("WORLD_SIZE", 1), "node_rank": num("GROUP_RANK", 0)}
    d = dist()
    if d is not None and "RANK" not in env:      # mp.spawn + init_process_group(rank=)
        out["rank"], out["world_size"] = d.get_rank(), d.get_world_size()
    return out


def node() -> str:
    """The Ray node this process runs on, ``<ip>/<node id, 8 hex>`` (two nodes of one host
    differ by their id), read once Ray is up in this process and kept; "" outside Ray. Ray
    only through ``sys.modules``: the agent never imports it."""
    got = state.NODE[0]
    if got is not None:
        return got
    ray = sys.modules.get("ray")
    try:
        if ray is None or not ray.is_initialized():
            return ""
        node_id = ray.get_runtime_context().get_node_id() or ""
        ip = ray.util.get_node_ip_address()
        state.NODE[0] = f"{ip}/{node_id[:8]}" if node_id else str(ip)
        return state.NODE[0]
    except Exception:  # noqa: BLE001 - a Ray that cannot say: no node recorded
        return ""


def dist():
    """torch.distributed when the job initialised a process group (a rank however it was
    started: torchrun, Ray Train, ``mp.spawn`` with ``init_process_group(rank=...)``)."""
    d = sys.modules.get("torch.distributed")
    try:
        return d if d is not None and d.is_available() and d.is_initialized() else None
    except Exception:  # noqa: BLE001
        return None


NAMING_FRAMES = 40      # how far up the stack ``framework_name`` looks


def framework_name() -> str:
    """What the job's framework calls the loader being made: the name of the nearest
    function of the job's own code (not a library's, not stallbench's) on the stack whose
    name ends with ``dataloader`` (Lightning's ``train_dataloader`` / ``val_dataloader`` hooks,
    a data module's ``test_dataloader``): the validation loader is ``val_dataloader``, not
    ``Items#1``. Where the job's code has none, a library's public function of that form
    names it, ``get_`` dropped (Hugging Face ``Trainer.get_train_dataloader`` /
    ``get_eval_dataloader``: ``train_dataloader``, ``eval_dataloader``); the job's own name
    wins over a library helper it calls. "" where none is (a loader made in a plain script
    keeps its dataset class's name). Read once per loader, at its creation; never raises."""
    try:
        f = sys._getframe(1)
        lib = ""
        for _ in range(NAMING_FRAMES):
            if f is None:
                break
            name, path = f.f_code.co_name, f.f_code.co_filename
            if name.endswith("dataloader") and name.isidentifier() and \
                    not path.startswith(state.HERE):
                if not library_file(path):
                    return name
                if not lib and not name.startswith("_"):
                    lib = name[len("get_"):] if name.startswith("get_") else name
            f = f.f_back
        return lib
    except Exception:  # noqa: BLE001 - unnamed: the dataset class names it
        return ""


def library_file(path: str) -> bool:
    """An installed package's or the standard library's file (not the user's code)."""
    import sysconfig
    if "site-packages" in path or "dist-packages" in path:
        return True
    paths = sysconfig.get_paths()
    return any(path.startswith(paths[k] + os.sep) for k in ("stdlib", "platstdlib")
               if paths.get(k))


def door_of(kind: str):
    """The loaded door module that makes streams of ``kind`` (None: none does)."""
    for mod in state.DOORS:
        if kind in getattr(mod, "KINDS", ()):
            return mod
    return None


def each_door(hook: str) -> None:
    """Each loaded door's ``hook`` (``at_fork``, ``at_exit``), where it has one; one that
    fails is left: the others still run, and nothing reaches the job."""
    for mod in state.DOORS:
        fn = getattr(mod, hook, None)
        if fn is not None:
            try:
                fn()
            except Exception:  # noqa: BLE001
                pass
