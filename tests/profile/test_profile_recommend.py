"""The profile's recommendation compares steady rates only: a variant whose runs had no steady
window has no steady rate (NaN, not its whole-run rate), and the recommendation says the runs
were too short instead of a ratio."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

from stallbench.profile import merge, session


def _variant(name: str, knobs: dict, steady: float, whole: float) -> NS:
    return NS(name=name, knobs=knobs, phases=NS(steady_samples_s=NS(median=steady)),
              throughput_samples_s=NS(median=whole))


def test_no_steady_window_gives_no_steady_ratio() -> None:
    base = _variant("num_workers=0", {"dataloader.num_workers": 0}, math.nan, 900.0)
    other = _variant("num_workers=2", {"dataloader.num_workers": 2}, 3000.0, 1200.0)
    assert math.isnan(session.steady_rate(base))
    for vs in ([base, other], [other, base]):
        rec = session.recommend(vs)
        assert "too short for a steady state" in rec.text
        assert "num_workers=0" in rec.text.split("too short")[0]
        assert rec.measured_speedup is None and rec.action == "keep"
    rec = session.recommend([_variant("a", {"dataloader.num_workers": 0}, 1000.0, 900.0),
                             _variant("b", {"dataloader.num_workers": 2}, 3000.0, 1200.0)])
    assert rec.measured_speedup == 3.0 and "3.00x" in rec.text


def test_a_stream_with_too_few_batches_has_no_steady_rate() -> None:
    s = merge.StreamRun(name="D#0", kind="torch.DataLoader", rank=0, key="1:0", settings={},
                        notes=[], wait=[0.5], step=[0.01], rows=[8], t_start=[0.0],
                        epoch_s=0.51)
    f = merge.figures(s)
    assert not f.phases.has_steady
    assert math.isnan(f.steady_throughput_samples_s)
    assert f.throughput_samples_s == 8 / 0.51
