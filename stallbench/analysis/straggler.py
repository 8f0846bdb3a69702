"""The straggler from every kind of evidence (issue 58), beside the shuffles of ``ranks``.

Why: ``ranks.straggler`` names a rank from its per-step own times alone, by tests that treat
the steps as exchangeable draws. A cost that lands on a few steps (a transform that burns
20 us/row once per row group, 4 row groups per rank) gives 4 informative steps: dealing them
at random puts all 4 on one rank 1 time in 8, so no 1% permutation test can name it, while
the other rank measurably waited 0.8 s for it in the all-reduce (reported three times as
"within the noise"). That cost is not random: it is the rank's own stage CPU on every one of
its row groups, and the stage timers measure it per rank. Evidence that is deterministic is
read as such:

- **the others' wait**: what the other ranks spent in the all-reduce beyond the candidate
  (``ranks.others_wait``, measured), median over the full runs;
- **the candidate's own work**: each rank's stage CPU per row (thread clocks: exact whatever
  else the machine does), the EMULATED delay per row it measured (``trainers.
  straggler_delay_ms``: a sleep of a known length, exact too) and its stage wait per row
  (stage wall beyond CPU), for the same kind of work (every rank runs the same stages on
  rows of the same table). The candidate's excess over the other ranks' median, times its
  rows, is seconds it spent that the others did not;
- **the same rank across runs**: with several full runs, the candidate must be the same and
  the evidence hold in every one.

A rank is named when the others waited at least ``MIN_WAIT_SHARE`` of the epoch for it and
its own excess work is at least ``EXPLAINS`` of that wait (CPU: less where more processes
than cores run, ``crowding``), its per-row cost above the others' by ``CPU_EXCESS`` (CPU, the
delay) or ``WAIT_EXCESS`` (waits: wall time, noisier on a busy machine); the candidate must
be the rank the per-step times put last. Exchangeable ranks run
the same code on the same kind of rows, so their CPU per row agrees within a few percent and
none is named (``tests/analysis/test_straggler_evidence.py``). Where the others measurably waited
and neither the shuffles nor the stage figures decide, the verdict says what run would
decide (``--repeats 3``, more epochs), never "within the noise".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

MIN_WAIT_SHARE = 0.02      # the others waited 2% of the epoch or more: a measured wait
MIN_WAIT_S = 0.01
EXPLAINS = 0.25            # the excess work is at least a quarter of the others' wait (a CPU
                           # burst stretches on a shared machine: 0.33 s of CPU, 0.8 s waited);
                           # with ``crowding`` processes per core, 1 / crowding where less (a
                           # CPU second stretches to at most that many seconds of wall: 3
                           # ranks and their workers on 1 core, 0.10 s of CPU, 0.41 s waited)
CPU_EXCESS = 0.25          # CPU per row 25% above the other ranks' median
WAIT_EXCESS = 1.0          # waits per row 2x the others' (wall time: a busy core stretches it),
                           # and the excess at least the others' whole own work


@dataclass(frozen=True)
class RankWork:
    """One rank's own work in one run, per row of its data (seconds)."""

    rows: float
    cpu: float                 # stage CPU per row
    wait: float                # stage wall beyond CPU, per row
    delay: float = 0.0         # the EMULATED delay it measured, per row


@dataclass(frozen=True)
class Finding:
    """What the stage figures say about a candidate: named or not, and in words."""

    rank: int | None
    evidence: str
    others_wait_s: float
    excess_s: float


def work_of(rank_run: Any) -> RankWork:
    """A rank's stage figures per row (``trainers.base.RankRun``)."""
    f = rank_run.figures
    s = f.stage_s
    cpu = s.fetch_cpu + s.preprocess_cpu + s.transfer_producer_cpu
    wall = s.fetch + s.preprocess + s.transfer_producer
    rows = float(max(f.samples, 1))
    delay = float(getattr(rank_run, "straggler_delay_s", 0.0) or 0.0)
    return RankWork(rows, cpu / rows, max(wall - cpu, 0.0) / rows, delay / rows)


def excesses(works: Sequence[RankWork], c: int) -> list[tuple[float, float, str]]:
    """Per kind of own work ("CPU", "delay", "wait"): (seconds rank ``c`` did beyond the
    others' median per row, its relative excess per row, the kind) of one run."""
    others = [w for r, w in enumerate(works) if r != c]
    if not others:
        return []
    out = []
    for kind, said in (("cpu", "CPU"), ("delay", "delay"), ("wait", "wait")):
        mine = getattr(works[c], kind)
        med = statistics.median(getattr(w, kind) for w in others)
        rel = mine / med - 1.0 if med > 0 else (math.inf if mine > 0 else 0.0)
        out.append(((mine - med) * works[c].rows, rel, said))
    return out


def excess(works: Sequence[RankWork], c: int) -> tuple[float, float, str]:
    """The kind of ``excesses`` largest in seconds: (seconds, relative, kind)."""
    return max(excesses(works, c), key=lambda x: x[0], default=(0.0, 0.0, ""))


def _others_work(works: Sequence[RankWork], c: int) -> float:
    """The other ranks' median own stage seconds (CPU + waits) over ``c``'s rows: a wait
    excess must at least double the candidate's work to count (a busy machine stretches a
    rank's stage wall by waits for a core, which no rank's own work explains)."""
    others = [(w.cpu + w.wait + w.delay) for r, w in enumerate(works) if r != c]
    return statistics.median(others) * works[c].rows if others else 0.0


def _others_wait(run: Sequence[Any], c: int) -> float:
    syncs = [r.sync_s for r in run]
    others = [s for r, s in enumerate(syncs) if r != c]
    return statistics.median(others) - syncs[c] if others else 0.0


def _holds(x: float, rel: float, kind: str, waited: float, explains: float,
           works: Sequence[RankWork], c: int) -> bool:
    """The module docstring's rule for one kind of excess in one run (``explains``: the share
    of the wait CPU must explain on this machine; a sleep or a wait is not stretched by the
    cores' crowding as CPU is, and keeps ``EXPLAINS``)."""
    exact = kind != "wait"
    need = CPU_EXCESS if exact else WAIT_EXCESS
    share = explains if kind == "CPU" else EXPLAINS
    return x >= share * waited and rel >= need and (exact or x >= _others_work(works, c))


def stage_evidence(full: Sequence[Sequence[Any]], c: int, crowding: float = 1.0) -> Finding:
    """The stage figures' finding on candidate ``c`` over the full runs (``full[run][rank]``
    of ``RankRun``s): named where the module docstring's rule holds in every run.
    ``crowding``: the job's processes per core (ranks and their loader workers)."""
    explains = min(EXPLAINS, 1.0 / crowding) if crowding > 1.0 else EXPLAINS
    waits, extra, said = [], [], []
    for run in full:
        w = _others_wait(run, c)
        epoch = max(r.figures.epoch_s for r in run)
        works = [work_of(r) for r in run]
        waited = w >= max(MIN_WAIT_S, MIN_WAIT_SHARE * epoch)
        # each kind by its own rule; exact evidence (thread CPU, a measured sleep: no core
        # stretches them) names a rank even where a noisier kind is larger in seconds
        passing = [(x, rel, kind) for x, rel, kind in excesses(works, c)
                   if waited and _holds(x, rel, kind, w, explains, works, c)]
        x, rel, kind = max(passing or [excess(works, c)], key=lambda e: e[0])
        ok = bool(passing)
        waits.append(w)
        extra.append(x)
        said.append((ok, kind, rel))
    wait, ex = statistics.median(waits), statistics.median(extra)
    if said and all(ok for ok, _, _ in said):
        kind, rel = said[0][1], statistics.median(r for _, _, r in said)
        runs = f"in each of {len(full)} runs" if len(full) > 1 else "in its one run"
        more = (f"{rel:+.0%} over the other ranks'" if math.isfinite(rel)
                else "where the other ranks had none")
        return Finding(c, (f"its own stage {kind} per row {more} "
                           f"({ex:.2f} s more work {runs}, measured by its stage timers), "
                           f"which the others waited for in the all-reduce"), wait, ex)
    return Finding(None, "", wait, ex)


def revise(summary: Any, full: Sequence[Sequence[Any]], verdict: Callable[[Any], str],
           crowding: float = 1.0) -> None:
    """Issue 58's evidence on a ``RankSummary`` the shuffles decided (``ranks.summarize``
    calls this once): a candidate they did not name is named where its own stage work
    explains the others' measured wait; an unnamed candidate the others measurably waited
    for gets a verdict that says what run would decide. ``verdict``: ``ranks.verdict``."""
    if summary.straggler is not None or summary.world < 2 or not full:
        return
    f = stage_evidence(full, summary.candidate, crowding)
    if f.rank is not None:
        summary.straggler, summary.straggler_evidence = f.rank, f.evidence
        summary.verdict = verdict(summary)
        return
    epoch = statistics.median(max(r.figures.epoch_s for r in run) for run in full)
    if summary.others_wait_s >= max(MIN_WAIT_S, MIN_WAIT_SHARE * epoch):
        summary.verdict = undecided(summary, f, len(full))


def undecided(s: Any, f: Finding, runs: int) -> str:
    """The ranks' line where the others waited for a rank no evidence names: the measured
    wait, why it is not named, and the run that would decide (never "within the noise")."""
    more = ("--repeats 3 (the same rank slow in every run names it)" if runs < 3 else
            "more epochs per run (more steps to judge)")
    return (f"no straggler named from these runs: the other ranks waited "
            f"{s.others_wait_s:.2f} s for rank {s.candidate} in the all-reduce (measured), "
            f"which reached it {s.straggler_excess_s:.2f} s later than the others' median; "
            f"its own stage work explains {f.excess_s:.2f} s of it (its per-row cost is not "
            f"set apart from the other ranks') and the shuffles' threshold is "
            f"{s.noise_s:.2f} s: measure again with {more} to decide")
