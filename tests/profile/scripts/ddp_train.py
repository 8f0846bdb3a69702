"""A DDP training script as a user writes it (imports nothing of stallbench), run by
``torchrun --nproc-per-node 2`` (or one torchrun per node, ``--nnodes``): gloo, a
DistributedSampler, and items that cost ITEM_MS (a sleep) only on rank SLOW, or, with
``node:K``, on every rank of torchrun's node K (its ``GROUP_RANK``: that node's data path is
slower, its ranks the stragglers the other nodes wait for), or, with ``all``, on every rank;
ITEMS items (default 512), EPOCHS epochs (default 1).

    ddp_train.py ITEM_MS STEP_MS SLOW [ITEMS [EPOCHS]]
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Items(Dataset):
    def __init__(self, n, item_s):
        self.n, self.item_s = n, item_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.item_s:
            time.sleep(self.item_s)
        return torch.full((4,), float(i)), torch.tensor(float(i))


def main():
    item_ms, step_ms, slow = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    items = int(sys.argv[4]) if len(sys.argv) > 4 else 512
    epochs = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    dist.init_process_group("gloo")
    me = (f"node:{os.environ['GROUP_RANK']}" if slow.startswith("node:")
          else str(dist.get_rank()))
    ds = Items(items, item_ms / 1e3 if slow in (me, "all") else 0.0)
    sampler = DistributedSampler(ds, shuffle=False)
    loader = DataLoader(ds, batch_size=16, sampler=sampler)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = ((model(x).squeeze(1) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(step_ms / 1e3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
