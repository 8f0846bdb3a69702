"""A stand-in for CUDA that runs the device path's stream logic on the CPU.

``FakeApi`` implements ``stallbench.stages.device.DeviceApi`` with CPU tensors for "device"
memory, and makes the asynchrony real where it matters: a copy is only *queued* on its stream
and runs when an event recorded after it is waited on (``synchronize``) or the device is
synchronised. So code that hands a host buffer back for reuse before its copy has completed
copies the *new* contents, and a checksum test fails on the CPU as it would on a GPU. Every
operation is logged (``log``) so tests can check the order of launches, waits and
``record_stream`` calls. Pinned memory is tracked by address ranges, like registered memory.
"""

from __future__ import annotations

import itertools
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from stallbench.stages.device import DeviceApi


class FakeStream:
    _ids = itertools.count()

    def __init__(self, name: str) -> None:
        self.name = f"{name}{next(self._ids)}"
        self.ops: list[Any] = []

    def __repr__(self) -> str:
        return self.name


class FakeEvent:
    def __init__(self, api: "FakeApi") -> None:
        self.api = api
        self.stream: FakeStream | None = None
        self.done_at: float | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        self.stream = stream or self.api.current_stream()
        self.done_at = None
        self.api._push(self.stream, ("event", self))
        self.api.log.append(("record", self.stream.name, id(self)))

    def query(self) -> bool:
        return self.done_at is not None

    def synchronize(self) -> None:
        if self.stream is not None:
            self.api._run(self.stream, until=self)

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.done_at is not None and end.done_at is not None, "event not completed"
        return (end.done_at - self.done_at) * 1e3


class FakeApi(DeviceApi):
    name = "fake:0"

    def __init__(self, copy_delay_s: float = 0.0) -> None:
        self.default = FakeStream("compute")
        self.side = FakeStream("side")
        self._current = threading.local()
        self.lock = threading.RLock()
        self.log: list[tuple] = []
        self.device_ptrs: set[int] = set()
        self.pinned_ranges: list[tuple[int, int]] = []
        self.pinned_allocs = 0
        self.copy_delay_s = copy_delay_s
        self._keep: list[torch.Tensor] = []   # no address reuse while the test runs
        self.registrations: list[tuple[int, int]] = []

    # streams
    def side_stream(self) -> FakeStream:
        return self.side

    def current_stream(self) -> FakeStream:
        return getattr(self._current, "s", None) or self.default

    @contextmanager
    def use(self, stream: FakeStream) -> Iterator[None]:
        prev = getattr(self._current, "s", None)
        self._current.s = stream
        try:
            yield
        finally:
            self._current.s = prev

    def _push(self, stream: FakeStream, op: Any) -> None:
        with self.lock:
            stream.ops.append(op)

    def _run(self, stream: FakeStream, until: FakeEvent | None = None) -> None:
        with self.lock:
            while stream.ops:
                kind, payload = stream.ops.pop(0)
                if kind == "copy":
                    dst, src = payload
                    if self.copy_delay_s:
                        time.sleep(self.copy_delay_s)
                    dst.copy_(src)
                elif kind == "kernel":
                    time.sleep(payload)     # a GPU step of a known length, run in order
                elif kind == "event":
                    payload.done_at = time.perf_counter()
                    if payload is until:
                        return

    def event(self) -> FakeEvent:
        return FakeEvent(self)

    def kernel(self, seconds: float) -> None:
        """Queue device work of ``seconds`` on the current stream (a model step's kernels):
        it runs, in order, when the stream is synchronised."""
        self._push(self.current_stream(), ("kernel", seconds))

    def wait_event(self, stream: FakeStream, event: FakeEvent) -> None:
        self.log.append(("wait_event", stream.name, id(event)))
        event.synchronize()

    # memory
    def alloc(self, nbytes: int) -> torch.Tensor:
        t = torch.empty(nbytes, dtype=torch.uint8)
        self._keep.append(t)
        self.device_ptrs.add(t.untyped_storage().data_ptr())
        self.log.append(("alloc", self.current_stream().name, nbytes))
        return t

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        s = self.current_stream()
        self.log.append(("copy", s.name, src.numel()))
        self._push(s, ("copy", (dst, src)))

    def record_stream(self, t: torch.Tensor, stream: FakeStream) -> None:
        self.log.append(("record_stream", stream.name, t.untyped_storage().data_ptr()))

    def pinned(self, nbytes: int) -> torch.Tensor:
        t = torch.empty(nbytes, dtype=torch.uint8)
        self._keep.append(t)
        self.pinned_allocs += 1
        self.register(t.untyped_storage().data_ptr(), nbytes)
        return t

    def is_pinned(self, t: torch.Tensor) -> bool:
        p = t.untyped_storage().data_ptr()
        return any(lo <= p < lo + n for lo, n in self.pinned_ranges)

    def on_device(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in self.device_ptrs

    def register(self, address: int, nbytes: int) -> None:
        self.registrations.append((address, nbytes))
        self.pinned_ranges.append((address, nbytes))

    def unregister(self, address: int) -> None:
        self.pinned_ranges = [r for r in self.pinned_ranges if r[0] != address]

    def synchronize(self) -> None:
        for s in (self.default, self.side):
            self._run(s)
