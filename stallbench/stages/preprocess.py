"""Preprocess: the scenario's ordered transforms plus an optional calibrated CPU cost.

Built once in the trainer (so a bad transform name fails before anything runs) and shipped to
workers; the output schema is known up front, so collate and the model can be sized.
"""

from __future__ import annotations

import pyarrow as pa

from ..data.schema import FeatureSchema
from ..scenario import PreprocessSpec
from .costs import burn_cpu
from .transforms import TRANSFORMS, Transform, UserTransform


class TransformSpecError(ValueError):
    """A transform name or parameter is wrong; carries the index for the scenario key."""

    def __init__(self, index: int, message: str) -> None:
        self.index = index
        super().__init__(message)


class Preprocess:
    def __init__(self, spec: PreprocessSpec, schema: FeatureSchema, seed: int = 0,
                 scenario_file: str = "<scenario>") -> None:
        self.cpu_cost_s_per_row = spec.cpu_cost_us_per_row / 1e6
        # where the user's modules are found (``user_dirs``): a process that rebuilds this
        # stage from the config (a local Flight server) needs it too
        self.scenario_file = scenario_file
        self.steps: list[Transform] = []
        current = schema
        for i, t in enumerate(spec.transform_specs):
            try:
                if ":" in t.name:
                    step: Transform = UserTransform(current, t.name, seed=seed, params=t.params,
                                                    file=scenario_file,
                                                    key=f"preprocess.transforms[{i}]")
                else:
                    cls = TRANSFORMS.get(t.name)
                    step = cls(current, seed=seed, **t.params)
            except KeyError as exc:
                raise TransformSpecError(i, exc.args[0]) from None
            except (ValueError, TypeError, ImportError) as exc:
                raise TransformSpecError(i, f"{t.name}: {exc}") from None
            self.steps.append(step)
            current = step.output_schema()
        self.input_schema = schema
        self.output_schema = current

    def __call__(self, table: pa.Table, shard_index: int) -> pa.Table:
        if self.cpu_cost_s_per_row:
            burn_cpu(self.cpu_cost_s_per_row * table.num_rows)
        for step in self.steps:
            table = step(table, shard_index)
        return table
