"""Runtimes kept across the variants of a scenario (``executors.runtimes``) and the order the
runner runs variants in so that each cluster shape starts once."""

from __future__ import annotations

import pytest

from stallbench import scenario
from stallbench.executors import runtimes
from stallbench.run.runner import run_order


class Fake:
    opened = 0

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_without_a_scope_release_closes_at_once() -> None:
    rt, reused = runtimes.acquire("a", lambda: Fake("a"), group="ray")
    assert not reused
    runtimes.release(rt)
    assert rt.closed == 1


def test_a_scope_reuses_by_key_and_closes_everything_at_its_end() -> None:
    with runtimes.RuntimeScope():
        a1, r1 = runtimes.acquire("a", lambda: Fake("a"), group="ray")
        runtimes.release(a1)
        a2, r2 = runtimes.acquire("a", lambda: Fake("a2"), group="ray")
        assert a2 is a1 and (r1, r2) == (False, True) and a1.closed == 0
        runtimes.release(a2)
        # another shape of the same group: the cached one is closed first (one Ray per process)
        b, rb = runtimes.acquire("b", lambda: Fake("b"), group="ray")
        assert not rb and a1.closed == 1
        other, _ = runtimes.acquire("x", lambda: Fake("x"), group="other")
        assert b.closed == 0                      # other groups coexist
        runtimes.release(b)
        runtimes.release(other)
        assert b.closed == 0 and other.closed == 0
    assert b.closed == 1 and other.closed == 1 and a1.closed == 1
    assert runtimes.active() is None


def test_an_error_or_ctrl_c_still_closes_the_cached_runtimes() -> None:
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with runtimes.RuntimeScope():
                rt, _ = runtimes.acquire("a", lambda: Fake("a"), group="ray")
                raise exc
        assert rt.closed == 1 and runtimes.active() is None


class Listening(Fake):
    """A runtime that wants to know the scope failed (the Ray runtime keeps its log)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.told: list[object] = []

    def failed(self, exc: Exception) -> None:
        assert self.closed == 0            # told before it closes
        self.told.append(exc)


def test_a_scope_ending_on_an_error_tells_its_runtimes_before_closing() -> None:
    boom = RuntimeError("boom")
    with pytest.raises(RuntimeError):
        with runtimes.RuntimeScope():
            rt, _ = runtimes.acquire("a", lambda: Listening("a"), group="ray")
            raise boom
    assert rt.told == [boom] and rt.closed == 1
    # a run that ends well, or that the user stops (Ctrl-C, SIGTERM), did not fail
    for ending in (None, KeyboardInterrupt()):
        with pytest.raises(KeyboardInterrupt) if ending else _nothing():
            with runtimes.RuntimeScope():
                rt, _ = runtimes.acquire("a", lambda: Listening("a"), group="ray")
                if ending:
                    raise ending
        assert rt.told == [] and rt.closed == 1


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def test_an_unhealthy_runtime_is_not_kept() -> None:
    with runtimes.RuntimeScope():
        rt, _ = runtimes.acquire("a", lambda: Fake("a"), group="ray")
        runtimes.release(rt, healthy=False)
        assert rt.closed == 1
        again, reused = runtimes.acquire("a", lambda: Fake("a2"), group="ray")
        assert not reused and again is not rt


def _shape_changes(sc: scenario.Scenario, order: list[int]) -> int:
    shapes = [sc.variants[i].config.executor.simulated_nodes for i in order]
    return sum(a != b for a, b in zip(shapes, shapes[1:]))


@pytest.mark.parametrize("matrix", [
    '"executor.simulated_nodes" = [1, 2]\n"loader.batch_format" = ["rows", "columnar"]',
    '"loader.batch_format" = ["rows", "columnar"]\n"executor.simulated_nodes" = [1, 2]',
])
def test_variants_of_one_cluster_shape_run_one_after_the_other(matrix: str) -> None:
    sc = scenario.parse(f'name = "o"\n[executor]\nkind = "ray"\n[matrix]\n{matrix}\n', "o.toml")
    order = run_order(sc.variants)
    assert sorted(order) == list(range(4))
    assert _shape_changes(sc, order) == 1             # two shapes: one runtime start each
    assert sc.variants[order[0]] is sc.variants[0]    # the scenario's first variant runs first


def test_local_variants_keep_the_scenarios_order() -> None:
    sc = scenario.parse('name = "l"\n[matrix]\n"loader.num_workers" = [2, 0, 1]\n', "l.toml")
    assert run_order(sc.variants) == [0, 1, 2]


def test_startup_figures_per_variant_and_the_run_note() -> None:
    import factories
    from stallbench.report import tables
    from stallbench.run.runner import startup_figures

    first = startup_figures(12.5, {"runtime": "started", "ray_init_s": 9.0,
                                   "warm_workers_s": 3.0, "warm_plan_s": 0.5})
    again = startup_figures(0.4, {"runtime": "reused", "ray_init_s": 0.0, "warm_workers_s": 0.0,
                                  "warm_plan_s": 0.4})
    local = startup_figures(0.01, {})
    assert (first.runtime, first.runtime_start_s, first.warm_s) == ("started", 9.0, 3.5)
    assert (again.runtime, again.runtime_start_s) == ("reused", 0.0)
    assert local.runtime == "none" and local.parts == {}
    a, b = factories.variant("a", [1.0]), factories.variant("b", [1.0])
    a.startup, b.startup = first, again
    assert tables.startup_note(factories.result([a, b])) == \
        "executor start-up (before the runs, not in epoch s): a 12.5 s (started), b 0.4 s (reused)"
    c = factories.variant("c", [1.0])
    c.startup = local
    assert tables.startup_note(factories.result([c])) is None
