"""The ``--set`` keys of ``stallbench profile``: named after the arguments they override
(``dataloader.num_workers`` overrides ``DataLoader(num_workers=...)`` of every DataLoader the
job creates), so they never collide with scenario keys; their matrix; variant names as
scenario variants are named (``num_workers=2,pin_memory=true``).

The keys, their values and what they reach are rows of ``analysis.knob_table`` (one table for
the parser, the help, the tune and the docs); this module parses ``--set`` from it and writes
its reference for ``docs/profile.md`` (``reference_markdown``), the one place that joins a
row's door group to the loader kinds whose doors honour it."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from ..analysis import knob_table
from ..errors import UserError
from ..scenario import MAX_VARIANTS, format_value


def _value(key: str, text: str) -> Any:
    k = knob_table.by_key(key)
    assert k is not None, key               # parse checked it
    t = text.strip()
    expected = f"--set {key}: expected {knob_table.values_text(k)}, got"
    if k.type is bool:
        if t.lower() in ("true", "1", "yes"):
            return True
        if t.lower() in ("false", "0", "no"):
            return False
        raise UserError(f"{expected} {t!r}")
    try:
        v = int(t)
    except ValueError:
        raise UserError(f"{expected} {t!r}") from None
    if not k.lo <= v <= k.hi:
        raise UserError(f"{expected} {v}")
    return v


def parse(items: list[str]) -> dict[str, list[Any]]:
    """``["dataloader.num_workers=0,2", ...]`` -> {key: [values]} in the order given."""
    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, vals = item.partition("=")
        key = key.strip()
        if not sep or not vals.strip():
            raise UserError(f"--set {item!r}: expected KEY=V1,V2,... (valid keys: "
                            f"{', '.join(knob_table.keys())})")
        if knob_table.by_key(key) is None:
            raise UserError(f"--set {key}: unknown key; valid keys: "
                            f"{', '.join(knob_table.keys())}")
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
    if knobs.get(knob_table.WORKERS.key) == 0:
        if knob_table.PREFETCH_FACTOR.key in knobs:
            return "torch refuses prefetch_factor with num_workers=0"
        if knobs.get(knob_table.PERSISTENT_WORKERS.key) is True:
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


def reference_markdown() -> str:
    """The ``--set`` key reference of ``docs/profile.md``, from ``analysis.knob_table`` and the
    doors (which loader kinds honour each row's group): generated, so the docs list exactly
    the keys ``--set`` accepts (``tests/profile/test_knob_table.py`` keeps it in sync)."""
    from .agent import doors

    lines = ["| key | values | reaches | door group: loader kinds that honour it "
             "| `tune -- CMD` searches it | recorded as | advice, as written |",
             "|---|---|---|---|---|---|---|"]
    for k in knob_table.rows():
        kinds = sorted(kind for kind, door in doors.table().items() if door.reaches(k.group))
        honoured = f"`{k.group}`: {', '.join(f'`{x}`' for x in kinds) or 'none'}" + (
            "; the trainer's process, so the tune also searches it on a loader no group "
            "reaches" if k.process else "")
        how = "no (`profile --set` only)" if k.search is None else k.search.step + (
            f" (from {k.search.start}, at most {k.search.most})" if k.search.most else "")
        example = "True" if k.type is bool else "N"
        lines.append(
            f"| `{k.key}` | {knob_table.values_text(k)} | {k.reaches} | {honoured} | {how} "
            f"| {f'`{k.recorded}`' if k.recorded else '—'} "
            f"| `{k.advice.write([(k.name, example)])}` |")
    return "\n".join(lines) + "\n"
