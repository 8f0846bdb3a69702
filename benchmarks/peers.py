"""Petastorm as a measured peer: the same Parquet files read five ways, side by side in one run.

Rows (each ends at the same tensors per batch of 4096: ``dense`` (B, 40) float32, ``sparse``
(B, 20) int64, ``label`` (B,) float32; a loader that hands over one tensor per column has
them stacked in the timed trainer loop, because a model needs them so):

* **petastorm DataLoader**: ``make_batch_reader`` (2 reader threads, row groups in order) and
  ``petastorm.pytorch.DataLoader``, Petastorm's PyTorch loader, which turns each Arrow batch
  into rows and collates them in Python;
* **petastorm BatchedDataLoader**: the same reader with ``petastorm.pytorch.BatchedDataLoader``
  (batches with torch ops, no per-row Python);
* **plain DataLoader**: a torch ``DataLoader`` over row groups, 2 workers, columnar tensors
  handed over the torch way (stallbench's vectorised conversion, as in ``variants.py``);
* **stallbench local**: the best on-trainer path of ``variants.py`` (``single_buffer``,
  producer collate, 2 workers, a 4-batch preload);
* **stallbench flight**: ``[executor] kind = "flight"``, 2 local Flight servers (one stream
  each) streaming Arrow record batches over loopback gRPC, IPC uncompressed.

No model (an emulated step of 0 ms) and no preprocessing: the data path alone. Start-up
(Petastorm's reader with its metadata scan, stallbench's executor start: workers fork per
epoch, Flight servers start once) is reported apart from the epoch; samples/s is rows over
the epoch from the first request to the last batch. Rows are interleaved over ``--repeats``;
the median is reported with min..max, and ratios use medians. A checksum of every tensor
(summed as float64) shows that every path delivered the same data.

The table has no sequence features: Petastorm's batch reader refuses list columns whose
lengths differ within a batch unless a user transform pads them in its workers.

Petastorm needs pyarrow's legacy ``ParquetDataset`` arguments, gone since pyarrow 15, so it
runs in its own environment (``make peers`` builds ``.venv-peers``: ``stallbench[peers]``'s
pyarrow < 15 and numpy < 2, torch shared with ``.venv``) as a subprocess that imports only
petastorm, torch and numpy; ``--peers-python`` points elsewhere. Without it, the Petastorm
rows say why and are skipped.

Run: ``.venv/bin/python benchmarks/peers.py [--repeats 3] [--rows 524288]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
BATCH = 4096
DENSE, SPARSE = 40, 20


# ============================================================== the peer, in its own venv

def petastorm_probe(files: list[str], loader_kind: str) -> dict[str, Any]:
    """One epoch with Petastorm (run by the peers interpreter; imports no stallbench)."""
    import warnings

    warnings.filterwarnings("ignore")
    import numpy as np
    import torch
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader, DataLoader

    dense = [f"dense_{i}" for i in range(DENSE)]
    sparse = [f"sparse_{i}" for i in range(SPARSE)]
    t0 = time.perf_counter()
    reader = make_batch_reader([f"file://{f}" for f in files], num_epochs=1, workers_count=2,
                               reader_pool_type="thread", shuffle_row_groups=False)
    t1 = time.perf_counter()
    loader_cls = DataLoader if loader_kind == "DataLoader" else BatchedDataLoader
    n, ttfb, check = 0, None, 0.0
    with reader:
        t2 = time.perf_counter()
        for b in loader_cls(reader, batch_size=BATCH):
            d = torch.stack([b[c] for c in dense], dim=1).to(torch.float32)
            s = torch.stack([b[c] for c in sparse], dim=1).to(torch.int64)
            y = b["label"].to(torch.float32)
            if ttfb is None:
                ttfb = time.perf_counter() - t2
            n += int(y.shape[0])
            check += float(d.double().sum() + s.double().sum() + y.double().sum())
        t3 = time.perf_counter()
    return {"samples": n, "epoch_s": t3 - t2, "startup_s": t1 - t0, "ttfb_s": ttfb or 0.0,
            "samples_s": n / (t3 - t2), "checksum": check,
            "versions": {"petastorm": __import__("petastorm").__version__,
                         "pyarrow": __import__("pyarrow").__version__,
                         "numpy": np.__version__}}


def run_peer(python: str, files: list[str], kind: str) -> dict[str, Any]:
    out = subprocess.run([python, __file__, "--petastorm-probe", kind, *files],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip()
                           else f"exit {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def peer_unavailable(python: str) -> str | None:
    if not Path(python).exists():
        return f"{python} not found (`make peers` builds it)"
    r = subprocess.run([python, "-c", "import petastorm, petastorm.pytorch, torch"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return f"petastorm does not import with {python}: {last}"
    return None


# ================================================================== stallbench's side

def _config(rows: int, executor: str, loader: dict[str, Any]) -> Any:
    from stallbench import scenario

    text = (f'name = "peers"\n[dataset]\nrows = {rows}\ndense_features = {DENSE}\n'
            f"sparse_features = {SPARSE}\nsparse_cardinality = 1000000\nsequence_features = 0\n"
            f'row_group_rows = 65536\nfiles = 4\ncodec = "snappy"\nseed = 7\n'
            f'[model]\nkind = "emulated"\nstep_ms = 0\n[loader]\nbatch_size = {BATCH}\n'
            + "".join(f"{k} = {json.dumps(v)}\n" for k, v in loader.items())
            + f'[executor]\n{executor}')
    return scenario.parse(text, "benchmarks/peers.py").base


def _checksum(batch: dict[str, Any]) -> float:
    return float(batch["dense"].double().sum() + batch["sparse"].double().sum()
                 + batch["label"].double().sum())


class Stallbench:
    """One executor kept across repeats (as ``stallbench run`` keeps it across runs), after
    one unrecorded warm-up epoch."""

    def __init__(self, rows: int, executor: str, loader: dict[str, Any]) -> None:
        from stallbench.executors import EXECUTORS
        from stallbench.pipeline import Plan, dataset_for
        from stallbench.run.runner import default_cache_dir

        cfg = _config(rows, executor, loader)
        self.plan = Plan.create(cfg, dataset_for(cfg, default_cache_dir(), "bench"))
        self.ex = EXECUTORS.get(cfg.executor.kind)(cfg, "bench")
        t0 = time.perf_counter()
        self.ex.start()
        self.ex.prepare(self.plan, None)
        self.startup_s = time.perf_counter() - t0
        self.checksum = None
        self()

    def __call__(self) -> dict[str, Any]:
        from stallbench.measure.probe import measured_run

        plan = self.plan
        if self.checksum is None:           # the warm-up epoch also checks the data
            total = 0.0
            for out in self.ex.run(plan):
                for b, _, _ in plan.receive(out):
                    total += _checksum(b)
            self.checksum = total
        fig, _, _ = measured_run(plan, self.ex, plan.build_compute())
        return {"samples": fig.samples, "epoch_s": fig.epoch_s, "ttfb_s": fig.time_to_first_batch_s,
                "samples_s": fig.throughput_samples_s, "startup_s": self.startup_s,
                "checksum": self.checksum}

    def stop(self) -> None:
        self.ex.stop()


def plain_dataloader(rows: int) -> dict[str, Any]:
    """A torch DataLoader over row groups, 2 workers, columnar tensors (variants.py's)."""
    import pyarrow.parquet as pq
    from torch.utils.data import DataLoader, Dataset

    from stallbench.pipeline import Plan, dataset_for
    from stallbench.run.runner import default_cache_dir
    from stallbench.stages.batch_format import tensors, to_arrays

    cfg = _config(rows, 'kind = "local"\n', {})
    plan = Plan.create(cfg, dataset_for(cfg, default_cache_dir(), "bench"))

    class RowGroups(Dataset):
        def __len__(self) -> int:
            return len(plan.items)

        def __getitem__(self, i: int) -> list[dict[str, Any]]:
            s = plan.items[i]
            t = pq.ParquetFile(s.file).read_row_group(s.row_group, columns=list(plan.schema.columns))
            return [tensors(to_arrays(t.slice(lo, BATCH), plan.schema))
                    for lo in range(0, t.num_rows, BATCH)]

    t0 = time.perf_counter()
    loader = DataLoader(RowGroups(), batch_size=None, num_workers=2, collate_fn=lambda x: x,
                        prefetch_factor=2, multiprocessing_context="fork")
    n, ttfb, check = 0, None, 0.0
    for batches in loader:
        for b in batches:
            if ttfb is None:
                ttfb = time.perf_counter() - t0
            n += int(b["label"].shape[0])
            check += _checksum(b)
    dt = time.perf_counter() - t0
    return {"samples": n, "epoch_s": dt, "ttfb_s": ttfb or 0.0, "samples_s": n / dt,
            "startup_s": 0.0, "checksum": check}


# ============================================================================== the run

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=524288)
    ap.add_argument("--peers-python", default=str(ROOT / ".venv-peers" / "bin" / "python"))
    ap.add_argument("--petastorm-probe", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.petastorm_probe:
        kind, *files = args.petastorm_probe
        print(json.dumps(petastorm_probe(files, kind)))
        return 0

    sys.path.insert(0, str(ROOT))
    from stallbench.pipeline import dataset_for
    from stallbench.run.runner import default_cache_dir

    cfg = _config(args.rows, 'kind = "local"\n', {})
    files = list(dataset_for(cfg, default_cache_dir(), "bench").files)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; "
          f"{args.rows:,} rows ({DENSE} dense, {SPARSE} sparse), {len(files)} files, "
          f"{args.repeats} interleaved repeats")
    why = peer_unavailable(args.peers_python)
    if why:
        print(f"petastorm rows skipped: {why}")
    runs: dict[str, Callable[[], dict[str, Any]]] = {}
    if not why:
        runs["petastorm DataLoader"] = lambda: run_peer(args.peers_python, files, "DataLoader")
        runs["petastorm BatchedDataLoader"] = lambda: run_peer(args.peers_python, files,
                                                               "BatchedDataLoader")
    runs["plain DataLoader, 2 workers"] = lambda: plain_dataloader(args.rows)
    live = {
        "stallbench local (single_buffer, 2 workers)": Stallbench(
            args.rows, 'kind = "local"\n', {"batch_format": "single_buffer", "collate": "producer",
                                            "num_workers": 2, "prefetch_batches": 4}),
        "stallbench flight (2 servers, loopback)": Stallbench(
            args.rows, 'kind = "flight"\nflight_local_servers = 2\n',
            {"collate": "producer", "prefetch_batches": 4}),
    }
    runs.update(live)
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in runs}
    try:
        for r in range(args.repeats):
            for name, fn in runs.items():
                results[name].append(fn())
    finally:
        for s in live.values():
            s.stop()
    base = "petastorm DataLoader" if "petastorm DataLoader" in results else "plain DataLoader, 2 workers"
    med = {k: statistics.median(x["samples_s"] for x in v) for k, v in results.items()}
    sums = {k: v[0]["checksum"] for k, v in results.items()}
    ref = next(iter(sums.values()))
    print(f"\n{'path':<46} {'samples/s (min..max)':>30} {'first batch s':>13} {'start-up s':>10}"
          f" {'vs ' + base.split(',')[0]:>24}")
    for k, v in results.items():
        vals = [x["samples_s"] for x in v]
        print(f"{k:<46} {med[k]:>12,.0f} ({min(vals):>7,.0f}..{max(vals):>7,.0f})"
              f" {statistics.median(x['ttfb_s'] for x in v):>13.3f}"
              f" {statistics.median(x['startup_s'] for x in v):>10.2f} {med[k] / med[base]:>23.2f}x")
    if "petastorm DataLoader" in results:
        v = results["petastorm DataLoader"][0]["versions"]
        print(f"\npetastorm {v['petastorm']} ran with pyarrow {v['pyarrow']}, numpy {v['numpy']} "
              f"(its own venv); the rest with this venv's pyarrow {__import__('pyarrow').__version__}")
    f, loc = med["stallbench flight (2 servers, loopback)"], med["stallbench local (single_buffer, 2 workers)"]
    print(f"ratios: flight / stallbench local {f / loc:.2f}x; stallbench local / plain DataLoader "
          f"{loc / med['plain DataLoader, 2 workers']:.2f}x"
          + (f"; stallbench local / petastorm DataLoader {loc / med['petastorm DataLoader']:.1f}x; "
             f"flight / petastorm DataLoader {f / med['petastorm DataLoader']:.1f}x; petastorm "
             f"BatchedDataLoader / DataLoader "
             f"{med['petastorm BatchedDataLoader'] / med['petastorm DataLoader']:.1f}x"
             if "petastorm DataLoader" in med else ""))
    bad = {k: s for k, s in sums.items() if abs(s - ref) > 1e-6 * max(abs(ref), 1.0)}
    print("checksums: " + ("every path delivered the same data" if not bad else
                           f"DIFFER: {sums}"))
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
