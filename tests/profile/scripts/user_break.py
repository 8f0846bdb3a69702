"""A training loop as users often write it: it leaves the first epochs with ``break`` after
BREAK_AT batches, runs the last one to its end, and builds its DataLoader with a numpy int
for ``num_workers`` (read from a config array). Each step burns STEP_CPU_MS of this
thread's CPU (a CPU-clock busy loop: the same truth on any machine or load).

    user_break.py NUM_WORKERS STEP_CPU_MS EPOCHS BREAK_AT

The last line printed is ``truth: {...}``: the batches the loop took and the process CPU
seconds from its first ``iter()`` to its end (what the profile's trainer CPU may not exceed).
"""

import json
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    workers = np.int64(int(sys.argv[1]))
    step_cpu = float(sys.argv[2]) / 1e3
    epochs, break_at = int(sys.argv[3]), int(sys.argv[4])
    loader = DataLoader(TensorDataset(torch.arange(64, dtype=torch.float32)), batch_size=8,
                        num_workers=workers)
    n = 0
    cpu0 = None
    for e in range(epochs):
        if cpu0 is None:
            cpu0 = time.process_time()
        for i, (x,) in enumerate(loader):
            n += 1
            c = time.thread_time()
            while time.thread_time() - c < step_cpu:
                pass
            if e < epochs - 1 and i + 1 == break_at:
                break
    print("truth: " + json.dumps({"batches": n, "loop_cpu_s": time.process_time() - cpu0}))


if __name__ == "__main__":
    main()
