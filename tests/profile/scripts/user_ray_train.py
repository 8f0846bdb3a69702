"""A Ray Train job as a user writes it (imports nothing of stallbench): its own local Ray
(``ray.init(num_cpus=4)``: logical CPUs, every cost here is a sleep), a dataset
``ray.data.range(ROWS).map_batches(fn)`` whose fn sleeps ITEM_MS per row, and a
``TorchTrainer`` with 2 CPU workers. Each worker loops 2 epochs over its shard
(``get_dataset_shard("train").iter_torch_batches(batch_size=BATCH)``, a new call per
epoch, as Ray's examples do) and sleeps per batch STEP_MS on rank 0, 3 x STEP_MS on rank 1
(the ranks' steps differ, so a rank's figures cannot pass for the other's).

    user_ray_train.py TRUTH_DIR ITEM_MS STEP_MS [ROWS] [BATCH]

Each worker measures its own truth and writes it to TRUTH_DIR/rank-<world rank>.json:
``next_s`` its seconds blocked in ``iter()`` + ``next()`` on the shard's iterable,
``step_s`` its seconds between batches, ``batches``, ``samples``, and Ray Data's own stat
for that iterator: ``ray_blocked_s`` (the shard's ``DatasetStats.iter_total_blocked_s``,
summed over the epochs), ``ray_init_s`` (``iter_initialize_s``), and ``ray_stats_blocked_s``
parsed from ``shard.stats()``'s "Total time user thread is blocked by Ray Data
iter_batches" line (its public text, rounded by Ray to 2 digits). ``rank_env`` is the
RANK environment variable the worker saw. The driver prints ``truth: {"0": {...}, "1":
{...}}`` last.
"""

import json
import os
import re
import sys
import time

import ray
import ray.train
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

EPOCHS = 2


def slow_rows(batch, item_s):
    time.sleep(item_s * len(batch["id"]))
    return batch


def _seconds(text):
    """Ray's ``fmt``: "1.23s", "12.3ms", "45.6us"."""
    m = re.match(r"([0-9.]+)(s|ms|us)$", text.strip())
    if not m:
        return None
    return float(m.group(1)) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[m.group(2)]


def train_loop_per_worker(config):
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    shard = ray.train.get_dataset_shard("train")
    step = config["step_s"] * (1 + 2 * rank)
    next_s = step_s = 0.0
    batches = samples = 0
    for _ in range(EPOCHS):
        it_able = shard.iter_torch_batches(batch_size=config["batch"])
        t = time.perf_counter()
        it = iter(it_able)
        next_s += time.perf_counter() - t
        t_last = None
        while True:
            t0 = time.perf_counter()
            if t_last is not None:
                step_s += t0 - t_last
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
            time.sleep(step)
    stats = getattr(shard, "_iter_stats", None)
    own = {}
    for name in ("iter_total_blocked_s", "iter_initialize_s", "iter_user_s",
                 "iter_time_to_first_batch_s"):
        timer = getattr(stats, name, None)
        own[name] = timer.get() if timer is not None else None
    text = shard.stats()
    m = re.search(r"Total time user thread is blocked by Ray Data iter_batches: (\S+)", text)
    truth = {"rank": rank, "rank_env": os.environ.get("RANK"), "pid": os.getpid(),
             "next_s": next_s, "step_s": step_s, "batches": batches, "samples": samples,
             "shard_type": type(shard).__name__,
             "ray_blocked_s": own["iter_total_blocked_s"],
             "ray_init_s": own["iter_initialize_s"], "ray_user_s": own["iter_user_s"],
             "ray_first_batch_s": own["iter_time_to_first_batch_s"],
             "ray_stats_blocked_s": _seconds(m.group(1)) if m else None}
    path = os.path.join(config["truth_dir"], f"rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(truth, f)
    os.replace(path + ".tmp", path)


def main():
    truth_dir, item_ms, step_ms = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    rows = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    batch = int(sys.argv[5]) if len(sys.argv) > 5 else 16
    os.makedirs(truth_dir, exist_ok=True)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        ds = ray.data.range(rows, override_num_blocks=16).map_batches(
            slow_rows, batch_size=16, fn_kwargs={"item_s": item_ms / 1e3})
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"truth_dir": os.path.abspath(truth_dir), "batch": batch,
                               "step_s": step_ms / 1e3},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            datasets={"train": ds})
        trainer.fit()
    finally:
        ray.shutdown()
    out = {}
    for rank in (0, 1):
        with open(os.path.join(truth_dir, f"rank-{rank}.json")) as f:
            out[str(rank)] = json.load(f)
    print("truth: " + json.dumps(out))


if __name__ == "__main__":
    main()
