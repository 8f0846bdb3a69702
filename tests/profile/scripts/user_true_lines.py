"""A user's job in the shapes whose lines were not true (issue 59): ``python
user_true_lines.py MODE``.

- own_iter: a DataLoader subclass whose own ``__iter__`` never calls the base class's;
- reload: a job that reloads ``torch.utils.data.dataloader`` and then trains two epochs;
- reexec: a job that re-executes itself without ``PYTHONPATH`` (a launcher's clean env);
- raise0 / raise2: a Dataset that raises on item 20, at 0 and at 2 workers;
- raise_thread: the same at 0 workers in a thread of the job (which then exits 1 itself).
Each prints ``batches N`` where it trains."""

import importlib
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

MODE = sys.argv[1]


class OwnIter(DataLoader):
    def __iter__(self):
        for i in range(0, len(self.dataset), self.batch_size):
            yield self.dataset[i:i + self.batch_size]


class Bad(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 20:
            raise ValueError("bad item 20")
        return torch.zeros(4)


def main() -> None:
    data = TensorDataset(torch.randn(256, 4))
    if MODE == "own_iter":
        print("batches", sum(1 for _ in OwnIter(data, batch_size=16)))
    elif MODE == "reload":
        import torch.utils.data.dataloader as dlm
        importlib.reload(dlm)
        dl = dlm.DataLoader(data, batch_size=16)
        print("batches", sum(1 for _ in range(2) for _ in dl))
    elif MODE == "reexec":
        if not os.environ.get("USER_TRUE_LINES_CHILD"):
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env["USER_TRUE_LINES_CHILD"] = "1"
            os.execve(sys.executable, [sys.executable, __file__, MODE], env)
        print("batches", sum(1 for _ in DataLoader(data, batch_size=16)))
    elif MODE in ("raise0", "raise2"):
        for _ in DataLoader(Bad(), batch_size=8, num_workers=int(MODE[-1])):
            pass
    elif MODE == "raise_thread":
        import threading

        def loop():
            for _ in DataLoader(Bad(), batch_size=8):
                pass
        t = threading.Thread(target=loop)
        t.start()
        t.join()
        sys.exit(1)


if __name__ == "__main__":
    main()
