"""The ``--set`` keys of ``stallbench profile``: named after the arguments they override
(``dataloader.num_workers`` overrides ``DataLoader(num_workers=...)`` of every DataLoader the
job creates), so they never collide with scenario keys; their matrix; variant names as
scenario variants are named (``num_workers=2,pin_memory=true``)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..scenario import MAX_VARIANTS, format_value

KEYS: dict[str, tuple[type, int, int]] = {     # key -> (type, min, max) for numbers
    "dataloader.num_workers": (int, 0, 1024),
    "dataloader.pin_memory": (bool, 0, 1),
    "dataloader.prefetch_factor": (int, 1, 1024),
    "dataloader.persistent_workers": (bool, 0, 1),
    "ray.prefetch_batches": (int, 0, 1024),
    "torch.num_threads": (int, 1, 1024),      # the trainer's intra-op threads (issue 41)
}


def _value(key: str, text: str) -> Any:
    tp, lo, hi = KEYS[key]
    t = text.strip()
    if tp is bool:
        if t.lower() in ("true", "1", "yes"):
            return True
        if t.lower() in ("false", "0", "no"):
            return False
        raise UserError(f"--set {key}: expected true or false, got {t!r}")
    try:
        v = int(t)
    except ValueError:
        raise UserError(f"--set {key}: expected an integer {lo}..{hi}, got {t!r}") from None
    if not lo <= v <= hi:
        raise UserError(f"--set {key}: expected an integer {lo}..{hi}, got {v}")
    return v


def parse(items: list[str]) -> dict[str, list[Any]]:
    """``["dataloader.num_workers=0,2", ...]`` -> {key: [values]} in the order given."""
    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, vals = item.partition("=")
        key = key.strip()
        if not sep or not vals.strip():
            raise UserError(f"--set {item!r}: expected KEY=V1,V2,... (valid keys: "
                            f"{', '.join(KEYS)})")
        if key not in KEYS:
            raise UserError(f"--set {key}: unknown key; valid keys: {', '.join(KEYS)}")
        if key in out:
            raise UserError(f"--set {key}: given twice; list its values once: {key}=V1,V2")
        values = [_value(key, v) for v in vals.split(",")]
        if len(set(map(repr, values))) != len(values):
            raise UserError(f"--set {key}: a value repeats in {vals!r}")
        out[key] = values
    count = math.prod(len(v) for v in out.values())     # before expanding: 10**8 would hang
    if count > MAX_VARIANTS:
        sizes = " x ".join(f"{len(v)} ({k})" for k, v in out.items())
        raise UserError(f"--set: {sizes} = {count:,} variants; at most {MAX_VARIANTS:,} per "
                        "profile, as per scenario (each variant runs the whole job)")
    return out


@dataclass
class Variant:
    name: str
    knobs: dict[str, Any]           # dotted key -> value
    skipped: str = ""               # why torch would refuse it ("" runs)

    def overrides(self) -> dict[str, dict[str, Any]]:
        """{"dataloader": {"num_workers": 2}, "ray": {...}} as the hooks read them."""
        out: dict[str, dict[str, Any]] = {}
        for k, v in self.knobs.items():
            sec, arg = k.split(".", 1)
            out.setdefault(sec, {})[arg] = v
        return out


def name_of(knobs: dict[str, Any]) -> str:
    """Scenario variants' rule: ``arg=value`` joined by commas; "default" without knobs."""
    if not knobs:
        return "default"
    short = [k.split(".", 1)[1] for k in knobs]
    names = short if len(set(short)) == len(short) else list(knobs)
    return ",".join(f"{n}={format_value(v)}" for n, v in zip(names, knobs.values()))


def refused(knobs: dict[str, Any]) -> str:
    """Why torch's DataLoader refuses this combination ("" when it does not)."""
    if knobs.get("dataloader.num_workers") == 0:
        if "dataloader.prefetch_factor" in knobs:
            return "torch refuses prefetch_factor with num_workers=0"
        if knobs.get("dataloader.persistent_workers") is True:
            return "torch refuses persistent_workers=true with num_workers=0"
    return ""


def matrix(axes: dict[str, list[Any]]) -> list[Variant]:
    """Every combination, in the order the axes and values were given."""
    keys = list(axes)
    out = []
    for combo in itertools.product(*(axes[k] for k in keys)):
        knobs = dict(zip(keys, combo))
        out.append(Variant(name_of(knobs), knobs, refused(knobs)))
    return out
