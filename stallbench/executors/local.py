"""On-trainer execution: producers are torch ``DataLoader`` workers on the trainer's machine.

Work items are shards (Parquet row groups), served by a map-style dataset in the plan's order;
the DataLoader preserves that order whatever ``num_workers`` is, so batches are identical
across worker counts. ``execution = "bulk"`` produces the whole epoch before the first batch
is handed to the trainer (time to first batch and memory grow with the data).
"""

from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader, Dataset, get_worker_info

from ..pipeline import Plan, ShardOutput
from .base import EXECUTORS, Executor


class _Shards(Dataset):
    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def __len__(self) -> int:
        return len(self.plan.items)

    def __getitem__(self, i: int) -> ShardOutput:
        # In a worker process, allocate single buffers in shared memory directly.
        return self.plan.produce(i, shared=get_worker_info() is not None)


def _identity(x: Any) -> Any:
    return x


@EXECUTORS.register("local")
class LocalExecutor(Executor):
    name = "local"

    def _stream(self, plan: Plan) -> Iterator[ShardOutput]:
        lc = self.config.loader
        if lc.num_workers == 0:
            for i in range(len(plan.items)):
                yield plan.produce(i)
            return
        loader = DataLoader(
            _Shards(plan), batch_size=None, shuffle=False, num_workers=lc.num_workers,
            prefetch_factor=lc.prefetch_factor, collate_fn=_identity, persistent_workers=False,
            multiprocessing_context="fork",
        )
        it = iter(loader)
        try:
            yield from it
        finally:
            # Stop workers promptly when the trainer stops early (max_batches) or fails.
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown:
                shutdown()

    def run(self, plan: Plan) -> Iterator[ShardOutput]:
        if self.config.loader.execution == "bulk":
            done = list(self._stream(plan))   # the whole epoch, before the first batch
            yield from done
        else:
            yield from self._stream(plan)
