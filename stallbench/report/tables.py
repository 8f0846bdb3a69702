"""Plain-text tables for the terminal: what a person reads after a run."""

from __future__ import annotations

import math
from typing import Sequence

from ..analysis import figures
from ..analysis.device import AU_PASS, WARNING, au_label
from ..outputs import one_line
from ..results import Attribution, DeviceFigures, Result, Summary


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int] | None = None) -> str:
    right = right if right is not None else set(range(1, len(headers)))
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def format_number(x: float | None, fmt: str = ",.0f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, fmt)


def spread(s: Summary, fmt: str = ",.0f") -> str:
    if len(s.values) <= 1:
        return format_number(s.median, fmt)
    return f"{format_number(s.median, fmt)} ({format_number(s.min, fmt)}..{format_number(s.max, fmt)})"


def format_percent(x: float | None, spec: str = ".0%") -> str:
    """A share (``figures.share``: never negative, "~0%" when it reads 0 without being 0); a
    signed spec ("+.1%": an error, a change) is ``figures.signed_percent``: its sign where
    the digits show one, none where they read 0."""
    digits = int(spec.strip("+.%") or 0)
    if spec.startswith("+"):
        return figures.signed_percent(x, digits)
    return figures.share(x, digits)


def run_table(result: Result) -> str:
    rows = []
    for v in result.variants:
        ph = v.phases
        rows.append([v.name, spread(v.throughput_samples_s),
                     format_number(ph.steady_samples_s.median) if ph else "-", figures.seconds_cell(v.epoch_s.median),
                     figures.seconds_cell(v.stall_s.median), format_percent(v.stall_share.median),
                     format_percent(ph.steady_stall_share.median) if ph else "-",
                     startup_text(ph.startup_cost_s.median) if ph else "-",
                     format_percent(v.device.au.median) if v.device else "-",
                     _steady_au(v.device),
                     figures.seconds_cell(v.time_to_first_batch_s.median), format_number(v.peak_pss_mb.median, ",.0f")])
    head = ["variant", "samples/s median (min..max)", "steady samples/s", "epoch s", "stall s",
            "stall %", "steady stall %", "start-up s", "AU", "steady AU", "1st batch s",
            "peak PSS MB"]
    return table(head, rows)


def _steady_au(d: DeviceFigures | None) -> str:
    return format_percent(d.steady_au.median) if d is not None and d.steady_au is not None else "-"


def au_note(result: Result) -> str | None:
    """What the AU column measures, once per kind of step in the result."""
    kinds = list(dict.fromkeys(v.device.compute_kind for v in result.variants if v.device))
    if not kinds:
        return None
    return (f"AU: accelerator utilisation = model step time / epoch time (MLPerf Storage passes "
            f"a run at >= {AU_PASS:.0%}); steady AU: the same over the steady window (after "
            f"start-up); step time: " + "; ".join(au_label(k) for k in kinds))


def device_table(result: Result) -> str | None:
    """The host -> device copies (CUDA events), for variants whose batches were copied."""
    rows = []
    for v in result.variants:
        d = v.device
        if d is None or d.h2d_gb_s is None:
            continue
        mb = d.h2d_bytes_per_batch / 1e6 if d.h2d_bytes_per_batch is not None else None
        rows.append([v.name, d.device, format_percent(d.au.median), _steady_au(d),
                     format_number(d.step_ms.median, ".2f"),
                     format_number(d.h2d_ms.median if d.h2d_ms else None, ".3f"), format_number(mb, ".2f"),
                     format_number(d.h2d_gb_s.median, ".1f"), str(d.device_prefetch), d.host_memory])
    if not rows:
        return None
    head = ["variant", "device", "AU", "steady AU", "GPU step ms", "H2D ms/batch", "H2D MB/batch",
            "H2D GB/s", "preload", "host memory of the copies"]
    return table(head, rows, right={2, 3, 4, 5, 6, 7, 8})


def warnings(result: Result) -> list[str]:
    """Notes that say data was lost (e.g. sequences cut by padding), one line each."""
    return [f"{v.name}: {note}" for v in result.variants for note in v.notes.values()
            if note.startswith(WARNING)]


def attribution_table(result: Result) -> str | None:
    rows = []
    for v in result.variants:
        a = v.attribution
        if a is None:
            continue

        def part(name: str, a: Attribution = a) -> str:
            x, iv = a.part_s(name), a.part_interval(name)
            if not (math.isfinite(iv.low) and math.isfinite(iv.high)) or iv.width < 1e-9:
                return figures.seconds_cell(x, signed=True)
            # an interval spanning 0: the part is not distinguishable from 0 (never printed
            # as a negative stall): "~0", explained under the table
            head = figures.seconds_cell(x, iv, signed=True)
            return f"{head} [{format_number(iv.low, '.2f')},{format_number(iv.high, '.2f')}]"

        steady = a.basis == "steady state"
        share = a.steady_attributed_stall_share if steady else a.attributed_stall_share
        rows.append([v.name, part("compute"), part("fetch"), part("preprocess"),
                     part("transfer"), part("overhead"),
                     startup_text(a.startup_cost_s) if steady else "-", format_percent(share),
                     a.bound_by + ("" if a.conclusive else "?")])
    if not rows:
        return None
    head = ["variant", "compute-only s", "fetch stall s", "preprocess stall s", "transfer stall s",
            "loader overhead s", "start-up s", "attributed stall %", "bound by"]
    return table(head, rows, right={1, 2, 3, 4, 5, 6, 7})


def startup_text(x: float | None) -> str:
    """A start-up cost: never negative (start-up cannot make a run faster; a window slower
    than that is refused in ``measure.phases``), "~0" within its tolerance."""
    return figures.seconds_cell(x)


# one rule for every surface (``analysis.figures``): the run table, the report, the profile
spans_zero = figures.spans_zero
ZERO_NOTE = figures.ZERO_NOTE


def attribution_title(result: Result) -> str:
    """What the attribution table's figures are: steady state unless a run had none."""
    bases = {v.attribution.basis for v in result.variants if v.attribution is not None}
    if bases == {"steady state"}:
        return ("stall attribution (steady state: each run's steady window scaled to all its "
                "batches, seconds; start-up apart; [interval]):")
    return "stall attribution (seconds per run, whole runs where no steady window; [interval]):"


def phase_lines(result: Result) -> list[str]:
    """Per variant whose runs were capped (max_batches): the EXTRAPOLATED full epoch."""
    out = []
    for v in result.variants:
        reasons = [f.phases.no_steady_reason for f in v.repeats
                   if f.phases is not None and f.phases.no_steady_reason]
        if reasons:
            n = sum(f.phases is not None for f in v.repeats)
            out.append(f"{v.name}: {reasons[0]} ({len(reasons)} of {n} runs): no steady-state "
                       f"figure from {'them' if len(reasons) > 1 else 'it'}; raise max_batches")
        ph = v.phases
        if ph is None or ph.extrapolated_full_epoch_s is None:
            continue
        share = ph.extrapolated_full_epoch_stall_share
        out.append(f"{v.name}: EXTRAPOLATED full epoch ({ph.full_epoch_samples:,} samples, "
                   f"from the measured start-up + steady rate, not measured): "
                   f"{format_number(ph.extrapolated_full_epoch_s.median, ',.1f')} s, trainer stall "
                   f"{format_percent(share.median if share else None)}")
    return out


def recommendation_line(result: Result) -> str | None:
    rec = result.analysis.recommendation
    if rec is None or not rec.text:
        return None
    return f"recommendation ({result.scenario.name}): {rec.text}"


def rank_table(result: Result) -> str | None:
    """Per rank of every data-parallel variant (medians over repeats); None without ranks."""
    rows = []
    # the node column where a rank's node is known (a profiled Ray job: issue 56)
    nodes = any(r.node for v in result.variants if v.ranks for r in v.ranks.ranks)
    for v in result.variants:
        if v.ranks is None:
            continue
        for r in v.ranks.ranks:
            a = r.attribution
            mark = " straggler" if r.rank == v.ranks.straggler else ""
            rows.append([v.name, f"{r.rank}{mark}", *([one_line(r.node) or "-"] if nodes else []),
                         format_number(r.stall_s, ".3f"), format_number(r.wait_s, ".3f"),
                         format_number(r.trainer_transfer_s, ".3f"), format_number(r.compute_s, ".3f"),
                         format_number(r.sync_s, ".3f"), format_number(r.steady_throughput_samples_s),
                         format_number(r.time_to_first_batch_s, ".3f"), format_percent(r.last_step_share),
                         "-" if a is None else a.bound_by + ("" if a.conclusive else "?")])
    if not rows:
        return None
    head = ["variant", "rank", *(["node"] if nodes else []), "exposed stall s", "wait s",
            "transfer s", "compute s", "all-reduce s", "steady samples/s", "1st batch s",
            "last at", "own time bound by"]
    first = 3 if nodes else 2
    return table(head, rows, right=set(range(first, first + 8)))


def rank_verdicts(result: Result) -> list[str]:
    return [f"{v.name}: {v.ranks.verdict}" for v in result.variants
            if v.ranks is not None and v.ranks.verdict]


def verdicts(result: Result) -> list[str]:
    return [f"{v.name}: {v.attribution.verdict}" for v in result.variants
            if v.attribution is not None and v.attribution.verdict]


def emulated_note(result: Result) -> str | None:
    keys = sorted({k for v in result.variants for k in v.emulated})
    if not keys:
        return None
    return "EMULATED figures in this run (by construction, not real hardware): " + ", ".join(keys)


def startup_note(result: Result) -> str | None:
    """Executor start-up per variant where a runtime was started or reused (Ray); None when
    no variant has one (the local executor). Before the measured runs, so not the run
    table's "start-up s" (the first part of each run, ``VariantResult.phases``)."""
    parts = [f"{v.name} {v.startup.executor_start_s:.1f} s ({v.startup.runtime})"
             for v in result.variants if v.startup and v.startup.runtime != "none"]
    return ("executor start-up (before the runs, not in epoch s): " + ", ".join(parts)
            if parts else None)


def _loss_cost(with_loss: list[float], without: list[float]) -> str:
    """What a loss cost in seconds, measured: the median epoch of the runs with one against
    that of the runs without one; with none to compare, the run's time alone, said so."""
    import statistics

    hit = statistics.median(with_loss)
    runs = "the run with the loss took" if len(with_loss) == 1 else \
        f"the {len(with_loss)} runs with a loss took (median)"
    if not without:
        return (f"{runs} {hit:.1f} s, no run without a loss to compare with "
                f"(run.repeats > 1 gives one)")
    base = statistics.median(without)
    return (f"{runs} {hit:.1f} s, {figures.signed(hit - base)} s against {base:.1f} s (median) "
            f"of the {len(without)} run(s) without one")


def faults_lines(result: Result) -> list[str]:
    """One line per variant whose measured runs completed although Ray lost something under
    them (a producer node, a worker process): what was lost, what it cost (the tasks Ray
    re-ran, and in seconds: the runs with a loss against the variant's runs without one,
    where there are some; else only the run's time, said so), and that the run completed,
    every row once (the figures include the time the loss cost). From each repeat's
    ``executor_figures["faults"]``; none for other executors. Runs that began with fewer
    simulated producer nodes than configured (one lost before them, ``nodes_lost_before_run``)
    are one more line: their figures are those of the nodes left."""
    out = []
    for v in result.variants:
        before = {str(n.get("node_id", "?"))[:8]: str(n.get("reason") or "").split(".")[0][:100]
                  for r in v.repeats
                  for n in ((r.executor_figures or {}).get("faults") or {}).get(
                      "nodes_lost_before_run") or []}
        short = sum(bool(((r.executor_figures or {}).get("faults") or {}).get(
            "nodes_lost_before_run")) for r in v.repeats)
        if before:
            named = ", ".join(f"node {k}" + (f" ({w})" if w else "") for k, w in before.items())
            out.append(one_line(
                f"RAY FAULTS: variant {v.name}: {len(before)} producer node(s) lost before its "
                f"measured runs began ({named}): {short} of {len(v.repeats)} run(s) ran on the "
                f"nodes left, and their figures are those of fewer nodes than the scenario "
                f"asks for"))
        deaths = retries = hit = 0
        with_loss: list[float] = []
        without: list[float] = []
        pids: list[str] = []
        nodes: list[str] = []
        for r in v.repeats:
            f = (r.executor_figures or {}).get("faults") or {}
            lost = f.get("nodes_lost") or []
            if not f.get("worker_deaths") and not lost:
                without.append(r.epoch_s)
                continue
            with_loss.append(r.epoch_s)
            hit += 1
            deaths += int(f.get("worker_deaths") or 0)
            retries += int(f.get("task_retries") or 0)
            pids += [str(d.get("pid")) for d in f.get("dead_workers") or []]
            for n in lost:
                why = str(n.get("reason") or "").split(".")[0][:100]
                nodes.append(f"node {str(n.get('node_id', '?'))[:8]}" + (f" ({why})" if why else ""))
        if not hit:
            continue
        what = []
        if nodes:
            what.append(f"{len(nodes)} producer node(s): {', '.join(nodes)}")
        if deaths:
            shown = ", ".join(pids[:6]) + (", ..." if len(pids) > 6 else "")
            what.append(f"{deaths} Ray worker process(es) (pid {shown})")
        out.append(one_line(
            f"RAY FAULTS: variant {v.name}: lost {' and '.join(what)} in {hit} of "
            f"{len(v.repeats)} run(s); Ray re-ran {retries} task(s) and the run completed, "
            f"every row once; {_loss_cost(with_loss, without)} (its figures include the time "
            f"the loss cost)"))
    return out
