"""The on-trainer path against the decode ceiling and a plain DataLoader (issue 27), side by side.

Part ``path``: on held-out Parquet (``heldout.py``: written by pyarrow, not by stallbench's
generator) of several shapes, in one run with interleaved repeats (the order rotates every
repeat, so a shared machine's drift hits every side alike), three sides:

* **decode ceiling**: decode only, the faster of ``ParquetFile.iter_batches(batch_size,
  use_threads=True)`` and ``read_row_group`` over the same row groups, both timed each repeat
  (a plain loader beat the ``iter_batches``-only ceiling at load 3-5);
* **plain DataLoader, 0 workers**: a torch ``DataLoader`` over the row groups yielding, per
  batch, each column's numpy values (a list column as values + offsets): what a user writes
  without stallbench, in the same process layout as the best variant (no workers);
* **best on-trainer variant**: stallbench with the default ``batch_format`` (``jagged``),
  0 loader workers, ``prefetch_batches = 2``, ``fetch_ahead = 1`` (the next row group decoded
  in a background thread while this one is packed; printed beside the same without it), an
  EMULATED 0 ms model step, measured by the
  same ``measured_run`` as ``stallbench run`` (its sampler and probe included).

Fairness of the ceiling: all three read the same files from a warm page cache (one unrecorded
pass of every side before the repeats), with the same pyarrow CPU pool (the library default;
no side sets a thread budget), one side at a time. Per-stage seconds: the ceiling is all
decode; the plain loader's decode (``read_row_group``) and its per-batch conversion are timed
inside it; stallbench's are its result's stage seconds (fetch, preprocess, producer-side and
trainer-side transfer, the trainer's wait).

Part ``workers``: ``cpu_cost_us_per_row = 2`` (a calibrated CPU-busy preprocess), 2 loader
workers over 0, with where the rest of 2x goes: the workers' CPU outside their stages
(fork, pickling, the DataLoader queue, exit), each worker's first work item against its later
ones (a worker is a fresh process every run: its first item faults in its memory), the
trainer's receive, and the cores the machine gave. Interleaved with the two: 2 workers with
``loader.persistent_workers`` (forked once, kept across runs: a run no longer pays a worker's
fork, start-up, first item's page faults and exit; their CPU read from the live processes),
with its own target line; and (``--no-ab`` leaves it out) 2 workers with the old end of run
(``LocalExecutor.early_shutdown = False``: workers told to exit only after the trainer consumed
every batch), with its ratio to the new. The first target's ratio is the same two sides as
before (workers forked every run).

Targets (PASS/FAIL, ratios of each side's best repeat): best variant >= 0.9x the ceiling and
>= 1.0x the plain DataLoader on every shape; 2 us/row: 2 workers >= 1.5x 0 workers, printed
for workers forked every run and for persistent workers.

Run: ``.venv/bin/python benchmarks/trainer_path.py [--repeats 5] [--files 4] [--part path]
[--profile] [--no-ab]`` (the first run writes the held-out files into the stallbench cache).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from heldout import heldout_files  # noqa: E402
from stallbench import scenario  # noqa: E402
from stallbench.executors import EXECUTORS  # noqa: E402
from stallbench.measure.probe import measured_run  # noqa: E402
from stallbench.pipeline import Plan, dataset_for  # noqa: E402
from stallbench.run.runner import default_cache_dir  # noqa: E402
from stallbench.stages.batch_format import seq_parts  # noqa: E402
from variants import with_cpu  # noqa: E402

TARGET_CEILING = 0.9
TARGET_PLAIN = 1.0
TARGET_WORKERS = 1.5
BEST = {"num_workers": 0, "prefetch_batches": 2, "fetch_ahead": 1}   # default batch_format: jagged
BEST_NAME = "best: jagged, 0 w, pf 2, ahead 1"
# The same without fetch-ahead (the best variant before ``loader.fetch_ahead``), side by side
# so what the overlap buys is a ratio of one run.
NO_AHEAD = {"num_workers": 0, "prefetch_batches": 2}
NO_AHEAD_NAME = "jagged, 0 w, pf 2, no ahead"


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    rows_per_file: int = 65_536
    row_group_rows: int | None = None
    max_len: int = 29


SHAPES = [
    Shape("held-out: 65,536-row groups, 0..29 ids, batches of 4,096", 4096),
    Shape("8,192-row groups, batches of 1,024", 1024, row_group_rows=8192),
    Shape("0..99 ids, batches of 16,384", 16_384, rows_per_file=32_768, max_len=99),
    Shape("0..4 ids, 16,384-row groups, batches of 8,192", 8192, row_group_rows=16_384,
          max_len=4),
]


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v) if isinstance(v, str) else str(v)


class Bench:
    def __init__(self, data: Path, files: list[str], batch: int) -> None:
        self.data = data
        self.files = files
        self.batch = batch
        self.groups = [(f, g) for f in files for g in range(pq.ParquetFile(f).num_row_groups)]
        self.live: dict[str, tuple[Plan, Any]] = {}

    def config(self, loader: dict[str, Any], cost: float = 0.0) -> Any:
        text = (f'name = "trainer-path"\n[dataset]\npath = "{self.data}"\n'
                f'[model]\nkind = "emulated"\nstep_ms = 0\n'
                f"[preprocess]\ncpu_cost_us_per_row = {cost}\n"
                f"[loader]\nbatch_size = {self.batch}\n"
                + "".join(f"{k} = {_toml(v)}\n" for k, v in loader.items()))
        return scenario.parse(text, "benchmarks/trainer_path.py").base

    def stallbench(self, loader: dict[str, Any], cost: float = 0.0,
                   profile: cProfile.Profile | None = None,
                   executor_attrs: dict[str, Any] | None = None) -> dict[str, Any]:
        """One measured run over the selected files; executor (and its buffer pool) kept
        across repeats after one unrecorded warm-up run, as ``stallbench run`` does.
        ``executor_attrs``: executor attributes set for an A/B of the old path (none of them
        is a scenario knob). The executor is tapped (``_Tap``): each work item's stage times
        as the trainer received them, for the workers part's per-worker figures."""
        cfg = self.config(loader, cost)
        key = repr(cfg) + repr(sorted((executor_attrs or {}).items()))
        if key not in self.live:
            plan = _only_files(Plan.create(cfg, dataset_for(cfg, default_cache_dir(), "bench")),
                               self.files)
            ex = EXECUTORS.get("local")(cfg, "bench")
            for k, v in (executor_attrs or {}).items():
                setattr(ex, k, v)
            ex.start()
            self.live[key] = (plan, _Tap(ex))
            measured_run(plan, self.live[key][1], plan.build_compute())
        plan, ex = self.live[key]
        ex.items = []
        kept0 = ex._kept_cpu_s()
        if profile is not None:
            profile.enable()
        fig, _, _ = measured_run(plan, ex, plan.build_compute())
        if profile is not None:
            profile.disable()
        s = fig.stage_s
        return {"samples_s": fig.throughput_samples_s, "samples": fig.samples,
                "epoch_s": fig.epoch_s, "fig": fig, "items": ex.items,
                # CPU of workers kept alive across runs: not in the clock of reaped children
                # that ``with_cpu`` reads
                "unreaped_cpu_s": ex._kept_cpu_s() - kept0,
                "stages": {"fetch": s.fetch, "preprocess": s.preprocess,
                           "transfer producer": s.transfer_producer,
                           "transfer trainer": s.transfer_trainer, "trainer wait": fig.wait_s}}

    def stop(self) -> None:
        for _, ex in self.live.values():
            ex.stop()
        self.live.clear()

    def ceiling(self) -> dict[str, Any]:
        """Decode only, the faster of pyarrow's two ways each time (both timed back to back,
        the order alternating): ``iter_batches(batch_size)`` and ``read_row_group``. Measured
        here, neither is always faster (``read_row_group`` won at load 3-5, ``iter_batches``
        under load 9-20), and a ceiling a plain loader can beat is not one."""
        self._flip = not getattr(self, "_flip", False)
        ways = [self._iter_batches, self._row_groups]
        got = [w() for w in (ways if self._flip else ways[::-1])]
        n, dt, how = min(got, key=lambda g: g[1])
        return {"samples_s": n / dt, "samples": n, "epoch_s": dt, "stages": {how: dt}}

    def _iter_batches(self) -> tuple[int, float, str]:
        n = 0
        t0 = time.perf_counter()
        for f in self.files:
            for b in pq.ParquetFile(f).iter_batches(batch_size=self.batch, use_threads=True):
                n += b.num_rows
        return n, time.perf_counter() - t0, "decode (iter_batches)"

    def _row_groups(self) -> tuple[int, float, str]:
        n = 0
        t0 = time.perf_counter()
        for f, g in self.groups:
            n += pq.ParquetFile(f).read_row_group(g, use_threads=True).num_rows
        return n, time.perf_counter() - t0, "decode (read_row_group)"

    def plain(self, workers: int) -> dict[str, Any]:
        ds = _PlainColumns(self.groups, self.batch)
        loader = DataLoader(ds, batch_size=None, num_workers=workers,
                            collate_fn=_identity, prefetch_factor=2 if workers else None,
                            multiprocessing_context="fork" if workers else None)
        n = 0
        t0 = time.perf_counter()
        for batches in loader:
            for b in batches:
                n += len(b["label"])
        dt = time.perf_counter() - t0
        stages = ({"decode": ds.decode_s, "convert": ds.convert_s,
                   "loader + loop": dt - ds.decode_s - ds.convert_s} if not workers else {})
        return {"samples_s": n / dt, "samples": n, "epoch_s": dt, "stages": stages}


class _Tap:
    """The executor, with each work item's ``StageTimes`` kept as the trainer receives it
    (what the producer measured: its stage CPU and pid); everything else is the executor's."""

    def __init__(self, ex: Any) -> None:
        self._ex = ex
        self.items: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ex, name)

    def run(self, plan: Plan) -> Any:
        inner = self._ex.run(plan)
        try:
            for out in inner:
                self.items.append(out.times)
                yield out
        finally:
            inner.close()   # the executor's end of run (workers joined) now, as untapped


def _per_worker(items: list[Any]) -> str:
    """Each loader worker's first work item against its later ones (stage CPU: fetch,
    preprocess, packing), in the order it produced them: a worker is a fresh process every
    run, and its first item pays for faulting in the memory its decode and packing use."""
    by: dict[int, list[float]] = {}
    for t in items:
        by.setdefault(t.worker, []).append(t.fetch_cpu_s + t.preprocess_cpu_s + t.transfer_cpu_s)
    parts = []
    for cpu in by.values():
        if len(cpu) > 1:
            rest = statistics.median(cpu[1:])
            parts.append(f"{cpu[0] * 1e3:.0f} vs {rest * 1e3:.0f} ms (+{(cpu[0] - rest) * 1e3:.0f})")
    return "; ".join(parts) or "n/a"


def _only_files(plan: Plan, files: list[str]) -> Plan:
    """The plan restricted to the benchmark's files (the dataset path holds all of them)."""
    keep = set(files)
    return dataclasses.replace(plan, items=tuple(s for s in plan.items if s.file in keep))


class _PlainColumns(Dataset):
    """A plain PyTorch dataset over row groups: per batch, each column's numpy values, a list
    column as (values, offsets): the issue's "plain DataLoader yielding values + offsets",
    with no collation at all. Times its own decode and conversion (0 workers: in-process)."""

    def __init__(self, groups: list[tuple[str, int]], batch: int) -> None:
        self.groups = groups
        self.batch = batch
        self.decode_s = self.convert_s = 0.0

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, i: int) -> list[dict[str, Any]]:
        f, g = self.groups[i]
        t0 = time.perf_counter()
        table = pq.ParquetFile(f).read_row_group(g)
        t1 = time.perf_counter()
        out = []
        for lo in range(0, table.num_rows, self.batch):
            t = table.slice(lo, self.batch)
            b: dict[str, Any] = {}
            for name in t.column_names:
                col = t.column(name)
                if str(col.type).startswith("list"):
                    off, vals = seq_parts(col)
                    b[name] = (np.ascontiguousarray(vals), off)
                else:
                    b[name] = np.ascontiguousarray(col.to_numpy())
            out.append(b)
        self.decode_s += t1 - t0
        self.convert_s += time.perf_counter() - t1
        return out


def _identity(x: Any) -> Any:
    return x


def _interleaved(runs: dict[str, Callable[[], dict[str, Any]]], repeats: int,
                 ) -> dict[str, list[dict[str, Any]]]:
    """Every side once unrecorded (page cache, executors, pools warm), then ``repeats``
    rounds, the order rotated each round so no side always runs first or after another."""
    for fn in runs.values():
        fn()
    names = list(runs)
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(with_cpu(runs[name]))
    return out


def _best(rs: list[dict[str, Any]]) -> dict[str, Any]:
    return max(rs, key=lambda r: r["samples_s"])


def _row(name: str, rs: list[dict[str, Any]]) -> str:
    vals = [r["samples_s"] for r in rs]
    b = _best(rs)
    stages = "  ".join(f"{k} {v:.3f}" for k, v in b["stages"].items())
    return (f"  {name:34} {max(vals):>10,.0f} {statistics.median(vals):>10,.0f} "
            f"{b['cores']:>6.2f}  {stages}")


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def path_part(shapes: list[Shape], n_files: int, repeats: int) -> list[tuple[str, float, bool]]:
    targets = []
    for shape in shapes:
        data = heldout_files(default_cache_dir(), files=n_files, rows_per_file=shape.rows_per_file,
                             row_group_rows=shape.row_group_rows, max_len=shape.max_len)
        files = sorted(str(p) for p in data.glob("*.parquet"))
        bench = Bench(data, files, shape.batch)
        runs = {"ceiling: decode only": bench.ceiling,
                "plain DataLoader, 0 workers": lambda: bench.plain(0),
                BEST_NAME: lambda: bench.stallbench(BEST),
                NO_AHEAD_NAME: lambda: bench.stallbench(NO_AHEAD)}
        print(f"\n{shape.name}: {len(files)} files, {len(bench.groups)} row groups, "
              f"{len(files) * shape.rows_per_file:,} rows; {_load()} before")
        res = _interleaved(runs, repeats)
        bench.stop()
        print(f"  {'side':34} {'best/s':>10} {'median/s':>10} {'cores':>6}  "
              f"seconds per stage (best repeat)")
        for name, rs in res.items():
            print(_row(name, rs))
        ceil, plain, best, no_ahead = (_best(res[k])["samples_s"] for k in runs)
        paired_c = statistics.median(b["samples_s"] / c["samples_s"] for b, c in
                                     zip(res[BEST_NAME],
                                         res["ceiling: decode only"]))
        paired_p = statistics.median(b["samples_s"] / c["samples_s"] for b, c in
                                     zip(res[BEST_NAME],
                                         res["plain DataLoader, 0 workers"]))
        print(f"  best / ceiling {best / ceil:.2f} (median of paired repeats {paired_c:.2f}); "
              f"best / plain {best / plain:.2f} (paired {paired_p:.2f}); "
              f"plain / ceiling {plain / ceil:.2f}; fetch-ahead / none {best / no_ahead:.2f}; "
              f"{_load()} after")
        if plain > ceil * 1.03:
            print("  NOTE: the plain loader beat the ceiling by more than 3%: the ceiling's "
                  "measurement is suspect on this shape")
        short = shape.name.split(":")[0]
        targets.append((f"{short}: best / ceiling >= {TARGET_CEILING}", best / ceil,
                        best / ceil >= TARGET_CEILING))
        targets.append((f"{short}: best / plain (0 workers) >= {TARGET_PLAIN}", best / plain,
                        best / plain >= TARGET_PLAIN))
    return targets


OLD_END = "2 workers, old end of run"
KEPT = "2 workers, persistent_workers"


def workers_part(n_files: int, repeats: int, fmt: str, ab: bool = False,
                 ) -> list[tuple[str, float, bool]]:
    data = heldout_files(default_cache_dir(), files=16)
    files = sorted(str(p) for p in data.glob("*.parquet"))[:n_files]
    bench = Bench(data, files, 4096)
    knobs = {"batch_format": fmt, "prefetch_batches": 2}
    runs = {f"{fmt}, 2 us/row, 0 workers": lambda: bench.stallbench({**knobs, "num_workers": 0}, 2.0),
            f"{fmt}, 2 us/row, 2 workers": lambda: bench.stallbench({**knobs, "num_workers": 2}, 2.0)}
    # Workers forked once and kept across runs (``loader.persistent_workers``): what is left
    # of 2x once a run no longer pays a worker's fork, start-up, first item and exit.
    runs[KEPT] = lambda: bench.stallbench({**knobs, "num_workers": 2, "persistent_workers": True},
                                          2.0)
    if ab:
        # The end of run before ``LocalExecutor.early_shutdown``: workers told to exit only
        # when the trainer asks for an item past the last, after consuming every batch.
        runs[OLD_END] = lambda: bench.stallbench({**knobs, "num_workers": 2}, 2.0,
                                                 executor_attrs={"early_shutdown": False})
    print(f"\nworkers at 2 us/row of preprocessing ({fmt}, batches of 4,096, prefetch_batches = 2): "
          f"{len(files)} files, {len(files) * 65536:,} rows; {_load()} before")
    res = _interleaved(runs, repeats)
    bench.stop()
    print(f"  {'side':34} {'best/s':>10} {'median/s':>10} {'cores':>6}  "
          f"seconds per stage (best repeat, producers summed)")
    for name, rs in res.items():
        print(_row(name, rs))
    r0, r2 = (_best(res[k]) for k in list(runs)[:2])
    ratio = r2["samples_s"] / r0["samples_s"]
    pairs = list(zip(*(res[k] for k in list(runs)[:2])))
    f0, f2 = r0["fig"], r2["fig"]
    s = f2.stage_s
    stages_cpu = s.fetch_cpu + s.preprocess_cpu + s.transfer_producer_cpu
    prod = f2.producer_cpu_s or 0.0
    pool = f2.executor_figures.get("buffer_pool", {})
    cpu0 = r0["cpu_us_row"] * r0["samples"] / 1e6
    cpu2 = r2["cpu_us_row"] * r2["samples"] / 1e6
    steady = f2.steady_throughput_samples_s / f0.steady_throughput_samples_s
    print(f"  2 workers / 0 workers {ratio:.2f} (median of paired repeats "
          f"{statistics.median(b['samples_s'] / a['samples_s'] for a, b in pairs):.2f}"
          f"; after each run's first batch only: {steady:.2f}, an upper bound that is not the "
          f"target: the rows 2 workers produced before their first batch count in it)")
    print(f"  where 2 workers' time goes (best repeat, {f2.epoch_s:.2f} s wall, {r2['cores']:.2f} "
          f"cores used of {os.cpu_count()}):")
    print(f"    workers' CPU {prod:.2f} s: in their stages {stages_cpu:.2f} s (fetch "
          f"{s.fetch_cpu:.2f}, preprocess {s.preprocess_cpu:.2f}, pack into shared memory "
          f"{s.transfer_producer_cpu:.2f}); outside them {prod - stages_cpu:.2f} s (fork and "
          f"start-up, pickling, the DataLoader queue hand-off, exit)")
    print(f"    each worker's first work item vs the median of its later ones, stage CPU (a "
          f"fresh process faults in the memory its decode and packing use): "
          f"{_per_worker(r2['items'])}")
    print(f"    trainer CPU {f2.trainer_cpu_s:.2f} s: receive (unpack, checks) "
          f"{f2.trainer_transfer_s:.2f} s wall; the rest (unpickling, the loop, the receive "
          f"thread, the sampler) {max(f2.trainer_cpu_s - f2.trainer_transfer_s, 0):.2f} s")
    print(f"    buffer pool: {pool.get('pooled_batches', 0)} batches in pool slots, "
          f"{pool.get('fresh_shared_batches', 0)} in fresh shared memory (one more page-faulting "
          f"copy each)")
    print(f"    CPU per run (this process and its workers): 0 workers {cpu0:.2f} s, 2 workers "
          f"{cpu2:.2f} s ({cpu2 / max(cpu0, 1e-9):.2f}x: the price of the hand-off); DERIVED "
          f"bound on 2 idle cores, were 0 workers on exactly one core: 2 x {cpu0:.2f} / "
          f"{cpu2:.2f} = {2 * cpu0 / max(cpu2, 1e-9):.2f}; time to first batch "
          f"{f2.time_to_first_batch_s:.2f} s vs {f0.time_to_first_batch_s:.2f} s; {_load()} after")
    if ab:
        old_end = _best(res[OLD_END])
        paired = statistics.median(b["samples_s"] / o["samples_s"]
                                   for b, o in zip(res[list(runs)[1]], res[OLD_END]))
        print(f"  A/B: 2 workers / {OLD_END} {r2['samples_s'] / old_end['samples_s']:.2f} "
              f"(paired {paired:.2f}); {OLD_END} / 0 workers "
              f"{old_end['samples_s'] / r0['samples_s']:.2f}")
    kept = _best(res[KEPT])
    kept_ratio = kept["samples_s"] / r0["samples_s"]
    kept_cpu = kept["cpu_us_row"] * kept["samples"] / 1e6
    print(f"  {KEPT} / 0 workers {kept_ratio:.2f} (paired "
          f"{statistics.median(k['samples_s'] / a['samples_s'] for a, k in zip(res[list(runs)[0]], res[KEPT])):.2f}"
          f"); / 2 workers forked per run {kept['samples_s'] / r2['samples_s']:.2f}; CPU per run "
          f"{kept_cpu:.2f} s ({kept_cpu / max(cpu0, 1e-9):.2f}x 0 workers'); its first work items "
          f"vs later: {_per_worker(kept['items'])}")
    return [(f"2 us/row {fmt}: 2 workers / 0 workers >= {TARGET_WORKERS}", ratio,
             ratio >= TARGET_WORKERS),
            (f"2 us/row {fmt}: 2 persistent workers / 0 workers >= {TARGET_WORKERS}", kept_ratio,
             kept_ratio >= TARGET_WORKERS)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--files", type=int, default=4, help="held-out files per shape")
    ap.add_argument("--worker-files", type=int, default=8,
                    help="held-out files (65,536 rows) for the workers part")
    ap.add_argument("--part", choices=("path", "workers", "all"), default="all")
    ap.add_argument("--shapes", type=int, default=len(SHAPES), help="first N shapes only")
    ap.add_argument("--format", default="jagged", help="batch format of the workers part")
    ap.add_argument("--no-ab", dest="ab", action="store_false",
                    help="workers part: leave out the old end of run (workers joined after the "
                         "last batch), otherwise run interleaved beside the new for their ratio")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile of the best variant's trainer (prefetch_batches = 0, so the "
                         "whole path runs in the profiled thread), first shape")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)   # progress shows when piped to a file
    print(f"machine: {os.cpu_count()} cores; {_load()} at start; {args.repeats} interleaved "
          f"repeats; EMULATED 0 ms model step (every figure is the data path alone)")
    targets = []
    if args.part in ("path", "all"):
        targets += path_part(SHAPES[:args.shapes], args.files, args.repeats)
    if args.part in ("workers", "all"):
        targets += workers_part(args.worker_files, args.repeats, args.format, args.ab)
    print(f"\n{'target':66} {'measured':>9}  result")
    for name, value, ok in targets:
        print(f"{name:66} {value:>9.2f}  {'PASS' if ok else 'FAIL'}")
    print(f"\n{_load()} at end ({os.cpu_count()} cores; above that, other work competed for "
          f"the CPU and the ratios are not this machine's limits)")
    if args.profile:
        shape = SHAPES[0]
        data = heldout_files(default_cache_dir(), files=args.files)
        bench = Bench(data, sorted(str(p) for p in data.glob("*.parquet")), shape.batch)
        knobs = {**BEST, "prefetch_batches": 0}
        bench.stallbench(knobs)
        prof = cProfile.Profile()
        bench.stallbench(knobs, profile=prof)
        print("\ncProfile of the trainer, best variant with prefetch_batches = 0 (tottime):")
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
        bench.stop()
    return 0 if all(ok for _, _, ok in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
