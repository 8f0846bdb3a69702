"""A trainer against a real Ray cluster, run by tests/executors/test_ray_cluster.py in its own
process (the test process may hold a local Ray of its own, and a Ray driver is per process).

``python ray_cluster_driver.py SCENARIO CACHE_DIR OUT_JSON``: starts stallbench's Ray executor
on the scenario's ``executor.ray_address``, runs one epoch, and writes a digest of every batch
the trainer received (in order), the run's figures and the cluster's nodes to OUT_JSON. It
prints ``BATCH n`` after each batch, so the test can act mid-epoch (lose a node).
A ``UserError`` is printed as stallbench's CLI prints it (one line) and exits 2.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any


def digest(batch: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for k in ("dense", "sparse", "seq", "label"):
        h.update(batch[k].contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv: list[str]) -> int:
    from stallbench import scenario
    from stallbench.errors import UserError
    from stallbench.executors import EXECUTORS
    from stallbench.pipeline import Plan, dataset_for

    path, cache, out = argv[0], Path(argv[1]), Path(argv[2])
    cfg = scenario.load(path).base
    plan = Plan.create(cfg, dataset_for(cfg, cache, path), scenario_file=path)
    ex = EXECUTORS.get("ray")(cfg, path)
    try:
        ex.start()
        ex.prepare(plan, None)
        print("STARTED", flush=True)
        digests = []
        for o in ex.run(plan):
            for batch, _, _ in plan.receive(o):
                digests.append(digest(batch))
                print(f"BATCH {len(digests)}", flush=True)
        import ray

        nodes = [{"id": n["NodeID"], "alive": n["Alive"], "head": "node:__internal_head__"
                  in n.get("Resources", {}) or n.get("Resources", {}).get("CPU", 0) == 0,
                  "resources": n.get("Resources", {})} for n in ray.nodes()]
        out.write_text(json.dumps({"digests": digests, "figures": ex.run_figures(),
                                   "nodes": nodes, "slots": ex.producer_slots(),
                                   "producer_nodes": ex.producer_nodes(),
                                   "producer_resources": ex.runtime.producer_resources,
                                   "client": ex.runtime.client}, default=str))
    except UserError as exc:
        print(f"stallbench: error: {exc}", file=sys.stderr)
        return 2
    finally:
        ex.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
