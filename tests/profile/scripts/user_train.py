"""A training script as a user writes it (imports nothing of stallbench): a Parquet Dataset
whose items cost ITEM_MS each, a DataLoader, an SGD loop whose step costs STEP_MS. Both
costs are sleeps, so the truth they make does not depend on how many cores are free.

    user_train.py DATA_DIR NUM_WORKERS ITEM_MS STEP_MS [EPOCHS] [EXIT_AFTER] [EXIT_CODE]

The truth, as the script measured it itself: every item's cost is appended (one line per
item, any process) to DATA_DIR/truth/items-<pid>.txt; the last line printed is
``truth: {...}`` with the batches, the loop's own step seconds and its own seconds in next().
"""

import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset


_OPEN = {}


def _append(path, line):
    """One line to a truth file through a handle kept open per process: an open and a close
    per item would be a cost of the item that its own clock does not see (on a busy machine
    a tenth of a 2 ms item), and the profile would rightly count it."""
    key = (os.getpid(), path)
    fh = _OPEN.get(key)
    if fh is None:
        fh = _OPEN[key] = open(path, "a", buffering=1)
    fh.write(line)


class ParquetItems(Dataset):
    def __init__(self, path, item_ms, truth_dir):
        self.x = torch.tensor(pq.read_table(path).column("x").to_numpy(), dtype=torch.float32)
        self.item_s = item_ms / 1e3
        self.truth_dir = truth_dir

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        t = time.perf_counter()
        time.sleep(self.item_s)
        out = self.x[i], self.x[i] * 2
        dt = time.perf_counter() - t
        _append(os.path.join(self.truth_dir, f"items-{os.getpid()}.txt"), f"{dt}\n")
        return out


def main():
    data_dir, workers = sys.argv[1], int(sys.argv[2])
    item_ms, step_ms = float(sys.argv[3]), float(sys.argv[4])
    epochs = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    exit_after = int(sys.argv[6]) if len(sys.argv) > 6 else -1
    exit_code = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    path = os.path.join(data_dir, "items.parquet")
    truth_dir = os.path.join(data_dir, "truth")
    os.makedirs(truth_dir, exist_ok=True)
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        pq.write_table(pa.table({"x": [float(i) for i in range(512)]}), tmp)
        os.replace(tmp, path)
    loader = DataLoader(ParquetItems(path, item_ms, truth_dir), batch_size=16,
                        num_workers=workers)
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-6)
    n, step_s, next_s = 0, 0.0, 0.0
    for _ in range(epochs):
        it = iter(loader)
        while True:
            t = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            next_s += t1 - t
            loss = ((x * w - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(step_ms / 1e3)
            step_s += time.perf_counter() - t1
            n += 1
            if n == exit_after:
                print("exiting early", flush=True)
                sys.exit(exit_code)
    print("truth: " + json.dumps({"batches": n, "step_s": step_s, "next_s": next_s,
                                  "torch_threads": torch.get_num_threads()}), flush=True)


if __name__ == "__main__":
    main()
