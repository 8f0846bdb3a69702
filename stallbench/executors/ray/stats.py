"""Ray Data's own figures of a run, read from the dataset's stats after it ended."""

from __future__ import annotations

from typing import Any


def operator_figures(ds: Any) -> dict[str, Any]:
    """Ray Data's own per-operator figures (wall / CPU seconds, rows, blocks, tasks, nodes)."""
    try:
        summ = ds.get_stats_summary()
    except Exception as exc:  # noqa: BLE001 - a figure, never a failure
        return {"stats_error": str(exc)[:200]}
    ops: list[dict[str, Any]] = []

    def walk(s: Any) -> None:
        for p in getattr(s, "parents", []) or []:
            walk(p)
        for op in s.operators_stats:
            rows = op.output_num_rows
            ops.append({
                "name": op.operator_name,
                "time_total_s": op.time_total_s,
                "wall_s": float(op.wall_time.sum) if op.wall_time else None,
                "cpu_s": float(op.cpu_time.sum) if op.cpu_time else None,
                "udf_s": float(op.function_body_time.sum) if op.function_body_time else None,
                "rows": int(rows.sum) if rows else None,
                "blocks": int(rows.count) if rows else None,
                "bytes": int(op.output_size_bytes.sum) if op.output_size_bytes else None,
                "tasks": int(op.task_rows.count) if op.task_rows else None,
                "nodes": int(op.node_count.count) if op.node_count else None,
                "rows_per_s": op.num_rows_per_s,
            })

    try:
        walk(summ)
    except Exception as exc:  # noqa: BLE001
        return {"stats_error": str(exc)[:200]}
    out: dict[str, Any] = {"operators": ops}
    it = getattr(summ, "iter_stats", None)
    if it is not None:
        try:
            fig = {"wait_s": it.wait_time.get(), "get_s": it.get_time.get(),
                   "format_s": it.format_time.get(), "collate_s": it.collate_time.get(),
                   "blocks_local": it.iter_blocks_local, "blocks_remote": it.iter_blocks_remote}
            if any(fig.values()):       # Ray fills these for some consumers only
                out["iterator"] = fig
        except Exception:  # noqa: BLE001
            pass
    return out


def operators_wall_s(stats: dict[str, Any]) -> float:
    """Wall seconds summed over every operator's tasks."""
    return sum(op.get("wall_s") or 0.0 for op in stats.get("operators", []))
