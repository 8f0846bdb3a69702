"""The decider of ``stallbench tune -- CMD`` (``analysis.loader_search``): each next trial is
what the measured evidence calls for, with the figure that chose it; no fixed answer."""

from __future__ import annotations

import math

from stallbench.analysis import knob_table
from stallbench.analysis import loader_search as ls

ROWS = 8.0


def trial(settings=None, *, rate, wait_s, step_s=0.020, workers=0, persistent=False,
          startup_share=0.0, p90=None, cuda=False, threads=1, epochs=6, pin=False,
          cpu_share=1.0, prefetch=None, ok=True) -> ls.Trial:
    """A trial whose whole-span wait share follows from its per-batch wait and step."""
    per = wait_s + step_s
    return ls.Trial(settings=dict(settings or {}), rate=rate, wait_share=wait_s / per,
                    step_s=step_s, wait_s=wait_s, wait_p90_s=p90 if p90 is not None else wait_s,
                    startup_share=startup_share, rows=ROWS, workers=workers,
                    persistent=persistent, prefetch_factor=prefetch, pin_memory=pin, cuda=cuda,
                    threads=threads, epochs=epochs, ok=ok, producer_cpu_share=cpu_share)


TORCH_DOOR = ("dataloader", "torch")      # the groups torch's DataLoader door honours


def ctx(ceiling=400.0, cores=2.0, groups=TORCH_DOOR, keys=None) -> ls.Context:
    """The tune's context for a loader whose door honours ``groups``: every key the table
    searches there, unless ``keys`` limits them."""
    known = [k.key for k in knob_table.searched_for(groups)]
    return ls.Context(cores=cores, ceiling=ceiling, keys=frozenset(keys or known))


def test_a_job_at_its_ceiling_stops_after_the_baseline() -> None:
    d = ls.decide(ctx(ceiling=400.0), [trial(rate=390.0, wait_s=0.0005)], [{}])
    assert d.choice is None and d.stop_reason == "at_ceiling"
    assert "98% of the compute-only ceiling" in d.stop_text


def test_the_knee_from_the_loops_own_fetch_wait() -> None:
    """0 workers, 16 ms of fetch per batch against a 20 ms step: one worker is the knee,
    not two (a fixed "2 workers" rule would be wrong here)."""
    base = trial(rate=ROWS / 0.036, wait_s=0.016)
    d = ls.decide(ctx(), [base], [{}])
    assert d.choice is not None
    assert d.choice.settings == {"dataloader.num_workers": 1}
    assert d.choice.predicted == 400.0          # capped at the measured ceiling
    assert "16.0 ms per batch" in d.choice.why and "knee is 1" in d.choice.why


def test_the_knee_is_bounded_by_the_cores_where_the_stages_burn_cpu() -> None:
    base = trial(rate=ROWS / 0.1, wait_s=0.080, cpu_share=0.98)
    d = ls.decide(ctx(ceiling=None), [base], [{}])
    assert d.choice.settings == {"dataloader.num_workers": 2}
    assert "beyond the 2 workers" in d.choice.why
    io = trial(rate=ROWS / 0.1, wait_s=0.080, cpu_share=0.05)    # storage waits: 4 per core
    d = ls.decide(ctx(ceiling=None), [io], [{}])
    assert d.choice.settings == {"dataloader.num_workers": 4}


def test_the_cores_are_shared_by_the_ranks_on_the_machine() -> None:
    """8 ranks on 16 cores (a torchrun node): each rank's loader has 2 cores, so a CPU-bound
    stage's knee stops at 2 workers per rank (16 more processes), not 16 (128); where the
    stages mostly wait, more per core as on one rank."""
    base = trial(rate=ROWS / 0.1, wait_s=0.080, cpu_share=0.98)
    node = ls.Context(cores=16.0, ceiling=None, ranks=8,
                      keys=frozenset(k.key for k in knob_table.searched_for(TORCH_DOOR)))
    d = ls.decide(node, [base], [{}])
    assert d.choice.settings == {"dataloader.num_workers": 2}
    assert "16 cores shared by its 8 ranks (2 each)" in d.choice.why
    io = trial(rate=ROWS / 0.1, wait_s=0.080, cpu_share=0.05)
    assert ls.decide(node, [io], [{}]).choice.settings == {"dataloader.num_workers": 4}
    alone = ls.Context(cores=16.0, ceiling=None, keys=node.keys)     # one rank: all 16
    assert ls.decide(alone, [base], [{}]).choice.settings == {"dataloader.num_workers": 4}


def test_workers_forked_every_epoch_call_for_persistent_workers() -> None:
    """The worker trial lost to the job as written (its workers' start-up each epoch): the
    next trial keeps them, at the same worker count, predicted from the start-up share."""
    base = trial(rate=ROWS / 0.036, wait_s=0.016)
    w1 = trial({"dataloader.num_workers": 1}, rate=120.0, wait_s=0.001, workers=1,
               startup_share=0.6)
    d = ls.decide(ctx(), [base, w1], [{}, {"dataloader.num_workers": 1}])
    assert d.choice.settings == {"dataloader.num_workers": 1,
                                 "dataloader.persistent_workers": True}
    assert math.isclose(d.choice.predicted, 300.0)
    assert "60%" in d.choice.why


def test_a_hand_off_wait_is_not_taken_for_too_few_workers() -> None:
    """1 worker that keeps up leaves the loop waiting ~1.3 ms per batch (unpickling): not a
    reason for a second worker."""
    base = trial(rate=ROWS / 0.040, wait_s=0.010, step_s=0.030)
    w1 = trial({"dataloader.num_workers": 1}, rate=ROWS / 0.0313, wait_s=0.0013, step_s=0.030,
               workers=1, persistent=True)
    d = ls.decide(ctx(ceiling=ROWS / 0.030), [base, w1],
                  [{}, {"dataloader.num_workers": 1}])
    assert d.choice is None or d.choice.settings.get("dataloader.num_workers") != 2


def test_a_thread_storm_calls_for_the_trainers_threads() -> None:
    base = trial(rate=ROWS / 0.05, wait_s=0.030, step_s=0.020, threads=2)
    w2 = trial({"dataloader.num_workers": 2}, rate=ROWS / 0.06, wait_s=0.0, step_s=0.060,
               workers=2, persistent=True, threads=2)
    d = ls.decide(ctx(ceiling=ROWS / 0.02), [base, w2], [{}, {"dataloader.num_workers": 2}])
    assert d.choice.settings["torch.num_threads"] == 1
    assert "oversubscribe" in d.choice.why
    # on a CUDA job the step is the GPU's: never the thread budget
    w2c = trial({"dataloader.num_workers": 2}, rate=ROWS / 0.06, wait_s=0.0, step_s=0.060,
                workers=2, persistent=True, threads=2, cuda=True)
    d = ls.decide(ctx(ceiling=ROWS / 0.02), [base, w2c], [{}, {"dataloader.num_workers": 2}])
    assert d.choice is None or "torch.num_threads" not in d.choice.settings


def test_pin_memory_only_where_batches_reach_a_cuda_device() -> None:
    kw = dict(rate=ROWS / 0.03, wait_s=0.010, workers=2, persistent=True, p90=0.010)
    cpu = ls.decide(ctx(ceiling=None), [trial({"dataloader.num_workers": 2}, **kw)],
                    [{"dataloader.num_workers": 2}])
    assert cpu.choice is None or "dataloader.pin_memory" not in cpu.choice.settings
    gpu = ls.decide(ctx(ceiling=None, keys=("dataloader.pin_memory",)),
                    [trial({"dataloader.num_workers": 2}, cuda=True, **kw)],
                    [{"dataloader.num_workers": 2}])
    assert gpu.choice.settings["dataloader.pin_memory"] is True


def test_ray_prefetch_doubles_while_it_pays_and_stops_when_it_does_not() -> None:
    c = ctx(groups=("ray",), ceiling=None)
    base = trial(rate=100.0, wait_s=0.02)
    d = ls.decide(c, [base], [{}])
    assert d.choice.settings == {"ray.prefetch_batches": 2}
    p2 = trial({"ray.prefetch_batches": 2}, rate=101.0, wait_s=0.02)    # +1%: spent
    d = ls.decide(c, [base, p2], [{}, {"ray.prefetch_batches": 2}])
    assert d.choice is None and d.stop_reason == "no_gain_predicted"


def test_a_failed_setting_is_never_tried_again_and_the_search_goes_on() -> None:
    base = trial(rate=ROWS / 0.1, wait_s=0.080, cpu_share=0.98)
    failed = ls.Trial(settings={"dataloader.num_workers": 2}, rate=0.0, wait_share=math.nan,
                      step_s=math.nan, wait_s=0.0, wait_p90_s=0.0, startup_share=0.0,
                      rows=math.nan, workers=0, persistent=False, prefetch_factor=None,
                      pin_memory=False, cuda=False, threads=None, epochs=0, ok=False)
    d = ls.decide(ctx(ceiling=None), [base, failed], [{}, {"dataloader.num_workers": 2}])
    assert d.choice is None or d.choice.settings != {"dataloader.num_workers": 2}


def test_keys_limit_what_it_may_change() -> None:
    base = trial(rate=ROWS / 0.036, wait_s=0.016)
    d = ls.decide(ctx(keys=("torch.num_threads",)), [base], [{}])
    assert d.choice is None and d.stop_reason == "no_gain_predicted"


def test_the_answer_as_the_user_writes_it() -> None:
    s = {"dataloader.num_workers": 2, "dataloader.persistent_workers": True}
    assert ls.apply_text(s) == "DataLoader(..., num_workers=2, persistent_workers=True)"
    assert ls.bare(s) == {"num_workers": 2, "persistent_workers": True}
    assert ls.bare({"torch.num_threads": 1, "ray.prefetch_batches": 4}) == \
        {"torch.num_threads": 1, "prefetch_batches": 4}
    assert ls.apply_text({"ray.prefetch_batches": 4}) == \
        "iter_torch_batches(..., prefetch_batches=4)"
    assert ls.apply_text({"torch.num_threads": 1, "dataloader.num_workers": 2}) == \
        ("DataLoader(..., num_workers=2); torch.set_num_threads(1) before the first op (or "
         "OMP_NUM_THREADS)")
    assert ls.dotted({"num_workers": 2, "torch.num_threads": 1}, TORCH_DOOR) == \
        {"dataloader.num_workers": 2, "torch.num_threads": 1}
    assert ls.dotted({"prefetch_batches": 4}, ("ray",)) == {"ray.prefetch_batches": 4}


def test_a_best_is_the_answer_only_when_its_confirmation_holds() -> None:
    assert ls.not_confirmed("nw=2", 1.57, [1.58, 1.56]) == ""
    assert "under 3%" in ls.not_confirmed("nw=2", 1.02, [1.03, 1.01])
    assert "range 0.98-1.20" in ls.not_confirmed("nw=2", 1.09, [1.20, 0.98])


def test_a_best_that_failed_in_its_confirmation_is_not_the_answer() -> None:
    why = ls.not_confirmed("nw=2", 1.6, [1.6], ["confirmation 1: the job exited with code 1"])
    assert "exited with code 1" in why
    assert "pair" in ls.not_confirmed("nw=2", 1.6, [1.6])       # no confirmation pair measured


def test_threads_without_a_fewer_worker_trial_from_the_oversubscription_read() -> None:
    """The job as written runs 2 workers beside 2 torch threads on 2 cores: no trial with
    fewer workers to compare its step with, so the oversubscription read in the job calls
    for the trainer's threads, with no predicted figure."""
    w2 = trial(rate=300.0, wait_s=0.001, workers=2, persistent=True, threads=2)
    d = ls.decide(ctx(ceiling=None, keys=("torch.num_threads",)), [w2], [{}])
    assert d.choice.settings == {"torch.num_threads": 1} and d.choice.predicted is None
    assert "read in the job" in d.choice.why


# --------------------------------------------------------------------- issue 58
def _moved(t: ls.Trial, foreign: float) -> ls.Trial:
    import dataclasses
    return dataclasses.replace(t, foreign_cores=foreign)


def test_a_losing_direction_is_not_pushed_further() -> None:
    """Issue 58: on 2 cores tune climbed to 5-8 workers, every step slower than the job as
    written. A count that lost bounds the next: halfway between the best and it, never
    above it."""
    base = trial(rate=ROWS / 0.1, wait_s=0.080, cpu_share=0.05)        # knee 4 (I/O rule)
    w4 = trial({"dataloader.num_workers": 4}, rate=ROWS / 0.1 * 0.9, wait_s=0.05, workers=4)
    d = ls.decide(ctx(ceiling=None), [base, w4], [{}, w4.settings])
    nxt = d.choice.settings.get("dataloader.num_workers") if d.choice else None
    assert nxt is None or nxt < 4, d.choice
    assert d.choice is not None and nxt == 2
    w2 = trial({"dataloader.num_workers": 2}, rate=ROWS / 0.1 * 0.95, wait_s=0.05, workers=2)
    d = ls.decide(ctx(ceiling=None), [base, w4, w2], [{}, w4.settings, w2.settings])
    nxt = d.choice.settings.get("dataloader.num_workers") if d.choice else None
    assert nxt in (None, 1), d.choice
    assert ls.lost_above([base, w4, w2], base) == 2


def test_a_trial_that_lost_while_the_load_moved_is_measured_again() -> None:
    """Issue 58: one num_workers=1 trial at 0.75x under a load that moved ended a search."""
    base = _moved(trial(rate=ROWS / 0.036, wait_s=0.016), 0.0)
    one = _moved(trial({"dataloader.num_workers": 1}, rate=ROWS / 0.036 * 0.75, wait_s=0.02,
                       workers=1), 1.2)
    d = ls.decide(ctx(), [base, one], [{}, one.settings])
    assert d.choice is not None and d.choice.settings == one.settings
    assert "moved" in d.choice.why and "1.20 cores" in d.choice.why
    again = _moved(one, 0.0)
    d = ls.decide(ctx(), [base, one, again], [{}, one.settings, one.settings])
    assert d.choice is None or d.choice.settings != one.settings     # measured twice: done
    steady = _moved(one, 0.1)                                          # the load held: no repeat
    assert ls.repeat_moved([base, steady]) is None


def test_a_ceiling_never_contradicts_the_measured_wait() -> None:
    """Issue 58: "at_ceiling: no loader setting can buy more than 1%" beside "(wait 12%)"."""
    base = trial(rate=100.0, wait_s=0.0030, step_s=0.020)          # waits 13% of its steady
    d = ls.decide(ctx(ceiling=101.0), [base], [{}])
    assert d.stop_reason != "at_ceiling", d.stop_text
    quiet = trial(rate=100.0, wait_s=0.0003, step_s=0.020)         # 1.5%: the ceiling holds
    assert ls.decide(ctx(ceiling=101.0), [quiet], [{}]).stop_reason == "at_ceiling"
    assert "the loop waits" in ls.decide(ctx(ceiling=101.0), [quiet], [{}]).stop_text


def test_keep_without_a_trial_is_not_an_answer() -> None:
    from stallbench.results import JobTuneBest
    b = JobTuneBest(name="default", settings={}, steady_samples_s=100.0, speedup=1.0,
                    ceiling_share=None, stop_reason="budget", stop_text="the budget ...",
                    answered=False)
    rec = ls.recommendation(b, {})
    assert rec.text.startswith("recommendation: none") and rec.conclusive is False
    b.answered, b.stop_reason = True, "no_gain_predicted"
    assert ls.recommendation(b, {}).text.startswith("recommendation: keep")


def test_the_answer_names_its_basis_and_the_whole_job() -> None:
    from stallbench.results import JobTuneBest
    b = JobTuneBest(name="w1", settings={"num_workers": 1}, steady_samples_s=130.0,
                    speedup=1.31, ceiling_share=None, stop_reason="no_gain_predicted",
                    stop_text="", basis="second epoch on, start-ups included",
                    whole_job_speedup=0.98, whole_job_basis="measured: both runs ran the "
                                                            "whole job")
    text = ls.recommendation(b, {"dataloader.num_workers": 1}).text
    assert "second epoch on" in text and "the whole job 0.98x" in text
