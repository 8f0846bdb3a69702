"""The device path's logic on the CPU: pinned ring, pin thread, copies, preload, clocks.

``tests/fake_device.py`` stands in for CUDA with deferred copies (a copy runs only when an
event after it is waited on), so every test here runs the real ``stages.device`` and
``measure.probe`` code and would see wrong bytes if a host buffer were reused before its copy
completed. The same properties are checked on a real GPU by ``tests/test_gpu.py``.
"""

from __future__ import annotations

import faulthandler
import hashlib
import mmap
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fake_device import FakeApi
from stallbench import scenario
from stallbench.executors import EXECUTORS
from stallbench.measure.probe import StageTotals, _Preload, measured_run
from stallbench.pipeline import Plan, dataset_for
from stallbench.stages.buffers import BufferPool
from stallbench.stages.device import DeviceFeeder, Staging, host_batch, ring_slots


def digest(batch: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(batch):
        t = batch[k].contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.cpu().numpy().tobytes())
    return h.hexdigest()


def _batches(n: int, rows: int = 16, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        r = rows + (i % 3) * 5          # sizes vary: slots must grow, never overflow
        out.append({"dense": torch.rand(r, 3, generator=g),
                    "sparse": torch.randint(0, 1000, (r, 2), generator=g),
                    "seq": torch.randint(-1, 50, (r, 2, 4), generator=g),
                    "label": torch.rand(r, generator=g)})
    return out


def _source(batches: list[dict[str, torch.Tensor]]) -> Any:
    for b in batches:
        # a fresh copy per batch, as a decoder would produce: the original stays the truth
        yield {k: v.clone() for k, v in b.items()}, int(b["label"].shape[0]), 0.0, 0


def _run_feeder(api: FakeApi, batches: list[dict[str, torch.Tensor]], depth: int,
                queue_depth: int = 2, step_s: float = 0.0) -> tuple[list[str], Staging]:
    stop = threading.Event()
    staging = Staging(api, ring_slots(queue_depth, depth), stop)
    pre = _Preload(_source(batches), queue_depth, StageTotals(), stage=staging.stage, stop=stop)
    feeder = DeviceFeeder(pre, api, depth)
    got = []
    try:
        for batch, rows, _, _ in feeder:
            assert all(api.on_device(t) for t in batch.values())
            got.append(digest(batch))
            if step_s:
                time.sleep(step_s)
    finally:
        feeder.close()
    return got, staging


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_device_batches_are_the_host_batches_bytes_for_bytes(depth: int) -> None:
    """The pin thread refills ring slots as fast as it can while copies are deferred until
    their events are waited on: a slot released before its copy completed would be copied
    with the next batch's bytes."""
    batches = _batches(40)
    got, staging = _run_feeder(FakeApi(), batches, depth)
    assert got == [digest(b) for b in batches]
    assert staging.copies == 40 and staging.passed == 0


def test_ring_buffers_are_reused_not_reallocated() -> None:
    api = FakeApi()
    batches = _batches(60)
    _, staging = _run_feeder(api, batches, depth=2, queue_depth=2)
    slots = ring_slots(2, 2)
    addresses = staging.addresses()
    assert len(addresses) == slots == len(set(addresses))
    # each slot is allocated once, plus at most a few regrowths while sizes still rise
    assert api.pinned_allocs == staging.allocations <= slots + 3


def test_preloaded_copies_run_on_a_side_stream_and_overlap_the_step() -> None:
    """With device_prefetch = 1: batch N+1's copy is launched on the side stream before batch N
    is handed to the step, the compute stream waits on each copy's event, and record_stream
    marks each device buffer as used by the compute stream."""
    api = FakeApi()
    batches = _batches(6)
    feeder = DeviceFeeder(_source(batches), api, depth=1)
    handed = 0
    for batch, _, _, _ in feeder:
        handed += 1
        launched = [e for e in api.log if e[0] == "alloc"]     # one buffer per batch copied
        # when batch k (1-based) is handed over, k + 1 copies have been launched (but at the end)
        assert len(launched) == min(handed + 1, len(batches))
    assert {e[1] for e in api.log if e[0] in ("copy", "alloc")} == {api.side.name}
    waits = [e for e in api.log if e[0] == "wait_event"]
    records = [e for e in api.log if e[0] == "record_stream"]
    assert len(waits) == len(records) == len(batches)
    assert {e[1] for e in waits} == {e[1] for e in records} == {api.default.name}


def test_without_preload_the_copy_runs_on_the_compute_stream() -> None:
    api = FakeApi()
    feeder = DeviceFeeder(_source(_batches(4)), api, depth=0)
    assert len(list(feeder)) == 4
    assert {e[1] for e in api.log if e[0] == "copy"} == {api.default.name}
    assert not [e for e in api.log if e[0] in ("wait_event", "record_stream")]


def test_a_batch_in_pinned_memory_is_copied_from_where_it_lies() -> None:
    """A single buffer (one storage) that is already pinned: one segment, no ring copy."""
    api = FakeApi()
    buf = api.pinned(4096)
    dense = buf[0:64].view(torch.float32).view(4, 4)
    label = buf[64:80].view(torch.float32)
    dense.copy_(torch.arange(16, dtype=torch.float32).view(4, 4))
    label.copy_(torch.ones(4))
    hb = host_batch({"dense": dense, "label": label}, api)
    assert hb.source == "pool" and len(hb.segments) == 1 and hb.nbytes == 80
    staging = Staging(api, 2)
    assert staging.stage({"dense": dense, "label": label}).source == "pool"
    assert staging.copies == 0 and staging.passed == 1
    feeder = DeviceFeeder(iter([(hb, 4, 0.0, 0)]), api, depth=0)
    (got, _, _, _), = list(feeder)
    assert torch.equal(got["dense"], dense) and torch.equal(got["label"], label)


def test_a_full_ring_waits_for_the_copy_not_the_launch() -> None:
    """With one slot, the pin thread must wait until the trainer has waited for the copy
    reading that slot; the deferred copy would otherwise read the next batch."""
    api = FakeApi(copy_delay_s=0.002)
    batches = _batches(10)
    stop = threading.Event()
    staging = Staging(api, 1, stop)
    pre = _Preload(_source(batches), 1, StageTotals(), stage=staging.stage, stop=stop)
    feeder = DeviceFeeder(pre, api, depth=0)
    got = [digest(b) for b, _, _, _ in feeder]
    feeder.close()
    assert got == [digest(b) for b in batches]


def test_stopping_early_does_not_hang_the_pin_thread() -> None:
    api = FakeApi()
    stop = threading.Event()
    staging = Staging(api, ring_slots(2, 1), stop)
    pre = _Preload(_source(_batches(50)), 2, StageTotals(), stage=staging.stage, stop=stop)
    feeder = DeviceFeeder(pre, api, depth=1)
    next(feeder)
    t0 = time.perf_counter()
    feeder.close()
    assert not pre.thread.is_alive() and time.perf_counter() - t0 < 5


def _fork_and_write(pool: BufferPool) -> int:
    """A child (as a loader worker is) writes into slot 0; returns its wait status."""
    pid = os.fork()
    if pid == 0:                                   # pragma: no cover - the child
        faulthandler.disable()                     # a crash here is the expected outcome
        try:
            pool.data[:8] = 7
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status


def test_a_pinned_pool_stays_mapped_in_workers_forked_later() -> None:
    """A driver may mark page-locked memory MADV_DONTFORK (a child would then not map it and
    crash writing its batch); ``BufferPool.pin`` lifts that mark on its shared mapping."""
    registered = []

    def driver_like_register(address: int, nbytes: int) -> None:
        registered.append((address, nbytes))
        pool._map.madvise(mmap.MADV_DONTFORK)

    pool = BufferPool(1, 2, 4096)
    pool.pin(driver_like_register)
    assert pool.pinned and registered == [(pool.data.ctypes.data, pool.data.nbytes)]
    assert os.WIFEXITED(status := _fork_and_write(pool)) and os.WEXITSTATUS(status) == 0
    assert (pool.data[:8] == 7).all()
    pool.close()
    assert not pool.pinned
    # the failure the fix prevents, shown on a pool left marked
    bare = BufferPool(1, 2, 4096)
    bare._map.madvise(mmap.MADV_DONTFORK)
    status = _fork_and_write(bare)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV


# ------------------------------------------------------------- the whole run, fake device

BASE = """
name = "fake-device"
[dataset]
rows = 1200
row_group_rows = 300
files = 2
dense_features = 3
sparse_features = 2
sequence_features = 2
sequence_max_len = 5
seed = 3
[model]
kind = "emulated"
step_ms = 0.2
[loader]
batch_size = 128
pin_memory = true
"""


class HashCompute:
    kind = "emulated"

    def __init__(self) -> None:
        self.digests: list[str] = []

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        time.sleep(0.0002)
        self.digests.append(digest(batch))

    def sync(self) -> None:
        pass


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fake-device-cache")


def _run(loader: str, cache: Path, fake: FakeApi | None) -> tuple[list[str], Any, Any]:
    cfg = scenario.parse(BASE + loader, "fake.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, cache, "fake.toml"), scenario_file="fake.toml")
    if fake is not None:
        plan.transfer.attach(fake)
    compute = HashCompute()
    with EXECUTORS.get("local")(cfg, "fake.toml") as ex:
        fig, timeline, _ = measured_run(plan, ex, compute)
        figures = ex.run_figures()
    return compute.digests, fig, (timeline, figures)


@pytest.mark.parametrize("loader, source", [
    ('batch_format = "single_buffer"\nnum_workers = 2\ndevice_prefetch = 2\n', "pool"),
    ('batch_format = "jagged"\nnum_workers = 0\ndevice_prefetch = 1\n', "pool"),
    # cut short: copies preloaded beyond the last batch are not counted
    ('batch_format = "jagged"\nnum_workers = 2\ndevice_prefetch = 3\nmax_batches = 5\n', "pool"),
    ('batch_format = "columnar"\nnum_workers = 2\ndevice_prefetch = 2\n', "ring"),
    ('batch_format = "arrow"\nnum_workers = 2\ndevice_prefetch = 1\n', "ring"),
    # jagged built by the trainer (fresh tensors, dense/sparse transposed views), as Flight's
    # lossless Arrow wire and Ray stock mode hand it over
    ('batch_format = "jagged"\ncollate = "trainer"\nnum_workers = 2\ndevice_prefetch = 1\n',
     "ring"),
    ('batch_format = "single_buffer"\ncompression = "zstd"\nnum_workers = 2\n'
     'device_prefetch = 1\nprefetch_batches = 3\n', "ring"),
])
def test_measured_run_through_the_device_path(loader: str, source: str, cache: Path) -> None:
    """The whole measured run on the fake device: the trainer sees the CPU run's batches, every
    batch is copied once, from the loader's pinned pool in place where the format lets
    workers write there (the pool registered through the device API) or via the pin thread's
    ring otherwise, and the run's device figures account for every copy."""
    want, _, _ = _run(loader, cache, None)
    fake = FakeApi()
    got, fig, (timeline, figures) = _run(loader, cache, fake)
    assert got == want and fig.batches == len(want) > 4
    d = fig.device
    assert d is not None and d.device == "fake:0" and d.compute_kind == "emulated"
    assert d.h2d_batches == fig.batches and getattr(d, f"h2d_from_{source}") == fig.batches
    assert d.h2d_bytes > 0 and d.h2d_s is not None and d.h2d_gb_s is not None
    assert 0 < d.au <= 1 and abs(d.compute_s - fig.compute_s) < 1e-6   # emulated: host clock
    assert d.device_prefetch == int(re.search(r"device_prefetch = (\d)", loader).group(1))
    assert timeline.h2d_ms is not None and len(timeline.h2d_ms) == fig.batches
    if source == "pool" and "single_buffer" in loader:
        assert figures["buffer_pool"]["pinned"] is True
        # registered through the device API (pinned ring buffers register too: > ring's),
        # and unregistered when the executor stopped
        assert len(fake.registrations) > fake.pinned_allocs
        assert len(fake.pinned_ranges) == fake.pinned_allocs


# ------------------------------------------------------------------- steady-state AU

def test_device_clock_takes_whole_run_and_steady_au_from_the_same_step_events() -> None:
    """Ground truth by construction: step events completed at set times (5 steps of 10, 10,
    40, 40, 40 ms), a 200 ms run whose steady window (from step 2) lasts 150 ms: AU =
    140 / 200, steady AU = 120 / 150, both from the events, not the host clock."""
    from stallbench.measure.device_clock import DeviceClock

    api = FakeApi()
    clock = DeviceClock(api, "gpu")
    t = 0.0
    for ms in (10, 10, 40, 40, 40):
        start, end = api.event(), api.event()
        start.done_at, end.done_at = t, t + ms / 1e3
        clock.steps.append((start, end))
        clock.host_step(1.0)                   # the host clock says otherwise: not used
        t += ms / 1e3 + 0.005
    rep, _, steps = clock.finish(0.200, steady_from=2, steady_s=0.150)
    assert rep.compute_clock == "cuda_events" and steps == pytest.approx([10, 10, 40, 40, 40])
    assert rep.au == pytest.approx(0.140 / 0.200)
    assert rep.steady_compute_s == pytest.approx(0.120)
    assert rep.steady_au == pytest.approx(0.120 / 0.150)
    none, _, _ = DeviceClock(api, "gpu").finish(0.2)   # no steady window: no steady AU
    assert none.steady_au is None and none.steady_compute_s is None


class KernelCompute:
    """A GPU model step on the fake device: KERNEL_S of queued device work, waited for by
    ``sync`` as a real trainer waits for its step (``Compute.sync``)."""

    kind = "gpu"
    KERNEL_S = 0.004

    def __init__(self, api: FakeApi) -> None:
        self.api = api

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        self.api.kernel(self.KERNEL_S)

    def sync(self) -> None:
        self.api.current_stream().ops and self.api._run(self.api.current_stream())


def test_a_measured_run_reports_steady_au_from_its_steady_steps(cache: Path) -> None:
    """The run's steady AU is the CUDA-event step times of its steady batches over its steady
    window (checked against the run's own timeline and phases), at least the known device
    work of those steps and at most the host's view of them; results carry it beside AU."""
    from stallbench.analysis.device import device_figures

    # 0 workers: start-up is work item 0, and the other 3 items are a steady window long
    # enough for the phase split's rule (2 workers over 4 items would leave none)
    cfg = scenario.parse(BASE + "num_workers = 0\n", "fake.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, cache, "fake.toml"), scenario_file="fake.toml")
    fake = FakeApi()
    plan.transfer.attach(fake)
    with EXECUTORS.get("local")(cfg, "fake.toml") as ex:
        fig, timeline, _ = measured_run(plan, ex, KernelCompute(fake))
    d, ph = fig.device, fig.phases
    assert d is not None and d.compute_clock == "cuda_events" and ph.steady_batches > 0
    k = ph.startup_batches
    steady_steps = timeline.gpu_step_ms[k:]
    assert d.steady_compute_s == pytest.approx(sum(steady_steps) / 1e3, rel=1e-3)
    assert d.steady_au == pytest.approx(d.steady_compute_s / ph.steady_s)
    assert sum(steady_steps) / 1e3 >= KernelCompute.KERNEL_S * ph.steady_batches * 0.999
    assert d.steady_compute_s <= ph.steady_compute_s + 1e-6    # events inside the host's step
    assert d.au == pytest.approx(sum(timeline.gpu_step_ms) / 1e3 / fig.epoch_s, rel=1e-3)
    summary = device_figures([fig])
    assert summary is not None and summary.steady_au.median == pytest.approx(d.steady_au)
