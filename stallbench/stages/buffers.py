"""Reusable shared-memory slots for single-buffer batches crossing from loader workers.

Handing a batch to another process through fresh shared memory costs more than the copy it
saves on this kind of machine: every new shared-memory buffer is a new ``shm`` file whose 4 KiB
pages fault in one by one as the producer writes them (measured here: ~5 ms to fill 8 MB of new
shared memory vs 0.35 ms for memory already mapped, i.e. ~1.5 us/row on the recsys table), and
torch passes one file descriptor per tensor over a socket. A ``BufferPool`` maps one shared
region *before* the DataLoader forks its workers, so every process already has it mapped:

- each worker owns a partition of fixed-size slots (no lock: one writer per partition), packs
  a batch straight into a free slot and hands over only a tiny ``PooledBuffer`` reference;
- the trainer turns the reference into a zero-copy tensor over the same pages and marks the
  slot free again when the last tensor viewing it is garbage-collected;
- when a worker finds no free slot (the trainer holds many batches, e.g. bulk execution) or a
  batch does not fit, it falls back to a fresh shared-memory buffer: never a wait, never a
  deadlock, and bulk memory still grows with the data as it must.

The pool is bounded, so in streaming mode it *is* the bounded buffer: its pages are reused
instead of new ones being faulted in for every batch.

On a GPU trainer the pool can also be page-locked (``pin``: ``cudaHostRegister`` of its slots in
the trainer), so loader workers write each batch straight into pinned memory and the trainer
copies it to the device from where it lies: no host copy remains on the trainer's path.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np
import torch

from .sizes import align_up

_PAGE = mmap.PAGESIZE
_FREE, _USED = 0, 1
# madvise(MADV_POPULATE_READ) (Linux >= 5.14; not in Python 3.11's mmap constants): maps the
# pages of a range in one call, with the kernel's fault-around. Where it is refused, a read of
# one byte per page does the same with one fault per fault-around window.
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)


@dataclass(frozen=True)
class PooledBuffer:
    """A single buffer living in a ``BufferPool`` slot: what crosses the process boundary."""

    pool: str
    slot: int
    nbytes: int

    def resolve(self) -> torch.Tensor:
        """The buffer as a uint8 tensor over the shared pages (trainer side)."""
        pool = BufferPool.registry.get(self.pool)
        if pool is None:
            raise LookupError(f"buffer pool {self.pool!r} is not mapped in this process")
        return pool.resolve(self)


class SlotAllocator:
    """One worker's partition of a pool: where that worker's batches are packed."""

    def __init__(self, pool: "BufferPool", partition: int, fallback_shared: bool = True) -> None:
        self.pool = pool
        self.partition = partition
        # Where a batch goes when no slot is free: fresh shared memory if it must cross to
        # another process, ordinary memory if the trainer packs for itself.
        self.fallback_shared = fallback_shared

    def take(self, nbytes: int) -> tuple[np.ndarray, PooledBuffer] | None:
        """A writable view of a free slot and its reference, or None (caller falls back)."""
        return self.pool.take(self.partition, nbytes)


class BufferPool:
    """``partitions`` x ``slots`` shared slots of ``slot_bytes`` each, plus one state byte per
    slot (0 free, 1 in use) in the same shared mapping. Create it in the trainer before the
    loader forks; workers inherit the mapping."""

    # Weak: the executor owns its pool; a stale reference fails to resolve, loudly.
    registry: ClassVar["weakref.WeakValueDictionary[str, BufferPool]"] = weakref.WeakValueDictionary()

    def __init__(self, partitions: int, slots: int, slot_bytes: int) -> None:
        self.partitions = partitions
        self.slots = slots
        self.slot_bytes = align_up(slot_bytes, _PAGE)
        n = partitions * slots
        state_bytes = align_up(n, _PAGE)
        self.key = f"{os.getpid()}:{id(self)}"
        self._map = mmap.mmap(-1, state_bytes + n * self.slot_bytes)   # MAP_SHARED | ANONYMOUS
        self.state = np.frombuffer(self._map, dtype=np.uint8, count=n)
        self.data = np.frombuffer(self._map, dtype=np.uint8, offset=state_bytes)
        self._live: set[int] = set()        # slots the trainer holds tensors over
        # What of each slot this process has mapped (``_map_in``), and which process: a forked
        # worker inherits the set but not the page-table entries.
        self._mapped: dict[int, int] = {}     # slot -> bytes of it mapped
        self._mapped_pid = os.getpid()
        self._lock = threading.Lock()
        self._unpin: Callable[[], None] | None = None
        BufferPool.registry[self.key] = self

    @property
    def pinned(self) -> bool:
        return self._unpin is not None

    def pin(self, register: Callable[[int, int], None],
            unregister: Callable[[int], None] | None = None) -> None:
        """Page-lock every slot: ``register(address, nbytes)`` (``cudaHostRegister``), in the
        trainer, once; workers forked afterwards write into the same (now pinned) pages.

        A driver may mark page-locked memory ``MADV_DONTFORK`` so that a child cannot
        copy-on-write pages a DMA engine reads; that would unmap the slots in every worker
        forked later. Our mapping is ``MAP_SHARED`` (a fork shares its pages, it never copies
        them), so the mark is lifted again with ``MADV_DOFORK``."""
        if self._unpin is not None:
            return
        address, nbytes = self.data.ctypes.data, self.data.nbytes
        register(address, nbytes)
        dofork = getattr(mmap, "MADV_DOFORK", None)
        if dofork is not None:
            self._map.madvise(dofork)
        self._unpin = (lambda: unregister(address)) if unregister else (lambda: None)

    def allocator(self, partition: int, fallback_shared: bool = True) -> SlotAllocator:
        return SlotAllocator(self, partition % self.partitions, fallback_shared)

    def take(self, partition: int, nbytes: int) -> tuple[np.ndarray, PooledBuffer] | None:
        if nbytes > self.slot_bytes:
            return None
        lo = partition * self.slots
        free = np.flatnonzero(self.state[lo:lo + self.slots] == _FREE)
        if free.size == 0:
            return None
        slot = lo + int(free[0])
        self.state[slot] = _USED
        start = slot * self.slot_bytes
        self._map_in(slot, start, nbytes)
        return self.data[start:start + nbytes], PooledBuffer(self.key, slot, nbytes)

    def _map_in(self, slot: int, start: int, nbytes: int) -> None:
        """Map a slot's pages into this process before it is written, in one call.

        Why: a fork does not copy the page-table entries of a shared mapping, so a loader
        worker (forked afresh every run) takes one page fault per 4 KiB page of every slot it
        writes first: ~13,000 faults for the first row group of 4,096-row batches of the
        held-out data, 20-25 ms of a worker's CPU. ``MADV_POPULATE_READ`` maps them with the
        kernel's fault-around (16 pages a fault): measured here 3.4 + 4.6 ms (map, then copy)
        for 52 MB against 21 ms of faulting copies. Pages no process has written yet are
        allocated either way."""
        pid = os.getpid()
        if pid != self._mapped_pid:
            self._mapped, self._mapped_pid = {}, pid
        done = self._mapped.get(slot, 0)
        if nbytes <= done:
            return
        length = align_up(nbytes, _PAGE)
        self._mapped[slot] = length
        start += done                                     # only what is not mapped yet
        length -= done
        off = len(self._map) - self.data.nbytes + start   # its offset in the mapping
        try:
            self._map.madvise(_MADV_POPULATE_READ, off, length)
        except (OSError, ValueError):
            int(self.data[start:start + length:_PAGE].sum())   # a read per page

    def resolve(self, ref: PooledBuffer) -> torch.Tensor:
        start = ref.slot * self.slot_bytes
        view = self.data[start:start + ref.nbytes]   # a fresh view object per batch
        with self._lock:
            self._live.add(ref.slot)
        weakref.finalize(view, self._release, ref.slot)
        return torch.from_numpy(view)

    def _release(self, slot: int) -> None:
        with self._lock:
            self._live.discard(slot)
        self.state[slot] = _FREE

    def reclaim(self) -> None:
        """Free every slot the trainer does not hold: call when no worker is alive (before a
        run), so references dropped unread (a run stopped early) do not leak slots."""
        with self._lock:
            held = np.fromiter(self._live, dtype=np.int64, count=len(self._live))
        keep = self.state[held].copy() if held.size else None
        self.state[:] = _FREE
        if held.size:
            self.state[held] = keep

    def close(self) -> None:
        """Forget the pool (and unpin it); the mapping itself lives until the last tensor over
        it is gone."""
        BufferPool.registry.pop(self.key, None)
        if self._unpin is not None:
            unpin, self._unpin = self._unpin, None
            unpin()
