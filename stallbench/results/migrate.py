"""Explicit migrations between result schema versions (asv's ``update_to_2``): 1 -> 2 -> 3.

A migration works on the parsed JSON of the older version and returns JSON of the next one,
so the typed reader only ever knows the current schema. Each step is a pure function; the
committed examples under ``results/examples/`` are the fixtures they are tested against.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from ..errors import ResultError

_REPEAT_RENAMES = {"peak_rss_mb": "peak_pss_mb", "workers": "producer_processes",
                   "worker_cpu_s": "producer_cpu_s", "startup_s": "executor_start_s",
                   "extra": "executor_figures"}
_ATTRIBUTION_RENAMES = {"stall_s": "attributed_stall_s", "stall_share": "attributed_stall_share"}
_PARTS = ("compute_s", "fetch_stall_s", "preprocess_stall_s", "transfer_stall_s", "overhead_s")


def _obj(x: Any, where: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise ResultError(f"{where}: expected an object")
    return x


def _rename(d: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    return {names.get(k, k): v for k, v in d.items()}


def _repeat_v2(r: Any, where: str) -> dict[str, Any]:
    return _rename(_obj(r, where), _REPEAT_RENAMES)


def _executor_facts_v1(v: dict[str, Any]) -> dict[str, Any]:
    """v1 did not record what the executor said about itself: rebuild it from the config the
    variant ran with, with the rules the v1 code applied (the only place config is parsed)."""
    cfg = v.get("config") if isinstance(v.get("config"), dict) else {}
    ex = cfg.get("executor") if isinstance(cfg.get("executor"), dict) else {}
    loader = cfg.get("loader") if isinstance(cfg.get("loader"), dict) else {}
    kind = ex.get("kind") if isinstance(ex.get("kind"), str) else "local"
    if kind == "ray":
        nodes = ex.get("simulated_nodes") or 0
        per = ex.get("cpus_per_node") or 1
        slots = ex.get("concurrency") or (nodes * per if nodes else (ex.get("cpus") or 1))
        return {"kind": kind, "producer_slots": int(slots), "has_producers": True,
                "producer_nodes": int(nodes) if nodes else None, "nodes_simulated": bool(nodes),
                "scaling_knobs": ["executor.simulated_nodes"]}
    workers = loader.get("num_workers") or 0
    return {"kind": kind, "producer_slots": int(workers), "has_producers": workers > 0,
            "producer_nodes": None, "nodes_simulated": False,
            "scaling_knobs": ["loader.num_workers"]}


def _attribution_v2(a: dict[str, Any], where: str) -> dict[str, Any]:
    out = _rename({k: x for k, x in a.items() if k != "notes"}, _ATTRIBUTION_RENAMES)
    iv = _obj(a.get("intervals", {}), f"{where}.intervals")
    intervals = {}
    for part in _PARTS:
        pair = iv.get(part)
        if isinstance(pair, list) and len(pair) == 2:
            intervals[part] = {"low": pair[0], "high": pair[1]}
        else:                      # no interval stored: it collapses to the point
            intervals[part] = {"low": a.get(part), "high": a.get(part)}
    out["intervals"] = intervals
    return out


def v1_to_v2(d: dict[str, Any], source: str) -> dict[str, Any]:
    d = copy.deepcopy(d)
    d["schema_version"] = 2
    variants = d.get("variants")
    if not isinstance(variants, list):
        raise ResultError(f"{source}: variants: expected a list")
    for i, v in enumerate(variants):
        where = f"{source}: variants[{i}]"
        v = _obj(v, where)
        if "peak_rss_mb" in v:
            v["peak_pss_mb"] = v.pop("peak_rss_mb")
        v["repeats"] = [_repeat_v2(r, f"{where}.repeats") for r in v.get("repeats") or []]
        v["ablations"] = {k: [_repeat_v2(r, f"{where}.ablations.{k}") for r in rs]
                          for k, rs in _obj(v.get("ablations", {}), f"{where}.ablations").items()}
        v["executor"] = _executor_facts_v1(v)
        rates = dict(_obj(v.get("stage_rates", {}), f"{where}.stage_rates"))
        rates.pop("workers", None)
        solo = {k: rates.pop(f"trainer_solo_{k}", None)
                for k in ("data_s_per_sample", "item_s")}
        v["stage_rates"] = rates
        if solo["data_s_per_sample"] is not None and solo["item_s"] is not None:
            v["trainer_solo"] = solo
        analysis = _obj(v.pop("analysis", {}) or {}, f"{where}.analysis")
        v["notes"] = analysis.get("notes") or {}
        if "compute_s" in analysis:
            v["attribution"] = _attribution_v2(analysis, f"{where}.analysis")
        res = _obj(v.get("resources", {}) or {}, f"{where}.resources")
        res = {k: x for k, x in res.items() if k != "memory_metric"}
        if "rss_mb" in res:
            res["pss_mb"] = res.pop("rss_mb")
        v["resources"] = res
    return d


def _recommendation_v3(rec: Any, where: str, steady: bool | None = None) -> Any:
    """``steady``: whether the variant's attribution was on steady state (None: unknown, as
    for the scenario's top recommendation); where it was not, v2's ``stall_share`` held the
    whole run's share, which v3 does not call steady: null."""
    if rec is None:
        return None
    rec = _rename(_obj(rec, where), {"stall_share": "steady_attributed_stall_share"})
    if steady is False:
        rec["steady_attributed_stall_share"] = None
    return rec


def v2_to_v3(d: dict[str, Any], source: str) -> dict[str, Any]:
    """Issue 25: a recommendation's ``stall_share`` (the steady-state attributed stall share)
    -> ``steady_attributed_stall_share``, so that no field name holds two figures (a
    variant's ``stall_share`` is the whole run's measured stall); null where the variant's
    attribution had no steady window (v2 held the whole run's share there)."""
    d = copy.deepcopy(d)
    d["schema_version"] = 3
    variants = d.get("variants")
    if not isinstance(variants, list):
        raise ResultError(f"{source}: variants: expected a list")
    for i, v in enumerate(variants):
        where = f"{source}: variants[{i}]"
        v = _obj(v, where)
        if "recommendation" in v:
            a = v.get("attribution")
            steady = (a.get("basis", "whole run") == "steady state"
                      if isinstance(a, dict) else None)
            v["recommendation"] = _recommendation_v3(v["recommendation"],
                                                     f"{where}.recommendation", steady)
    analysis = d.get("analysis")
    if isinstance(analysis, dict) and "recommendation" in analysis:
        analysis["recommendation"] = _recommendation_v3(analysis["recommendation"],
                                                        f"{source}: analysis.recommendation")
    return d


# version -> migration to the next version
MIGRATIONS: dict[int, Callable[[dict[str, Any], str], dict[str, Any]]] = {1: v1_to_v2,
                                                                          2: v2_to_v3}


def to_current(d: dict[str, Any], version: int, current: int, source: str) -> dict[str, Any]:
    while version < current:
        d = MIGRATIONS[version](d, source)
        version += 1
    return d
