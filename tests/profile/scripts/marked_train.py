"""A script with the two stallbench lines a user adds: ``stallbench.stage("decode")`` inside
its Dataset (run in 2 DataLoader workers) and ``stallbench.watch`` around a generator the loop
consumes. decode burns DECODE_MS of this thread's CPU per item; the generator sleeps GEN_MS
per item. Run unprofiled, both lines do nothing."""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import stallbench


def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class Decoded(Dataset):
    def __init__(self, decode_s):
        self.decode_s = decode_s

    def __len__(self):
        return 64

    def __getitem__(self, i):
        with stallbench.stage("decode"):
            burn(self.decode_s)
        return torch.tensor(float(i))


def slow_items(n, gen_s):
    for i in range(n):
        time.sleep(gen_s)
        yield i


if __name__ == "__main__":
    decode_ms, gen_ms = float(sys.argv[1]), float(sys.argv[2])
    for _ in DataLoader(Decoded(decode_ms / 1e3), batch_size=8, num_workers=2):
        pass
    for _ in stallbench.watch(slow_items(20, gen_ms / 1e3), name="slow_items"):
        time.sleep(0.001)
    print("done", stallbench.watch([1]) == [1] if "--plain" in sys.argv else "")
