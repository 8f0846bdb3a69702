"""A training script as a user writes it for text (imports nothing of stallbench): sequences
of varying length, a collate that pads each batch to its longest sequence (dynamic padding, as
Hugging Face's ``DataCollatorWithPadding`` does) and returns a mapping of tensors, a step whose
cost grows with the batch's tokens. Known costs, as sleeps: ITEM_MS per item; a step of
STEP_MS + US_PER_TOKEN per padded token.

    user_padded.py NUM_WORKERS EPOCHS ITEM_MS STEP_MS US_PER_TOKEN [encoding]

With ``encoding`` the collate returns a ``UserDict`` subclass holding the tensors (as
``transformers.BatchEncoding`` is), not a dict.

Why: a compute-only run serves its first batches again; with dynamic padding they are a few of
the job's lengths, and their step was taken for the job's (the transformers tutorial: 53.8 s
of "interference" that was the kept batch's length, and the whole run called start-up).

The last line printed is ``truth: {...}``: batches, samples, the loop's own step seconds and
seconds in next(), and the items' cost paid in its own process.
"""

import json
import random
import sys
import time
from collections import UserDict

import torch
from torch.utils.data import DataLoader, Dataset

ROWS, BATCH = 384, 8
OWN = {"items_s": 0.0, "items": 0}


class Encoding(UserDict):
    """What a tokenizer returns (``transformers.BatchEncoding``): a ``UserDict`` whose
    attributes read its keys, and that says how it pickles (without ``__setstate__`` its
    ``__getattr__`` recurses on unpickling)."""

    def __getattr__(self, item):
        try:
            return self.data[item]
        except KeyError:
            raise AttributeError(item) from None

    def __getstate__(self):
        return {"data": self.data}

    def __setstate__(self, state):
        self.data = state["data"]


class Texts(Dataset):
    def __init__(self, item_ms):
        rnd = random.Random(7)
        # lengths as a corpus's: most short, a long tail
        self.lengths = [min(int(rnd.lognormvariate(3.4, 0.7)) + 4, 400) for _ in range(ROWS)]
        self.item_s = item_ms / 1e3

    def __len__(self):
        return ROWS

    def __getitem__(self, i):
        t = time.perf_counter()
        time.sleep(self.item_s)
        ids = list(range(101, 101 + self.lengths[i]))
        OWN["items_s"] += time.perf_counter() - t
        OWN["items"] += 1
        return {"input_ids": ids, "label": i % 2}


def pad(encoding):
    def collate(items):
        longest = max(len(x["input_ids"]) for x in items)
        ids = torch.zeros(len(items), longest, dtype=torch.long)
        mask = torch.zeros(len(items), longest, dtype=torch.long)
        for r, x in enumerate(items):
            n = len(x["input_ids"])
            ids[r, :n] = torch.tensor(x["input_ids"])
            mask[r, :n] = 1
        out = {"input_ids": ids, "attention_mask": mask,
               "labels": torch.tensor([x["label"] for x in items])}
        return Encoding(out) if encoding else out
    return collate


def main():
    torch.set_num_threads(1)      # a 2-core machine shared with others: one intra-op thread
    workers, epochs = int(sys.argv[1]), int(sys.argv[2])
    item_ms, step_s, per_token = float(sys.argv[3]), float(sys.argv[4]) / 1e3, float(sys.argv[5]) / 1e6
    encoding = "encoding" in sys.argv[6:]
    torch.manual_seed(0)
    loader = DataLoader(Texts(item_ms), batch_size=BATCH, shuffle=True, num_workers=workers,
                        collate_fn=pad(encoding))
    n = samples = 0
    steps = nexts = 0.0
    for _ in range(epochs):
        it = iter(loader)
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            nexts += t1 - t
            tokens = batch["input_ids"].numel()
            time.sleep(step_s + per_token * tokens)
            steps += time.perf_counter() - t1
            n += 1
            samples += len(batch["labels"])
    print("truth: " + json.dumps({"batches": n, "samples": samples, "step_s": steps,
                                  "next_s": nexts, **OWN}), flush=True)


if __name__ == "__main__":
    main()
