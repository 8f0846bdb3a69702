"""A training script as a user writes it (imports nothing of stallbench) whose loader runs on
a background thread: the thread iterates a DataLoader and puts each batch into a
``queue.Queue``; the training loop (the main thread) takes them from the queue (the shape of
MONAI's ThreadDataLoader and of hand-written prefetch threads). The producer is always busy
in the loader's ``__next__``; the loop waits only where the producer falls behind its step.

    user_thread_queue.py ITEM_MS STEP_MS [BATCHES_PER_EPOCH] [EPOCHS] [END]

END ``marker`` (default): the producer puts None after each epoch and the loop stops there;
``count``: no marker, the loop takes ``len(loader)`` batches per epoch, each with
``get(timeout=1 ms)`` tried again on ``queue.Empty`` (MONAI's ThreadBuffer polls so).

Batches are dicts ``{"path": [str, ...], "x": tensor}`` (a first value that is not a tensor).
The last line printed is ``truth: {...}``: the loop's own seconds blocked in ``get`` for a
batch (``wait_s``), its seconds between a batch and its next ``get`` (``step_s``), batches and
samples.
"""

import json
import queue
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

BATCH = 4


class Items(Dataset):
    def __init__(self, n, item_s):
        self.n, self.item_s = n, item_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.item_s)
        return {"path": f"img{i:05d}.jpg", "x": torch.full((3,), float(i))}


def produce(loader, q, epochs, marker):
    for _ in range(epochs):
        for batch in loader:
            q.put(batch)
        if marker:
            q.put(None)             # the end of an epoch


def take(q, marker):
    if marker:
        return q.get()
    while True:
        try:
            return q.get(timeout=0.001)
        except queue.Empty:
            pass


def main():
    item_s, step_s = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3
    per_epoch = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    marker = (sys.argv[5] if len(sys.argv) > 5 else "marker") == "marker"
    loader = DataLoader(Items(per_epoch * BATCH, item_s), batch_size=BATCH, num_workers=0)
    q = queue.Queue(maxsize=4)
    t = threading.Thread(target=produce, args=(loader, q, epochs, marker), daemon=True)
    t.start()
    wait = step = 0.0
    batches = samples = 0
    for _ in range(epochs):
        got = None
        for i in range(len(loader) + marker):
            ask = time.perf_counter()
            if got is not None:
                step += ask - got
            batch = take(q, marker)
            if batch is None:
                break
            got = time.perf_counter()
            wait += got - ask
            batches += 1
            samples += len(batch["path"])
            x = batch["x"] * 2
            time.sleep(step_s)
            del x
        if not marker:
            step += time.perf_counter() - got   # the epoch's last step
    t.join()
    print("truth: " + json.dumps({"wait_s": wait, "step_s": step, "batches": batches,
                                  "samples": samples}), flush=True)


if __name__ == "__main__":
    main()
