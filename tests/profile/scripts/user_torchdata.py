"""A training script as a user writes it (imports nothing of stallbench) that loads through
torchdata instead of torch's DataLoader, two loops one after the other:

    user_torchdata.py ITEM_MS STEP_MS [BATCHES_PER_EPOCH] [EPOCHS]

``stateful``: a ``StatefulDataLoader`` (torchtitan's loader; its ``__iter__`` does not call
DataLoader's), 0 workers, its ``state_dict()`` taken mid-epoch as a checkpoint would;
``nodes``: a torchdata.nodes ``Loader`` over ``Batcher(ParallelMapper(SamplerWrapper))``
with 2 mapper threads. Items cost ITEM_MS (a sleep), the step STEP_MS. The last line
printed is ``truth: {"stateful": {...}, "nodes": {...}}``: each loop's own seconds in
``iter()`` and ``next()`` (``next_s``) and between batches (``step_s``), batches and samples.
"""

import json
import sys
import time

import torch
from torch.utils.data import Dataset, SequentialSampler

BATCH = 4


class Items(Dataset):
    def __init__(self, n, item_s):
        self.n, self.item_s = n, item_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.item_s)
        return {"path": f"img{i:05d}.jpg", "x": torch.full((3,), float(i))}


def make(kind, ds):
    if kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader
        return StatefulDataLoader(ds, batch_size=BATCH, num_workers=0)
    from torchdata.nodes import Batcher, Loader, ParallelMapper, SamplerWrapper
    node = ParallelMapper(SamplerWrapper(SequentialSampler(ds)), map_fn=ds.__getitem__,
                          num_workers=2, method="thread")
    return Loader(Batcher(node, batch_size=BATCH, drop_last=False))


def run(kind, item_s, step_s, per_epoch, epochs):
    loader = make(kind, Items(per_epoch * BATCH, item_s))
    next_s = step = 0.0
    batches = samples = 0
    for _ in range(epochs):
        t = time.perf_counter()
        it = iter(loader)               # the loop waits here too (nodes: threads start)
        next_s += time.perf_counter() - t
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            next_s += t1 - t
            batches += 1
            samples += len(batch["path"]) if isinstance(batch, dict) else len(batch)
            if batches == per_epoch // 2 and kind == "stateful":
                loader.state_dict()
            time.sleep(step_s)
            step += time.perf_counter() - t1
    return {"next_s": next_s, "step_s": step, "batches": batches, "samples": samples}


def main():
    item_s, step_s = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3
    per_epoch = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    truth = {kind: run(kind, item_s, step_s, per_epoch, epochs)
             for kind in ("stateful", "nodes")}
    print("truth: " + json.dumps(truth), flush=True)


if __name__ == "__main__":
    main()
