"""A training script as a user writes it (imports nothing of stallbench), with known costs in
each part of its data path: a Parquet Dataset whose items cost ITEM_MS each, a collate_fn that
costs COLLATE_MS per batch, and a step of STEP_MS. The costs are sleeps, so the truth does not
depend on how many cores are free; the script measures each itself.

    user_ablate.py DATA_DIR NUM_WORKERS ITEM_MS COLLATE_MS STEP_MS SHUFFLE

SHUFFLE: "none" (in order) or "seeded" (torch.manual_seed(0) then shuffle=True; an unseeded
shuffle is user_marked.py's). Every item's and every collate's cost is appended to
DATA_DIR/truth/{items,collate}-<pid>.txt; the last line printed is ``truth: {...}`` with the
batches, the loop's own step seconds, its own seconds in next() and the item and collate
costs paid in its own process (all of them with 0 workers).
"""

import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data import default_collate

ROWS, BATCH = 384, 16
OWN = {"items_s": 0.0, "items": 0, "collate_s": 0.0, "collates": 0}   # this process's costs


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
        OWN["items_s"] += dt
        OWN["items"] += 1
        _append(os.path.join(self.truth_dir, f"items-{os.getpid()}.txt"), f"{dt}\n")
        return out


class SlowCollate:
    def __init__(self, collate_ms, truth_dir):
        self.s = collate_ms / 1e3
        self.truth_dir = truth_dir

    def __call__(self, items):
        t = time.perf_counter()
        time.sleep(self.s)
        out = default_collate(items)
        dt = time.perf_counter() - t
        OWN["collate_s"] += dt
        OWN["collates"] += 1
        _append(os.path.join(self.truth_dir, f"collate-{os.getpid()}.txt"), f"{dt}\n")
        return out


def main():
    data_dir, workers = sys.argv[1], int(sys.argv[2])
    item_ms, collate_ms, step_ms = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
    shuffle = sys.argv[6]
    path = os.path.join(data_dir, "items.parquet")
    truth_dir = os.path.join(data_dir, "truth")
    os.makedirs(truth_dir, exist_ok=True)
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        pq.write_table(pa.table({"x": [float(i) for i in range(ROWS)]}), tmp)
        os.replace(tmp, path)
    if shuffle == "seeded":
        torch.manual_seed(0)
    loader = DataLoader(ParquetItems(path, item_ms, truth_dir), batch_size=BATCH,
                        num_workers=workers, shuffle=shuffle != "none",
                        collate_fn=SlowCollate(collate_ms, truth_dir))
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-6)
    n, step_s, next_s = 0, 0.0, 0.0
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
    print("truth: " + json.dumps({"batches": n, "step_s": step_s, "next_s": next_s, **OWN}),
          flush=True)


if __name__ == "__main__":
    main()
