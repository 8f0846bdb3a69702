"""A training loop of many short epochs, as a user writes it (imports nothing of stallbench),
for ``profile --live``: items cost ITEM_MS (a sleep), each step STEP_MS; with GO (a path),
after its last epoch it writes GO.done and waits (at most 120 s) for GO to exist, so that a
test scrapes the endpoint while the job still runs and has finished its batches.

    user_live.py EPOCHS BATCHES ITEM_MS STEP_MS [GO]
"""

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    def __init__(self, n, item_s):
        self.n, self.item_s = n, item_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.item_s:
            time.sleep(self.item_s)
        return torch.full((4,), float(i))


def main():
    epochs, batches = int(sys.argv[1]), int(sys.argv[2])
    item_ms, step_ms = float(sys.argv[3]), float(sys.argv[4])
    go = sys.argv[5] if len(sys.argv) > 5 else None
    loader = DataLoader(Items(batches * 4, item_ms / 1e3), batch_size=4)
    for _ in range(epochs):
        for x in loader:
            if step_ms:
                time.sleep(step_ms / 1e3)
    if go:
        open(go + ".done", "w").close()
        end = time.monotonic() + 120
        while not os.path.exists(go) and time.monotonic() < end:
            time.sleep(0.05)


if __name__ == "__main__":
    main()
