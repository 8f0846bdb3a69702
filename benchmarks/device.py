"""The trainer's data path into a GPU (issue 15's GPU targets), side by side in one run.

Needs a CUDA GPU (``--smoke`` runs a tiny version anywhere, to check the script: its figures
are not the targets'). On held-out Parquet files (``heldout.py``: 65,536-row files, 40 dense,
20 id and 4 sequence features of 0..29 ids):

1. **The ladder with the real DLRM on the GPU** (embedding dim 64, MLPs 512-256, batch 8192,
   ``dataset.sequence_max_len = 29`` so padded steps carry every id too), from the naive
   PyTorch baseline to the full device path with ``--workers`` loader workers (default 8):
   per step the steady throughput (after the first batch), AU and the H2D copy (CUDA
   events); and the model's **compute-only rate** (the same batches already on the GPU, no
   loader: DS-Analyzer's ingestion-free rate) of each step's own batch form.
2. **The loader alone into GPU memory** (no model: an EMULATED 0 ms step), 8 and 12 workers
   (``--loader-workers``), stallbench's device path against a plain PyTorch ``DataLoader``
   (``pin_memory=True``, ``.to("cuda", non_blocking=True)``) over the same files.

Targets (PASS/FAIL): the best ladder step's steady throughput >= 0.9x its compute-only rate
with >= 8 workers, with AU >= 90%; the loader alone >= 3M samples/s steady with 8-12 workers.

Run: ``python benchmarks/device.py [--workers 8] [--loader-workers 8 12] [--files 16]
[--repeats 2]`` (on the offline GPU machine: after ``. .device/env.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from heldout import heldout_files  # noqa: E402
from stallbench import scenario  # noqa: E402
from stallbench.executors import EXECUTORS  # noqa: E402
from stallbench.measure.probe import measured_run  # noqa: E402
from stallbench.pipeline import COMPUTE_ONLY, Plan, StageCaches, dataset_for  # noqa: E402
from stallbench.run.runner import default_cache_dir  # noqa: E402

BATCH = 8192
TARGET_COMPUTE = 0.9
TARGET_AU = 0.9
TARGET_LOADER = 3_000_000
MODEL = """
[model]
kind = "dlrm"
embedding_dim = 64
embedding_rows = 100000
bottom_mlp = [512, 256, 64]
top_mlp = [512, 256, 1]
"""
NO_MODEL = """
[model]
kind = "emulated"
step_ms = 0
"""


def ladder(workers: int) -> dict[str, dict[str, Any]]:
    """Each step adds one fix to the one before (as scenarios/optimizations.toml)."""
    w = workers
    return {
        "1-naive rows, trainer collate": dict(batch_format="rows", collate="trainer",
                                              num_workers=0, max_batches=4),
        "2-columnar": dict(batch_format="columnar", num_workers=0),
        f"3-columnar, {w} workers": dict(batch_format="columnar", num_workers=w),
        f"4-single buffer, {w} workers, pinned": dict(batch_format="single_buffer",
                                                      num_workers=w, pin_memory=True),
        f"5-jagged, {w} workers, pinned, preload 2": dict(batch_format="jagged", num_workers=w,
                                                         pin_memory=True, device_prefetch=2),
        f"6-jagged + zstd, {w} workers": dict(batch_format="jagged", num_workers=w,
                                              pin_memory=True, device_prefetch=2,
                                              compression="zstd", prefetch_batches=4),
    }


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v) if isinstance(v, str) else str(v)


def config(data: Path, loader: dict[str, Any], model: str, max_batches: int) -> Any:
    loader = {"max_batches": max_batches, **loader}
    text = (f'name = "device-bench"\n[dataset]\npath = "{data}"\nsequence_max_len = 29\n'
            + model + f"[loader]\nbatch_size = {BATCH}\n"
            + "".join(f"{k} = {_toml(v)}\n" for k, v in loader.items()))
    return scenario.parse(text, "benchmarks/device.py").base


def _only(plan: Plan, files: list[str]) -> Plan:
    import dataclasses

    keep = set(files)
    return dataclasses.replace(plan, items=tuple(s for s in plan.items if s.file in keep))


def measure(cfg: Any, files: list[str], repeats: int, compute_only: bool) -> dict[str, Any]:
    """Warm-up run, then ``repeats`` measured runs (best steady rate kept: other work only
    slows a run down), and optionally the compute-only run of the same batches."""
    plan = _only(Plan.create(cfg, dataset_for(cfg, default_cache_dir(), "bench")), files)
    compute = plan.build_compute()
    out: dict[str, Any] = {}
    with EXECUTORS.get("local")(cfg, "bench") as ex:
        measured_run(plan, ex, compute)
        figs = [measured_run(plan, ex, compute)[0] for _ in range(repeats)]
        best = max(figs, key=lambda f: f.steady_throughput_samples_s)
        out.update(steady=best.steady_throughput_samples_s, epoch_rate=best.throughput_samples_s,
                   au=best.device.au if best.device else float("nan"),
                   h2d_gb_s=best.device.h2d_gb_s if best.device else None,
                   h2d_ms=best.device.h2d_ms_median if best.device else None,
                   step_ms=best.device.step_ms_median if best.device else None,
                   sources=(best.device.h2d_from_pool, best.device.h2d_from_ring,
                            best.device.h2d_from_pageable) if best.device else None,
                   pool=ex.run_figures().get("buffer_pool"))
        if compute_only:
            caches = StageCaches.build(plan)
            only = plan.with_ablation(COMPUTE_ONLY, caches)
            measured_run(only, ex, compute)
            runs = [measured_run(only, ex, compute)[0] for _ in range(repeats)]
            out["compute_only"] = max(f.steady_throughput_samples_s for f in runs)
            del caches
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


class _PlainColumns(Dataset):
    """A plain PyTorch dataset: per batch, one tensor per column (list columns as values +
    offsets), no collation; the DataLoader's pin thread pins them."""

    def __init__(self, files: list[str]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> list[dict[str, torch.Tensor]]:
        from stallbench.stages.batch_format import seq_parts

        table = pq.ParquetFile(self.files[i]).read_row_group(0)
        out = []
        for lo in range(0, table.num_rows, BATCH):
            t = table.slice(lo, BATCH)
            b: dict[str, torch.Tensor] = {}
            for name in t.column_names:
                col = t.column(name)
                if str(col.type).startswith("list"):
                    off, vals = seq_parts(col)
                    b[name + ".values"] = torch.from_numpy(np.ascontiguousarray(vals))
                    b[name + ".offsets"] = torch.from_numpy(off)
                else:
                    b[name] = torch.from_numpy(np.array(col.to_numpy(zero_copy_only=False)))
            out.append(b)
        return out


def _identity(x: Any) -> Any:
    return x


def plain_loader(files: list[str], workers: int, device: torch.device) -> float:
    """Steady samples/s (after the first batch) of a plain DataLoader into GPU memory."""
    loader = DataLoader(_PlainColumns(files), batch_size=None, num_workers=workers,
                        collate_fn=_identity, pin_memory=device.type == "cuda",
                        prefetch_factor=2 if workers else None,
                        multiprocessing_context="fork" if workers else None)
    n, t_first = 0, None
    t0 = time.perf_counter()
    for batches in loader:
        for b in batches:
            on = {k: v.to(device, non_blocking=True) for k, v in b.items()}
            if device.type == "cuda":
                torch.cuda.current_stream().synchronize()
            if t_first is None:
                t_first = time.perf_counter()
            else:
                n += len(on["label"])
    dt = time.perf_counter() - (t_first or t0)
    return n / dt if dt > 0 else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=8, help="loader workers of the ladder")
    ap.add_argument("--loader-workers", type=int, nargs="+", default=[8, 12])
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--ladder-batches", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny run on any device (no targets)")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)   # progress shows when piped to a file
    gpu = torch.cuda.is_available()
    if not gpu and not args.smoke:
        print("benchmarks/device.py needs a CUDA GPU (or --smoke to check the script)",
              file=sys.stderr)
        return 2
    if args.smoke:
        args.workers, args.loader_workers, args.files = 2, [2], 2
        args.ladder_batches, args.repeats = 6, 1
    data = heldout_files(default_cache_dir(), files=16)
    files = sorted(str(p) for p in data.glob("*.parquet"))[:args.files]
    dev = torch.cuda.get_device_name() if gpu else "no GPU (smoke run on the CPU)"
    print(f"machine: {os.cpu_count()} cores, {dev}, load average {os.getloadavg()[0]:.1f}; "
          f"{len(files)} held-out files ({len(files) * 65536:,} rows), batches of {BATCH}")

    print(f"\n1. ladder, real DLRM on the {'GPU' if gpu else 'CPU'} ({args.ladder_batches} "
          f"batches per run, best of {args.repeats})")
    head = (f"{'step':44} {'steady samples/s':>16} {'compute-only':>13} {'ratio':>6} {'AU':>5} "
            f"{'H2D ms':>7} {'GB/s':>6} {'step ms':>8}  H2D from pool/ring/pageable")
    print(head)
    steps = {}
    for name, knobs in ladder(args.workers).items():
        heavy = knobs.get("num_workers", 0) > 0
        cfg = config(data, knobs, MODEL, knobs.get("max_batches", args.ladder_batches))
        r = measure(cfg, files, args.repeats, compute_only=heavy)
        steps[name] = r
        co = r.get("compute_only")
        ratio = r["steady"] / co if co else float("nan")
        print(f"{name:44} {r['steady']:>16,.0f} {co or float('nan'):>13,.0f} {ratio:>6.2f} "
              f"{r['au']:>5.0%} {r['h2d_ms'] or float('nan'):>7.3f} "
              f"{r['h2d_gb_s'] or float('nan'):>6.1f} {r['step_ms'] or float('nan'):>8.2f}  "
              f"{r['sources']}", flush=True)
    eligible = {k: v for k, v in steps.items() if v.get("compute_only")}
    best_name = max(eligible, key=lambda k: eligible[k]["steady"])
    best = eligible[best_name]

    print("\n2. loader alone into GPU memory (EMULATED 0 ms step)")
    loader_rates = {}
    for w in args.loader_workers:
        for fmt in ("jagged", "single_buffer"):
            knobs = dict(batch_format=fmt, num_workers=w, pin_memory=True, device_prefetch=2)
            cfg = config(data, knobs, NO_MODEL, 0)
            r = measure(cfg, files, args.repeats, compute_only=False)
            loader_rates[(fmt, w)] = r["steady"]
            print(f"  stallbench {fmt:13} {w:>2} workers  {r['steady']:>12,.0f} samples/s steady  "
                  f"H2D {r['h2d_gb_s'] or float('nan'):.1f} GB/s, from pool/ring/pageable "
                  f"{r['sources']}", flush=True)
        plain = plain_loader(files, w, torch.device("cuda" if gpu else "cpu"))
        print(f"  plain DataLoader (pin_memory) {w:>2} workers {plain:>12,.0f} samples/s steady",
              flush=True)
    best_loader = max(loader_rates.values())

    targets = [
        (f"best ladder step ({best_name}) / compute-only >= {TARGET_COMPUTE}",
         best["steady"] / best["compute_only"], best["steady"] / best["compute_only"] >= TARGET_COMPUTE),
        (f"AU of that step >= {TARGET_AU:.0%}", best["au"], best["au"] >= TARGET_AU),
        (f"loader alone into GPU memory >= {TARGET_LOADER / 1e6:.0f}M samples/s "
         f"({'/'.join(map(str, args.loader_workers))} workers)", best_loader / 1e6,
         best_loader >= TARGET_LOADER),
    ]
    print(f"\n{'target':78} {'measured':>9}  result")
    for name, value, ok in targets:
        verdict = ("PASS" if ok else "FAIL") if gpu and not args.smoke else "(smoke)"
        print(f"{name:78} {value:>9.2f}  {verdict}")
    print(f"\nload average {os.getloadavg()[0]:.1f} at end ({os.cpu_count()} cores)")
    return 0 if args.smoke or all(ok for _, _, ok in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
