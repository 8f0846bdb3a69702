"""A Ray Data training loop as a user writes it (imports nothing of stallbench):
read_parquet -> map_batches (MAP_MS per batch, a sleep) -> iter_torch_batches, and a step of
STEP_MS. Starts its own local Ray. Then a small iterable made once and looped for two epochs.

    ray_train.py DATA_DIR MAP_MS STEP_MS
"""

import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import ray


def slow(batch, map_s):
    time.sleep(map_s)
    return batch


def main():
    data_dir, map_ms, step_ms = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    path = os.path.join(data_dir, "rows.parquet")
    if not os.path.exists(path):
        os.makedirs(data_dir, exist_ok=True)
        pq.write_table(pa.table({"x": [float(i) for i in range(2048)]}), path,
                       row_group_size=128)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    ds = ray.data.read_parquet(path, override_num_blocks=16).map_batches(slow, batch_size=64,
                                                 fn_kwargs={"map_s": map_ms / 1e3})
    n = 0
    for batch in ds.iter_torch_batches(batch_size=64):
        time.sleep(step_ms / 1e3)
        n += len(batch["x"])
    print(f"rows {n}")
    # Ray's tutorials make the iterable once and loop over it every epoch (issue 38)
    small = ray.data.from_items([{"x": float(i)} for i in range(128)])
    loader = small.iter_torch_batches(batch_size=32)
    print(f"reiterable {[sum(1 for _ in loader) for _ in range(2)]}")
    ray.shutdown()


if __name__ == "__main__":
    main()
