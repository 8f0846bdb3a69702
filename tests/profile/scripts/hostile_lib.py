"""Datasets and loaders of ``user_hostile.py`` in a module of their own, so that a loader the
job pickles can be unpickled by another Python that has never seen stallbench."""

import time

import torch
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    """N items, each a 2-vector; ``sleep_s`` per item (threads overlap for sure)."""

    def __init__(self, n, sleep_s=0.0):
        self.n, self.sleep_s = n, sleep_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.tensor([float(i), 1.0])


class FwdDS(Rows):
    pass


class LookupDS(Rows):
    pass


class PickDS(Rows):
    pass


class CopyDS(Rows):
    pass


class Chunks:
    """A re-iterable of the user's own (no DataLoader): every ``iter()`` is a new pass."""

    def __init__(self, n, size):
        self.n, self.size = n, size

    def __iter__(self):
        for i in range(0, self.n, self.size):
            yield torch.arange(i, min(i + self.size, self.n))


class NextDS(Rows):
    pass


class ThreadDS(Rows):
    pass


class HelperDS(Rows):
    pass


class ValDS(Rows):
    pass


class ExecDS(Rows):
    pass


class FsizeDS(Rows):
    pass


class SpawnDS(Rows):
    """Unpicklable (a lambda): a spawn worker cannot be given it."""

    def __init__(self, n):
        super().__init__(n)
        self.fn = lambda x: x


class _Shouty:
    def __str__(self):
        raise RuntimeError("a module name that cannot be printed")


class OddDS(Rows):
    pass


OddDS.__module__ = _Shouty()      # reading the loader's settings fails inside the hooks


class ForwardingLoader(DataLoader):
    """A DataLoader subclass whose ``__getattr__`` forwards to its dataset (a common shape:
    ``loader.vocab``); before its ``__init__`` ran, ``self.dataset`` itself is looked up here."""

    def __getattr__(self, name):
        return getattr(self.dataset, name)


class Batch:
    """A batch object with a lookup ``__getattr__`` (``batch.x``): a missing name is a
    KeyError, not an AttributeError."""

    def __init__(self, d):
        self.d = d

    def __getattr__(self, name):
        return self.__dict__["d"][name]


def to_batch(samples):
    return Batch({"x": torch.stack(samples)})
