"""A Hugging Face Accelerate training loop as a user writes it (imports nothing of
stallbench): ``accelerator.prepare(model, optimizer, loader)`` on the CPU, then the loop over
the prepared loader (Accelerate's ``DataLoaderShard``, a DataLoader subclass that fetches one
batch ahead on the loop's own thread).

    user_accelerate.py ITEM_MS STEP_MS [BATCHES_PER_EPOCH] [EPOCHS] [WORKERS]

Items cost ITEM_MS (a sleep), the step STEP_MS (a sleep). The last line printed is
``truth: {...}``: the loop's own seconds blocked in ``next()`` on the prepared loader
(``next_s``, the first batch of an epoch from ``iter()``), between batches (``step_s``),
batches and samples.
"""

import json
import sys
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

BATCH = 4


class Items(Dataset):
    def __init__(self, n, item_s):
        self.n, self.item_s = n, item_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.item_s)
        return {"x": torch.full((3,), float(i)), "y": torch.tensor(float(i % 2))}


def main():
    item_s, step_s = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3
    per_epoch = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    workers = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Items(per_epoch * BATCH, item_s), batch_size=BATCH, num_workers=workers)
    model, opt, loader = acc.prepare(model, opt, loader)
    next_s = step = 0.0
    batches = samples = 0
    for _ in range(epochs):
        t = time.perf_counter()
        it = iter(loader)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            got = time.perf_counter()
            next_s += got - t
            loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            time.sleep(step_s)
            batches += 1
            samples += batch["x"].shape[0]
            t = time.perf_counter()
            step += t - got
    print("truth: " + json.dumps({"next_s": next_s, "step_s": step, "batches": batches,
                                  "samples": samples}))


if __name__ == "__main__":
    main()
