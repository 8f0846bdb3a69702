"""A Ray Train job that joins an existing cluster, as a user writes it (imports nothing of
stallbench): ``ray.init(address=ADDRESS, runtime_env=...)`` with a runtime_env of its own
(an env var and a ``worker_process_setup_hook`` callable: both must reach its workers with
stallbench's merged in), a ``TorchTrainer`` with 2 CPU workers placed on different nodes
(``STRICT_SPREAD``), each looping 2 epochs over ``get_dataset_shard("train")
.iter_torch_batches(...)`` with a step of STEP_MS on rank 0 and 3 x STEP_MS on rank 1, and
then a Ray Data loop on the driver (``iter_batches``, STEP_MS per batch).

    user_ray_cluster.py TRUTH_DIR ITEM_MS STEP_MS ADDRESS [--lost] [--submitted]

ADDRESS "-": ``ray.init()`` with the address from ``RAY_ADDRESS`` (as ``ray job submit``
gives the entrypoint); ``ray://...``: Ray Client (no setup hook of the job's then: Ray
Client cannot send a callable one, and no driver loop: Ray Data does not iterate in a
client). ``--lost``: then one more task on another node than the driver's
makes a Ray Data iterator and is SIGKILLed (by itself) before its first batch; the driver
goes on (the figures of that process never come home). Each worker writes its own truth to
TRUTH_DIR/rank-<world rank>.json as ``user_ray_train.py`` does (its clocks, Ray Data's own
``iter_total_blocked_s`` / ``iter_initialize_s``), plus its Ray node id and what its
runtime_env gave it; the driver its loop's clocks to TRUTH_DIR/driver.json, and prints
``truth: {...}`` last.
"""

import json
import os
import signal
import sys
import time

import ray
import ray.train
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

EPOCHS = 2


def job_hook():
    """The job's own setup hook: must still run in every worker under stallbench."""
    os.environ["JOB_HOOK_RAN"] = "1"


def slow_rows(batch, item_s):
    time.sleep(item_s * len(batch["id"]))
    return batch


def timed_loop(make_iterable, step_s, epochs):
    """The loop's own clocks: seconds in iter() + next(), between batches; batches, rows."""
    next_s = between = 0.0
    batches = samples = 0
    for _ in range(epochs):
        t = time.perf_counter()
        it = iter(make_iterable())
        next_s += time.perf_counter() - t
        t_last = None
        while True:
            t0 = time.perf_counter()
            if t_last is not None:
                between += t0 - t_last
            try:
                batch = next(it)
            except StopIteration:
                next_s += time.perf_counter() - t0
                break
            t1 = time.perf_counter()
            next_s += t1 - t0
            batches += 1
            samples += len(batch["id"])
            t_last = t1
            time.sleep(step_s)
    return {"next_s": next_s, "step_s": between, "batches": batches, "samples": samples}


def write(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def train_loop_per_worker(config):
    rank = ray.train.get_context().get_world_rank()
    shard = ray.train.get_dataset_shard("train")
    own = timed_loop(lambda: shard.iter_torch_batches(batch_size=config["batch"]),
                     config["step_s"] * (1 + 2 * rank), EPOCHS)
    stats = getattr(shard, "_iter_stats", None)
    for name in ("iter_total_blocked_s", "iter_initialize_s"):
        timer = getattr(stats, name, None)
        own[name] = timer.get() if timer is not None else None
    own.update(rank=rank, rank_env=os.environ.get("RANK"), pid=os.getpid(),
               node_id=ray.get_runtime_context().get_node_id(),
               job_env=os.environ.get("JOB_OWN"), job_hook=os.environ.get("JOB_HOOK_RAN"),
               ray_blocked_s=own.pop("iter_total_blocked_s"),
               ray_init_s=own.pop("iter_initialize_s"))
    write(os.path.join(config["truth_dir"], f"rank-{rank}.json"), own)


@ray.remote(num_cpus=0)
def lost_process(rows):
    """Makes its loader, then dies as a machine's process does (SIGKILL) before a batch."""
    it_able = ray.data.range(rows).iter_batches(batch_size=8)
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)
    return it_able is not None


def main():
    truth_dir, item_ms, step_ms, address = sys.argv[1:5]
    lost = "--lost" in sys.argv[5:]
    item_s, step_s = float(item_ms) / 1e3, float(step_ms) / 1e3
    os.makedirs(truth_dir, exist_ok=True)
    env = {"env_vars": {"JOB_OWN": "kept"}, "worker_process_setup_hook": job_hook}
    if address.startswith("ray://"):       # Ray Client sends no callable hook (Ray's limit)
        env.pop("worker_process_setup_hook")
    if address == "-":
        ray.init(runtime_env=env, log_to_driver=False)
    else:
        ray.init(address=address, runtime_env=env, log_to_driver=False)
    try:
        ds = ray.data.range(256, override_num_blocks=16).map_batches(
            slow_rows, batch_size=16, fn_kwargs={"item_s": item_s})
        TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"truth_dir": os.path.abspath(truth_dir), "batch": 16,
                               "step_s": step_s},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                         placement_strategy="STRICT_SPREAD"),
            datasets={"train": ds}).fit()
        if not address.startswith("ray://"):   # Ray Data does not iterate in a Ray Client
            local = ray.data.range(128, override_num_blocks=8).map_batches(
                slow_rows, batch_size=16, fn_kwargs={"item_s": item_s})
            driver = timed_loop(lambda: local.iter_batches(batch_size=16), step_s, 1)
            driver["node_id"] = ray.get_runtime_context().get_node_id()
            write(os.path.join(truth_dir, "driver.json"), driver)
        if lost:
            here = ray.get_runtime_context().get_node_id()
            other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here
                         and n["Resources"].get("CPU", 0) > 0)
            strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(other, False)
            try:
                ray.get(lost_process.options(scheduling_strategy=strategy,
                                             max_retries=0).remote(64))
            except ray.exceptions.RayError as exc:
                print(f"lost task died: {type(exc).__name__}", flush=True)
            write(os.path.join(truth_dir, "lost.json"), {"node_id": other})
    finally:
        ray.shutdown()
    out = {}
    for name in sorted(os.listdir(truth_dir)):
        with open(os.path.join(truth_dir, name)) as f:
            out[name[:-5]] = json.load(f)
    print("truth: " + json.dumps(out))


if __name__ == "__main__":
    main()
