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
