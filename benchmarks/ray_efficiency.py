"""The Ray path's producer CPU per sample against a local DataLoader worker's, on the same
work, side by side; and Ray's start-up, first and reused.

Both executors run the same plan through stallbench's measured trainer loop: a synthetic
recsys table, a calibrated CPU burn per row (``--cost-us``, thread CPU time: known by
construction), ``single_buffer`` batches, an emulated step of ``--step-ms`` (so the producers,
not the trainer, set the pace). ``--workers`` local DataLoader workers against a local Ray of
as many CPUs (producer tasks), interleaved per repeat.

*Producer CPU per sample* is measured with process clocks, not wall time (this machine is
shared): for the local executor the CPU of its forked workers (all their threads); for Ray the
CPU of every process of the runtime (workers, raylet, GCS, agents, Ray Data's helper actors:
what the Ray path costs, not only its tasks), each split by kind. The in-stage CPU (fetch +
preprocess + producer-side transfer, the stage timers) is printed beside it, so what each
executor spends *outside* the stages is visible. Target (issue 16): Ray within 1.15x of local.

Start-up: ``executor.start()`` of the first Ray variant (runtime started: ``ray.init`` plus
warming the producers) and of a second one with the same cluster shape inside the same
scenario scope (runtime reused), as ``stallbench run`` does; plus ``--simulated-nodes`` (a
simulated cluster of that many nodes, started once; 0 to skip). Targets: <= 8 s for a local
Ray, <= 10 s for a 4-node simulated cluster (on 16 cores).

    .venv/bin/python benchmarks/ray_efficiency.py [--workers 1] [--repeats 3] [--rows 262144]

Exit code 0 when the CPU ratio target passes, 1 otherwise (start-up targets are printed).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stallbench import scenario  # noqa: E402
from stallbench.executors import EXECUTORS  # noqa: E402
from stallbench.executors.runtimes import RuntimeScope  # noqa: E402
from stallbench.measure.probe import measured_run  # noqa: E402
from stallbench.pipeline import FULL, Plan, dataset_for  # noqa: E402

TEXT = """
name = "ray_efficiency"
[dataset]
rows = {rows}
dense_features = 13
sparse_features = 8
sequence_features = 2
sequence_max_len = 20
row_group_rows = {rg}
files = 4
seed = 7
[preprocess]
transforms = ["log_dense", {{name = "hash_ids", buckets = 100000}}]
cpu_cost_us_per_row = {cost}
[model]
kind = "emulated"
step_ms = {step}
[loader]
batch_size = {batch}
batch_format = "single_buffer"
num_workers = {workers}
[executor]
kind = "{kind}"
cpus = {workers}
object_store_mb = {store}
"""

TARGET_RATIO = 1.15
TARGET_LOCAL_S = 8.0
TARGET_SIM4_S = 10.0


def _plan(args: argparse.Namespace, kind: str) -> Plan:
    text = TEXT.format(rows=args.rows, rg=args.row_group_rows, cost=args.cost_us,
                       step=args.step_ms, batch=args.batch_size, workers=args.workers,
                       kind=kind, store=args.object_store_mb)
    cfg = scenario.parse(text, "benchmark").base
    return Plan.create(cfg, dataset_for(cfg, args.cache_dir, "benchmark"), FULL)


def _per_sample_us(x: float | None, samples: int) -> float:
    return (x or 0.0) / max(samples, 1) * 1e6


def _stage_cpu(fig) -> float:
    s = fig.stage_s
    return s.fetch_cpu + s.preprocess_cpu + s.transfer_producer_cpu


def _tree_cpu_s() -> float:
    """CPU seconds of this process and every process under it (Ray's, once started)."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system
    for p in me.children(recursive=True):
        try:
            c = p.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


def _simulated_startup(nodes: int, cpus_per_node: int) -> dict:
    """A simulated cluster's start-up in a fresh process (one Ray runtime per process)."""
    code = (
        "import json, sys, time\n"
        "from stallbench import scenario\n"
        "from stallbench.executors import EXECUTORS\n"
        "t = 'name=\"s\"\\n[executor]\\nkind=\"ray\"\\nsimulated_nodes={n}\\ncpus_per_node={c}\\n"
        "object_store_mb=128\\n'\n"
        "cfg = scenario.parse(t.format(n=int(sys.argv[1]), c=int(sys.argv[2])), 'b').base\n"
        "ex = EXECUTORS.get('ray')(cfg, 'b')\n"
        "t0 = time.perf_counter(); ex.start(); total = time.perf_counter() - t0\n"
        "print(json.dumps({'total_s': total, **ex.startup_figures()}))\n"
        "ex.stop()\n")
    r = subprocess.run([sys.executable, "-c", code, str(nodes), str(cpus_per_node)],
                       capture_output=True, text=True, timeout=600)
    for line in reversed(r.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:200]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=1, help="local workers = Ray CPUs")
    ap.add_argument("--rows", type=int, default=262144)
    ap.add_argument("--row-group-rows", type=int, default=16384)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--cost-us", type=float, default=25.0, help="calibrated CPU per row")
    ap.add_argument("--step-ms", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--object-store-mb", type=int, default=512)
    ap.add_argument("--simulated-nodes", type=int, default=4)
    ap.add_argument("--cpus-per-node", type=int, default=1)
    ap.add_argument("--cache-dir", type=Path,
                    default=Path(os.environ.get("STALLBENCH_CACHE",
                                                Path.cwd() / ".cache" / "stallbench")))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    load0 = os.getloadavg()
    plans = {k: _plan(args, k) for k in ("local", "ray")}
    print(f"{args.rows:,} rows, row groups of {args.row_group_rows:,}, batch "
          f"{args.batch_size}, {args.cost_us:g} us/row calibrated CPU, emulated step "
          f"{args.step_ms:g} ms; {args.workers} local worker(s) vs a local Ray of "
          f"{args.workers} CPU(s); {os.cpu_count()} cores; load average {load0[0]:.2f}",
          flush=True)
    figs: dict[str, list] = {"local": [], "ray": []}
    kinds: list[dict[str, float]] = []
    startup: dict[str, dict] = {}
    with RuntimeScope():
        execs = {k: EXECUTORS.get(k)(plans[k].config, "benchmark") for k in plans}
        try:
            for k in ("local", "ray"):
                t0, c0 = time.perf_counter(), _tree_cpu_s()
                execs[k].start()
                if k == "ray":
                    startup["first"] = {"total_s": time.perf_counter() - t0,
                                        "cpu_s": _tree_cpu_s() - c0,
                                        **execs[k].startup_figures()}
                execs[k].prepare(plans[k], None)
            computes = {k: plans[k].build_compute() for k in plans}
            rt = execs["ray"].runtime
            for r in range(args.repeats):
                for k in ("local", "ray"):
                    before = rt.cluster_cpu_by_kind() if k == "ray" else None
                    fig, _, _ = measured_run(plans[k], execs[k], computes[k])
                    figs[k].append(fig)
                    if before is not None:
                        after = rt.cluster_cpu_by_kind() or {}
                        kinds.append({x: after.get(x, 0.0) - before.get(x, 0.0) for x in after})
                    print(f"  repeat {r + 1} {k:5s}: {fig.throughput_samples_s:>9,.0f} samples/s, "
                          f"producer CPU {_per_sample_us(fig.producer_cpu_s, fig.samples):6.2f} "
                          f"us/sample (in stages "
                          f"{_per_sample_us(_stage_cpu(fig), fig.samples):6.2f})", flush=True)
        finally:
            execs["local"].stop()
            execs["ray"].stop()            # released into the scope: kept for the next one
        second = EXECUTORS.get("ray")(plans["ray"].config, "benchmark")
        t0, c0 = time.perf_counter(), _tree_cpu_s()
        second.start()
        startup["reused"] = {"total_s": time.perf_counter() - t0, "cpu_s": _tree_cpu_s() - c0,
                             **second.startup_figures()}
        second.stop()
    if args.simulated_nodes:
        startup[f"simulated {args.simulated_nodes} nodes"] = _simulated_startup(
            args.simulated_nodes, args.cpus_per_node)
    load1 = os.getloadavg()

    def med_us(k: str, f) -> float:
        return statistics.median(_per_sample_us(f(x), x.samples) for x in figs[k])

    local = med_us("local", lambda x: x.producer_cpu_s)
    ray = med_us("ray", lambda x: x.producer_cpu_s)
    local_in = med_us("local", _stage_cpu)
    ray_in = med_us("ray", _stage_cpu)
    samples = statistics.median(x.samples for x in figs["ray"])
    kind_us = {k: statistics.median(d.get(k, 0.0) for d in kinds) / samples * 1e6
               for k in sorted({k for d in kinds for k in d})}
    ratio = ray / local if local else float("inf")
    print()
    print("producer CPU per sample (median over repeats; process clocks)")
    print(f"  local DataLoader worker(s): {local:7.2f} us  (in stages {local_in:6.2f}, "
          f"outside {local - local_in:6.2f})")
    print(f"  Ray (every process)       : {ray:7.2f} us  (in stages {ray_in:6.2f}, "
          f"outside {ray - ray_in:6.2f})")
    print("  Ray by process kind       : " + ", ".join(f"{k} {v:.2f}" for k, v in kind_us.items()))
    print(f"  ratio Ray / local: {ratio:.3f}  (target <= {TARGET_RATIO:g})")
    print()
    print("start-up (executor.start(), wall s)")
    for name, s in startup.items():
        if "error" in s:
            print(f"  {name:22s}: failed: {s['error']}")
            continue
        cpu = f", {s['cpu_s']:.1f} CPU s" if "cpu_s" in s else ""
        print(f"  {name:22s}: {s['total_s']:6.2f} s  (runtime {s.get('runtime', '?')}: "
              f"ray.init {s.get('ray_init_s', 0):.2f} s, warm-up {s.get('warm_workers_s', 0):.2f} s"
              f"{cpu})")
    first = startup["first"]["total_s"]
    sim = startup.get(f"simulated {args.simulated_nodes} nodes", {})
    print(f"  local Ray first start {'PASS' if first <= TARGET_LOCAL_S else 'FAIL'} "
          f"(<= {TARGET_LOCAL_S:g} s)" + (
              f"; {args.simulated_nodes}-node simulated "
              f"{'PASS' if sim.get('total_s', 1e9) <= TARGET_SIM4_S else 'FAIL'} "
              f"(<= {TARGET_SIM4_S:g} s on 16 cores)" if sim else ""))
    print(f"\nconditions: {os.cpu_count()} cores, load average {load0[0]:.2f} at start, "
          f"{load1[0]:.2f} at end (CPU clocks are per process; wall figures are not clean "
          f"on a loaded machine)")
    verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
    print(f"{verdict}: Ray producer CPU per sample {ratio:.2f}x the local worker's "
          f"(target <= {TARGET_RATIO:g}x)")
    if args.json:
        args.json.write_text(json.dumps({
            "local_us": local, "ray_us": ray, "local_in_stages_us": local_in,
            "ray_in_stages_us": ray_in, "ray_by_kind_us": kind_us, "ratio": ratio,
            "startup": startup, "load": [load0[0], load1[0]], "cores": os.cpu_count(),
            "args": {k: str(v) for k, v in vars(args).items()}}, indent=1))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
