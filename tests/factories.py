"""Small typed result builders shared by the tests that need results without running anything
(the report's rich sample lives in tests/report/sample.py)."""

from __future__ import annotations

from stallbench.results import (SCHEMA_VERSION, ExecutorFacts, MachineInfo, RepeatFigures, Result,
                                RunSettings, ScenarioInfo, Summary, ToolInfo, VariantResult,
                                DatasetInfo, WhatIfModel)

FP = "0123456789abcdef"


def repeat(tp: float = 1000.0, share: float = 0.2, pss: float = 500.0, samples: int = 10_000,
           **kw) -> RepeatFigures:
    epoch = samples / tp
    return RepeatFigures(epoch_s=epoch, samples=samples, batches=40, throughput_samples_s=tp,
                         steady_throughput_samples_s=tp, stall_s=share * epoch,
                         wait_s=share * epoch, trainer_transfer_s=0.0,
                         compute_s=(1 - share) * epoch, time_to_first_batch_s=0.1,
                         peak_pss_mb=pss, **kw)


def variant(name: str, tp: list[float], share: list[float] | None = None,
            pss: list[float] | None = None, **kw) -> VariantResult:
    share = share if share is not None else [0.2] * len(tp)
    pss = pss if pss is not None else [500.0] * len(tp)
    reps = [repeat(t, s, m) for t, s, m in zip(tp, share, pss)]
    return VariantResult(
        name=name, knobs={}, config={}, emulated=[],
        executor=ExecutorFacts(kind="local", producer_slots=0, has_producers=False,
                               scaling_knobs=["loader.num_workers"]),
        throughput_samples_s=Summary.of(tp), epoch_s=Summary.of([r.epoch_s for r in reps]),
        stall_s=Summary.of([r.stall_s for r in reps]), stall_share=Summary.of(share),
        time_to_first_batch_s=Summary.of([0.1] * len(tp)), peak_pss_mb=Summary.of(pss),
        repeats=reps, **kw)


def result(variants: dict[str, list[float]] | list[VariantResult], *, scenario: str = "tiny",
           fingerprint: str = FP, machine: MachineInfo | None = None,
           created: str = "2024-05-01T12:00:00+00:00",
           schema_version: int = SCHEMA_VERSION) -> Result:
    """A result whose variants have the given per-repeat throughputs (or are given whole)."""
    vs = (variants if isinstance(variants, list)
          else [variant(n, tp) for n, tp in variants.items()])
    return Result(
        schema_version=schema_version, tool=ToolInfo("stallbench", "0.1.0"), created_utc=created,
        scenario=ScenarioInfo(name=scenario, path=f"scenarios/{scenario}.toml", sha256="0" * 64,
                              fingerprint=fingerprint, text="", matrix={}),
        machine=machine or MachineInfo(cpu_model="Test CPU 3000", cores_logical=2, memory_gb=8),
        settings=RunSettings(repeats=len(vs[0].repeats)), dataset=DatasetInfo(), variants=vs)


def transform_bound_scenario(name: str, *, row_group_rows: int,
                             max_batches: int | None = None) -> str:
    """A real run that a transform bounds (issue 25): 32,768 rows whose transform burns 20 us
    of CPU per row, 1024-row jagged batches behind an EMULATED 2 ms step, 2 repeats of 0 and 2
    loader workers. ``row_group_rows`` sets the batches per work item; ``max_batches`` makes it
    a quick look."""
    look = f"max_batches = {max_batches}\n" if max_batches is not None else ""
    return f"""
name = "{name}"
[dataset]
rows = 32768
row_group_rows = {row_group_rows}
dense_features = 8
sparse_features = 4
sequence_features = 1
[preprocess]
cpu_cost_us_per_row = 20
[model]
kind = "emulated"
step_ms = 2
[loader]
batch_size = 1024
batch_format = "jagged"
{look}[run]
repeats = 2
[matrix]
"loader.num_workers" = [0, 2]
"""


def whatif_model(fetch: float = 1.0, prep: float = 1.0, xfer: float = 1.0, compute: float = 10.0,
                 trainer_xfer: float = 0.0, cores: float = 64.0, io: float = 0.0,
                 cpu_scale: float = 1.0, io_bytes: float = 0.0) -> WhatIfModel:
    """A what-if model fitted at 1 worker from per-sample stage times in microseconds: the
    producers' CPU is their wall less the storage wait (``io``), times ``cpu_scale``."""
    us = 1e-6
    p_wall = (fetch + prep + xfer) * us
    return WhatIfModel(
        p_wall=p_wall, p_cpu=(p_wall - io * us) * cpu_scale,
        t_trainer=(compute + trainer_xfer) * us, t_cpu=trainer_xfer * us, cores=cores,
        stage_wall={"fetch": fetch * us, "preprocess": prep * us, "transfer": xfer * us,
                    "transfer_trainer": trainer_xfer * us, "overhead": 0.0},
        io_wait=io * us, io_bytes=io_bytes, compute=compute * us, fit_workers=1, fit_variant="v")
