"""The measured trainer loop's receive stage: compressed batches decoded by several threads
arrive complete and in order (the trainer thread never decompresses when a receive thread
exists)."""

from __future__ import annotations

import gc
import hashlib
import threading
import time
from pathlib import Path

import pytest
import torch

from stallbench import scenario
from stallbench.executors import EXECUTORS
from stallbench.measure.probe import measured_run
from stallbench.pipeline import Plan, dataset_for
from stallbench.stages.transfer import Transfer

TEXT = """
name = "probe"
[dataset]
rows = 2400
row_group_rows = 600
files = 2
dense_features = 3
sparse_features = 2
sequence_features = 2
sequence_max_len = 6
[model]
kind = "emulated"
[loader]
batch_size = 100
batch_format = "{fmt}"
compression = "zstd"
num_workers = 2
prefetch_batches = {prefetch}
"""


class Hash:
    def __init__(self) -> None:
        self.digests: list[str] = []

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        h = hashlib.sha256()
        for k in sorted(batch):
            h.update(batch[k].contiguous().cpu().numpy().tobytes())
        self.digests.append(h.hexdigest())

    def sync(self) -> None:
        pass


def _run(tmp_path: Path, fmt: str, prefetch: int) -> tuple[list[str], set[str]]:
    cfg = scenario.parse(TEXT.format(fmt=fmt, prefetch=prefetch), "p.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, tmp_path, "p.toml"), scenario_file="p.toml")
    seen: set[str] = set()
    real = plan.transfer.receive_host

    def spy(p):                                   # which threads decompress
        seen.add(threading.current_thread().name)
        return real(p)

    plan.transfer.receive_host = spy              # instance attribute: this plan only
    compute = Hash()
    with EXECUTORS.get("local")(cfg, "p.toml") as ex:
        fig, _, _ = measured_run(plan, ex, compute)
    assert fig.batches == 24
    return compute.digests, seen


@pytest.mark.parametrize("fmt", ["single_buffer", "jagged", "columnar"])
def test_parallel_receive_keeps_order_and_leaves_the_trainer_thread(
        tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    serial, where = _run(tmp_path, fmt, prefetch=0)
    assert where == {threading.main_thread().name}          # no receive thread: the trainer
    monkeypatch.setattr(Transfer, "receive_threads", property(lambda self: 3))
    parallel, where = _run(tmp_path, fmt, prefetch=2)
    assert parallel == serial
    assert threading.main_thread().name not in where
    assert all(name.startswith("stallbench-receive") for name in where) and len(where) >= 2


class _Keeps(Hash):
    """A step that keeps 3,000 new lists per batch (a model's growing state, a metrics log)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self.kept: list[list[list[int]]] = []

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        self.times.append(time.perf_counter())
        self.kept.append([[] for _ in range(3000)])
        super().step(batch)


def test_the_callers_heap_is_collected_before_the_clock(tmp_path: Path) -> None:
    """The trainer runs in the caller's process. 400,000 objects it made just before (a test
    session's, a notebook's) make Python's next full collection due; the run collects once
    before its clock, so that collection is not inside the measured batches (without it: one
    full collection there, every time)."""
    cfg = scenario.parse(TEXT.format(fmt="single_buffer", prefetch=0), "p.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, tmp_path, "p.toml"), scenario_file="p.toml")
    full: list[float] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(time.perf_counter())

    held = [[] for _ in range(400_000)]
    step = _Keeps()
    gc.callbacks.append(on_gc)
    try:
        with EXECUTORS.get("local")(cfg, "p.toml") as ex:
            measured_run(plan, ex, step)
    finally:
        gc.callbacks.remove(on_gc)
    assert len(held) and step.times
    inside = [t for t in full if step.times[0] <= t <= step.times[-1]]
    assert not inside, f"{len(inside)} full collection(s) inside the measured batches"


def test_the_ranks_start_together_after_every_set_up_of_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``start_together`` (the ranks' barrier) is the last thing before the clock: a set-up
    that takes 0.3 s (here the heap's collection, slowed by construction) happens before it,
    and none of it is in the epoch. Before, a rank's collection after the barrier started its
    epoch earlier than the others' by the difference of their collections."""
    import stallbench.measure.probe as probe

    cfg = scenario.parse(TEXT.format(fmt="single_buffer", prefetch=0), "p.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, tmp_path, "p.toml"), scenario_file="p.toml")
    order: list[tuple[str, float]] = []
    monkeypatch.setattr(probe.gc, "collect",
                        lambda *a: (time.sleep(0.3), order.append(("set-up", time.perf_counter()))))
    step = _Keeps()
    with EXECUTORS.get("local")(cfg, "p.toml") as ex:
        fig, _, _ = measured_run(plan, ex, step,
                                 start_together=lambda: order.append(("start",
                                                                      time.perf_counter())))
    assert [k for k, _ in order] == ["set-up", "start"]
    # the epoch is counted from the start: it ends at the last batch, not 0.3 s later
    started = order[1][1]
    assert fig.epoch_s < (step.times[-1] - started) + 0.25
    assert step.times[0] >= started
