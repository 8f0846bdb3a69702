"""Variable-length samples, as users often load them: a map-style dataset over a Parquet
file whose items are dicts (``ids`` of varying length, ``y``), an identity ``collate_fn``
(the batch is the list of the samples) and padding in the loop.

    user_identity_collate.py PARQUET BATCH_SIZE
"""

import sys

import pyarrow.parquet as pq
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset


class Seqs(Dataset):
    def __init__(self, path: str) -> None:
        t = pq.read_table(path)
        self.ids, self.y = t["ids"].to_pylist(), t["y"].to_pylist()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return {"ids": torch.tensor(self.ids[i]), "y": torch.tensor(self.y[i])}


def main() -> None:
    loader = DataLoader(Seqs(sys.argv[1]), batch_size=int(sys.argv[2]), collate_fn=lambda b: b)
    n = 0
    for batch in loader:
        x = pad_sequence([s["ids"] for s in batch], batch_first=True)
        n += x.shape[0]
    print(f"rows {n}")


if __name__ == "__main__":
    main()
