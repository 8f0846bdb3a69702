"""``stallbench tune``: the cheapest configuration without a data stall, confirmed by a run.

It measures, so it lives beside the runner (it drives ``runner.run_variant``), and it reads its
own measurements with the analysis: the attribution says what bounds, the what-if says which
producer count would remove it and what cannot pay off.

The search, one measured step at a time, each changing one knob of the best configuration so
far (the base scenario, no matrix, to start):

1. Baseline: the base scenario, with the differential attribution when the budget is at least
   ``ATTRIBUTION_BUDGET_S`` (its five runs are the costliest step), else read from the run's own
   figures by the one-point what-if (which term binds, which stage is heaviest).
2. Remove the bounding stage first. Fetch or preprocess (the producers): the producer count
   the what-if (contention model once two counts are measured, else one-point) predicts to be
   the fewest without a stall, or, when none is, the count where it saturates, skipped when it
   predicts no gain over what was measured. Transfer (the trainer's own data work): the batch
   format (one buffer per batch), collate on the producers, a trainer-side preload thread, zstd
   (only where a link's bandwidth is the limit: it costs CPU and saves only bytes). Compute
   bound (stall-free): fewer producers, if the what-if says fewer still keep up (cheaper).
   Last, on any bound: where the executor could keep the best's loader workers across runs
   and forks them every run instead (``Executor.workers_kept`` is False), one step with
   ``loader.persistent_workers = true``: every run otherwise pays each worker's fork,
   start-up, first item's page faults and exit (docs/data-path.md, "What workers still pay").
3. A step "is better" when it becomes the best: stall-free beats stalled; among stall-free, the
   cheaper (cost per epoch with prices, else fewer producer nodes, then fewer producers);
   among stalled, the faster by more than ``BETTER`` (one run's noise on a shared machine).
4. Time-boxed: before each step its time is estimated (predicted epoch, else the best one's,
   plus the measured set-up); the search stops when that step and the confirmation would not
   fit in the budget, and recommends what it has.
5. The recommendation (the best, or the fastest when nothing removes the stall) is written as a
   scenario file (the base scenario's keys plus the chosen knobs, no matrix), loaded back and
   run again: the confirmation, printed beside its prediction (the what-if's for that producer
   count, fitted on the search's runs).

"Stall-free" is judged on the steady state: 1 - steady rate x compute seconds per sample below
5% (a short run's start-up alone can be 5% of its epoch). Every step is one repeat, except a
configuration whose workers are kept: two runs, judged on the second (the first forks them,
as every run of a forked-every-run configuration does; ``Search.runs_for``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

from .. import __version__, interrupts, registry, results
from ..analysis import whatif
from ..analysis.whatif_models import fit_best
from ..measure.load import LoadMeter
from ..results import (SCHEMA_VERSION, ScenarioInfo, now_utc, ToolInfo, TuneConfirmation,
                       TuneRecommendation, TuneResult)
from ..scenario import Scenario
from ..scenario import load as load_scenario
from ..scenario import parse as parse_scenario
from .preflight import check_scenario
from .runner import RunOptions, run_scenario
from .tune_file import knob_diff, scenario_text, variant_name, with_knobs
from .tune_search import GOAL, Point, Search, TuneOptions

__all__ = ["TuneOptions", "Tuner", "knob_diff", "scenario_text", "tune", "variant_name",
           "with_knobs"]


class Tuner(Search):
    """The search, then its recommendation written as a scenario file and confirmed by a run."""

    def predict_point(self, point: Point) -> tuple[float, str]:
        """What a fresh run of a measured configuration should give: the what-if fitted on the
        search's runs of its family (every producer count of it when the contention model
        applies), run over the same samples; with no producers, the point's own search run."""
        if point.figures.producer_slots == 0:
            # no producers: nothing to scale, and a no-worker fit is not calibrated (its gap
            # would be hand-off, which it has none of): its own search run is the prediction
            return point.figures.throughput_samples_s, "search run (no producers to scale)"
        if point.figures.runs_not_counted:
            # kept workers: the what-if models a run's start-up as forked workers pay it (its
            # fit holds the run that forked them), not runs that reuse them
            return (point.figures.throughput_samples_s,
                    "search run (its run that reused the kept workers; the what-if models "
                    "forked ones)")
        fam = [p.vr for p in self.family(point.cfg)]
        m = fit_best(fam, self.machine, self.dataset)
        if m is None:
            return point.figures.throughput_samples_s, "search run"
        run = whatif.predict_run(m, point.figures.producer_slots, point.figures.samples)
        return run.whole_samples_s, f"what-if, {m.kind} model fitted on {', '.join(m.fit_variants)}"

    def recommend(self) -> tuple[Point, TuneRecommendation, Path]:
        best = self.best()
        free = self.stall_free(best.figures)
        pred, by = self.predict_point(best)
        cost = ("the cheapest stall-free configuration measured" if free else
                "no configuration measured removed the stall: the fastest")
        why = (f"{cost}: steady stall {best.figures.steady_stall_share:.1%}, "
               f"{best.figures.throughput_samples_s:,.0f} samples/s")
        text = scenario_text(self.sc, best.knobs,
                             f"{self.sc.description or self.sc.name} (tuned: "
                             f"{variant_name(best.knobs)})")
        parsed = parse_scenario(text, "<tuned>")
        if parsed.base != best.cfg:      # the file must say exactly what was measured
            raise AssertionError("tune: the written scenario does not resolve to the recommended "
                                 "configuration")
        out = self.opts.out_dir / results.store.TUNE_DIR
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{results.result_stem(self.sc.name + '-tuned')}.toml"
        n = 0
        while path.exists():
            n += 1
            path = out / f"{results.result_stem(self.sc.name + '-tuned')}-{n}.toml"
        results.write_atomic(path, text)
        self.written.append(str(path))
        return best, TuneRecommendation(variant=best.name, knobs=best.knobs,
                                        scenario_path=str(path), stall_free=free, why=why,
                                        measured=best.figures, predicted_samples_s=pred,
                                        predicted_by=by), path

    def confirm(self, rec: TuneRecommendation, path: Path) -> TuneConfirmation:
        sc = load_scenario(path)            # the file as written: valid and loadable
        check_scenario(sc)
        est = rec.measured.epoch_s + self.setup_estimate()
        # kept workers: at least the 2 runs the search judged it on (``runs_for``; the
        # search reserved them), the first of which ``figures`` leaves out
        least = self.runs_for(sc.base)
        repeats = max(least, min(max(sc.base.run.repeats, least),
                                 int(self.left() // max(est, 1e-9))))
        self.say(f"  confirm: stallbench run {path} ({repeats} repeat(s), no ablations)")
        # the written file lies in OUT/tune/: its transforms and model are the base scenario's,
        # found beside that one (registry.code_from), as the search's runs found them
        with LoadMeter() as meter, registry.code_from(self.sc.path):
            r = run_scenario(sc, RunOptions(repeats=repeats, analyze=False, cache_dir=self.cache,
                                            progress=self.opts.progress))
        foreign = meter.load.foreign_cores if meter.load else None
        saved = results.save(r, self.opts.out_dir)
        self.written.append(str(saved))
        fig = self.figures(r.variants[0])
        pred = rec.predicted_samples_s
        err = pred / fig.throughput_samples_s - 1.0 if pred and fig.throughput_samples_s > 0 else None
        return TuneConfirmation(result_path=str(saved), measured=fig, predicted_samples_s=pred,
                                error=err, within_goal=None if err is None else abs(err) <= GOAL,
                                foreign_cores=foreign)

    def run(self) -> TuneResult:
        with LoadMeter() as meter:
            out = self._run_all()
        return dataclasses.replace(out, foreign_cores=meter.load.foreign_cores
                                   if meter.load else None)

    @property
    def written(self) -> list[str]:
        """Files this tune has written so far (the recommended scenario, the confirmation's
        result): what an interrupted tune says it leaves."""
        if not hasattr(self, "_written"):
            self._written: list[str] = []
        return self._written

    def _run_all(self) -> TuneResult:
        stopped = self.search()
        self.say(f"  search stopped: {stopped}")
        try:
            best, rec, path = self.recommend()
            conf = self.confirm(rec, path)
        except interrupts.Interrupted as exc:
            # The recommendation is kept (it is whole: written atomically) and said to be:
            # an interrupted confirmation must not claim that nothing was written.
            if self.written:
                exc.outcome = (f"kept the file(s) written before it: {', '.join(self.written)}; "
                               f"no tune result written (the recommendation is unconfirmed)")
            raise
        return TuneResult(
            schema_version=SCHEMA_VERSION, kind="tune",
            tool=ToolInfo(name="stallbench", version=__version__), created_utc=now_utc(),
            scenario=ScenarioInfo(name=self.sc.name, path=self.sc.path, sha256=self.sc.sha256,
                                  fingerprint=self.sc.fingerprint, text=self.sc.text,
                                  matrix=self.sc.matrix, description=self.sc.description),
            machine=self.machine, budget_s=self.opts.budget_s,
            wall_s=time.perf_counter() - self.t0,
            cpu_node_cost=self.opts.cpu_node_cost, gpu_node_cost=self.opts.gpu_node_cost,
            steps=self.steps, stopped_because=stopped, recommendation=rec, confirmation=conf)


def tune(sc: Scenario, opts: TuneOptions, say: Callable[[str], None] = lambda s: None) -> TuneResult:
    """Search, recommend, write the scenario file and confirm it (module docstring)."""
    check_scenario(sc)
    return Tuner(sc, opts, say).run()

