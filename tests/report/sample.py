"""Plausible stallbench results (schema v2, typed) for report tests, with every section filled.

The committed examples (``results/examples/*.json``) are real runs; these are made up but
consistent, and every section can be switched off to test the page's placeholders. The three
stall figures differ on purpose, as they do in real runs: the trainer's ``stall_share`` (wait +
its own data work) is smaller than the attribution's ``attributed_stall_share`` (epoch time
above the compute-only run), so a page that shows one under the other's name fails a test.
Deterministic: the same arguments give the same Result. Run as a script to write one as JSON::

    python tests/report/sample.py /tmp/sample.json [--speed 1.2]
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

from stallbench import results
from stallbench.results import (SCHEMA_VERSION, Attribution, ByteCounts, ByteFigures, DatasetInfo,
                                DeviceRepeat, ExecutorFacts, GitInfo, GpuInfo, Interval, Knee,
                                MachineInfo,
                                PartIntervals, PhaseSummary, Phases, RepeatFigures, Resources, Result, RunSettings,
                                ScenarioAnalysis, ScenarioInfo, StageRates, StageRows, StageSeconds,
                                Summary, Timeline, ToolInfo, TrainerSolo, VariantResult,
                                WhatIfCheck, WhatIfModel, WhatIfPoint, WhatIfValidation)

SCENARIO_TEXT = '''\
name = "recsys-workers"
description = "DLRM on a synthetic click log: does adding loader workers remove the preprocess stall?"

[dataset]
rows = 200_000
files = 4
codec = "zstd"

[storage]
bandwidth_mb_s = 200      # EMULATED remote object storage

[preprocess]
transforms = ["log_dense", {name = "hash_ids", buckets = 100_000}, "pad_sequences"]
cpu_cost_us_per_row = 12  # EMULATED tokenizer-like CPU cost

[model]
kind = "dlrm"

[loader]
batch_size = 4096

[run]
repeats = 3

[matrix]
"loader.num_workers" = [0, 1, 2]
'''

# Per variant: epoch split (seconds) at speed 1.0: compute, fetch, preprocess, transfer stall.
_SPLITS = {
    0: (2.0, 0.55, 3.1, 0.35),
    1: (2.0, 0.30, 1.55, 0.25),
    2: (2.0, 0.18, 0.62, 0.22),
}
_ROWS = 200_000
_BATCH = 4096
# The trainer's own stall (wait + its data work) as a share of the attributed stall: the rest of
# the time above the compute-only run is hand-off and slower steps under contention.
TRAINER_SHARE_OF_ATTRIBUTED = 0.45


def _summary(vals: list[float]) -> Summary:
    return Summary.of(vals)


def _timeline(rng: random.Random, n_batches: int, split: tuple[float, ...]) -> Timeline:
    compute, fetch, prep, transfer = split
    wait_mean = (fetch + prep) / n_batches
    tr_mean = transfer / n_batches
    c_mean = compute / n_batches
    t = 0.0
    tl = Timeline()
    for i in range(n_batches):
        # First batch waits longest (pipeline fill); then bursts when a worker falls behind.
        wait = wait_mean * (6.0 if i == 0 else rng.choice([0.2, 0.5, 1.0, 1.0, 1.6, 2.2]))
        tr = tr_mean * rng.uniform(0.7, 1.3)
        c = c_mean * rng.uniform(0.9, 1.1)
        rows = _BATCH if i < n_batches - 1 else _ROWS - _BATCH * (n_batches - 1)
        tl.t_start_s.append(round(t, 5))
        tl.wait_s.append(round(wait, 5))
        tl.transfer_s.append(round(tr, 5))
        tl.compute_s.append(round(c, 5))
        tl.rows.append(rows)
        t += wait + tr + c
    return tl


def _resources(rng: random.Random, epoch: float, workers: int, *, object_store: bool,
               gpu: bool, cores: int = 2) -> Resources:
    dt = 0.1
    n = max(2, int(epoch / dt))
    t_s = [round(i * dt, 3) for i in range(n)]
    per_core = []
    for c in range(cores):
        base = 95.0 if (c == 0 or workers >= c) else 35.0
        per_core.append([round(min(100.0, max(0.0, base + rng.gauss(0, 6) - (20 if i < 3 else 0))), 1)
                         for i in range(n)])
    pss = [round(850 + 220 * workers + 180 * (1 - math.exp(-i / 8)) + rng.gauss(0, 6), 1) for i in range(n)]
    res = Resources(t_s=t_s, cpu_percent_per_core=per_core, pss_mb=pss,
                    rss_sum_mb=[round(x * (1 + 0.6 * workers), 1) for x in pss],
                    pss_exact_sweeps=n // 10, pss_sweep_s=0.004)
    if object_store:
        res.object_store_mb = [round(60 + 40 * math.sin(i / 5) ** 2 + rng.uniform(0, 10), 1)
                               for i in range(n)]
    if gpu:   # one value per GPU per sample
        res.gpu_util_percent = [[round(min(100, max(0, 55 + rng.gauss(0, 15))), 1)] for _ in range(n)]
    return res


def _interval(x: float) -> Interval:
    return Interval(round(x * 0.9, 4), round(x * 1.12, 4))


def _attribution(split_s: tuple[float, ...], stalls: list[float], workers: int, method: str,
                 repeats: int) -> Attribution:
    compute = split_s[0]
    epoch = sum(split_s)
    stage = max(zip(("fetch", "preprocess", "transfer"), stalls), key=lambda kv: kv[1])
    bound = stage[0] if stage[1] > 0.1 * compute else "compute"
    share = (epoch - compute) / epoch
    ideal = epoch / (epoch - stage[1]) if bound != "compute" else 1.0
    overhead = 0.02 * workers
    fetch, prep, transfer = (round(x, 4) for x in split_s[1:])
    return Attribution(
        method=method, interval=f"bootstrap percentile 90% over repeats ({repeats} per run)",
        compute_s=round(compute, 4), fetch_stall_s=fetch, preprocess_stall_s=prep,
        transfer_stall_s=transfer, overhead_s=overhead, epoch_s=round(epoch, 4),
        attributed_stall_s=round(epoch - compute, 4), attributed_stall_share=round(share, 4),
        overhead_share=round(overhead / epoch, 4), bound_by=bound, ideal_speedup=round(ideal, 3),
        intervals=PartIntervals(compute_s=_interval(compute), fetch_stall_s=_interval(fetch),
                                preprocess_stall_s=_interval(prep),
                                transfer_stall_s=_interval(transfer),
                                overhead_s=_interval(overhead)),
        closure_error=0.0,
        ablation_epoch_s={"full": round(epoch, 4),
                          "no_fetch": round(epoch - stalls[0], 4),
                          "no_fetch_preprocess": round(epoch - stalls[0] - stalls[1], 4),
                          "no_fetch_preprocess_transfer": round(compute + overhead, 4),
                          "compute_only": round(compute, 4)},
        compute_noise_s=round(0.02 * compute, 4), compute_noise_share=round(0.02 * compute / epoch, 4),
        verdict=(f"{bound}-bound: attributed stall {share:.0%} of the epoch; "
                 f"ideal {bound} would give {ideal:.1f}x" if bound != "compute"
                 else f"compute-bound: attributed stall {share:.0%} of the epoch"),
    )


def _whatif(variants: list[VariantResult], speed: float) -> WhatIfValidation:
    per_worker = 64_000.0 * speed * 0.75
    compute_cap = _ROWS / 2.0
    points = []
    for n in range(0, 9):
        pred = min(per_worker * max(n, 0.6), compute_cap)
        bound = "preprocess" if per_worker * max(n, 0.6) < compute_cap else "compute"
        points.append(WhatIfPoint(
            n=n, predicted_samples_s=round(pred, 1),
            stall_share=round(max(0.0, 1 - pred / compute_cap), 3), bound_by=bound,
            why=(f"{n} worker(s) at {1e6 / per_worker:.1f} us/sample each cannot keep up"
                 if bound == "preprocess" else "the trainer binds: model step"),
            binding="workers" if bound == "preprocess" else "trainer"))
    measured = []
    for v in variants:
        n = v.executor.producer_slots
        pred = points[n].predicted_samples_s
        meas = v.throughput_samples_s.median
        measured.append(WhatIfCheck(n=n, variant=v.name, measured_samples_s=round(meas, 1),
                                    predicted_samples_s=pred, error=round((pred - meas) / meas, 3),
                                    is_fit=n == 1, bound_by=points[n].bound_by))
    knee = next((p.n for p in points if p.bound_by == "compute"), None)
    model = WhatIfModel(p_wall=1e-5, p_cpu=0.9e-5, t_trainer=1.0e-5, t_cpu=0.95e-5, cores=2.0,
                        stage_wall={"fetch": 2e-6, "preprocess": 7e-6, "transfer": 1e-6},
                        io_wait=0.0, io_bytes=117.0, compute=1.0e-5, fit_workers=1,
                        fit_variant="num_workers=1",
                        calibration="producers +0.5 us/sample outside the stage timers")
    return WhatIfValidation(
        label="predicted", axis="workers", fit_variant="num_workers=1", model=model,
        points=points, measured=measured,
        knee=Knee(n=knee, bound_by="compute", saturates_at=knee,
                  explanation=f"from {knee} workers on the model step is the bottleneck: "
                              "more preprocessing workers add nothing"),
        max_abs_error=max(abs(m.error or 0.0) for m in measured if not m.is_fit),
        note="fitted on one configuration, the rest predicted")


def make_result(
    name: str = "recsys-workers",
    *,
    seed: int = 0,
    speed: float = 1.0,
    created_utc: str = "2025-11-20T10:00:00+00:00",
    git_commit: str = "3f2c9a1",
    repeats: int = 3,
    analysis: bool = True,
    whatif: bool = True,
    timeline: bool = True,
    resources: bool = True,
    object_store: bool = False,
    gpu: bool = False,
    method: str = "chain",
    device: bool = False,
) -> Result:
    """A complete, plausible v2 Result.

    ``speed`` scales every stall (1.2 = 20% less stall, i.e. a faster "current" run against a
    baseline). The flags drop the sections other engineers fill, to test placeholders.
    ``device``: accelerator figures (AU, H2D copies) and start-up/steady phases, the three
    cases of steady AU: measured (num_workers=0), runs without a steady window
    (num_workers=1), a result without device figures (num_workers=2).
    """
    rng = random.Random(seed)
    variants = []
    n_batches = math.ceil(_ROWS / _BATCH)
    for workers, split in _SPLITS.items():
        compute = split[0]
        stalls = [s / speed for s in split[1:]]
        split_s = (compute, *stalls)
        epoch = sum(split_s)
        reps: list[RepeatFigures] = []
        for _ in range(repeats):
            noise = rng.uniform(0.95, 1.06)
            e = epoch * noise
            st = (epoch - compute) * noise * TRAINER_SHARE_OF_ATTRIBUTED
            wait = st * 0.8
            reps.append(RepeatFigures(
                epoch_s=round(e, 4), samples=_ROWS, batches=n_batches,
                throughput_samples_s=round(_ROWS / e, 2),
                steady_throughput_samples_s=round(_ROWS / (e - 0.1), 2),
                stall_s=round(st, 4), wait_s=round(wait, 4), trainer_transfer_s=round(st - wait, 4),
                compute_s=round(compute * rng.uniform(0.98, 1.02), 4),
                time_to_first_batch_s=round(0.12 + 0.25 / (workers + 1) + rng.uniform(0, 0.03), 4),
                peak_pss_mb=round(1030 + 230 * workers + rng.uniform(0, 40), 1),
                executor_start_s=round(0.05 + 0.3 * workers, 3),
                trainer_cpu_s=round(e * 0.9, 3),
                producer_cpu_s=round(e * 0.8 * workers, 3) if workers else None,
                stage_s=StageSeconds(fetch=round(split[1] * 1.1, 3), preprocess=round(split[2] * 1.2, 3),
                                     transfer=round(split[3], 3),
                                     transfer_producer=round(split[3] * 0.7, 3),
                                     transfer_trainer=round(split[3] * 0.3, 3)),
                stage_rows=StageRows(fetch=_ROWS, preprocess=_ROWS, transfer=_ROWS),
                bytes=ByteCounts(storage_bytes=23_400_000, raw_bytes=61_000_000,
                                 wire_bytes=58_500_000, ipc_bytes=58_500_000 if workers else 0),
                producer_processes=workers,
            ))
        v = VariantResult(
            name=f"num_workers={workers}",
            knobs={"loader.num_workers": workers},
            config={"loader": {"num_workers": workers, "batch_size": _BATCH},
                    "model": {"kind": "dlrm"}, "storage": {"bandwidth_mb_s": 200.0},
                    "preprocess": {"cpu_cost_us_per_row": 12.0}},
            emulated=["storage.bandwidth_mb_s", "preprocess.cpu_cost_us_per_row"],
            executor=ExecutorFacts(kind="local", producer_slots=workers, has_producers=workers > 0),
            throughput_samples_s=_summary([r.throughput_samples_s for r in reps]),
            epoch_s=_summary([r.epoch_s for r in reps]),
            stall_s=_summary([r.stall_s for r in reps]),
            stall_share=_summary([r.stall_s / r.epoch_s for r in reps]),
            time_to_first_batch_s=_summary([r.time_to_first_batch_s for r in reps]),
            peak_pss_mb=_summary([r.peak_pss_mb for r in reps]),
            repeats=reps,
            stage_rates=StageRates(fetch_rows_s=420_000.0, preprocess_rows_s=64_000.0 * speed,
                                   transfer_producer_rows_s=900_000.0, storage_mb_s=198.5,
                                   compute_rows_s=100_000.0, rows_out_per_row_in=1.0),
            trainer_solo=(TrainerSolo(data_s_per_sample=round(sum(stalls) / _ROWS, 9), item_s=0.05)
                          if workers == 0 else None),
            bytes=ByteFigures(storage_bytes=23_400_000, raw_bytes=61_000_000, wire_bytes=58_500_000,
                              ipc_bytes=58_500_000 if workers else 0, crossed_process=workers > 0,
                              compression_ratio=1.04, wire_bytes_per_sample=292.5),
            notes={"device_copy": "no-op: trainer device is the CPU"},
        )
        if device and workers < 2:
            _add_device(v, steady=workers == 0)
        if analysis:
            v.attribution = _attribution(split_s, stalls, workers, method, repeats)
        if timeline:
            v.timeline = _timeline(rng, n_batches, split_s)
        if resources:
            v.resources = _resources(rng, epoch, workers, object_store=object_store, gpu=gpu)
        variants.append(v)

    res_analysis = ScenarioAnalysis()
    base, best = variants[0], max(variants, key=lambda v: v.throughput_samples_s.median)
    if analysis:
        speedup = best.throughput_samples_s.median / base.throughput_samples_s.median
        res_analysis = ScenarioAnalysis(
            verdict=(f"preprocess-bound at num_workers=0: the trainer stalls "
                     f"{base.stall_share.median:.0%} of the run. {best.name} is "
                     f"{speedup:.1f}x faster; more workers stop helping at 3 (compute-bound)."),
            baseline_variant=base.name, best_variant=best.name, best_speedup=round(speedup, 3))
    if whatif:
        res_analysis.whatif = _whatif(variants, speed)

    return Result(
        schema_version=SCHEMA_VERSION,
        tool=ToolInfo(name="stallbench", version="0.1.0"),
        created_utc=created_utc,
        scenario=ScenarioInfo(name=name, path="scenarios/recsys-workers.toml",
                              sha256="9b1e" + "0" * 60, fingerprint="a1b2c3d4e5f60718",
                              text=SCENARIO_TEXT.replace('"recsys-workers"', f'"{name}"'),
                              matrix={"loader.num_workers": [0, 1, 2]}),
        machine=MachineInfo(hostname="ci-runner", cpu_model="Intel(R) Xeon(R) CPU @ 2.20GHz",
                            cores_logical=2, cores_physical=1, cpu_affinity=2, memory_gb=7.8,
                            os="Linux-6.1.0-x86_64-with-glibc2.36", python="3.11.2",
                            libraries={"torch": "2.13.0", "pyarrow": "18.1.0", "numpy": "2.4.6",
                                       "ray": "2.52.0"},
                            gpu=[GpuInfo(name="NVIDIA T4", memory_mb=15_360.0)] if gpu else None,
                            git=GitInfo(commit=git_commit + "0" * 33, dirty=False),
                            load_avg_at_start=[0.4, 0.3, 0.2]),
        settings=RunSettings(repeats=repeats, argv=["run", "scenarios/recsys-workers.toml"],
                             cache_dir=".cache/stallbench"),
        dataset=DatasetInfo(source=".cache/stallbench/datasets/676e434b", synthetic=True, files=4,
                            rows=_ROWS, shards=13, compressed_bytes=23_400_000,
                            uncompressed_bytes=61_000_000, dense_columns=13, sparse_columns=8,
                            sequence_columns=2, label="label", seq_len=20, cardinality=100_000),
        variants=variants,
        analysis=res_analysis,
        status="complete",
    )


def _add_device(v: VariantResult, steady: bool) -> None:
    """GPU figures per repeat, consistent with its epoch: AU = compute / epoch; with
    ``steady`` a steady window after a start-up of 4 of the batches (steady AU = the steady
    batches' step time / steady_s), else runs too short for one."""
    for r in v.repeats:
        startup = round(0.12 * r.epoch_s, 4)
        steady_s = r.epoch_s - startup
        k = max(1, r.batches // 12) if steady else r.batches
        steady_compute = r.compute_s * (r.batches - k) / r.batches
        r.phases = Phases(
            startup_items=1, startup_batches=k, startup_samples=k * _BATCH, startup_s=startup,
            startup_stall_s=startup, steady_batches=r.batches - k,
            steady_samples=max(r.samples - k * _BATCH, 0), steady_s=steady_s if steady else math.nan,
            steady_stall_s=0.0, steady_wait_s=0.0, steady_compute_s=steady_compute,
            steady_stall_share=0.0, steady_epoch_s=r.epoch_s, startup_cost_s=0.0,
            no_steady_reason="" if steady else "the run ended before every producer delivered its first work item")
        r.device = DeviceRepeat(
            device="cuda:0", compute_kind="gpu", compute_clock="cuda_events", compute_s=r.compute_s,
            au=r.compute_s / r.epoch_s, step_ms_median=1e3 * r.compute_s / r.batches,
            h2d_batches=r.batches, h2d_bytes=r.batches * 1_200_000, h2d_s=r.batches * 1.1e-4,
            h2d_gb_s=1_200_000 / 1.1e-4 / 1e9, h2d_ms_median=0.11, h2d_from_ring=r.batches,
            steady_compute_s=steady_compute if steady else None,
            steady_au=steady_compute / steady_s if steady else None)
    from stallbench.analysis.device import device_figures
    v.device = device_figures(v.repeats)
    if steady:
        v.phases = PhaseSummary(
            rule="work item 1 (every producer delivered once)",
            startup_s=_summary([r.phases.startup_s for r in v.repeats]),
            startup_cost_s=_summary([0.0 for _ in v.repeats]),
            startup_stall_s=_summary([r.phases.startup_stall_s for r in v.repeats]),
            steady_s=_summary([r.phases.steady_s for r in v.repeats]),
            steady_stall_share=_summary([0.0 for _ in v.repeats]),
            steady_samples_s=_summary([r.phases.steady_samples / r.phases.steady_s
                                       for r in v.repeats]))


def main(argv: list[str]) -> int:
    import json

    out = Path(argv[0]) if argv else Path("sample.json")
    speed = float(argv[argv.index("--speed") + 1]) if "--speed" in argv else 1.0
    out.write_text(json.dumps(results.to_dict(make_result(speed=speed)), indent=1) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
