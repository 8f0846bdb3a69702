"""A Ray Data training loop over several epochs, as a user writes it (imports nothing of
stallbench): ``ds.iter_torch_batches(prefetch_batches=P)`` called again each epoch (one
iterator per epoch), a map of ``--map-ms`` per block (a sleep), a step of ``--step-ms``.
Starts its own local Ray (4 CPUs). Its own meter, last line:
``rate: {"steady_samples_s": ...}`` from its second epoch on.

    stallbench tune -- python examples/tune_ray.py
"""
import argparse, json, time
import numpy as np
import ray

def slow(batch, map_s):
    time.sleep(map_s)
    return batch

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--map-ms", type=float, default=20.0)
    p.add_argument("--step-ms", type=float, default=15.0)
    p.add_argument("--prefetch-batches", type=int, default=1)
    a = p.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    ds = ray.data.range(a.rows, override_num_blocks=32).map_batches(
        slow, batch_size=128, fn_kwargs={"map_s": a.map_ms / 1e3})
    starts, n = [], 0
    for e in range(a.epochs):
        starts.append(time.perf_counter())
        for batch in ds.iter_torch_batches(batch_size=128, prefetch_batches=a.prefetch_batches):
            time.sleep(a.step_ms / 1e3)
            if e >= 1:
                n += len(batch["id"])
    end = time.perf_counter()
    print("rate: " + json.dumps({"steady_samples_s": n / (end - starts[1])}))
    ray.shutdown()

if __name__ == "__main__":
    main()
