"""The scenario checks that need the registries: names of implementations and their own rules.

``scenario.py`` validates structure (types, ranges, plain choices) and cannot import the
implementations (they import it). Keys whose value names an implementation (``knob(...,
registry=...)``: the executor, the model, the batch format) are checked here, against the live
registries, for every variant, with the implementation's own cross-key rules
(``Executor.validate``, ``Compute.validate``). ``stallbench run`` calls ``check_scenario`` on
every scenario before the first one runs.
"""

from __future__ import annotations

from .errors import ScenarioError
from .executors import EXECUTORS
from .scenario import Config, Scenario
from .scenario import reference_markdown as _reference
from .stages.batch_format import FORMATS
from .stages.compute import MODELS

USER_MODEL = '"pkg.module:factory"'    # the other accepted form of model.kind


def check_config(cfg: Config, file: str = "<scenario>") -> None:
    """One variant's registry-backed keys; ScenarioError(file, key, ...) naming valid values."""
    if cfg.loader.batch_format not in FORMATS:
        raise ScenarioError(file, "loader.batch_format", FORMATS.unknown(cfg.loader.batch_format))
    kind = cfg.model.kind
    if ":" not in kind:
        if kind not in MODELS:
            raise ScenarioError(file, "model.kind", MODELS.unknown(kind, also=USER_MODEL))
        MODELS.get(kind).validate(cfg.model, file)
    if cfg.executor.kind not in EXECUTORS:
        raise ScenarioError(file, "executor.kind", EXECUTORS.unknown(cfg.executor.kind))
    EXECUTORS.get(cfg.executor.kind).validate(cfg, file)


def check_scenario(sc: Scenario) -> None:
    """The base config, then every variant (whose errors say they come from the matrix)."""
    check_config(sc.base, sc.path)
    for v in sc.variants:
        try:
            check_config(v.config, sc.path)
        except ScenarioError as exc:
            raise ScenarioError(sc.path, exc.key, f"{exc.message} (from [matrix])") from None


def registered_names() -> dict[str, list[str]]:
    """Valid names per registry kind, as ``knob(registry=...)`` names them."""
    return {EXECUTORS.kind: list(EXECUTORS), MODELS.kind: [*MODELS, USER_MODEL.strip('"')],
            FORMATS.kind: list(FORMATS)}


def reference_markdown() -> str:
    """The README's key reference, with the registries' names for registry-backed keys."""
    return _reference(registered_names())
