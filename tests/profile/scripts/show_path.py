"""Prints this process's import path, and that of a child it spawns (as a DataLoader worker
would be started), as one JSON line: what `stallbench profile` must leave exactly as is."""

import json
import multiprocessing as mp
import sys


def child(q):
    q.put(sys.path)


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    spawned = q.get()
    p.join()
    print("path: " + json.dumps({"main": sys.path, "spawned": spawned,
                                 "modules": sorted(m for m in sys.modules
                                                   if m.startswith(("torch", "stallbench")))}))
    # a loader must be seen for a result: one tiny DataLoader pass
    from torch.utils.data import DataLoader
    for _ in DataLoader(list(range(4)), batch_size=2):
        pass
