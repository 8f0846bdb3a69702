"""The scenario file tune writes: the base scenario's keys plus the chosen knobs, no matrix.

Written by hand because no TOML writer is a dependency (``tomllib`` only reads); what is
written is checked by reading it back (``Tuner.recommend`` parses it and requires the very
configuration that was measured), and only the value kinds a scenario holds are written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from typing import Any

from ..results import now_utc
from ..scenario import Config, Scenario, format_value


def with_knobs(cfg: Config, knobs: dict[str, Any]) -> Config:
    """``cfg`` with dotted keys set (``{"loader.num_workers": 2}``)."""
    sections: dict[str, dict[str, Any]] = {}
    for dotted, value in knobs.items():
        section, key = dotted.split(".", 1)
        sections.setdefault(section, {})[key] = value
    return cfg.replace(**{s: dataclasses.replace(getattr(cfg, s), **kv) for s, kv in sections.items()})


def knob_diff(base: Config, cfg: Config) -> dict[str, Any]:
    """Every dotted key whose value differs from the base config."""
    out: dict[str, Any] = {}
    b, c = base.to_dict(), cfg.to_dict()
    for section, values in c.items():
        for key, value in values.items():
            if b[section][key] != value:
                out[f"{section}.{key}"] = value
    return out


def variant_name(knobs: dict[str, Any]) -> str:
    if not knobs:
        return "base"
    return ",".join(f"{k.split('.', 1)[1]}={format_value(v)}" for k, v in sorted(knobs.items()))


def toml_value(v: Any) -> str:
    """A TOML value for what ``tomllib`` reads back as ``v`` (no datetimes: scenarios hold none)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"not a TOML number: {v}")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)          # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise ValueError(f"no TOML form for {v!r}")


def toml_key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def scenario_text(sc: Scenario, knobs: dict[str, Any], note: str) -> str:
    """The base scenario's own keys plus ``knobs``, no matrix, named ``<name>-tuned``."""
    raw = tomllib.loads(sc.text)
    raw.pop("matrix", None)
    raw["name"] = f"{sc.name}-tuned"
    raw["description"] = note
    for dotted, value in knobs.items():
        section, key = dotted.split(".", 1)
        raw.setdefault(section, {})[key] = value
    lines = [f"# Written by stallbench tune from {sc.path} ({now_utc()}): the base scenario's keys",
             "# plus the recommended knobs, without its matrix. Run it with `stallbench run`.",
             f"name = {toml_value(raw.pop('name'))}",
             f"description = {toml_value(raw.pop('description'))}"]
    for section, table in raw.items():
        if not isinstance(table, dict):
            lines.append(f"{toml_key(section)} = {toml_value(table)}")
            continue
        lines.append("")
        lines.append(f"[{section}]")
        lines.extend(f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"
