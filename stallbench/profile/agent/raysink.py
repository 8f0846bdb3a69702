"""What runs in a Ray cluster's workers for the agent: the setup hook that installs it there,
the sink its records go to (``Collected``), and the collector actor that keeps them until
the driver takes them home (``Collector``).

Why an actor: a worker on another node has its own temp directory and no path of the
launcher's machine, so its parts and beats cannot be files the launcher reads. They travel
over the engine the job already uses: each put is one record, whole, under its file name, to
a small actor the driver's agent started for this run (named per run, ``num_cpus=0``, in the
job's namespace, owned by the driver so that it ends with the job); the driver drains it
into the run directory (``raycluster``). The records are the same wire records a local
process writes as files.

How the agent gets there (``raycluster`` merges it into the job's ``runtime_env``): this
folder is shipped as the ``py_modules`` package ``_stallbench_profile_agent`` (the name the
bootstrap gives it locally, so ``stallbench.watch`` finds it by that name everywhere), the
settings in ``env_vars``, and ``setup`` as the job's ``worker_process_setup_hook``; the
job's own hook runs right after it (chained, never replaced: ``Chained``).

Standard library only; Ray through ``sys.modules`` (a Ray worker has imported it).
"""

from __future__ import annotations

import importlib
import os
import sys
import threading

from . import util, wire

PUT_TIMEOUT_S = 10.0      # a put the job's loop waits for (a part, a loader's beat)
LIMIT_BYTES = 64 << 20    # what a collector keeps undrained, over all its records
PENDING = 16              # puts sent without waiting, kept to read their replies


def setup() -> None:
    """The ``worker_process_setup_hook`` of a profiled job's workers: the agent installed in
    this worker (a no-op where it already is: a worker that inherited the bootstrap), then
    the job's own hook (``Settings.hook``), whose errors are the job's as they would be
    without stallbench. Nothing of the agent's raises here."""
    try:
        install = importlib.import_module(f"{__package__}.install")
        if not install.active():
            install.install()
        ready = getattr(importlib.import_module(f"{__package__}.state").SINK, "ready", None)
        if ready is not None:
            ready.set()
    except Exception as exc:  # noqa: BLE001 - never break the job's worker for the hooks
        util.say(f"hooks not installed in this Ray worker ({type(exc).__name__}: {exc})")
    hook = wire.Settings.from_env(os.environ).hook
    if hook:
        module, _, name = hook.rpartition(".")
        getattr(importlib.import_module(module), name)()


class Chained:
    """The hook for a job whose own ``worker_process_setup_hook`` is a callable: ``setup``,
    then the job's. An object of this module's class (pickled by reference to the shipped
    package) holding the job's callable (pickled as Ray would pickle it alone: cloudpickle
    by a driver, the standard pickle by Ray Client), named as the job's hook for Ray's
    messages."""

    def __init__(self, job_hook) -> None:
        self.job_hook = job_hook
        self.__name__ = getattr(job_hook, "__name__", "worker_process_setup_hook")

    def __call__(self):
        setup()
        return self.job_hook()


class Collector:
    """The actor that keeps the latest record of each file name until the driver drains it
    (``drain``). Bounded: a put that would take the records it holds past ``limit`` bytes is
    refused (its process then counts a lost part, and the run is refused as incomplete,
    never published as whole). ``flush`` carries the launcher's ``wire.FLUSH_MARK`` to the
    workers, in every put's reply."""

    def __init__(self, limit: int = LIMIT_BYTES) -> None:
        self.limit = limit
        self.files: dict = {}
        self.size = 0
        self.flush = False

    def put(self, name: str, text: str):
        old = self.files.get(name)
        grow = len(text) - (len(old) if old else 0)
        if grow > 0 and self.size + grow > self.limit:
            return False, self.flush
        self.files[name] = text
        self.size += grow
        return True, self.flush

    def remove(self, name: str) -> None:
        old = self.files.get(name)
        self.size -= len(old) if old else 0
        self.files[name] = None          # the driver removes the file it drained before

    def drain(self, flush: bool = False) -> dict:
        """Every record put since the last drain (None: removed), handed over and dropped."""
        self.flush = self.flush or flush
        out, self.files, self.size = self.files, {}, 0
        return out


class Collected:
    """A worker's sink (``sink``): its records to the run's collector actor, found by name in
    the job's namespace when first used. A put that matters (a part, a beat of a process
    with loaders) waits for the actor's reply, so a worker Ray kills right after still
    delivered it; the others are sent and their replies read later."""

    fork_safe = False       # a forked child has no working Ray: ``install._forked``

    def __init__(self, name: str) -> None:
        self.name = name
        self.actor = None
        self.asked = False
        self.refused = 0        # puts the collector refused (full): the next put says so
        self.pending: list = []
        # set once ``setup`` returned: a task submitted from inside the setup hook, before
        # the worker's runtime_env is known, aborts the worker (Ray 2.60: a check in
        # ``OverrideTaskOrActorRuntimeEnvInfo``); what would go before (the install's beat,
        # no loader yet) is not sent
        self.ready = threading.Event()

    def where(self) -> str:
        return f"the run's collector actor {self.name}"

    def _ray(self):
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            raise OSError("Ray is not up in this process")
        if self.actor is None:
            self.actor = ray.get_actor(self.name)
        return ray

    def _reply(self, got) -> None:
        ok, asked = got
        self.asked = self.asked or bool(asked)
        if not ok:
            self.refused += 1

    def put(self, name: str, text: str, wait: bool = True, in_place: bool = False) -> None:
        """One record; raises ``OSError`` where it (or a put sent earlier) was refused.
        ``in_place`` is a file sink's way of writing (``sink.Files``): nothing here."""
        if not self.ready.is_set():
            return
        if self.refused:
            raise OSError(f"the collector held its limit ({LIMIT_BYTES >> 20} MiB) undrained")
        self._send(name, text, wait)
        if self.refused:
            raise OSError(f"the collector held its limit ({LIMIT_BYTES >> 20} MiB) undrained")

    def _send(self, name: str, text: str, wait: bool) -> None:
        ray = self._ray()
        ref = self.actor.put.remote(name, text)
        if wait:
            self._reply(ray.get(ref, timeout=PUT_TIMEOUT_S))
        else:
            self.pending = (self.pending + [ref])[-PENDING:]

    def mark(self, name: str) -> None:
        """The ``lost-*`` marker (empty: a full collector still takes it)."""
        if self.ready.is_set():
            self._send(name, "", True)

    def remove(self, name: str) -> None:
        if not self.ready.is_set():
            return
        try:
            self._ray()
            self.actor.remove.remote(name)
        except Exception:  # noqa: BLE001 - a marker left: the run is refused, as it was
            pass

    def flush_asked(self) -> bool:
        """Whether a reply so far carried the launcher's flush mark (no wait)."""
        if self.pending and not self.asked and self.ready.is_set():
            ray = self._ray()
            done, self.pending = ray.wait(self.pending, num_returns=len(self.pending),
                                          timeout=0)
            for ref in done:
                try:
                    self._reply(ray.get(ref))
                except Exception:  # noqa: BLE001 - a lost hint
                    pass
        return self.asked


class Nowhere:
    """The sink of a process forked from a Ray worker of a cluster (a DataLoader worker):
    Ray does not work in a forked child, so what it would send is not sent (its loader's
    stages are not recorded there; the loop's wait, in the worker, is)."""

    fork_safe = True

    def where(self) -> str:
        return "nowhere (a process forked from a Ray worker)"

    def put(self, name: str, text: str, wait: bool = True, in_place: bool = False) -> None:
        return None

    def mark(self, name: str) -> None:
        return None

    def remove(self, name: str) -> None:
        return None

    def flush_asked(self) -> bool:
        return False

