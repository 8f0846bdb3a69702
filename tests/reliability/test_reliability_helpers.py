"""The hostile-input tests' own helper: ``Watched.wait_for`` must not burn a core while a run
starts (it scanned every process of the machine each 2 ms) and must still see a fork within
~25 ms. A fake clock: no timing of this machine."""

from __future__ import annotations

from types import SimpleNamespace

import reliability_helpers as rh


def test_wait_for_backs_off_while_nothing_changes_and_not_after_a_change(monkeypatch) -> None:
    clock = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        clock[0] += s

    monkeypatch.setattr(rh.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(rh.time, "sleep", sleep)
    w = rh.Watched.__new__(rh.Watched)
    w.proc = SimpleNamespace(poll=lambda: None)
    # one process for 2 s, a second one from then on; the condition holds at 2.5 s
    w.children = lambda: [SimpleNamespace(pid=p) for p in ([1] if clock[0] < 2 else [1, 2])]
    assert w.wait_for(lambda kids: clock[0] >= 2.5, timeout=10)
    before = [s for s, t in zip(sleeps, _times(sleeps)) if t < 2]
    assert max(sleeps) <= rh.POLL_MAX_S
    assert len(before) < 2 / rh.POLL_MAX_S + 10, len(before)   # was 1,000 polls of 2 ms
    after = [s for s, t in zip(sleeps, _times(sleeps)) if t >= 2]
    assert after[0] == rh.POLL_MIN_S, after[:3]                 # the change: polled at once


def _times(sleeps: list[float]) -> list[float]:
    """The fake clock when each sleep began."""
    out, t = [], 0.0
    for s in sleeps:
        out.append(t)
        t += s
    return out
