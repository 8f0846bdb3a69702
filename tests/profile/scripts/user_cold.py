"""A map-style dataset as users often write it: it opens its Parquet file lazily on the first
``__getitem__`` (and builds a lookup table there: COLD_CPU_MS of this thread's CPU, a
CPU-clock busy loop, the same truth on any machine or load); every later item is one row
read from the open table.

    user_cold.py PARQUET NUM_WORKERS COLD_CPU_MS

Batches are tuples ``(dense, label)`` from the default collate, 4 rows each.
"""

import sys
import time

import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset


class LazyRows(Dataset):
    def __init__(self, path: str, cold_cpu_s: float) -> None:
        self.path, self.cold, self.table = path, cold_cpu_s, None
        self.n = pq.ParquetFile(path).metadata.num_rows

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if self.table is None:
            self.table = pq.read_table(self.path)
            c = time.thread_time()
            while time.thread_time() - c < self.cold:
                pass
        return (torch.tensor([self.table["x"][i].as_py()]),
                torch.tensor(float(self.table["y"][i].as_py())))


def main() -> None:
    ds = LazyRows(sys.argv[1], float(sys.argv[3]) / 1e3)
    loader = DataLoader(ds, batch_size=4, num_workers=int(sys.argv[2]))
    n = 0
    for x, y in loader:
        n += len(y)
    print(f"rows {n}")


if __name__ == "__main__":
    main()
