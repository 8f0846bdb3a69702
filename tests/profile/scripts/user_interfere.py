"""A training script as a user writes it (imports nothing of stallbench) whose model step is
slowed by its own data path: with the loader in the loop's process (0 workers), every step
after a batch the loop's process made itself pays EXTRA_MS more (standing in for loader
threads competing with the step, SPDL's case study); a batch the process did not make (made by
a worker, or served from memory by ``profile --analyze``) does not.

    user_interfere.py NUM_WORKERS ITEM_MS STEP_MS EXTRA_MS

The last line printed is ``truth: {...}``: batches, the loop's own step seconds, the extra
paid, the item costs paid in this process and its seconds in next().
"""

import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

ROWS, BATCH = 192, 8
OWN = {"items_s": 0.0, "items": 0}
MADE_HERE = [False]


class Items(Dataset):
    def __init__(self, item_ms):
        self.item_s = item_ms / 1e3

    def __len__(self):
        return ROWS

    def __getitem__(self, i):
        t = time.perf_counter()
        time.sleep(self.item_s)
        OWN["items_s"] += time.perf_counter() - t
        OWN["items"] += 1
        MADE_HERE[0] = True
        return torch.tensor([float(i)])


def main():
    workers, item_ms = int(sys.argv[1]), float(sys.argv[2])
    step_s, extra_s = float(sys.argv[3]) / 1e3, float(sys.argv[4]) / 1e3
    loader = DataLoader(Items(item_ms), batch_size=BATCH, num_workers=workers)
    n, steps, extra, nexts = 0, 0.0, 0.0, 0.0
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            x = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        nexts += t1 - t
        float(x.sum())
        time.sleep(step_s)
        if MADE_HERE[0]:
            t2 = time.perf_counter()
            time.sleep(extra_s)
            extra += time.perf_counter() - t2
            MADE_HERE[0] = False
        steps += time.perf_counter() - t1
        n += 1
    print("truth: " + json.dumps({"batches": n, "step_s": steps, "extra_s": extra,
                                  "next_s": nexts, **OWN}), flush=True)


if __name__ == "__main__":
    main()
