"""The trainer's device path: pinned host staging, the copy to the accelerator, and preload.

What happens to a decoded batch before the model step, when the trainer's device is a GPU:

1. **Stage** (the pin thread, ``Staging.stage``): the batch's host bytes must sit in page-locked
   (pinned) memory for the copy to be a real asynchronous DMA. A batch that already lives in
   pinned memory (a single buffer in the loader's shared-memory pool registered with CUDA, see
   ``BufferPool.pin``) is used where it is: no host copy at all. Any other batch is copied once
   into a slot of a small ring of pinned buffers that is reused across batches (as the
   DataLoader's pin thread and Pinterest's pin stage do), never a fresh ``pin_memory()`` per
   tensor per batch.
2. **Copy** (the trainer thread, ``DeviceFeeder``): one ``cudaMemcpyAsync`` of the whole batch
   (its fields laid out in one byte range) into one device buffer, whose views are the batch's
   device tensors. With ``loader.device_prefetch = N`` the copies of the next N batches are
   launched on a side stream while the current batch computes; the compute stream waits on each
   copy's event and ``record_stream`` tells the caching allocator that the compute stream uses
   the buffer, so its memory is not handed out again while a step may still read it.
3. **Clocks**: every copy is bracketed by CUDA events on the stream that runs it, so its time is
   the GPU's, not a host timer around an asynchronous call (``measure.device_clock``).

Lifetimes, the part that is easy to get wrong: a host slot may be refilled only once the copy
reading it has *completed* (its end event), not when it was launched; the trainer thread
releases a slot after waiting for that event, and the pin thread blocks for a free slot. The
ring has ``queue depth + device_prefetch + 2`` slots: at most the queue, the preloaded batches
and the batch being returned hold one, so the pin thread always finds a free one (no deadlock).
The trainer also waits on the host for the copy of the batch it returns (almost always already
done when preloaded) so its clock can tell a copy that is late (data stall) from compute.

Everything above goes through ``DeviceApi``: ``CudaApi`` is the real one; without CUDA the
trainer's device is the CPU and none of this runs (results say so). Tests drive the same code
with a fake API that defers copies until their events are waited on, so a slot released too
early shows up on the CPU as a wrong checksum.
"""

from __future__ import annotations

import collections
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator

import torch

from .sizes import align_up

ALIGN = 64                     # field offsets in a staged batch (any dtype's alignment)
# (batch, rows, trainer-side seconds spent producing it, work item it came from)
Item = tuple[Any, int, float, int]


def _aligned(n: int) -> int:
    return align_up(n, ALIGN)


# ----------------------------------------------------------------------------- device API

class DeviceApi:
    """The few device operations the data path uses (one object, so a test can stand in)."""

    name: str = "?"

    def side_stream(self) -> Any:
        raise NotImplementedError

    def current_stream(self) -> Any:
        raise NotImplementedError

    def use(self, stream: Any) -> ContextManager[Any]:
        """Make ``stream`` current (work and allocations inside go to it)."""
        raise NotImplementedError

    def event(self) -> Any:
        """A timing event: ``record(stream)``, ``query()``, ``synchronize()``,
        ``elapsed_time(end) -> ms``."""
        raise NotImplementedError

    def wait_event(self, stream: Any, event: Any) -> None:
        raise NotImplementedError

    def alloc(self, nbytes: int) -> torch.Tensor:
        """Device bytes, allocated on the current stream."""
        raise NotImplementedError

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Asynchronous host -> device copy on the current stream."""
        raise NotImplementedError

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        raise NotImplementedError

    def pinned(self, nbytes: int) -> torch.Tensor:
        """Page-locked host bytes."""
        raise NotImplementedError

    def is_pinned(self, t: torch.Tensor) -> bool:
        raise NotImplementedError

    def on_device(self, t: torch.Tensor) -> bool:
        raise NotImplementedError

    def register(self, address: int, nbytes: int) -> None:
        """Page-lock existing host memory (``cudaHostRegister``)."""
        raise NotImplementedError

    def unregister(self, address: int) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError


class CudaApi(DeviceApi):
    """``DeviceApi`` on ``torch.cuda``: one per process and device (``cuda_api``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.name = str(device)
        self._side: Any = None
        self._registered: dict[int, int] = {}     # address -> nbytes (cudaHostRegister)

    def side_stream(self) -> Any:
        if self._side is None:
            self._side = torch.cuda.Stream(device=self.device)
        return self._side

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def use(self, stream: Any) -> ContextManager[Any]:
        return torch.cuda.stream(stream)

    def event(self) -> Any:
        return torch.cuda.Event(enable_timing=True)

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def alloc(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def is_pinned(self, t: torch.Tensor) -> bool:
        if t.device.type != "cpu":
            return False
        p = t.untyped_storage().data_ptr()
        for lo, n in self._registered.items():    # registered ranges first: no driver call
            if lo <= p < lo + n:
                return True
        return bool(t.is_pinned())

    def on_device(self, t: torch.Tensor) -> bool:
        return t.device.type == "cuda"

    def register(self, address: int, nbytes: int) -> None:
        cudart = torch.cuda.cudart()
        res = cudart.cudaHostRegister(address, nbytes, 0)        # cudaHostRegisterDefault
        if int(res) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed: "
                               f"{cudart.cudaGetErrorString(res)}")
        self._registered[address] = nbytes

    def unregister(self, address: int) -> None:
        if self._registered.pop(address, None) is not None:
            torch.cuda.cudart().cudaHostUnregister(address)   # best effort: memory goes anyway

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


_APIS: dict[str, CudaApi] = {}


def cuda_api(device: torch.device | None = None) -> CudaApi | None:
    """The process's ``CudaApi`` for the trainer's device, or None where there is no CUDA."""
    if device is None:
        if not torch.cuda.is_available():
            return None
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda":
        return None
    key = str(device)
    if key not in _APIS:
        _APIS[key] = CudaApi(device)
    return _APIS[key]


# ---------------------------------------------------------------------------- host batches

@dataclass
class HostBatch:
    """A batch ready for one copy: its host bytes (one or more segments, each placed at an
    offset of one device buffer of ``nbytes``) and where each field lies in that buffer."""

    segments: list[tuple[torch.Tensor, int]]             # (flat uint8 host bytes, offset)
    fields: list[tuple[str, int, torch.dtype, tuple[int, ...], tuple[int, ...]]]
    nbytes: int
    source: str                  # "pool" (already pinned: no host copy), "ring" (staged by the
                                 # pin thread), "pageable" (not pinned: the copy is synchronous)
    release: Callable[[], None] | None = None   # frees the staging slot once the copy is done
    keep: Any = None             # keeps the host memory alive until then

    @property
    def pinned(self) -> bool:
        return self.source in ("pool", "ring")

    def done(self) -> None:
        """The copy reading these bytes has completed: give the memory back."""
        if self.release is not None:
            self.release()
            self.release = None
        self.keep = None
        self.segments = []


def dense_extent(t: torch.Tensor) -> int | None:
    """Elements of storage a view covers when it covers them exactly once with no gap (a
    contiguous tensor, or a transposed / permuted one such as a feature-major ``dense``
    seen as (B, D)), else None. Such a view is copied as its storage bytes and rebuilt on the
    device with the same strides; anything else is made contiguous first."""
    if t.numel() == 0:
        return 0
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1)
    expect = 1
    for st, n in dims:
        if st != expect:
            return None
        expect *= n
    return expect


def _bytes(t: torch.Tensor, extent: int) -> torch.Tensor:
    """The storage bytes of a dense view (``extent`` elements from its first one)."""
    if extent == 0:
        return torch.empty(0, dtype=torch.uint8)
    lo = t.storage_offset() * t.element_size()
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage(), lo,
                                                  (extent * t.element_size(),), (1,))


Field = tuple[str, int, torch.dtype, tuple[int, ...], tuple[int, ...]]   # name, offset, dtype,
                                                                          # shape, stride


def host_batch(batch: dict[str, torch.Tensor], api: DeviceApi | None) -> HostBatch:
    """Describe a decoded host batch for one copy, without copying it.

    When every field is a dense view into one storage (a single buffer: the batch format
    packed it that way) the span from the first to the last field is ONE segment: one DMA, and
    the device tensors are views at the same relative offsets and strides. Otherwise each field
    is its own segment at an aligned offset."""
    items = [(name, t, dense_extent(t)) for name, t in batch.items()]
    one = bool(items) and all(t.device.type == "cpu" and ext is not None for _, t, ext in items)
    if one:
        ptr = items[0][1].untyped_storage().data_ptr()
        one = all(t.untyped_storage().data_ptr() == ptr for _, t, _ in items)
    spans = []
    if one:
        for _, t, ext in items:
            lo = t.storage_offset() * t.element_size()
            spans.append((lo, lo + (ext or 0) * t.element_size()))
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        one = all((a - lo) % t.element_size() == 0 for (a, _), (_, t, _) in zip(spans, items))
    fields: list[Field] = []
    if one:
        storage = items[0][1].untyped_storage()
        flat = torch.empty(0, dtype=torch.uint8).set_(storage, lo, (hi - lo,), (1,))
        fields = [(name, a - lo, t.dtype, tuple(t.shape), tuple(t.stride()))
                  for (a, _), (name, t, _) in zip(spans, items)]
        segments = [(flat, 0)]
        total = hi - lo
    else:
        segments, total = [], 0
        for name, t, ext in items:
            if ext is None or t.device.type != "cpu":
                t = t.contiguous().cpu()
                ext = t.numel()
            fields.append((name, total, t.dtype, tuple(t.shape), tuple(t.stride())))
            segments.append((_bytes(t, ext), total))
            total = _aligned(total + ext * t.element_size())
    pinned = api is not None and all(api.is_pinned(s) for s, _ in segments if s.numel())
    return HostBatch(segments, fields, total, "pool" if pinned else "pageable", keep=batch)


def device_views(buf: torch.Tensor, fields: list[Field]) -> dict[str, torch.Tensor]:
    """The batch's tensors as views of its device buffer (same offsets, shapes, strides)."""
    out = {}
    for name, off, dtype, shape, stride in fields:
        size = torch.empty(0, dtype=dtype).element_size()
        extent = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 0
        base = buf[off:off + extent * size].view(dtype)
        out[name] = base.as_strided(shape, stride)
    return out


# ----------------------------------------------------------------------------- the ring

class _Slot:
    def __init__(self, index: int) -> None:
        self.index = index
        self.buf: torch.Tensor | None = None
        self.free = threading.Event()
        self.free.set()


class Staging:
    """A ring of pinned host buffers, reused across batches, filled by the pin thread.

    ``stage`` runs in the pin thread: a batch already in pinned memory passes through; any
    other is copied into the next slot once that slot is free (its previous batch's copy has
    completed). A slot grows when a batch does not fit (variable-size batches: jagged
    sequences); it never shrinks, so a run settles on a fixed set of pinned buffers."""

    def __init__(self, api: DeviceApi, slots: int, stop: threading.Event | None = None) -> None:
        self.api = api
        self.slots = [_Slot(i) for i in range(max(slots, 1))]
        self.next = 0
        self.stop = stop or threading.Event()
        self.copies = 0            # batches copied into the ring
        self.passed = 0            # batches already pinned (no host copy)
        self.allocations = 0       # pinned buffers allocated (grows only at the start)

    def _take(self, nbytes: int) -> _Slot:
        slot = self.slots[self.next]
        self.next = (self.next + 1) % len(self.slots)
        while not slot.free.wait(0.05):
            if self.stop.is_set():
                raise _Stopped
        slot.free.clear()
        if slot.buf is None or slot.buf.numel() < nbytes:
            slot.buf = self.api.pinned(max(nbytes, int(nbytes * 1.25)))
            self.allocations += 1
        return slot

    def stage(self, batch: Any) -> Any:
        """The batch in pinned memory (a ``HostBatch``); device-resident batches and anything
        that is not a dict of tensors pass through untouched."""
        if not isinstance(batch, dict) or any(self.api.on_device(t) for t in batch.values()):
            return batch
        hb = host_batch(batch, self.api)
        if hb.pinned:
            self.passed += 1
            return hb
        slot = self._take(hb.nbytes)
        buf = slot.buf
        assert buf is not None
        for seg, off in hb.segments:
            if seg.numel():
                buf[off:off + seg.numel()].copy_(seg)
        self.copies += 1
        return HostBatch([(buf[:hb.nbytes], 0)], hb.fields, hb.nbytes, "ring",
                         release=slot.free.set)

    def addresses(self) -> list[int]:
        """Host addresses of the ring's buffers (a test checks they are reused)."""
        return [s.buf.data_ptr() for s in self.slots if s.buf is not None]


class _Stopped(Exception):
    """The run is over while the pin thread waited for a slot."""


# ----------------------------------------------------------------------------- the feeder

@dataclass
class CopyRecord:
    """One batch's host -> device copy, for the clocks: bytes, its events, and where the bytes
    were ("pool", "ring", "pageable"; "device" with no events: no copy was needed)."""

    nbytes: int
    start: Any
    end: Any
    source: str


@dataclass
class _InFlight:
    batch: Any                   # device batch (views into ``buf``) or a pass-through batch
    rows: int
    record: CopyRecord
    buf: torch.Tensor | None = None
    end: Any = None
    host: HostBatch | None = None
    side: bool = False
    item: int = 0                # the work item the batch came from (start-up/steady split)


@dataclass
class DeviceFeeder:
    """Iterates ``(device batch, rows, trainer seconds, work item)`` from a source of host
    batches.

    ``depth`` (``loader.device_prefetch``): how many batches beyond the one returned have their
    copy launched; 0 copies each batch on the compute stream right before its step. Batches
    already on the device (ablation caches) pass through without a copy."""

    source: Iterator[Item]
    api: DeviceApi
    depth: int = 0
    on_copy: Callable[[CopyRecord], None] | None = None
    inflight: collections.deque = field(default_factory=collections.deque)
    exhausted: bool = False

    def __iter__(self) -> "DeviceFeeder":
        return self

    def _launch(self, item: Item) -> float:
        """Start the copy of one batch; returns the trainer seconds it took on the host
        (the producing seconds the source reported, plus launching)."""
        batch, rows, tx, work_item = item
        t0 = time.perf_counter()
        hb = batch if isinstance(batch, HostBatch) else None
        if hb is None and isinstance(batch, dict) and not any(
                self.api.on_device(t) for t in batch.values()):
            hb = host_batch(batch, self.api)
        if hb is None:                                   # already on the device
            self.inflight.append(_InFlight(batch, rows, CopyRecord(0, None, None, "device"),
                                           item=work_item))
            return tx + time.perf_counter() - t0
        side = self.depth > 0
        stream = self.api.side_stream() if side else self.api.current_stream()
        start, end = self.api.event(), self.api.event()
        with self.api.use(stream) if side else nullcontext():
            buf = self.api.alloc(hb.nbytes)
            start.record(stream)
            for seg, off in hb.segments:
                if seg.numel():
                    self.api.copy(buf[off:off + seg.numel()], seg)
            end.record(stream)
        out = device_views(buf, hb.fields)
        self.inflight.append(_InFlight(out, rows, CopyRecord(hb.nbytes, start, end, hb.source),
                                       buf, end, hb, side, work_item))
        return tx + time.perf_counter() - t0

    def __next__(self) -> Item:
        tx = 0.0
        while len(self.inflight) < self.depth + 1 and not self.exhausted:
            try:
                item = next(self.source)
            except StopIteration:
                self.exhausted = True
                break
            tx += self._launch(item)
        if not self.inflight:
            raise StopIteration
        f = self.inflight.popleft()
        if self.on_copy is not None:     # counted when handed over: a run cut short by
            self.on_copy(f.record)       # max_batches does not count copies it never used
        if f.end is not None:
            t0 = time.perf_counter()
            f.end.synchronize()          # the copy is done (a preloaded one long since)
            assert f.host is not None
            f.host.done()                # only now may its host bytes be reused
            if f.side:
                cur = self.api.current_stream()
                self.api.wait_event(cur, f.end)
                assert f.buf is not None
                self.api.record_stream(f.buf, cur)
            tx += time.perf_counter() - t0
        return f.batch, f.rows, tx, f.item

    def close(self) -> None:
        """Wait for copies still in flight and free their host memory (a run stopped early)."""
        while self.inflight:
            f = self.inflight.popleft()
            if f.end is not None:
                f.end.synchronize()
                if f.host is not None:
                    f.host.done()
        close = getattr(self.source, "close", None)
        if close:
            close()


def ring_slots(queue_depth: int, device_prefetch: int) -> int:
    """Slots a ring needs so the pin thread never waits on a slot the trainer would only free
    after the pin thread's next batch (see the module docstring)."""
    return queue_depth + device_prefetch + 2
