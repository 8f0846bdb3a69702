"""The trainer's device path on a real CUDA GPU (marker ``gpu``: skipped without one).

What the CPU cannot show, checked where it runs: batches copied to the GPU are byte-identical
to the host batches (every format, pinned or not, preloaded or not, with and without loader
workers); the pin thread's pinned buffers are reused (same host addresses) and the loader's
registered pool is copied from in place; the H2D copy is timed by CUDA events (the time
scales with the bytes; launching is not timed); AU comes out of a known GPU step and a known
injected stall; the DLRM pools jagged and padded batches alike on the GPU; NVML memory is
sampled; the CLI prints the device table. ``tests/stages/test_device.py`` runs the same logic
against a fake device on any machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch

from stallbench import scenario
from stallbench.data.schema import FeatureSchema
from stallbench.executors import EXECUTORS
from stallbench.measure.device_clock import DeviceClock
from stallbench.measure.probe import StageTotals, _Preload, measured_run
from stallbench.measure.sampler import Sampler
from stallbench.pipeline import COMPUTE_ONLY, Plan, StageCaches, dataset_for
from stallbench.scenario import ModelSpec
from stallbench.stages import batch_format as bf
from stallbench.stages.buffers import BufferPool
from stallbench.stages.compute import DLRM
from stallbench.stages.device import DeviceFeeder, Staging, cuda_api, host_batch, ring_slots

pytestmark = pytest.mark.gpu

BASE = """
name = "gpu"
[dataset]
rows = 4096
row_group_rows = 512
files = 2
dense_features = 4
sparse_features = 3
sequence_features = 2
sequence_max_len = 8
seed = 5
[model]
kind = "emulated"
[loader]
"""


def digest(batch: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(batch):
        t = batch[k].contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.cpu().numpy().tobytes())
    return h.hexdigest()


class HashOnDevice:
    """Stands in for the model: checks the batch is on the GPU, hashes it on the host."""

    def __init__(self) -> None:
        self.digests: list[str] = []

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        assert all(t.is_cuda for t in batch.values())
        self.digests.append(digest(batch))

    def sync(self) -> None:
        torch.cuda.current_stream().synchronize()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu-cache")


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f'"{v}"' if isinstance(v, str) else str(v)


def _plan(cache: Path, extra: str = "", **loader: Any) -> Plan:
    loader = {"batch_size": 256, **loader}
    text = BASE + "".join(f"{k} = {_toml(v)}\n" for k, v in loader.items()) + extra
    cfg = scenario.parse(text, "gpu.toml").base
    return Plan.create(cfg, dataset_for(cfg, cache, "gpu.toml"), scenario_file="gpu.toml")


def _host_digests(plan: Plan) -> list[str]:
    """The CPU batches: the same plan's host half, never copied to the device."""
    with EXECUTORS.get("local")(plan.config, "gpu.toml") as ex:
        return [digest(b) for out in ex.run(plan) for b, _, _ in plan.receive_host(out)]


COMBOS = [
    dict(batch_format="columnar", pin_memory=False, device_prefetch=0, num_workers=0),
    dict(batch_format="columnar", pin_memory=True, device_prefetch=2, num_workers=2),
    dict(batch_format="rows", collate="trainer", pin_memory=True, device_prefetch=1, num_workers=0),
    dict(batch_format="single_buffer", pin_memory=True, device_prefetch=0, num_workers=0),
    dict(batch_format="single_buffer", pin_memory=True, device_prefetch=2, num_workers=2),
    dict(batch_format="single_buffer", pin_memory=False, device_prefetch=2, num_workers=2),
    dict(batch_format="single_buffer", compression="zstd", pin_memory=True, device_prefetch=1,
         num_workers=2, prefetch_batches=2),
    dict(batch_format="jagged", pin_memory=True, device_prefetch=2, num_workers=2),
    dict(batch_format="arrow", pin_memory=True, device_prefetch=1, num_workers=2),
    dict(batch_format="jagged", collate="trainer", pin_memory=True, device_prefetch=1,
         num_workers=0, execution="bulk"),
]


@pytest.mark.parametrize("knobs", COMBOS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_gpu_batches_are_the_cpu_batches(cache: Path, knobs: dict[str, Any]) -> None:
    plan = _plan(cache, **knobs)
    want = _host_digests(_plan(cache, **{**knobs, "pin_memory": False, "device_prefetch": 0}))
    compute = HashOnDevice()
    with EXECUTORS.get("local")(plan.config, "gpu.toml") as ex:
        fig, timeline, _ = measured_run(plan, ex, compute)
        pool = ex.run_figures().get("buffer_pool")
    assert compute.digests == want and len(want) == fig.batches == 16
    d = fig.device
    assert d is not None and d.device.startswith("cuda") and d.h2d_batches == fig.batches
    assert d.device_prefetch == knobs["device_prefetch"]
    assert len(timeline.h2d_ms) == fig.batches and all(x > 0 for x in timeline.h2d_ms)
    if not knobs["pin_memory"]:
        assert d.h2d_from_pageable == fig.batches
    elif (knobs["batch_format"] in ("single_buffer", "jagged") and knobs.get("compression") != "zstd"
          and knobs.get("execution") != "bulk"):
        # workers (or the trainer) pack straight into the registered pool: no host copy
        assert pool is not None and pool["pinned"] is True
        assert d.h2d_from_pool + d.h2d_from_ring == fig.batches
        assert d.h2d_from_pool >= fig.batches - pool.get("fresh_shared_batches", 0) \
            - pool.get("fresh_batches", 0)
    else:
        assert d.h2d_from_ring + d.h2d_from_pool == fig.batches


def test_pinned_ring_buffers_are_reused_across_batches() -> None:
    api = cuda_api()
    assert api is not None
    g = torch.Generator().manual_seed(0)
    batches = [{"dense": torch.rand(512 + 7 * (i % 3), 16, generator=g),
                "ids": torch.randint(0, 10**6, (512 + 7 * (i % 3), 4), generator=g)}
               for i in range(50)]

    def source() -> Any:
        for b in batches:
            yield {k: v.clone() for k, v in b.items()}, int(b["dense"].shape[0]), 0.0, 0

    stop = threading.Event()
    staging = Staging(api, ring_slots(2, 2), stop)
    feeder = DeviceFeeder(_Preload(source(), 2, StageTotals(), stage=staging.stage, stop=stop),
                          api, depth=2)
    got = []
    seen_addresses = set()
    for batch, _, _, _ in feeder:
        got.append(digest(batch))
        seen_addresses.update(staging.addresses())
    feeder.close()
    assert got == [digest(b) for b in batches]
    assert len(seen_addresses) == ring_slots(2, 2) == len(staging.addresses())
    assert staging.allocations <= ring_slots(2, 2) + 3 and staging.copies == 50
    assert all(s.buf is not None and s.buf.is_pinned() for s in staging.slots)


def test_registered_pool_memory_is_pinned_for_the_copy() -> None:
    api = cuda_api()
    pool = BufferPool(1, 2, 1 << 20)
    pool.pin(api.register, api.unregister)
    try:
        t = torch.from_numpy(pool.data[: 1 << 20])
        assert api.is_pinned(t)
        t.copy_(torch.arange(1 << 20, dtype=torch.int32).view(torch.uint8)[: 1 << 20])
        hb = host_batch({"x": t[:4096].view(torch.int32)}, api)
        assert hb.source == "pool"
        (got, _, _, _), = list(DeviceFeeder(iter([(hb, 1, 0.0, 0)]), api, depth=1))
        assert torch.equal(got["x"].cpu(), t[:4096].view(torch.int32))
    finally:
        pool.close()


def test_h2d_copy_is_timed_by_cuda_events() -> None:
    """Event time is the copy's: it grows with the bytes (4x bytes: 2.5x..5.5x the time, the
    fixed launch cost is not in it) and it fits inside the host's wall time around
    launch + wait."""
    api = cuda_api()
    times, hosts = {}, {}
    for mb in (64, 256):
        buf = api.pinned(mb << 20)
        buf.fill_(1)
        hb = host_batch({"x": buf}, api)
        assert hb.source == "pool"
        for _ in range(2):                                 # the second one is measured
            clock = DeviceClock(api, "gpu")
            t0 = time.perf_counter()
            out = list(DeviceFeeder(iter([(host_batch({"x": buf}, api), 1, 0.0, 0)]), api, 0,
                                    on_copy=clock.on_copy))
            hosts[mb] = (time.perf_counter() - t0) * 1e3
            rep, h2d_ms, _ = clock.finish(1.0)
        assert rep.h2d_bytes == mb << 20 and rep.h2d_batches == 1 and len(out) == 1
        assert 1.0 < rep.h2d_gb_s < 500
        times[mb] = h2d_ms[0]
        assert 0 < times[mb] <= hosts[mb] * 1.05
    assert 2.5 <= times[256] / times[64] <= 5.5, (times, hosts)


def _cycles_per_ms() -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)                           # warm up
    s.record()
    torch.cuda._sleep(20_000_000)
    e.record()
    e.synchronize()
    return 20_000_000 / s.elapsed_time(e)


class SleepOnGpu:
    """A model step of known GPU time: ``torch.cuda._sleep`` spins the GPU, not the host."""

    kind = "gpu"

    def __init__(self, ms: float) -> None:
        self.cycles = int(_cycles_per_ms() * ms)

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        torch.cuda._sleep(self.cycles)

    def sync(self) -> None:
        torch.cuda.current_stream().synchronize()


def test_accelerator_utilisation_from_known_step_and_stall(cache: Path) -> None:
    """Ground truth: a GPU step of 8 ms and an EMULATED storage latency of 8 ms before each
    batch (one batch per row group; no workers, no receive thread, no preload: all serial in
    the trainer thread), so AU ~ 8 / (8 + 8 + a little data work); the compute-only run
    (batches already on the GPU) has AU near 1."""
    step_ms, latency_ms = 8.0, 8.0
    plan = _plan(cache, extra=f"[storage]\nlatency_ms = {latency_ms}\n", batch_size=512,
                 batch_format="single_buffer", pin_memory=False, device_prefetch=0)
    compute = SleepOnGpu(step_ms)
    with EXECUTORS.get("local")(plan.config, "gpu.toml") as ex:
        fig, timeline, _ = measured_run(plan, ex, compute)
        caches = StageCaches.build(plan)
        only, _, _ = measured_run(plan.with_ablation(COMPUTE_ONLY, caches), ex, compute)
    d = fig.device
    assert d.compute_kind == "gpu" and d.compute_clock == "cuda_events"
    assert abs(d.step_ms_median - step_ms) <= 0.15 * step_ms, d   # GPU clocks may boost
    assert len(timeline.gpu_step_ms) == fig.batches
    ideal = step_ms / (step_ms + latency_ms)
    assert 0.8 * ideal <= d.au <= 1.05 * ideal, (d.au, ideal)
    assert abs(d.au - d.compute_s / fig.epoch_s) < 1e-9
    assert only.device.au >= 0.9, only.device


def test_dlrm_pools_jagged_and_padded_batches_alike_on_the_gpu() -> None:
    schema = FeatureSchema(dense=("a",), sparse=("b",), sequence=("q0", "q1"), label="y",
                           seq_len=5)
    n = 64
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(0, 6, (2, n), generator=g)
    seqs = {f"q{j}": [torch.randint(0, 10**5, (int(lens[j, i]),), generator=g).tolist()
                      for i in range(n)] for j in range(2)}
    table = pa.table({"a": pa.array(torch.rand(n, generator=g).numpy()),
                      "b": pa.array(torch.randint(0, 1000, (n,), generator=g).numpy()),
                      **{k: pa.array(v, pa.list_(pa.int64())) for k, v in seqs.items()},
                      "y": pa.array(torch.rand(n, generator=g).numpy())})
    sb = bf.FORMATS.get("single_buffer")(schema, "producer")
    jf = bf.FORMATS.get("jagged")(schema, "producer")
    padded = {k: v.cuda() for k, v in sb.decode(sb.encode(table, "0:0", False), "0:0").items()}
    jagged = {k: v.cuda() for k, v in jf.decode(jf.encode(table, "0:0", False), "0:0").items()}
    torch.manual_seed(0)
    model = DLRM(ModelSpec(embedding_rows=5000, embedding_dim=16), schema).cuda()
    torch.testing.assert_close(model(padded), model(jagged), rtol=1e-5, atol=1e-5)
    model(jagged).sum().backward()                         # the sparse backward runs on CUDA


def test_gpu_memory_is_sampled() -> None:
    with Sampler(0.05) as s:
        time.sleep(0.2)
        x = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        time.sleep(0.3)
    res = s.resources()
    if res.gpu_util_percent is None:
        pytest.skip("NVML is not available here (nvidia-ml-py / driver)")
    mem = [sum(sample) for sample in res.gpu_memory_mb]        # NVML's order may not be CUDA's
    assert len(mem) == len(res.t_s) and max(mem) - min(mem) >= 400, mem
    del x


def test_cli_prints_the_device_table(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(
        BASE + "batch_size = 256\npin_memory = true\ndevice_prefetch = 1\n"
        "batch_format = \"single_buffer\"\n"
        "[analysis]\ndifferential = false\n")
    env = {**os.environ, "STALLBENCH_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "stallbench", "run", "s.toml", "--out", "out",
                        "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "host -> device copies (CUDA events" in r.stdout and "H2D GB/s" in r.stdout
    assert "AU: accelerator utilisation" in r.stdout
    (path,) = (tmp_path / "out").glob("*.json")
    v = json.loads(path.read_text())["variants"][0]
    assert v["device"]["device"].startswith("cuda") and v["device"]["h2d_gb_s"]["median"] > 0
    assert v["timeline"]["h2d_ms"] and v["resources"]["gpu_memory_mb"]
