"""The text of a profile (and of a tune of the user's job): the one printer that the terminal
(``stallbench profile`` / ``stallbench tune -- CMD``) and the HTML report share (issue 55).

Why one printer: the attribution's lines were printed from ``profile/ablate.py`` and said
again, in other words, by the report; two printers of one stored analysis drift apart. Every
figure here was decided in ``analysis`` and stored in the result (the attribution, the knee's
advice, the recommendation, the tune's answer); this module only writes it. It reads a
``Result`` and nothing else, so a result read back from a file prints as it did when it was
made.
"""

from __future__ import annotations

import math

from ..analysis import figures, knee, knob_table
from ..measure.load import busy_summary
from ..outputs import one_line
from ..results import Attribution, ProfileAnalysis, Result
from . import tables

LOADER_HEAD = ("per loader (medians over repeats; * = headline, the loader with most batches; "
               "wait = blocked on the next batch, step = the loop's time between batches):")


def text(result: Result) -> list[str]:
    """What the terminal printed for this result: a tune's search and answer, else the
    profile's figures (the report shows it as printed)."""
    return tune_lines(result) if result.tune is not None else lines(result)


def lines(result: Result) -> list[str]:
    """A profile's figures as ``stallbench profile`` prints them: the loaders, each variant's
    notes, the ranks, the ``--analyze`` attribution, the knee, a busy machine."""
    out = [LOADER_HEAD, *loader_table(result).splitlines()]
    for v in result.variants:
        if v.profile is not None and v.profile.ended_early:
            out.append(f"  {v.name}: {v.profile.ended_early}")
        if v.profile is not None and v.profile.capped:
            out.append(f"  {v.name}: --max-batches ended the epochs early")
        for loader, note in v.notes.items():
            if not loader.startswith("--analyze"):     # printed with the analysis below
                out.append(f"  {v.name}: {loader}: {note}")
    out += node_lines(result)
    ranks = tables.rank_table(result)
    if ranks:
        out += ["", "ranks (exposed stall = the rank's wait for its batches; medians over "
                "repeats):", *ranks.splitlines()]
        out += [f"  {line}" for line in tables.rank_verdicts(result)]
    for v in result.variants:
        if v.profile is not None and v.profile.analysis is not None:
            out += ["", f"analysis of {v.name} (--analyze):"]
            out += analysis_lines(v.attribution, v.profile.analysis)
    knee_text = knee_lines(result)
    if knee_text:
        out += ["", *knee_text]
    busy = busy_summary(result)
    if busy:
        out.append(f"WARNING: BUSY MACHINE: {busy}")
    return out


def loader_table(result: Result) -> str:
    """Per loader of every variant (medians over repeats): its rank, workers, rates, waits
    and its most expensive stage."""
    fmt_n, fmt_p, cell = tables.format_number, tables.format_percent, figures.seconds_cell
    rows = []
    # the node column where a loader's node is known (a Ray job: issue 56)
    nodes = any(lo.node for v in result.variants if v.profile for lo in v.profile.loaders)
    for v in result.variants:
        if v.profile is None:
            continue
        for lo in v.profile.loaders:
            top = max(lo.stages, key=lambda s: s.wall_s, default=None)
            # names the job made: escaped again here, for a result read back from a file
            rows.append([one_line(v.name), one_line(lo.name) + (" *" if lo.headline else ""),
                         *([one_line(lo.node) or "-"] if nodes else []), str(lo.rank),
                         str(lo.settings.get("num_workers", "-")), f"{lo.batches:,}",
                         fmt_n(lo.samples_s), fmt_n(lo.steady_samples_s), cell(lo.wait_s),
                         fmt_p(lo.wait_share), fmt_p(lo.steady_wait_share), cell(lo.step_s),
                         cell(lo.time_to_first_batch_s),
                         f"{one_line(top.name)} {figures.seconds(top.wall_s)}" if top else "-"])
    head = ["variant", "loader", *(["node"] if nodes else []), "rank", "workers", "batches",
            "samples/s", "steady samples/s", "wait s", "wait %", "steady wait %", "step s",
            "1st batch s", "top stage (wall)"]
    first = 3 if nodes else 2
    return tables.table(head, rows, right=set(range(first, first + 10)))


def node_lines(result: Result) -> list[str]:
    """A multi-node job's nodes (``ProfileVariant.nodes``): one row per node and variant, a
    node that brought no figures marked MISSING with why, so that no table reads as whole
    without it; [] on one machine."""
    rows, missing = [], []
    for v in result.variants:
        for n in (v.profile.nodes if v.profile is not None else []):
            ranks = ",".join(map(str, n.ranks)) or "-"
            rows.append([one_line(v.name), str(n.node), one_line(n.host) or "-", ranks,
                         f"{n.runs}/{n.of_runs}", n.via or "-", figures.seconds_cell(n.wait_s),
                         "MISSING" if n.missing else "ok"])
            if n.missing:
                missing.append(f"  {v.name}: node rank {n.node}: {one_line(n.missing)}")
    if not rows:
        return []
    head = ["variant", "node", "host", "ranks", "runs", "figures via", "most wait s", "figures"]
    return ["", "nodes (one stallbench profile per node; most wait = the longest a rank of the "
            "node waited for its batches, median over runs, its own clock):",
            *tables.table(head, rows, right={1, 4, 6}).splitlines(), *missing]


# ------------------------------------------------------------------ --analyze

def analysis_lines(a: Attribution | None, an: ProfileAnalysis) -> list[str]:
    """The attribution of a ``--analyze`` profile: the epochs' difference, the parts, the
    user's marked stages, what could not be ablated and why, the notes."""
    out = []
    iv = an.data_stall_interval
    if an.data_stall_s is not None and iv is not None:
        # the epochs' difference holds the wait AND any change of the step between the two
        # runs (issue 39): said as such, never as the data stall
        out.append(f"full - compute-only epochs: {an.data_stall_s:.2f} s "
                   f"[{iv.low:.2f}, {iv.high:.2f}] (the wait and any change of the step between "
                   f"the runs); the loop's own step served from memory: "
                   f"{(an.compute_only_step_s or math.nan) * 1e3:.1f} ms/batch "
                   f"(compute-only, kept {an.keep_batches} batches per loader)")
    if a is not None:
        out += _part_lines(a, an)
    return out + _ablation_lines(an)


def _part_lines(a: Attribution, an: ProfileAnalysis) -> list[str]:
    """The parts with their intervals, by the job's own stage names (``figures.part_name``:
    "dataset __getitem__", not "fetch", on a user's job), then what lies beside them."""
    ivs = a.intervals
    if figures.withheld(a):
        # issue 57: a verdict that withholds the parts prints none of them as a figure
        names = ", ".join(figures.part_name(p, True, an.stage_map)
                          for p in ("fetch", "preprocess", "transfer", "overhead"))
        return [f"attribution ({a.basis}): parts withheld ({names}): the verdict says why",
                f"  {'compute':<28} {figures.seconds_cell(a.compute_s, ivs.compute_s):>8} s  "
                f"(the compute-only runs)"] + _beside_lines(a)
    out = [f"attribution ({a.basis}, {a.interval}):"]
    if "(1 per run)" in a.interval:
        out.append("  (one repeat per run: each interval is its point; --repeats 2 or more "
                   "gives intervals)")
    zero = False
    for label, part, i in (("compute", a.compute_s, ivs.compute_s),
                           (figures.part_name("fetch", True, an.stage_map), a.fetch_stall_s,
                            ivs.fetch_stall_s),
                           (figures.part_name("preprocess", True, an.stage_map), a.preprocess_stall_s,
                            ivs.preprocess_stall_s),
                           (figures.part_name("transfer", True, an.stage_map), a.transfer_stall_s,
                            ivs.transfer_stall_s),
                           (figures.part_name("overhead", True, an.stage_map), a.overhead_s,
                            ivs.overhead_s)):
        # an interval spanning 0: not distinguishable from 0, never a negative stall
        head = f"{figures.seconds_cell(part, i, signed=True):>8}"
        zero = zero or figures.spans_zero(i)
        out.append(f"  {label:<28} {head} s  [{i.low:.2f}, {i.high:.2f}]")
    if zero:
        out.append(f"  {figures.ZERO_NOTE}")
    return out + _beside_lines(a)


def _beside_lines(a: Attribution) -> list[str]:
    """What is measured beside the parts, not inside them: start-up, interference, the
    wait's bound on any gain, a step that moved between runs; then the verdict."""
    out = []
    hold = figures.withheld(a)
    if a.startup_cost_s:
        out.append(f"  {'start-up (apart)':<28} {figures.seconds_cell(a.startup_cost_s):>8} s")
    if a.interference_s is not None and not hold:
        out.append(f"  {'interference (own line)':<28} {figures.seconds_cell(a.interference_s):>8} s  the model "
                   f"step took longer beside the data path than served from memory "
                   f"(not a wait: not in the parts above)")
    if a.wait_bound_speedup is not None and math.isfinite(a.wait_bound_speedup):
        out.append(f"  removing every wait gives at most {a.wait_bound_speedup:.2f}x "
                   f"(1 / (1 - the measured wait share))")
    moved = {k: r for k, r in a.step_ratio.items()
             if a.step_noise_share is not None and abs(r - 1) > a.step_noise_share}
    if moved and not hold:          # withheld: the verdict names what moved
        out.append("  step per batch vs the full run's: "
                   + ", ".join(f"{k} {r:.2f}x" for k, r in moved.items())
                   + f" (noise {a.step_noise_share:.0%})")
    out.append(f"  verdict: {a.verdict}")
    return out


def _ablation_lines(an: ProfileAnalysis) -> list[str]:
    """The user's ``stallbench.stage`` functions served alone, the ablations that could not
    be made and why, and the notes on how the parts were made."""
    out = []
    marked = [ab for ab in an.ablations
              if ab.done and ab.stall_s is not None and ab.stall_interval is not None]
    if marked:
        out.append("your stallbench.stage functions, each served alone (full - that run; "
                   "inside the parts above, not beside them):")
    for ab in marked:
        part = f" ({ab.part})" if ab.part != ab.name.split(":", 1)[-1] else ""
        lo, hi = ab.stall_interval.low, ab.stall_interval.high  # type: ignore[union-attr]
        head = f"{figures.seconds_cell(ab.stall_s, ab.stall_interval, signed=True):>8}"
        out.append(f"  {ab.removes + part:<28} {head} s  [{lo:.2f}, {hi:.2f}]")
    for ab in an.ablations:
        if not ab.done:
            out.append(f"cannot ablate {ab.removes} ({ab.name}): {ab.why}")
    out += [f"  note: {n}" for n in an.notes]
    out.append(f"  note: {an.transfer_note}")
    if getattr(an, "budget_basis", ""):
        out.append(f"  note: recording budget {an.budget_basis}")
    return out


# ------------------------------------------------------------------ the knee

def knee_lines(result: Result) -> list[str]:
    """The knee and what to do, as ``analysis.knee`` decided it (stored in
    ``whatif.advice``; decided here only for results written before it was stored): measured
    where a variant measured it, PREDICTED (with the back-test's interval) only where none did."""
    wi = result.analysis.whatif
    if wi is None:
        return []
    adv = getattr(wi, "advice", None) or knee.decide(wi)
    said = wi.note if wi.note.startswith(f"{wi.model.kind} model") else f"{wi.model.kind} model, {wi.note}"
    out = [f"what-if ({said}):"]
    bt = wi.backtest
    if bt is not None and bt.max_abs_steady_error is not None:
        out.append(f"  back-test: leave-one-out steady error up to {bt.max_abs_steady_error:.0%}"
                   f" over {len(bt.points)} point(s)")
    if adv.action == "none":
        out.append(f"  knee: {adv.reason}")
        return out
    point = next((p for p in wi.points if p.n == adv.n), None)
    unpredicted = point is not None and getattr(point, "not_predicted", "")
    out += _knee_point(result, wi, adv, point, unpredicted)
    out += _knee_advice(wi, adv, point, unpredicted)
    return out


def _knee_point(result: Result, wi, adv, point, unpredicted) -> list[str]:
    """The knee itself: MEASURED where a variant ran at it, else PREDICTED with its band, or
    why it is not predicted. With a loader per rank (torchrun) the count is each rank's."""
    m = wi.model
    each = getattr(m, "ranks", 1) > 1 and getattr(m, "producers_per_rank", True)
    n = f"{adv.n} worker(s) per rank" if each else f"{adv.n} worker(s)"
    if adv.knee_variant:
        kv = next((v for v in getattr(result, "variants", ()) if v.name == adv.knee_variant),
                  None)
        ph = getattr(kv, "phases", None)
        share = ph.steady_stall_share.median if ph is not None else None
        return [f"  knee: {n}, MEASURED ({adv.knee_variant}): {adv.knee_rate:,.0f} "
                f"{knee.measured_rate(next(c for c in wi.measured if c.n == adv.n))[1]};"
                f" {knee.measured_knee_explanation(wi.knee.explanation, share)}"]
    if unpredicted:
        return [f"  knee: {n}, not predicted ({point.not_predicted})"]
    if point is not None:
        band = (f" [{point.low_samples_s:,.0f}, {point.high_samples_s:,.0f}]"
                if point.low_samples_s is not None else " (no back-test interval: one point)")
        return [f"  knee: {n}, PREDICTED {point.predicted_samples_s:,.0f} steady "
                f"samples/s{band}; {wi.knee.explanation}"]
    return []


def _knee_advice(wi, adv, point, unpredicted) -> list[str]:
    """The knee's advice as decided (measure, keep, set, try), with the figure behind it."""
    n, rate, what = adv.n, adv.best_rate, adv.rate_basis
    workers = knob_table.WORKERS        # the knob the knee is a value of (its --set key)
    if adv.action == "measure" and unpredicted:
        return [f"  recommendation: none predicted; measure num_workers={n} with "
                f"--set {workers.key}={','.join(str(c.n) for c in wi.measured)},{n}"]
    if adv.action == "measure" and point is not None:
        return [f"  recommendation: none predicted: no variant had a steady rate to "
                f"compare the knee's with (best measured {adv.best_variant}: {rate:,.0f} "
                f"{what}); measure num_workers={n} over more batches with "
                f"--set {workers.key}={adv.best_n},{n}"]
    if adv.action == "keep" and adv.knee_variant:
        return [f"  recommendation: keep {adv.best_variant} (MEASURED {rate:,.0f} {what}): "
                f"the knee's num_workers={n} MEASURED {adv.knee_rate / rate:.2f}x of it"]
    if adv.action == "keep":
        return [f"  recommendation: keep {adv.best_variant} (MEASURED {rate:,.0f} {what}): "
                f"the knee's num_workers={n} is PREDICTED {adv.predicted_gain:.2f}x of it"]
    if adv.action == "set":
        return [f"  recommendation: num_workers={adv.best_n} on your DataLoader (MEASURED "
                f"{rate:,.0f} {what}, variant {adv.best_variant})"]
    if adv.action == "try":
        band = (f" [{adv.predicted_gain_low:.2f}x, {adv.predicted_gain_high:.2f}x]"
                if math.isfinite(adv.predicted_gain_low) else "")
        return [f"  recommendation: try num_workers={n} on your DataLoader: PREDICTED "
                f"{adv.predicted_gain:.2f}x{band} the best measured ({adv.best_variant}); "
                f"measure it with --set {workers.key}={adv.best_n},{n}"]
    return []


# ------------------------------------------------------------------ tune -- CMD

def tune_lines(result: Result) -> list[str]:
    """The search, then the answer a user applies (issue 41's last lines)."""
    t = result.tune
    out = ["trials (steady samples/s from the second epoch on, each epoch's start-up "
           "included; measured):"]
    for i, tr in enumerate(t.trials, 1):
        out += _trial_lines(i, tr, t.ceiling_samples_s)
    out.append(f"ceiling: {t.ceiling_note}")
    if t.best is None:
        return out
    return out + _answer_lines(t)


def _trial_lines(i: int, tr, ceiling: float | None) -> list[str]:
    """One trial: its measured rate against the ceiling and its prediction, and why it was
    chosen; or the finding it made (the job failed, the setting was not applied)."""
    if tr.outcome == "failed":      # why: the last clause the tune added to ``why``
        what = (f"the job exited with code {tr.exit_code}" if tr.exit_code else
                tr.why.rsplit("; ", 1)[-1])
        return [f"  {i}. {tr.name}: {what} (a finding; the search went on)"]
    if tr.outcome == "not_applied":
        return [f"  {i}. {tr.name}: not applied ({tr.why.rsplit('; not applied: ', 1)[-1]})"]
    share = f", {tr.steady_samples_s / ceiling:.0%} of the ceiling" if ceiling else ""
    pred = (f"; PREDICTED {tr.predicted_samples_s:,.0f}, measured "
            f"{tr.steady_samples_s / tr.predicted_samples_s - 1:+.0%} of it"
            if tr.predicted_samples_s else "")
    out = [f"  {i}. {tr.name}: {tr.steady_samples_s:,.0f} samples/s{share} "
           f"(wait {tr.steady_wait_share:.0%}; {tr.rate_basis}{pred})"
           + (f" [ended by tune: {tr.ended_by_tune}]" if tr.ended_by_tune else "")]
    if i > 1:
        out.append(f"     why: {tr.why}")
    return out


def _answer_lines(t) -> list[str]:
    """Why the search stopped, the answer (keep the job, or the settings to apply with their
    confirmed speedup), what still binds, and the runs it took."""
    b = t.best
    out = [f"stopped: {b.stop_reason}: {b.stop_text}"]
    if not b.settings and not getattr(b, "answered", True):
        out.append("answer: none: no loader setting was measured; keeping the job as written "
                   "is not an answer")
    elif not b.settings:
        out.append(f"answer: keep the job as written ({b.steady_samples_s:,.0f} steady "
                   "samples/s" + (f", {b.ceiling_share:.0%} of the compute-only ceiling"
                                  if b.ceiling_share is not None else "") + ")")
    else:
        iv = (f" (range {b.speedup_low:.2f}-{b.speedup_high:.2f} over the search's pair and "
              "the confirmation's)"
              if b.speedup_low is not None else " (one pair: no interval)")
        out.append(f"answer: {b.apply}")
        out.append(f"  measured {b.speedup:.2f}x{iv} the job as written, steady state "
                   f"({b.steady_samples_s:,.0f} samples/s; confirmed over {b.confirm_runs} "
                   "interleaved round(s) of both)")
        if getattr(b, "basis", ""):
            out.append(f"  basis: {b.basis}")
        if getattr(b, "whole_job_basis", ""):
            whole = (f"{b.whole_job_speedup:.2f}x" if b.whole_job_speedup is not None
                     else "not known")
            out.append(f"  the whole job (its first epoch included): {whole} "
                       f"({b.whole_job_basis})")
        if b.ceiling_share is not None:
            out.append(f"  {b.ceiling_share:.0%} of the compute-only ceiling")
    out.append(f"  still binds: {b.still_binds}")
    searched = len(t.trials) - 1
    what = ["the job as written", "its ceiling"] if t.ceiling_samples_s is not None else \
        ["the job as written", "a ceiling run"]
    what.insert(1, f"{searched} trial(s)")
    if b.confirm_runs:
        what.append(f"{2 * b.confirm_runs} confirmation run(s)")
    out.append(f"  runs: {t.runs} ({', '.join(what)})")
    return out
