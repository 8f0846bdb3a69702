"""The profile's recommendation compares steady rates only: a variant whose runs had no steady
window has no steady rate (NaN, not its whole-run rate), and the recommendation says the runs
were too short instead of a ratio."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

from stallbench.analysis import loader_search
from stallbench.profile import merge


def _variant(name: str, knobs: dict, steady: float, whole: float, wait_share: float = 0.7,
             step_ms: float = 10.0, repeats: int = 1) -> NS:
    reps = [NS(phases=None, compute_s=step_ms / 1e3 * 100, batches=100, ranks=[],
               steady_throughput_samples_s=steady) for _ in range(repeats)]
    return NS(name=name, knobs=knobs, attribution=None, repeats=reps,
              phases=NS(steady_samples_s=NS(median=steady),
                        steady_stall_share=NS(median=wait_share)),
              stall_share=NS(median=wait_share), throughput_samples_s=NS(median=whole))


def test_no_steady_window_gives_no_steady_ratio() -> None:
    base = _variant("num_workers=0", {"dataloader.num_workers": 0}, math.nan, 900.0)
    other = _variant("num_workers=2", {"dataloader.num_workers": 2}, 3000.0, 1200.0)
    assert math.isnan(loader_search.steady_rate(base))
    for vs in ([base, other], [other, base]):
        rec = loader_search.recommend(vs)
        assert "too short for a steady state" in rec.text
        assert "num_workers=0" in rec.text.split("too short")[0]
        assert rec.measured_speedup is None and rec.action == "keep"
    rec = loader_search.recommend([_variant("a", {"dataloader.num_workers": 0}, 1000.0, 900.0),
                             _variant("b", {"dataloader.num_workers": 2}, 3000.0, 1200.0)])
    assert rec.measured_speedup == 3.0 and "3.00x" in rec.text
    assert "one repeat: no interval" in rec.text


def test_a_measured_gain_the_wait_cannot_explain_is_not_the_knobs() -> None:
    """Issue 39: the baseline waited 14% (bound 1/(1 - 0.14) = 1.16x); a variant measured
    2.47x with the same step is not the knob's gain, nor one whose step halved."""
    base = _variant("a", {"dataloader.num_workers": 0}, 1000.0, 900.0, wait_share=0.14,
                    repeats=2)
    fast = _variant("b", {"dataloader.num_workers": 2}, 2470.0, 2000.0, wait_share=0.01,
                    repeats=2)
    rec = loader_search.recommend([base, fast])
    assert rec.action == "keep" and rec.conclusive is False
    assert "more than the baseline's wait allows (1.16x" in rec.text, rec.text
    assert "model step changed" not in rec.text
    halved = _variant("b", {"dataloader.num_workers": 2}, 1150.0, 1100.0, wait_share=0.01,
                      step_ms=5.0, repeats=2)
    rec = loader_search.recommend([base, halved])
    assert rec.action == "keep" and "model step changed" in rec.text, rec.text
    # within the bound and the same step: the knob's gain, measured, with its interval
    ok = _variant("b", {"dataloader.num_workers": 2}, 1150.0, 1100.0, wait_share=0.01,
                  repeats=2)
    rec = loader_search.recommend([base, ok])
    assert rec.conclusive and rec.measured_speedup == 1.15 and "over 2 repeats" in rec.text


def test_a_stream_with_too_few_batches_has_no_steady_rate() -> None:
    s = merge.StreamRun(name="D#0", kind="torch.DataLoader", rank=0, key="1:0", settings={},
                        notes=[], wait=[0.5], step=[0.01], rows=[8], t_start=[0.0],
                        epoch_s=0.51)
    f = merge.figures(s)
    assert not f.phases.has_steady
    assert math.isnan(f.steady_throughput_samples_s)
    assert f.throughput_samples_s == 8 / 0.51


def _whatif(steady0: float, steady2: float, predicted1: float) -> NS:
    measured = [NS(n=0, variant="num_workers=0", measured_samples_s=500.0,
                   measured_steady_samples_s=steady0),
                NS(n=2, variant="num_workers=2", measured_samples_s=160.0,
                   measured_steady_samples_s=steady2)]
    wi = NS(measured=measured, model=NS(kind="one-point"), note="fitted on 1", backtest=None,
            knee=NS(n=1, saturates_at=None, explanation="CPU-bound"),
            points=[NS(n=1, predicted_samples_s=predicted1, low_samples_s=None,
                       high_samples_s=None)])
    return NS(analysis=NS(whatif=wi))


def test_knee_never_prints_nan_for_runs_without_a_steady_rate() -> None:
    """A job that breaks after 40 batches (pkg.train-style) had no steady window in either
    variant (NaN): the knee's advice printed 'PREDICTED nanx the best measured'."""
    from stallbench.report import profile_lines

    text = "\n".join(profile_lines.knee_lines(_whatif(math.nan, math.nan, 76.0)))
    assert "nan" not in text.lower(), text
    assert "whole run" in text and "num_workers=0" in text, text


def test_knee_does_not_advise_trying_what_it_predicts_slower() -> None:
    """The knee predicted at 0.67x the best measured variant is no reason to try it: the
    advice keeps the measured best (what the measured recommendation says too)."""
    from stallbench.report import profile_lines

    lines = profile_lines.knee_lines(_whatif(181_000.0, 125_000.0, 122_000.0))
    rec = next(x for x in lines if "recommendation" in x)
    assert "try num_workers=1" not in rec and "keep num_workers=0" in rec, rec
    assert "0.67x" in rec, rec
    lines = profile_lines.knee_lines(_whatif(1000.0, 1500.0, 3000.0))
    rec = next(x for x in lines if "recommendation" in x)
    assert "try num_workers=1" in rec and "2.00x the best measured (num_workers=2)" in rec, rec


def test_knee_at_a_measured_count_slower_than_another_keeps_the_faster() -> None:
    """pkg.train-style job on a busy 2-core machine: the model put the knee at 2 workers
    (measured 649 steady samples/s) while 0 workers measured 1,075: the knee's advice said
    'num_workers=2' beside the measured recommendation 'keep num_workers=0'."""
    from stallbench.report import profile_lines

    r = _whatif(1075.0, 649.0, 0.0)
    r.analysis.whatif.knee.n = 2
    rec = next(x for x in profile_lines.knee_lines(r) if "recommendation" in x)
    assert "keep num_workers=0" in rec and "0.60x" in rec, rec
    r = _whatif(1075.0, 1649.0, 0.0)
    r.analysis.whatif.knee.n = 2
    rec = next(x for x in profile_lines.knee_lines(r) if "recommendation" in x)
    assert "num_workers=2 on your DataLoader (MEASURED 1,649" in rec, rec


def test_knee_not_predicted_gives_the_reason_and_no_figure() -> None:
    """Issue 39: a knee at an unmeasured count whose back-test missed by more than its
    threshold prints "not predicted (reason)", no PREDICTED figure and no gain to try."""
    from stallbench.report import profile_lines

    r = _whatif(1000.0, 1500.0, 3000.0)
    r.analysis.whatif.points[0].not_predicted = ("the one-point what-if's leave-one-out "
                                                 "back-test missed a measured count by 150%")
    text = "\n".join(profile_lines.knee_lines(r))
    assert "knee: 1 worker(s), not predicted (the one-point what-if's" in text, text
    assert "PREDICTED" not in text and "x the best measured" not in text, text
    assert "--set dataloader.num_workers=0,2,1" in text, text


def test_the_answer_is_decided_once_and_assembled_as_given() -> None:
    """Issue 55: ``profile`` and ``tune`` each decide their result's answer once in
    ``analysis.loader_search``; the best variant is the fastest advisable in steady state (a
    profile's) or the confirmed answer (a tune's, even where another variant measured faster)."""
    base = _variant("a", {"dataloader.num_workers": 0}, 1000.0, 900.0)
    fast = _variant("b", {"dataloader.num_workers": 2}, 3000.0, 1200.0)
    ans = loader_search.profile_answer([base, fast])
    assert ans.best_variant == "b" and ans.whatif
    assert ans.recommendation.text == loader_search.recommend([base, fast]).text
    one = loader_search.profile_answer([base])
    assert one.best_variant is None and one.recommendation is None
    best = NS(name="a", speedup=1.0, stop_text="nothing left")
    tuned = loader_search.tune_answer(best, {}, [base, fast])
    assert tuned.best_variant == "a" and tuned.recommendation.action == "keep"
    assert tuned.recommendation.text == "recommendation: keep the job as written (nothing left)"
