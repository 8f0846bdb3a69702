"""A job that joins an existing Ray cluster, measured on every node: the agent, in the job's
driver, ships itself to the cluster's workers through the job's own ``runtime_env``, and
brings their figures home over Ray.

Why through the ``runtime_env``: a ``ray start`` cluster's workers are started by its
raylets, which never saw stallbench's bootstrap (only processes that inherit the job's
environment do: a local ``ray.init()`` works because its raylet inherits ``PYTHONPATH``).
The job's ``runtime_env`` is the one channel Ray gives a job to every worker of its own,
on every node, and to no other job's: this job's workers are measured, other jobs on the
cluster are untouched. What is merged into it (``merged``), never replacing the job's own:

- ``py_modules``: a copy of this folder as the package ``_stallbench_profile_agent``, made
  in the run directory (scratch of the launcher, removed with it); Ray uploads it to the
  cluster and unpacks it on each node. Never a path of the launcher's machine in
  ``env_vars`` or ``PYTHONPATH``: a worker node has no such path;
- ``worker_process_setup_hook``: ``raysink.setup``, which installs the agent in the worker
  (a no-op where it already is) and then runs the job's own hook (a string: named in the
  settings; a callable: chained, ``raysink.chained``);
- ``env_vars``: the settings (``wire.Settings``: the ``--set`` overrides and
  ``--max-batches``, so a ``tune -- CMD`` trial reaches every rank; the collector's name
  instead of a run directory; no secret).

Where: ``ray._private.worker.connect`` of the driver (``SCRIPT_MODE``), for a node it did
not start (``node.head`` false: ``ray.init(address=...)``, ``"auto"``, ``RAY_ADDRESS``,
``ray job submit``'s entrypoint, a ``JobConfig`` the job passed): there Ray has merged every
source of the job's ``runtime_env`` (the submission's too) into the ``JobConfig`` it
connects with, and the job's own object is left as it was (a copy is connected). Ray Client
(``ray://``) connects elsewhere: ``init``'s arguments are merged there. A local Ray that
``ray.init()`` starts gets nothing: its workers inherited the bootstrap.

Figures home: after ``ray.init`` the driver starts the run's collector (``raysink.Collector``)
on its own node and a thread that drains it into the run directory every ``DRAIN_S`` (the
launcher reads beats and parts while the job runs: ``--progress-timeout``, tune's stop),
and once more, with the actor ended, at ``ray.shutdown()`` and at exit (before Ray's own);
through Ray Client only then (its connection belongs to the thread that made it).

Nothing here raises into the job: whatever fails is said once and the job goes on, its
cluster's workers unmeasured.
"""

from __future__ import annotations

import atexit
import copy
import functools
import os
import shutil
import sys
import threading

from . import raysink, sink, state, util, wire

AGENT = "_stallbench_profile_agent"
HOOK = f"{AGENT}.raysink.setup"
RESERVED = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"   # Ray's: a hook already exported
DRAIN_S = 0.5
DRAIN_TIMEOUT_S = 30.0


class _Run:
    """The cluster run of this driver: its collector's name, then the actor and its drain."""

    def __init__(self, name: str, client: bool = False) -> None:
        self.name = name
        self.client = client        # Ray Client: no drain thread (see ``_start``)
        self.actor = None
        self.stop = threading.Event()
        self.thread = None
        self.closed = False
        self.said = False


_RUN: list = [None]      # the current ``_Run`` (one per ``ray.init`` that joined a cluster)
_SEQ = [0]


def merged(runtime_env, module_dir: str, settings: wire.Settings,
           client: bool = False) -> dict:
    """The job's ``runtime_env`` (a dict or Ray's ``RuntimeEnv``, never changed) with the
    agent added: its package in ``py_modules``, its settings in ``env_vars``, its hook
    first in ``worker_process_setup_hook`` (the job's own chained after it). Raises
    ``ValueError`` where the job's hook was already exported by Ray (it cannot be chained).

    ``client`` (Ray Client): Ray turns no ``worker_process_setup_hook`` of a client's job
    into the variable its workers read (the client sends none; its server skips the step
    for a client's job), so the agent's hook goes straight into that variable, as Ray does
    for a hook named by a string; the job's own field is left as it was, and, as without
    stallbench, not run."""
    env = dict(runtime_env or {})
    env["py_modules"] = list(env.get("py_modules") or []) + [module_dir]
    env_vars = dict(env.get("env_vars") or {})
    if RESERVED in env_vars:
        raise ValueError("the job's runtime_env carries a setup hook Ray already exported")
    theirs = env.get("worker_process_setup_hook")
    hook = HOOK
    if client:
        env_vars[RESERVED] = HOOK
        hook = theirs
    elif isinstance(theirs, str) and theirs:
        settings = wire.Settings(overrides=settings.overrides, max_batches=settings.max_batches,
                                 collector=settings.collector, hook=theirs)
    elif callable(theirs):
        hook = raysink.Chained(theirs)
    env_vars[wire.ENV] = settings.to_env()
    env["env_vars"] = env_vars
    if hook is not None:
        env["worker_process_setup_hook"] = hook
    return env


def _ship(runtime_env, client: bool = False) -> dict:
    """The job's ``runtime_env`` with the agent merged in, for a new run (``_RUN``)."""
    _SEQ[0] += 1
    name = f"stallbench-collector-{os.getpid()}-{state.IMAGE}-{_SEQ[0]}"
    where = os.path.join(state.SETTINGS.run_dir, f"ray-agent-{state.IMAGE}-{_SEQ[0]}", AGENT)
    if not os.path.isdir(where):
        shutil.copytree(state.HERE, where,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "bootstrap"))
    settings = wire.Settings(overrides=state.SETTINGS.overrides,
                             max_batches=state.SETTINGS.max_batches, collector=name)
    env = merged(runtime_env, where, settings, client)
    _RUN[0] = _Run(name, client)
    return env


def _said(exc: Exception) -> None:
    util.say(f"the Ray cluster's workers are not measured ({type(exc).__name__}: {exc}); "
             "the driver's loops are")


def patch_worker(mod) -> None:
    """``ray._private.worker``: ``connect`` (the runtime_env merged), ``init`` (the collector
    started after it; Ray Client's arguments merged before it) and ``shutdown`` (drained
    and ended before it), also where the ``ray`` package already bound them."""
    ray = sys.modules.get("ray")
    orig = {n: getattr(mod, n, None) for n in ("connect", "init", "shutdown")}
    if None in orig.values():
        util.say("Ray's connect/init/shutdown were not found: a Ray cluster's workers are not "
                 "measured")
        return
    new = {"connect": _connect(mod, orig["connect"]), "init": _init(orig["init"]),
           "shutdown": _shutdown(orig["shutdown"])}
    for n, fn in new.items():
        setattr(mod, n, fn)
        if ray is not None and getattr(ray, n, None) is orig[n]:
            setattr(ray, n, fn)


def _wanted() -> bool:
    return bool(state.SETTINGS.run_dir) and state.own_process()


def _connect(mod, orig):
    script = getattr(mod, "SCRIPT_MODE", 0)
    unset = object()

    @functools.wraps(orig)
    def connect(node, *a, mode=unset, **k):
        cfg = k.get("job_config")
        if (mode == script and _wanted() and not getattr(node, "head", True)
                and cfg is not None):
            try:
                mine = copy.copy(cfg)
                mine.set_runtime_env(_ship(cfg.runtime_env))
                k["job_config"] = mine
            except Exception as exc:  # noqa: BLE001 - the job joins as it asked
                _RUN[0] = None
                _said(exc)
        if mode is not unset:
            k.update(mode=mode)
        return orig(node, *a, **k)
    return connect


def _client(a: tuple, k: dict) -> tuple:
    """Ray Client (``ray://``): the agent merged into ``init``'s own arguments (the client
    uploads ``py_modules`` itself); a ``JobConfig`` the job passed is copied, not changed."""
    address = a[0] if a else k.get("address")
    if address in (None, "auto"):
        address = os.environ.get("RAY_ADDRESS") or address
    if not (isinstance(address, str) and "://" in address and _wanted()):
        return a, k
    try:
        k = dict(k)
        cfg = k.get("job_config")
        if k.get("runtime_env") is None and cfg is not None and cfg.runtime_env:
            mine = copy.copy(cfg)
            mine.set_runtime_env(_ship(cfg.runtime_env, True))
            k["job_config"] = mine
        else:
            k["runtime_env"] = _ship(k.get("runtime_env"), True)
    except Exception as exc:  # noqa: BLE001
        _RUN[0] = None
        _said(exc)
    return a, k


def _init(orig):
    @functools.wraps(orig)
    def init(*a, **k):
        a, k = _client(a, k)
        out = orig(*a, **k)
        run = _RUN[0]
        if run is not None and run.actor is None:
            try:
                _start(run)
            except Exception as exc:  # noqa: BLE001
                _said(exc)
        return out
    return init


def _start(run: _Run) -> None:
    """The run's collector on the driver's node (soft: anywhere if that cannot be), owned by
    the driver (it ends with the job), and its drain."""
    ray = sys.modules["ray"]
    # one call at a time: a caller's puts are kept in the order it sent them (a threaded
    # actor may run them out of order, and an older part would replace a newer one)
    opts = {"name": run.name, "num_cpus": 0, "max_concurrency": 1, "max_restarts": 0}
    try:
        strategies = sys.modules.get("ray.util.scheduling_strategies")
        node_id = ray.get_runtime_context().get_node_id()
        if strategies is not None and node_id:
            opts["scheduling_strategy"] = strategies.NodeAffinitySchedulingStrategy(
                node_id, soft=True)
    except Exception:  # noqa: BLE001 - placed where Ray places it
        pass
    run.actor = ray.remote(raysink.Collector).options(**opts).remote()
    if not run.client:
        # a Ray Client's connection is not another thread's (Ray there would start a local
        # Ray of its own): through a client the figures come home at shutdown and exit only
        run.thread = threading.Thread(target=_drain_loop, args=(run,), daemon=True,
                                      name="stallbench-drain")
        run.thread.start()
    atexit.register(_close, run)      # after Ray's own: runs before its shutdown


def _drain_loop(run: _Run) -> None:
    while not run.stop.wait(DRAIN_S):
        _drain(run)


def _safe(name) -> bool:
    """A record's name as the agent makes them: one plain file name of the run directory."""
    return isinstance(name, str) and bool(name) and os.path.basename(name) == name and \
        not name.startswith(".") and name.split("-", 1)[0] in ("part", "epochs", "stage",
                                                                "beat", wire.LOST_PREFIX)


def _drain(run: _Run) -> bool:
    """The collector's records into the run directory; False where it did not answer."""
    ray = sys.modules.get("ray")
    files = sink.Files(state.SETTINGS.run_dir)
    try:
        got = ray.get(run.actor.drain.remote(files.flush_asked()), timeout=DRAIN_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - said once; the remote figures stop there
        if not run.said:
            run.said = True
            util.say(f"the cluster workers' figures could not be fetched "
                     f"({type(exc).__name__}: {exc})")
        return False
    for name, text in (got or {}).items():
        if not _safe(name):
            continue
        try:
            if text is None:
                files.remove(name)
            elif text == "":
                files.mark(name)
            else:
                files.put(name, text)
        except OSError as exc:
            util.say(f"cannot write the cluster workers' figures to {files.where()} ({exc})")
    return True


def _close(run: _Run) -> None:
    """The last drain, then the collector ended: at ``ray.shutdown()`` and at exit."""
    if run.closed:
        return
    run.closed = True
    run.stop.set()
    if run.thread is not None:
        run.thread.join(timeout=DRAIN_TIMEOUT_S)
    if run.actor is not None:
        _drain(run)
        try:
            sys.modules["ray"].kill(run.actor)
        except Exception:  # noqa: BLE001 - it ends with the job anyway (not detached)
            pass
    if _RUN[0] is run:
        _RUN[0] = None


def _shutdown(orig):
    @functools.wraps(orig)
    def shutdown(*a, **k):
        run = _RUN[0]
        if run is not None and state.own_process():
            try:
                _close(run)
            except Exception as exc:  # noqa: BLE001
                _said(exc)
        return orig(*a, **k)
    return shutdown


PATCHES = {"ray._private.worker": patch_worker}
