"""Thread budgets: how many threads each producer process and the trainer may run.

Every producer process (a loader worker, a Ray task's worker, a Flight server) runs libraries
that start their own thread pools: pyarrow's CPU pool (Parquet decode, compute kernels), torch's
intra-op pool, OpenMP/MKL/OpenBLAS. Each sizes itself to the whole machine by default, so N
producers on C cores run up to N x C threads that only add context switches and hand-offs:
Yelp's "thread storms", fixed by giving each process a budget of cores.

``loader.producer_threads``:

- unset: the machine's cores split between the producer processes that share them,
  ``max(1, cores // producers)`` (the executor says how many share this machine: loader
  workers, local Flight servers; a Ray task gets the one CPU it reserves);
- ``0``: no budget: pyarrow's pool gets every core, torch and OMP keep what their runtime set
  (what a user who configures nothing gets), the "unbounded" side of an oversubscription test;
- ``N``: N threads.

``loader.trainer_threads`` (unset: library defaults) sizes pyarrow's pool in the trainer
process, which decodes at ``num_workers = 0`` and unpacks what producers send; the trainer's
torch intra-op pool stays ``model.torch_threads``.

``apply`` sets the pools of the calling process and the OMP/MKL/OpenBLAS variables, which
reach libraries that start later in it and its children (a library already running keeps
its pool: set them before, as a freshly started server does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
UNBOUNDED = 0


def machine_cores() -> int:
    """Cores this process may run on (its affinity where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def producer_budget(setting: int | None, producers: int, cores: int | None = None) -> int | None:
    """Threads per producer process for a ``loader.producer_threads`` ``setting`` when
    ``producers`` producer processes share this machine's ``cores``; None: no budget."""
    if setting == UNBOUNDED:
        return None
    if setting is not None:
        return setting
    c = cores if cores is not None else machine_cores()
    return max(1, c // max(producers, 1))


@dataclass(frozen=True)
class Applied:
    """What ``apply`` replaced, so ``restore`` can put it back (the trainer's pools belong to
    the process, not to one variant)."""

    pyarrow: int
    torch: int | None
    env: dict[str, str | None]


def apply(threads: int | None, torch_too: bool = True) -> Applied:
    """Size this process's pools to ``threads`` (None: no budget: pyarrow gets every core,
    torch and OMP are left alone). ``torch_too``: also torch's intra-op pool (not in the
    trainer, whose torch pool is ``model.torch_threads``)."""
    import pyarrow as pa

    before = Applied(pa.cpu_count(), torch_threads(), {k: os.environ.get(k) for k in ENV_KEYS})
    if threads is None:
        pa.set_cpu_count(machine_cores())
        return before
    pa.set_cpu_count(threads)
    for k in ENV_KEYS:
        os.environ[k] = str(threads)
    if torch_too:
        import torch

        torch.set_num_threads(threads)
    return before


def restore(prev: Applied) -> None:
    import pyarrow as pa

    pa.set_cpu_count(prev.pyarrow)
    for k, v in prev.env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if prev.torch is not None and torch_threads() != prev.torch:
        import torch

        torch.set_num_threads(prev.torch)


def torch_threads() -> int | None:
    """torch's intra-op threads in this process now; None where torch is not imported (read
    only: importing torch here would cost a process that never uses it ~1.4 s)."""
    import sys

    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def env_for(threads: int | None) -> dict[str, str]:
    """Environment of a producer process started fresh with this budget (set before any
    library starts its pool, which is the only time OMP/MKL read it)."""
    return {} if threads is None else {k: str(threads) for k in ENV_KEYS}
