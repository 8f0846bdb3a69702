"""A training script as a user writes it (imports nothing of stallbench): a Parquet Dataset
whose items cost ITEM_MS each, a DataLoader, and a loop whose step costs STEP_MS. Both costs
are sleeps, so the truth they make does not depend on how many cores the machine has free.

Arguments: DATA_DIR NUM_WORKERS ITEM_MS STEP_MS [EPOCHS] [EXIT_AFTER] [EXIT_CODE]
It prints one JSON line of the truth it measured itself ("truth: {...}")."""

import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset


def spin(seconds):
    time.sleep(seconds)


class ParquetItems(Dataset):
    def __init__(self, path, item_ms):
        self.table = pq.read_table(path)
        self.x = torch.tensor(self.table.column("x").to_numpy(), dtype=torch.float32)
        self.item_s = item_ms / 1e3

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        spin(self.item_s)
        return self.x[i], self.x[i] * 2


def main():
    data_dir, workers, item_ms, step_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    epochs = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    exit_after = int(sys.argv[6]) if len(sys.argv) > 6 else -1
    exit_code = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    path = os.path.join(data_dir, "items.parquet")
    if not os.path.exists(path):
        os.makedirs(data_dir, exist_ok=True)
        pq.write_table(pa.table({"x": [float(i) for i in range(512)]}), path)
    ds = ParquetItems(path, item_ms)
    loader = DataLoader(ds, batch_size=16, num_workers=workers)
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-6)
    n = 0
    for _ in range(epochs):
        for x, y in loader:
            loss = ((x * w - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            spin(step_ms / 1e3)
            n += 1
            if n == exit_after:
                print("exiting early", flush=True)
                sys.exit(exit_code)
    print("truth: " + json.dumps({"batches": n, "pid": os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
