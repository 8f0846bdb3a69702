"""A training script as a user writes it (imports nothing of stallbench) that loads through a
Meta SPDL pipeline (``spdl.pipeline``: a background event loop and its thread pool, no
DataLoader), two loops one after the other:

    user_spdl.py ITEM_MS STEP_MS [BATCHES_PER_EPOCH] [EPOCHS] [for]

Each pipeline is ``PipelineBuilder().add_source(range(N)).pipe(f, concurrency=2)
.aggregate(4).add_sink(2).build(num_threads=2)``; ``f`` sleeps ITEM_MS per item, the loop
sleeps STEP_MS per batch.

``iterator``: one pipeline over a continuous source (``add_source(..., continuous=True)``:
SPDL's multi-epoch reuse), ``with pipeline.auto_stop():`` and one
``pipeline.get_iterator(timeout=...)`` per epoch. Its stages are connected by ``SinkStats``,
a ``StatsQueue`` subclass that keeps the ``QueuePerfStats`` SPDL computes for the sink's
output queue: ``ave_get_time`` (how long a ``get`` on it was blocked) and ``num_items`` (the
gets, each epoch's end marker included) are SPDL's own meter of the loop's wait. A custom
queue class is read through SPDL's loop-side path: each foreground ``get_item`` awaits the
queue's ``get`` on the event loop (in slices of at most 0.1 s; a slice that times out is not
counted by ``StatsQueue``: its counter runs only when the get returns).
``get_item``: a pipeline built each epoch (as ``spdl.dataloader.DataLoader`` does), SPDL's
default queues (read through its foreground mirror, a ``queue.Queue``), the items taken by
``pipeline.get_item(timeout=...)`` until its ``EOFError``.

With ``images``, every item is a 16 x 16 array (an image) instead of its index: a batch is
the list of 4 arrays ``aggregate`` made, 4 samples, not the 16 rows of the first one.

With ``for``, only a third loop: ``for batch in pipeline:`` (``Pipeline.__iter__``) each
epoch over one continuous pipeline; its truth is ``{"for": {"per_epoch": [batches seen]}}``.

The last line printed is ``truth: {"iterator": {...}, "get_item": {...}}``: each loop's own
seconds blocked in ``get_iterator()``/``next()``/``get_item()`` (``next_s``) and between
batches (``step_s``), batches and samples; for ``iterator`` SPDL's figures too
(``spdl_get_s`` = the sink queue's ``ave_get_time * num_items``, ``spdl_gets``).
"""

import json
import sys
import time

import numpy as np

from spdl.pipeline import PipelineBuilder, QueuePerfStats, StatsQueue

BATCH = 4
SINK_STATS = []         # the QueuePerfStats of SinkStats sink queues, as SPDL reports them


class SinkStats(StatsQueue):
    """SPDL's StatsQueue, keeping its final figures for the sink's queue (SPDL only logs
    them)."""

    def _log_stats(self, stats: QueuePerfStats) -> None:
        if self.info.stage_name == "sink":
            SINK_STATS.append(stats)
        super()._log_stats(stats)


def build(fn, n_items, continuous=False, queue_class=None):
    return (PipelineBuilder()
            .add_source(range(n_items), continuous=continuous)
            .pipe(fn, concurrency=2)
            .aggregate(BATCH)
            .add_sink(2)
            .build(num_threads=2, queue_class=queue_class))


IMAGES = sys.argv[5:] == ["images"]


def item(i):
    return np.full((16, 16), float(i)) if IMAGES else i


def run_iterator(item_s, step_s, per_epoch, epochs):
    def decode(i):
        time.sleep(item_s)
        return item(i)

    next_s = step = 0.0
    batches = samples = 0
    pipeline = build(decode, per_epoch * BATCH, continuous=True, queue_class=SinkStats)
    with pipeline.auto_stop():
        for _ in range(epochs):
            t = time.perf_counter()
            it = pipeline.get_iterator(timeout=30)
            next_s += time.perf_counter() - t
            while True:
                t = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                t1 = time.perf_counter()
                next_s += t1 - t
                batches += 1
                samples += len(batch)
                time.sleep(step_s)
                step += time.perf_counter() - t1
    # stop() ran the sink's stage hook to its end: its figures are in
    stats = list(SINK_STATS)
    return {"next_s": next_s, "step_s": step, "batches": batches, "samples": samples,
            "spdl_get_s": sum(s.ave_get_time * s.num_items for s in stats),
            "spdl_gets": sum(s.num_items for s in stats), "spdl_reports": len(stats)}


def run_get_item(item_s, step_s, per_epoch, epochs):
    def fetch(i):
        time.sleep(item_s)
        return item(i)

    next_s = step = 0.0
    batches = samples = 0
    for _ in range(epochs):
        pipeline = build(fetch, per_epoch * BATCH)
        with pipeline.auto_stop():
            while True:
                t = time.perf_counter()
                try:
                    batch = pipeline.get_item(timeout=30)
                except EOFError:
                    break
                t1 = time.perf_counter()
                next_s += t1 - t
                batches += 1
                samples += len(batch)
                time.sleep(step_s)
                step += time.perf_counter() - t1
    return {"next_s": next_s, "step_s": step, "batches": batches, "samples": samples}


def run_for(item_s, step_s, per_epoch, epochs):
    def load(i):
        time.sleep(item_s)
        return i

    seen = []
    pipeline = build(load, per_epoch * BATCH, continuous=True)
    with pipeline.auto_stop():
        for _ in range(epochs):
            n = 0
            for _batch in pipeline:
                n += 1
                time.sleep(step_s)
            seen.append(n)
    return {"per_epoch": seen}


def main():
    item_s, step_s = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3
    per_epoch = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    if sys.argv[5:] == ["for"]:
        print("truth: " + json.dumps({"for": run_for(item_s, step_s, per_epoch, epochs)}))
        return
    truth = {"iterator": run_iterator(item_s, step_s, per_epoch, epochs),
             "get_item": run_get_item(item_s, step_s, per_epoch, epochs)}
    print("truth: " + json.dumps(truth), flush=True)


if __name__ == "__main__":
    main()
