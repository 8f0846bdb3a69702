"""``RAY FAULTS:`` lines of ``stallbench run`` (``report.tables.faults_lines``): a completed
run that lost Ray worker processes or producer nodes says so in one line per variant, with
what it cost (tasks re-run); a run without faults says nothing."""

from __future__ import annotations

from typing import Any, Callable

from stallbench.report import tables


def test_no_faults_no_line(make_result: Callable[..., Any]) -> None:
    assert tables.faults_lines(make_result()) == []


def test_lost_workers_and_nodes_are_one_line_per_variant(
        make_result: Callable[..., Any]) -> None:
    result = make_result()
    v = result.variants[0]
    v.repeats[0].executor_figures = {"faults": {
        "worker_deaths": 2, "task_retries": 3,
        "dead_workers": [{"pid": 11, "exit_type": 0}, {"pid": 12, "exit_type": 0}],
        "nodes_lost": [{"node_id": "1a2b3c4d5e6f", "reason": "health check failed.\nmore"}]}}
    lines = tables.faults_lines(result)
    assert len(lines) == 1 and "\n" not in lines[0], lines
    line = lines[0]
    assert line.startswith(f"RAY FAULTS: variant {v.name}: lost 1 producer node(s): node "
                           "1a2b3c4d (health check failed)"), line
    assert "2 Ray worker process(es) (pid 11, 12)" in line, line
    assert f"in 1 of {len(v.repeats)} run(s)" in line and "Ray re-ran 3 task(s)" in line, line
    assert "the run completed" in line, line
    # what it cost in seconds: this run against the variant's runs without a loss
    hit = v.repeats[0].epoch_s
    if len(v.repeats) > 1:
        import statistics

        base = statistics.median(r.epoch_s for r in v.repeats[1:])
        assert f"the run with the loss took {hit:.1f} s, {hit - base:+.1f} s against " \
               f"{base:.1f} s (median) of the {len(v.repeats) - 1} run(s) without one" in line, line
    else:
        assert f"the run with the loss took {hit:.1f} s, no run without a loss" in line, line


def test_the_cost_of_a_loss_in_seconds(make_result: Callable[..., Any]) -> None:
    """Two runs without a loss (10 s, 12 s) and one with (15 s): +4.0 s against 11.0 s."""
    result = make_result()
    v = result.variants[0]
    base = v.repeats[0]
    import dataclasses

    v.repeats = [dataclasses.replace(base, epoch_s=e) for e in (10.0, 15.0, 12.0)]
    v.repeats[1].executor_figures = {"faults": {"worker_deaths": 1, "task_retries": 1,
                                                "dead_workers": [{"pid": 7}]}}
    (line,) = tables.faults_lines(result)
    assert "in 1 of 3 run(s)" in line, line
    assert "the run with the loss took 15.0 s, +4.0 s against 11.0 s (median) of the 2 run(s) " \
           "without one" in line, line


def test_a_node_lost_before_the_runs_is_said(make_result: Callable[..., Any]) -> None:
    """Issue 26, class 6 (campaign case 39): a simulated node killed during start-up left a
    run that exited 0 on fewer nodes, said nowhere. The runs that began without it say so."""
    result = make_result()
    v = result.variants[0]
    for r in v.repeats:
        r.executor_figures = {"faults": {"nodes_lost_before_run": [
            {"node_id": "9f8e7d6c5b4a", "reason": "killed by SIGKILL"}]}}
    (line,) = tables.faults_lines(result)
    assert line == (f"RAY FAULTS: variant {v.name}: 1 producer node(s) lost before its measured "
                    f"runs began (node 9f8e7d6c (killed by SIGKILL)): {len(v.repeats)} of "
                    f"{len(v.repeats)} run(s) ran on the nodes left, and their figures are "
                    f"those of fewer nodes than the scenario asks for"), line
