"""A loop with no DataLoader at all, as some teams write it: a generator over a Parquet
file's record batches, wrapped in ``stallbench.watch``; each batch is a tuple.

    user_watch_only.py PARQUET
"""

import sys

import pyarrow.parquet as pq
import torch

import stallbench


def batches(path: str):
    for rb in pq.ParquetFile(path).iter_batches(batch_size=16):
        yield torch.from_numpy(rb["x"].to_numpy()), torch.from_numpy(rb["y"].to_numpy())


def main() -> None:
    n = 0
    for x, y in stallbench.watch(batches(sys.argv[1])):
        n += len(y)
    print(f"rows {n}")


if __name__ == "__main__":
    main()
