"""A small training job to try ``stallbench tune`` on (it imports nothing of stallbench):
a Dataset whose items cost ``--item-ms`` each, a DataLoader, and a loop whose step costs
``--step-ms``, over ``--epochs`` short epochs. Each loader worker pays ``--worker-init-ms``
when it starts (opening files, a connection: what a worker forked again every epoch pays
every epoch).

    python examples/tune_loader.py                       # the defaults: workers that pay
    stallbench tune -- python examples/tune_loader.py    # find and confirm its settings

``--burn`` makes the item cost CPU (a busy loop) instead of a wait (a sleep). The last line
printed is the job's own meter: ``rate: {"steady_samples_s": ...}``, samples/s from the start
of its second epoch to its end, each epoch's start-up included (the figure tune compares).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset


def _cost(ms: float, burn: bool) -> None:
    end = time.perf_counter() + ms / 1e3
    if burn:
        while time.perf_counter() < end:
            pass
    else:
        time.sleep(ms / 1e3)


class Items(Dataset):
    def __init__(self, n: int, item_ms: float, burn: bool) -> None:
        self.n, self.item_ms, self.burn = n, item_ms, burn

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        _cost(self.item_ms, self.burn)
        return torch.full((16,), float(i)), torch.tensor(float(i % 2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=64, help="items per epoch")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--item-ms", type=float, default=2.0)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--worker-init-ms", type=float, default=300.0)
    p.add_argument("--burn", action="store_true", help="items cost CPU, not a wait")
    p.add_argument("--hidden", type=int, default=0,
                   help="an MLP of this width computed on the CPU as the step (torch's "
                        "intra-op threads), instead of the sleep")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--persistent-workers", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    if a.hidden:
        model = torch.nn.Sequential(torch.nn.Linear(16, a.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(a.hidden, 1))
    else:
        model = torch.nn.Linear(16, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    init_ms = a.worker_init_ms

    def worker_init(_: int) -> None:
        _cost(init_ms, False)

    loader = DataLoader(Items(a.items, a.item_ms, a.burn), batch_size=a.batch,
                        num_workers=a.num_workers, worker_init_fn=worker_init,
                        persistent_workers=a.persistent_workers and a.num_workers > 0)
    starts, samples = [], 0
    for epoch in range(a.epochs):
        starts.append(time.perf_counter())
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if not a.hidden:
                time.sleep(a.step_ms / 1e3)   # the rest of the step (a GPU's time, say)
            if epoch >= 1:
                samples += len(x)
    end = time.perf_counter()
    rate = samples / (end - starts[1]) if len(starts) > 1 else float("nan")
    print("rate: " + json.dumps({"steady_samples_s": rate, "epochs": a.epochs}))


if __name__ == "__main__":
    main()
