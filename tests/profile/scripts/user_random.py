"""A training script as a newcomer writes it (imports nothing of stallbench): the default
DataLoader (``shuffle=True``, no seed anywhere, torch's default non-persistent workers) over a
dataset with a random augmentation in ``__getitem__`` (``torch.rand``, numpy's and Python's
global generators), a ``collate_fn`` that draws too (a random mask), several epochs. Known
costs, as sleeps: ITEM_MS per item, COLLATE_MS per batch, STEP_MS per step.

    user_random.py NUM_WORKERS EPOCHS ITEM_MS COLLATE_MS STEP_MS [persistent] [seeded]
                   [slow_served]

``slow_served`` (a busy machine made by hand): the script counts its runs in
``$TRUTH_DIR/runs`` and from its fourth run on (under ``profile --analyze``: the served runs)
its ``collate_fn`` sleeps twice COLLATE_MS.

Why these draws: serving an item from a recording skips them, so the global generators of a
served run would stand elsewhere than in the recorded run, and the next epoch's
``RandomSampler`` (seeded from torch's global generator) would ask for other items.

The last line printed is ``truth: {...}``: batches, the loop's own step seconds and seconds in
next(), and the item and collate costs paid in the loop's own process (all of them with 0
workers); each item's cost is also appended to ``$TRUTH_DIR/items-<pid>.txt`` where set.
"""

import json
import os
import random
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

ROWS, BATCH = 256, 16
OWN = {"items_s": 0.0, "items": 0, "collate_s": 0.0, "collates": 0}
_FH = {}


def _truth(line):
    d = os.environ.get("TRUTH_DIR")
    if not d:
        return
    fh = _FH.get(os.getpid())
    if fh is None:
        fh = _FH[os.getpid()] = open(os.path.join(d, f"items-{os.getpid()}.txt"), "a",
                                     buffering=1)
    fh.write(line)


class Augmented(Dataset):
    def __init__(self, item_ms):
        self.item_s = item_ms / 1e3
        self.x = torch.arange(ROWS, dtype=torch.float32).reshape(ROWS, 1).repeat(1, 8)

    def __len__(self):
        return ROWS

    def __getitem__(self, i):
        t = time.perf_counter()
        time.sleep(self.item_s)
        x = self.x[i] * (1 + 0.1 * torch.rand(8))           # a random augmentation
        x = x + float(np.random.rand()) + random.random()
        dt = time.perf_counter() - t
        OWN["items_s"] += dt
        OWN["items"] += 1
        _truth(f"{dt}\n")
        return x, i % 3


def _run_number():
    path = os.path.join(os.environ["TRUTH_DIR"], "runs")
    n = int(open(path).read()) + 1 if os.path.exists(path) else 1
    with open(path, "w") as fh:
        fh.write(str(n))
    return n


class MaskCollate:
    def __init__(self, collate_ms):
        self.s = collate_ms / 1e3

    def __call__(self, items):
        t = time.perf_counter()
        time.sleep(self.s)
        x, y = default_collate(items)
        x = x * (torch.rand(x.shape[0], 1) > 0.1)          # a random mask, as MLM collators
        OWN["collate_s"] += time.perf_counter() - t
        OWN["collates"] += 1
        return x, y


def main():
    # one intra-op thread: on a 2-core machine shared with other jobs torch's two spinning
    # threads made this 12 ms step 60-80 ms (the truth is the script's own clock either way)
    torch.set_num_threads(1)
    workers, epochs = int(sys.argv[1]), int(sys.argv[2])
    item_ms, collate_ms, step_s = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]) / 1e3
    flags = sys.argv[6:]
    if "seeded" in flags:
        torch.manual_seed(0)
    collate = MaskCollate(collate_ms)
    if "slow_served" in flags and _run_number() >= 4:
        collate.s *= 2
    loader = DataLoader(Augmented(item_ms), batch_size=BATCH, shuffle=True,
                        num_workers=workers, collate_fn=collate,
                        persistent_workers=workers > 0 and "persistent" in flags)
    model = torch.nn.Linear(8, 3)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    n, steps, nexts = 0, 0.0, 0.0
    for _ in range(epochs):
        it = iter(loader)
        while True:
            t = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            nexts += t1 - t
            loss = torch.nn.functional.cross_entropy(torch.nn.functional.dropout(model(x)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(step_s)
            steps += time.perf_counter() - t1
            n += 1
    print("truth: " + json.dumps({"batches": n, "step_s": steps, "next_s": nexts, **OWN}),
          flush=True)


if __name__ == "__main__":
    main()
