"""A Hugging Face ``Trainer`` job as a user writes it (imports nothing of stallbench): a map
dataset whose items cost ITEM_MS each (a sleep, 0 loader workers: paid on the loop's thread),
a tiny model whose step sleeps STEP_MS, two epochs. The Trainer makes and prepares its
loader itself (``get_train_dataloader``) and owns the loop, so the job cannot time ``next()``:
its truth is what its own dataset paid on the main thread (the exposed wait with 0 workers
and no prefetch: Accelerate's one-ahead fetch is on the same thread) and the batches the
model saw. The last line printed is ``truth: {...}``.

    user_hf_trainer.py ITEM_MS STEP_MS [eval] [encoding]   (the Trainer's output_dir: ./hf_out)

``eval``: an eval dataset evaluated every epoch (the Trainer makes a new eval DataLoader at
each evaluation; the truth counts its batches and samples apart: ``eval_batches``,
``eval_samples``). ``encoding``: the Trainer's ``data_collator`` returns a
``transformers.BatchEncoding`` (as a tokenizer's padding collator does), a ``UserDict``, not a
dict: its samples are its rows.
"""

import json
import sys
import threading
import time

import torch
from torch.utils.data import Dataset
from transformers import BatchEncoding, Trainer, TrainingArguments

ITEM_S, STEP_S = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3
BATCH, ITEMS, EPOCHS = 8, 96, 2
OWN = {"item_s": 0.0, "items": 0, "batches": 0, "samples": 0, "eval_batches": 0,
       "eval_samples": 0}
FLAGS = sys.argv[3:]
MAIN = threading.get_ident()


class Items(Dataset):
    def __len__(self):
        return ITEMS

    def __getitem__(self, i):
        t = time.perf_counter()
        time.sleep(ITEM_S)
        if threading.get_ident() == MAIN:
            OWN["item_s"] += time.perf_counter() - t
            OWN["items"] += 1
        return {"x": torch.full((4,), float(i)), "labels": torch.tensor(float(i % 3))}


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        pre = "" if self.training else "eval_"
        OWN[pre + "batches"] += 1
        OWN[pre + "samples"] += len(x)
        time.sleep(STEP_S)
        out = self.lin(x).squeeze(-1)
        return {"loss": ((out - labels) ** 2).mean()}


def encode(items):
    """The batch as a tokenizer's collator returns it: a ``BatchEncoding`` of tensors."""
    return BatchEncoding({"x": torch.stack([x["x"] for x in items]),
                          "labels": torch.stack([x["labels"] for x in items])})


def main():
    evaluate = "eval" in FLAGS
    args = TrainingArguments(output_dir="hf_out", per_device_train_batch_size=BATCH,
                             per_device_eval_batch_size=BATCH,
                             num_train_epochs=EPOCHS, report_to=[], save_strategy="no",
                             logging_strategy="no", dataloader_num_workers=0, use_cpu=True,
                             disable_tqdm=True, seed=1,
                             eval_strategy="epoch" if evaluate else "no")
    extra = {"eval_dataset": Items()} if evaluate else {}
    if "encoding" in FLAGS:
        extra["data_collator"] = encode
    Trainer(model=Tiny(), args=args, train_dataset=Items(), **extra).train()
    print("truth: " + json.dumps(OWN), flush=True)


if __name__ == "__main__":
    main()
