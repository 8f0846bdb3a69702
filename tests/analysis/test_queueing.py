"""Producers waiting for a core (``analysis.queueing``): the repairman model against values
derived by hand, its two limits (the workers and the cores terms), and the what-if's workers
term that uses it."""

from __future__ import annotations

import pytest

from stallbench.analysis.queueing import queued_rate, waiting_share
from stallbench.analysis.whatif import predict

from factories import whatif_model as model


def test_nobody_waits_with_a_core_each() -> None:
    assert queued_rate(4, think=3.0, service=1.0, cores=4) == pytest.approx(1.0)
    assert queued_rate(4, think=3.0, service=1.0, cores=16) == pytest.approx(1.0)
    assert waiting_share(4, 3.0, 1.0, 4) == 0.0


def test_all_on_the_cpu_is_the_cores_term() -> None:
    assert queued_rate(8, think=0.0, service=2.0, cores=2) == pytest.approx(1.0)
    assert queued_rate(8, think=0.0, service=2.0, cores=1.5) == pytest.approx(0.75)


def test_hand_derived_chains() -> None:
    # N = 2, c = 1, think = service = 1: weights 1, 2, 2 -> busy 4/5
    assert queued_rate(2, 1.0, 1.0, 1) == pytest.approx(0.8)
    # N = 3, c = 1: weights 1, 3, 6, 6 -> busy 15/16
    assert queued_rate(3, 1.0, 1.0, 1) == pytest.approx(15 / 16)
    # N = 3, c = 2, think = 2, service = 1: weights 1, 3/2, 3/4, 3/16
    w = [1, 1.5, 0.75, 0.1875]
    busy = (w[1] * 1 + w[2] * 2 + w[3] * 2) / sum(w)
    assert queued_rate(3, 2.0, 1.0, 2) == pytest.approx(busy)
    assert waiting_share(3, 2.0, 1.0, 2) == pytest.approx(3 / busy / 3 - 1)


def test_many_sources_do_not_overflow() -> None:
    r = queued_rate(4096, think=1e-9, service=1.0, cores=64)
    assert r == pytest.approx(64.0, rel=1e-6)


def test_workers_that_mostly_wait_share_two_cores() -> None:
    # 100 us per sample of which 80 us storage wait, 20 us CPU: 8 workers on 2 cores ask
    # for 1.6 cores; some bursts find both taken, so they deliver less than 8 / 100 us
    m = model(fetch=90, prep=10, xfer=0, compute=1, io=80, cores=2)
    p = predict(m, 8)
    assert p.binding == "workers"
    expected = queued_rate(8, 80e-6, 20e-6, 2)
    assert p.throughput_samples_s == pytest.approx(expected, rel=1e-6)
    assert p.throughput_samples_s < 0.95 * 8 / 100e-6
    assert "waiting for a core (PREDICTED)" in p.why
    # with a core each nobody waits: the formula before the queue
    q = predict(model(fetch=90, prep=10, xfer=0, compute=1, io=80, cores=8), 8)
    assert q.throughput_samples_s == pytest.approx(8 / 100e-6)
    assert "waiting" not in q.why
