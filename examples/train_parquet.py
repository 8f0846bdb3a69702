"""An ordinary PyTorch training script: a Parquet Dataset with a per-row transform, a
DataLoader, an MLP trained with SGD. It knows nothing of stallbench; profile it with

    stallbench profile --set dataloader.num_workers=0,2 -- python examples/train_parquet.py

It writes its small Parquet dataset itself on first use (under $TRAIN_PARQUET_DATA, default
a directory in the system's temp dir) and reads it from there afterwards.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 32
ROWS = 4096


def make_data(path: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, FEATURES)).astype("float32")
    w = rng.standard_normal(FEATURES).astype("float32")
    y = (x @ w > 0).astype("int64")
    text = [" ".join(f"tok{int(v * 100) % 997}" for v in row[:16]) for row in x]
    table = pa.table({"features": list(x), "text": text, "label": y})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    pq.write_table(table, tmp, row_group_size=1024)
    os.replace(tmp, path)


class ParquetDataset(Dataset):
    """Rows of a Parquet file; each item's text is hashed into features (the transform)."""

    def __init__(self, path: str) -> None:
        table = pq.read_table(path)
        self.features = np.stack(table.column("features").to_numpy(zero_copy_only=False))
        self.text = table.column("text").to_pylist()
        self.label = table.column("label").to_numpy()

    def __len__(self) -> int:
        return len(self.label)

    def transform(self, i: int) -> torch.Tensor:
        hashed = np.zeros(FEATURES, dtype="float32")
        for _ in range(24):                       # a tokeniser's worth of Python per row
            for tok in self.text[i].split():
                hashed[hash(tok) % FEATURES] += 1.0
        x = self.features[i] + hashed / 24.0
        return torch.from_numpy((x - x.mean()) / (x.std() + 1e-6))

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(i), torch.tensor(self.label[i])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-workers", type=int, default=0)
    args = ap.parse_args()
    root = os.environ.get("TRAIN_PARQUET_DATA",
                          os.path.join(tempfile.gettempdir(), "train_parquet_example"))
    path = os.path.join(root, "train.parquet")
    if not os.path.exists(path):
        make_data(path)
    torch.manual_seed(0)
    torch.set_num_threads(1)    # a small model: more threads only spin-wait on a small machine
    loader = DataLoader(ParquetDataset(path), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.num_workers)
    model = nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        total, n = 0.0, 0
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
            n += 1
        print(f"epoch {epoch}: loss {total / max(n, 1):.4f} over {n} batches")
    assert math.isfinite(total)


if __name__ == "__main__":
    main()
