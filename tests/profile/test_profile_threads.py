"""Loaders whose batches reach the loop another way than its own ``next()`` (issue 40).

A DataLoader iterated on a background thread that feeds the training loop through a
``queue.Queue`` (tests/profile/scripts/user_thread_queue.py, importing nothing of stallbench):
the exposed wait is what the *loop* waited in its ``get``, which the script times itself; the
producer thread's time in ``__next__`` (always busy: ~100%) is production, and its loader
row has no wait share (JSON null, never NaN) and a line saying it is a background thread.

Samples are counted from the batch's structure, one rule for every door: a dict whose first
value is a list of paths counts its paths (``stallbench.watch`` counted one per batch).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import loadcheck
import profile_helpers as helpers

ITEM_MS, STEP_MS = 2.5, 8.5     # a batch of 4 costs ~10 ms to make, the loop's step 8.5 ms


def _queue_case(tmp_path: Path, end: str) -> list[str]:
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    cp = helpers.profile(["--out", str(out), "--", helpers.sys.executable,
                          helpers.script("user_thread_queue.py"), str(ITEM_MS), str(STEP_MS),
                          "20", "2", end], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    t = helpers.truth(cp.stdout)
    truth_share = t["wait_s"] / (t["wait_s"] + t["step_s"])
    r = helpers.load(out)
    v = r.variants[0]
    f = v.repeats[0]
    head = next(lo for lo in v.profile.loaders if lo.headline)
    assert head.name.endswith("(queue)"), [lo.name for lo in v.profile.loaders]
    assert f.batches == t["batches"] and f.samples == t["samples"], (f, t)
    share = f.stall_s / f.epoch_s
    problems = []
    if abs(share - truth_share) > 0.10:
        problems.append(f"profile {share:.1%} vs the loop's own {truth_share:.1%} (the "
                        "producer's time would read ~100%)")
    producer = next(lo for lo in v.profile.loaders if not lo.headline)
    assert producer.wait_share is None and producer.steady_wait_share is None
    assert any("background thread" in n for n in producer.notes), producer.notes
    raw = json.loads(helpers.result_files(out)[0].read_text())
    rows = raw["variants"][0]["profile"]["loaders"]
    assert [lo["wait_share"] for lo in rows if not lo["headline"]] == [None]
    assert "background thread" in cp.stdout
    assert not v.profile.ended_early, v.profile.ended_early    # every epoch was taken whole
    return problems


@pytest.mark.groundtruth     # a share read off timings: the timing pass (tests/run_suite.sh)
@pytest.mark.parametrize("end", ["marker", "count"])
def test_a_loop_fed_by_a_loader_thread_is_charged_its_own_wait(tmp_path: Path, end: str) -> None:
    """``marker``: the loop stops at the producer's None; ``count``: it takes len(loader)
    batches, polling with ``get(timeout=)`` (its waits run from its first try). The costs are
    sleeps: the job needs well under a core."""
    loadcheck.attempts(f"thread queue[{end}]", lambda: _queue_case(tmp_path, end), 3, 1.0)


def _agent():
    return helpers.load_agent("_agent_rows")


def test_samples_are_counted_from_the_batch_structure() -> None:
    import numpy as np
    a = _agent()
    batches = [{"path": ["a.jpg", "b.jpg", "c.jpg"], "label": [0, 1, 0]},     # watch's case
               {"id": 7, "x": np.zeros((5, 2))},     # first value not countable: the next
               [np.zeros(6), np.zeros(6)],      # columns
               [(1, 2), (3, 4)],                    # identity collate: samples
               [1, 2, 3, 4, 5, 6, 7],               # a column of plain values
               "not a batch"]
    assert [a.rows.rows(b, 99) for b in batches] == [3, 5, 6, 2, 7, 99]
    for _ in a.install.watch(batches[:1]):
        pass
    assert a.state.STREAMS[-1].epochs[-1].rows == [3]



def test_a_feed_is_only_a_queue_the_loader_thread_puts_its_batches_into() -> None:
    """In process (the rules, without a job): a loader iterated on a background thread whose
    batches go into one queue makes that queue a feed (and the loader a producer); another
    queue the same thread puts other things into is not one; a loader iterated on the main
    thread never feeds; the job's own ``queue.Empty`` reaches it unchanged."""
    import queue
    import threading
    a = _agent()
    saved = queue.Queue.put, queue.Queue.get
    try:
        door = a.util.door_of("thread.queue")
        door.patch_queue(queue)
        feed, other, mine = queue.Queue(), queue.Queue(), queue.Queue()
        batches = [[1, 2], [3, 4], [5, 6]]

        def produce() -> None:
            for b in a.install.watch(batches, name="bg"):
                other.put("a log line")
                feed.put((0, b))
            feed.put(None)
        t = threading.Thread(target=produce)
        t.start()
        got = []
        while True:
            try:
                item = feed.get(timeout=0.001)
            except queue.Empty:
                continue
            if item is None:
                break
            got.append(item[1])
        t.join()
        for b in a.install.watch(batches, name="main"):
            mine.put(b)
        try:
            feed.get(timeout=0.001)
        except queue.Empty:
            pass
        else:
            raise AssertionError("an empty queue's get returned")
        by = {s.name: s for s in a.state.STREAMS}
        assert got == batches
        assert by["bg#0"].role == "producer" and by["main#2"].role == ""
        cons = by["bg#0 (queue)"]
        assert cons.fed_by == "bg#0" and cons.kind == "thread.queue"
        ep = cons.epochs[0]
        assert ep.rows == [2, 2, 2] and len(ep.wait) == 3 and ep.t_end is not None
        assert door._FEEDS.get(other) is None and door._FEEDS.get(mine) is None
        assert other.qsize() == 3 and mine.qsize() == 3
    finally:
        queue.Queue.put, queue.Queue.get = saved


def test_watch_called_every_epoch_is_one_loader() -> None:
    """``for epoch ...: for b in stallbench.watch(loader)`` (the docs' shape): one stream
    with an epoch per call, not a loader per epoch whose first alone made the headline."""
    a = _agent()

    class Loader:                   # any re-iterable object the job keeps across epochs
        def __iter__(self):
            return iter([[1, 2, 3]] * 4)
    loader = Loader()
    for _ in range(3):
        for _ in a.install.watch(loader):
            pass
    for _ in a.install.watch(x for x in [[1]]):     # a new object: a stream of its own
        pass
    made = a.state.STREAMS
    assert [(s.name, len(s.epochs)) for s in made] == [("Loader#0", 3), ("generator#1", 1)]
    assert [ep.rows for ep in made[0].epochs] == [[3] * 4] * 3
