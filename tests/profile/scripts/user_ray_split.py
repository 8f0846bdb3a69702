"""A Ray Data loop whose steady wait is production by construction (imports nothing of
stallbench): range -> map_batches (MAP_MS per block, a sleep, on one CPU) ->
iter_torch_batches, a step of STEP_MS. With MAP_MS far above STEP_MS every steady batch
waits for Ray's operators to produce its block. The last line printed is ``truth: {...}``:
the loop's own clock, its first batch's wait apart from the rest.

    user_ray_split.py MAP_MS STEP_MS BLOCKS
"""

import json
import sys
import time

import ray


def slow(batch, map_s):
    time.sleep(map_s)
    return batch


def main():
    map_ms, step_ms, blocks = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    # one read task per block (64 rows), the map fused into it: on one CPU the blocks come
    # one after another, MAP_MS apart
    ds = ray.data.range(64 * blocks, override_num_blocks=blocks).map_batches(
        slow, batch_size=None, fn_kwargs={"map_s": map_ms / 1e3})
    waits, n = [], 0
    it = iter(ds.iter_torch_batches(batch_size=64))
    while True:
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - t)
        n += len(batch["id"])
        time.sleep(step_ms / 1e3)
    ray.shutdown()
    print("truth: " + json.dumps({"rows": n, "batches": len(waits), "first_s": waits[0],
                                  "rest_s": sum(waits[1:])}), flush=True)


if __name__ == "__main__":
    main()
