"""Stock Ray Data vs stallbench's Ray path, side by side in one run, on the recsys table.

- **stock**: ``read_parquet -> map_batches(normalize + preprocess, pyarrow) ->
  iter_torch_batches(batch_size, collate_fn=...)`` with a straightforward collate (numpy dict ->
  tensors, sequences padded in a Python loop): what a user writes first.
- **stallbench**: fetch + preprocess + collate into one single buffer per batch inside Ray
  tasks (one block per row group, one row per batch), ``iter_batches`` prefetching blocks, the
  trainer only unpacks zero-copy views (plus a trainer-side preload thread).

Both run through stallbench's ``RayExecutor`` and the measured trainer loop (emulated compute
of ``--step-ms``), on one shared local Ray of ``--cpus`` CPUs, interleaved per repeat so drift
of a shared machine hits both. Ray start-up (``ray.init`` + worker warm-up) is timed once and
reported apart; per run the table gives time to first batch, epoch throughput (samples /
epoch time, start-up excluded) and steady throughput (after the first batch).

The target (issue 5): stallbench's epoch throughput >= 3x stock's. What the ratio is made of,
measured here (2 cores, 262k rows, batch 4096): stock spends most of an epoch before its first
batch (Ray Data's ListFiles task, then whole files read and preprocessed as a few huge blocks,
then converted to numpy with object arrays for the sequence columns), ~9-12 s, after which it
drains what it prepared at a high rate; stallbench's first batch arrives in ~0.7 s (one row
group) and it streams from then on. Steady-state rates are close (within ~1.3x either way): both
are bound by the same Parquet decode + preprocess CPU on 2 cores, which no batch format can
remove, so the >= 3x holds for epochs of this size and shrinks for much longer ones (a 2M-row
epoch would amortise stock's ~10 s start). Run:
    .venv/bin/python benchmarks/ray_stock_vs_stallbench.py [--rows 524288] [--repeats 3]
Exit code 0 on PASS, 1 on FAIL.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stallbench import scenario  # noqa: E402
from stallbench.executors import EXECUTORS  # noqa: E402
from stallbench.measure.probe import measured_run  # noqa: E402
from stallbench.pipeline import FULL, Plan, dataset_for  # noqa: E402

# The recsys scenario's table (scenarios/recsys.toml): 40 dense, 20 sparse, 4 sequence features.
TEXT = """
name = "ray_stock_vs_stallbench"
[dataset]
rows = {rows}
dense_features = 40
sparse_features = 20
sparse_cardinality = 1000000
sequence_features = 4
sequence_max_len = 50
row_group_rows = {rg}
files = {files}
codec = "snappy"
seed = 42

[preprocess]
transforms = ["log_dense", {{name = "hash_ids", buckets = 200000}},
              {{name = "truncate_sequences", max_len = 32}}]

[model]
kind = "emulated"
step_ms = {step_ms}

[loader]
batch_size = 4096
batch_format = "{fmt}"
collate = "producer"
prefetch_factor = {prefetch}
prefetch_batches = {preload}

[executor]
kind = "ray"
ray_mode = "{mode}"
cpus = {cpus}
object_store_mb = {store}
"""

TARGET = 3.0


def _plan(args: argparse.Namespace, mode: str, cache: Path) -> Plan:
    fmt = "single_buffer" if mode == "stallbench" else "columnar"
    text = TEXT.format(rows=args.rows, rg=args.row_group_rows, files=args.files,
                       step_ms=args.step_ms, fmt=fmt, mode=mode, cpus=args.cpus,
                       store=args.object_store_mb, prefetch=2,
                       preload=args.preload if mode == "stallbench" else 0)
    cfg = scenario.parse(text, "benchmark").base
    return Plan.create(cfg, dataset_for(cfg, cache, "benchmark"), FULL)


def _fmt_rate(x: float) -> str:
    return f"{x / 1000:,.1f}k"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=262144)
    ap.add_argument("--row-group-rows", type=int, default=16384)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--object-store-mb", type=int, default=1024)
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--preload", type=int, default=2,
                    help="stallbench: trainer-side preload thread depth (batches)")
    ap.add_argument("--cache-dir", type=Path,
                    default=Path(os.environ.get("STALLBENCH_CACHE",
                                                Path.cwd() / ".cache" / "stallbench")))
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()

    plans = {m: _plan(args, m, args.cache_dir) for m in ("stock", "stallbench")}
    print(f"table: {args.rows:,} rows x (40 dense, 20 sparse, 4 seq), row groups of "
          f"{args.row_group_rows:,}, batch 4096; local Ray with {args.cpus} CPUs; "
          f"emulated step {args.step_ms:g} ms", flush=True)
    execs = {m: EXECUTORS.get("ray")(plans[m].config, "benchmark") for m in plans}
    figures: dict[str, list] = {m: [] for m in plans}
    try:
        t0 = time.perf_counter()
        execs["stallbench"].start()          # owns the Ray runtime
        startup = time.perf_counter() - t0
        execs["stock"].start()               # reuses it (and warms the same workers)
        su = execs["stallbench"].run_figures() or {}
        print(f"Ray start-up: {startup:.1f} s "
              f"(ray.init {execs['stallbench']._startup.get('ray_init_s', 0):.1f} s + worker "
              f"warm-up {execs['stallbench']._startup.get('warm_workers_s', 0):.1f} s), "
              f"excluded from every figure below", flush=True)
        del su
        for m in plans:                      # untimed warm pass, as `stallbench run` does
            execs[m].prepare(plans[m], None)
        computes = {m: plans[m].build_compute() for m in plans}
        ops: dict[str, list] = {m: [] for m in plans}
        for r in range(args.repeats):
            for m in ("stock", "stallbench"):
                fig, _, _ = measured_run(plans[m], execs[m], computes[m])
                figures[m].append(fig)
                ops[m] = fig.executor_figures.get("ray", {}).get("operators", [])
                print(f"  repeat {r + 1} {m:10s}: {fig.throughput_samples_s:>10,.0f} samples/s, "
                      f"first batch {fig.time_to_first_batch_s:5.2f} s, epoch {fig.epoch_s:6.2f} s",
                      flush=True)
    finally:
        execs["stock"].stop()
        execs["stallbench"].stop()

    def med(m: str, attr: str) -> float:
        return statistics.median(getattr(f, attr) for f in figures[m])

    base = med("stock", "throughput_samples_s")
    base_steady = med("stock", "steady_throughput_samples_s")
    rows = []
    for m in ("stock", "stallbench"):
        vals = [f.throughput_samples_s for f in figures[m]]
        rows.append((m, f"{med(m, 'time_to_first_batch_s'):.2f}", f"{med(m, 'epoch_s'):.2f}",
                     f"{_fmt_rate(med(m, 'throughput_samples_s'))} "
                     f"({_fmt_rate(min(vals))}..{_fmt_rate(max(vals))})",
                     _fmt_rate(med(m, "steady_throughput_samples_s")),
                     f"{med(m, 'throughput_samples_s') / base:.2f}x",
                     f"{med(m, 'steady_throughput_samples_s') / base_steady:.2f}x"))
    head = ("mode", "first batch s", "epoch s", "samples/s (min..max)", "steady samples/s",
            "vs stock", "steady vs stock")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    print()
    print(line(head))
    print(line(["-" * w for w in widths]))
    for r in rows:
        print(line(r))
    print("\nRay Data operators, last repeat (wall s summed over tasks / rows out / blocks):")
    for m in ("stock", "stallbench"):
        for op in ops[m]:
            if op.get("wall_s") is None:
                continue
            print(f"  {m:10s} {op['name'][:58]:58s} {op['wall_s']:6.2f} s  "
                  f"{op.get('rows') or 0:>9,} rows  {op.get('blocks') or 0:>4} blocks")
    ratio = med("stallbench", "throughput_samples_s") / base
    verdict = "PASS" if ratio >= TARGET else "FAIL"
    print(f"\n{verdict}: stallbench's Ray path delivers {ratio:.2f}x stock Ray Data's epoch "
          f"throughput (target >= {TARGET:g}x); Ray start-up {startup:.1f} s excluded.")
    if args.json:
        args.json.write_text(json.dumps({
            "startup_s": startup, "ratio": ratio, "verdict": verdict,
            "runs": {m: [f.__dict__ for f in figures[m]] for m in figures}}, indent=1,
            default=str))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
