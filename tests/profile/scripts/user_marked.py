"""A user's script with the two marker lines of ``stallbench.stage``: a decorated ``decode``
(DECODE_MS per item, keyed by the item's index) and an ``augment`` block (a ``with``, which
has no output to serve). 0 loader workers; the last line printed is ``truth: {...}`` with
the decode seconds this process paid.

The loader shuffles without a seed (seeded from the clock): every run asks for the items in
another order, so the dataset's and collate's outputs cannot be served by call (those
ablations must say so), while ``decode``, served by its argument, still can.

    user_marked.py DECODE_MS AUGMENT_MS STEP_MS
"""

import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import stallbench

DECODE_S, AUGMENT_S, STEP_S = (float(x) / 1e3 for x in sys.argv[1:4])
OWN = {"decode_s": 0.0, "decodes": 0}


class Items(Dataset):
    def __len__(self):
        return 256

    @stallbench.stage("decode")
    def decode(self, i):
        t = time.perf_counter()
        time.sleep(DECODE_S)
        OWN["decode_s"] += time.perf_counter() - t
        OWN["decodes"] += 1
        return torch.tensor([float(i)])

    def __getitem__(self, i):
        x = self.decode(i)
        with stallbench.stage("augment"):
            time.sleep(AUGMENT_S)
        return x


torch.manual_seed(time.time_ns() % 2**31)
for x in DataLoader(Items(), batch_size=16, shuffle=True):
    time.sleep(STEP_S)
print("truth: " + json.dumps(OWN), flush=True)
