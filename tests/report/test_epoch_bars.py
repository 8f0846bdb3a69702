"""The report's "Where the epoch goes" (issue 42): every bar's length equals its label, a
negative part drawn (hatched, back from the positive end) rather than left out, each series
named in the legend in its own colour, and no label past the figure's edge."""

from __future__ import annotations

from typing import Any

import pytest

from stallbench.analysis import figures
from stallbench.report import plots


def test_bar_length_is_its_label_with_a_negative_part(monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rows = [{"name": "a", "segments": [("compute (compute-only run)", 10.0, None),
                                       ("fetch stall (attributed)", 7.0, (6.0, 8.0)),
                                       ("preprocess stall (attributed)", -3.26, (-4.0, -2.5))],
             "total_range": None},
            {"name": "b", "segments": [("compute (compute-only run)", 4.0, None),
                                       ("fetch stall (attributed)", 1.5, None)],
             "total_range": None}]
    got: list[Any] = []
    monkeypatch.setattr(plots, "png", lambda fig: got.append(fig) or "png")
    assert plots.epoch_breakdown(rows) == "png"
    fig = got[0]
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    ends: dict[float, float] = {}
    for p in ax.patches:
        y = round(p.get_y() + p.get_height() / 2, 3)
        ends[y] = ends.get(y, 0.0) + p.get_width()      # signed widths: the drawn net length
    assert sorted(round(x, 6) for x in ends.values()) == [5.5, 13.74]
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert len(hatched) == 1 and hatched[0].get_width() == pytest.approx(-3.26)
    labels = sorted(t.get_text() for t in ax.texts)
    assert labels == sorted([figures.seconds(13.74), figures.seconds(5.5)])
    # every series named once in the legend, each quantity its own colour
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["compute (compute-only run)", "fetch stall (attributed)",
                      "preprocess stall (attributed), below 0 (cancels the hatched length)"]
    # nothing drawn past the figure's right edge (the "not drawi" cut at 1400 px)
    r = fig.canvas.get_renderer()
    width = fig.bbox.width
    for t in ax.texts:
        assert t.get_window_extent(r).x1 <= width, t.get_text()


def test_one_colour_per_quantity() -> None:
    labels = ["compute (compute-only run)", "compute", "fetch stall (attributed)",
              "wait for a batch", "transfer stall (attributed)", "transfer (trainer side)",
              "preprocess stall (attributed)", "loader overhead (attributed)",
              "start-up (beyond the steady rate)", "other"]
    colours = [plots.series_color(x) for x in labels]
    assert len(set(colours)) == len(labels), dict(zip(labels, colours))
    # a profiled job's parts are the same quantities under the job's own names
    for part in ("fetch", "preprocess", "transfer", "overhead"):
        job, scenario = (figures.part_name(part, on_job) for on_job in (True, False))
        assert plots.series_color(job + " stall (attributed)") == \
            plots.series_color(scenario + " stall (attributed)"), part


def test_whatif_legend_is_beside_the_axes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The what-if's legend sat over its curve (issue 42): it is drawn outside the axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from stallbench.results import WhatIfPoint

    pts = [WhatIfPoint(n=n, predicted_samples_s=1000.0 * min(n + 1, 4), stall_share=0.0,
                       bound_by="compute" if n >= 3 else "fetch", why="")
           for n in range(0, 7)]
    got: list[Any] = []
    monkeypatch.setattr(plots, "png", lambda fig: got.append(fig) or "png")
    assert plots.whatif(pts) == "png"
    fig = got[0]
    FigureCanvasAgg(fig).draw()
    r = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend, axes = ax.get_legend().get_window_extent(r), ax.get_window_extent(r)
    assert legend.x0 >= axes.x1 - 1 and legend.x1 <= fig.bbox.width + 1


def test_runs_legend_names_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """"Runs side by side" named 1 of 3 runs: a run without the first variant got no entry."""
    runs = [{"label": "run 1", "values": {"b": [10.0, 11.0]}},
            {"label": "run 2", "values": {"a": [5.0], "b": [9.0]}},
            {"label": "run 3", "values": {"a": [6.0, 6.5], "b": [12.0]}}]
    got: list[Any] = []
    monkeypatch.setattr(plots, "png", lambda fig: got.append(fig) or "png")
    assert plots.throughput(["a", "b"], runs) == "png"
    legend = [t.get_text() for t in got[0].axes[0].get_legend().get_texts()]
    assert legend == ["run 1", "run 2", "run 3"]
