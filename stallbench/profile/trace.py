"""``--trace FILE``: a Chrome trace-event JSON (opens in Perfetto and chrome://tracing, beside
a torch.profiler trace) of every loader stream of every run: one process per variant, repeat
and rank, one thread per loader, a ``wait`` and a ``step`` slice per batch on the Unix-time
clock (microseconds), so ranks and hosts line up. Stages are summed per run in the result,
not per batch, so they are not slices here; each stream's stage totals are in its ``wait``
slices' ``args`` of the first batch."""

from __future__ import annotations

import json
from typing import Any

from .. import __version__
from .merge import StreamRun


def events(label: str, pid: int, streams: list[StreamRun]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": pid,
                                  "args": {"name": label}}]
    for tid, s in enumerate(sorted(streams, key=lambda s: s.key)):
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                    "args": {"name": f"{s.name} ({s.kind})"}})
        for i, t in enumerate(s.t_wall):
            us, wait, step = t * 1e6, s.wait[i] * 1e6, s.step[i] * 1e6
            args: dict[str, Any] = {"batch": i, "rows": s.rows[i]}
            if i == 0:
                args["stages"] = {n: {"calls": v[0], "wall_s": round(v[1], 6),
                                      "cpu_s": round(v[2], 6)} for n, v in s.stages.items()}
            out.append({"ph": "X", "name": "wait", "cat": "data", "pid": pid, "tid": tid,
                        "ts": round(us, 1), "dur": round(wait, 1), "args": args})
            if step > 0:
                out.append({"ph": "X", "name": "step", "cat": "loop", "pid": pid, "tid": tid,
                            "ts": round(us + wait, 1), "dur": round(step, 1)})
    return out


def dumps(evts: list[dict[str, Any]]) -> str:
    """The file's text; it starts with the marker ``outputs.TRACE`` recognises, so a later
    ``--trace`` may replace a trace stallbench wrote and nothing else."""
    return json.dumps({"otherData": {"generator": f"stallbench {__version__}"},
                       "displayTimeUnit": "ms", "traceEvents": evts})
