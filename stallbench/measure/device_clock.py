"""The accelerator's own clocks for one run: every host -> device copy and every model step.

A host timer around an asynchronous call measures the launch, not the work: a
``copy_(non_blocking=True)`` returns in microseconds whatever the copy takes, and a GPU step's
kernels run after the Python call has returned. So on a GPU both are bracketed by CUDA events
recorded on the stream that runs them and read (``elapsed_time``) once the run is over, when
every event has completed (reading them during the run would synchronise the device).

Accelerator utilisation (AU) is compute time / epoch time, the MLPerf Storage (DLIO) figure; a
run passes their bar at AU >= 90%. Its compute time is taken where the step really runs:

- ``gpu``: a torch model on CUDA; step time from CUDA events (the GPU's busy time in the step);
- ``emulated``: ``model.kind = "emulated"``, a wait standing in for an accelerator; step time
  from the host clock around that wait; AU is EMULATED (its numerator is the emulation);
- ``cpu``: a torch model on the CPU (no accelerator); step time from the host clock: AU then
  says how much of the epoch the trainer's CPU step took, a figure of the same form.

AU is reported for every run and always labelled with that source (``compute_kind``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..results import DeviceRepeat
from ..stages.device import CopyRecord, DeviceApi


@dataclass
class DeviceClock:
    api: DeviceApi | None           # None: the trainer's device is the CPU
    compute_kind: str               # "gpu", "emulated" or "cpu"
    device_prefetch: int = 0
    copies: list[CopyRecord] = field(default_factory=list)
    steps: list[tuple[Any, Any]] = field(default_factory=list)
    host_steps: list[float] = field(default_factory=list)

    @property
    def step_events(self) -> bool:
        return self.api is not None and self.compute_kind == "gpu"

    def on_copy(self, rec: CopyRecord) -> None:
        self.copies.append(rec)

    def step_start(self) -> Any:
        if not self.step_events:
            return None
        assert self.api is not None
        ev = self.api.event()
        ev.record(self.api.current_stream())
        return ev

    def step_stop(self, start: Any) -> None:
        """Right after the step's work is queued (before the host waits for it), so the end
        event marks when the GPU finished the step, not when the host came back."""
        if start is None:
            return
        assert self.api is not None
        end = self.api.event()
        end.record(self.api.current_stream())
        self.steps.append((start, end))

    def host_step(self, host_s: float) -> None:
        """The step as the host clock saw it (launch + wait): the source for emulated and
        CPU steps."""
        self.host_steps.append(host_s)

    def finish(self, epoch_s: float, steady_from: int | None = None,
               steady_s: float | None = None,
               ) -> tuple[DeviceRepeat, list[float] | None, list[float] | None]:
        """The run's figures, plus per-batch H2D and GPU step times (ms) for the timeline
        (None without an accelerator). Call once the run is over: it waits for the device to
        finish what was queued. A batch that needed no copy (already on the device) has a
        ``CopyRecord`` without events and counts 0 ms, 0 bytes in the series only.

        ``steady_from`` (the first steady batch, ``Phases.startup_batches``) and ``steady_s``
        (the steady window's wall time): then also the steady AU,
        ``sum(step_ms[steady_from:]) / 1000 / steady_s``, from the same per-step times as
        the whole run's AU (CUDA events on a GPU), so the two differ only by the window."""
        if self.api is not None and (self.copies or self.steps):
            self.api.synchronize()
        series = [c.start.elapsed_time(c.end) if c.start is not None else 0.0
                  for c in self.copies]
        real = [c for c in self.copies if c.start is not None]
        h2d_ms = [x for x, c in zip(series, self.copies) if c.start is not None]
        if self.step_events:
            step_ms = [s.elapsed_time(e) for s, e in self.steps]
            clock = "cuda_events"
        else:
            step_ms = [x * 1e3 for x in self.host_steps]
            clock = "host"
        compute_s = sum(step_ms) / 1e3
        steady_compute = steady_au = None
        if (steady_from is not None and steady_s is not None and steady_s > 0
                and 0 <= steady_from < len(step_ms)):
            steady_compute = sum(step_ms[steady_from:]) / 1e3
            steady_au = steady_compute / steady_s
        h2d_bytes = sum(c.nbytes for c in real)
        h2d_s = sum(h2d_ms) / 1e3 if real else None
        sources = [c.source for c in real]
        rep = DeviceRepeat(
            device=self.api.name if self.api is not None else "cpu",
            compute_kind=self.compute_kind, compute_clock=clock, compute_s=compute_s,
            au=compute_s / epoch_s if epoch_s > 0 else 0.0,
            step_ms_median=statistics.median(step_ms) if step_ms else None,
            h2d_batches=len(real), h2d_bytes=h2d_bytes, h2d_s=h2d_s,
            h2d_gb_s=h2d_bytes / h2d_s / 1e9 if h2d_s else None,
            h2d_ms_median=statistics.median(h2d_ms) if h2d_ms else None,
            h2d_from_pool=sources.count("pool"), h2d_from_ring=sources.count("ring"),
            h2d_from_pageable=sources.count("pageable"),
            device_prefetch=self.device_prefetch if self.api is not None else 0,
            steady_compute_s=steady_compute, steady_au=steady_au)
        self.copies, self.steps = [], []
        if self.api is None:
            return rep, None, None
        return (rep, [round(x, 4) for x in series],
                [round(x, 4) for x in step_ms] if clock == "cuda_events" else None)
