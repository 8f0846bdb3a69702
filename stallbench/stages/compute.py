"""Compute: one training step per batch, real (DLRM-style torch model) or emulated.

The emulated step stands in for an accelerator faster than this CPU: it waits a fixed time
without using the CPU (a GPU step leaves the host cores to the loader), and results label it.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any, Callable, ClassVar

import torch
from torch import nn

from ..data.schema import FeatureSchema
from ..errors import ScenarioError, UserCodeError, describe_exception, user_code
from ..registry import Registry, import_object, locate, user_dirs
from ..scenario import ModelSpec
from .batch_format import TensorBatch, documented
from .costs import precise_wait
from .transfer import device
from .transforms import at_user_frame, is_real_signal

MODELS: Registry[type["Compute"]] = Registry("model")


class Compute:
    name: ClassVar[str]
    emulated: ClassVar[bool] = False

    def __init__(self, spec: ModelSpec, schema: FeatureSchema) -> None:
        self.spec = spec
        self.schema = schema

    @classmethod
    def validate(cls, spec: ModelSpec, scenario_file: str = "<scenario>") -> None:
        """Rules across this model's keys (ScenarioError naming the key), checked for every
        variant before anything runs; the model, not the scenario parser, knows them."""

    def step(self, batch: TensorBatch) -> None:
        raise NotImplementedError

    @property
    def kind(self) -> str:
        """Where the step's time is spent, for accelerator utilisation: "gpu", "cpu" or
        "emulated" (``measure.device_clock`` takes each from the right clock)."""
        if self.emulated:
            return "emulated"
        return "gpu" if device().type == "cuda" else "cpu"

    def sync(self) -> None:
        """Wait for the step's queued device work so host step timings are real (no-op on
        CPU). Only the compute stream: a copy preloaded on a side stream keeps running."""
        if torch.cuda.is_available():
            torch.cuda.current_stream().synchronize()


@MODELS.register("emulated")
class EmulatedCompute(Compute):
    name = "emulated"
    emulated = True

    def step(self, batch: TensorBatch) -> None:
        precise_wait(self.spec.step_ms / 1000.0)


def _mlp(sizes: list[int], final_act: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or final_act:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """DLRM-style: bottom MLP on dense, sum-pooled embedding bags for ids, mean-pooled ones for
    sequences, concatenated into a top MLP. Sparse gradients keep the embedding update
    proportional to the ids seen, as in production recommenders.

    The sequence features share one fused table (feature ``j`` owns rows ``j*R+1 .. j*R+R-1``,
    row 0 is padding), so all of them are pooled by ONE ``EmbeddingBag`` call, either form of
    batch: padded ``seq`` (B, Q, L) as B*Q bags of L with the padding excluded from the mean,
    or jagged ``seq_values`` + ``seq_offsets`` (TorchRec's KeyedJaggedTensor layout) as Q*B
    bags given by their offsets, with no padding at all. Both give the same pooled vectors for
    the same ids, and nothing here reads a device value back to the host (no sync)."""

    def __init__(self, spec: ModelSpec, schema: FeatureSchema) -> None:
        super().__init__()
        d = spec.embedding_dim
        self.rows = spec.embedding_rows
        self.q = len(schema.sequence)
        self.bottom = _mlp([max(len(schema.dense), 1), *spec.bottom_mlp], final_act=True)
        self.sparse = nn.ModuleList(nn.EmbeddingBag(self.rows, d, mode="sum", sparse=True)
                                    for _ in schema.sparse)
        self.seq = (nn.EmbeddingBag(self.q * self.rows, d, mode="mean", sparse=True,
                                    padding_idx=0, include_last_offset=True)
                    if self.q else None)
        self.register_buffer("seq_base", torch.arange(self.q, dtype=torch.int64) * self.rows,
                             persistent=False)
        width = spec.bottom_mlp[-1] + d * (len(schema.sparse) + self.q)
        self.top = _mlp([width, *spec.top_mlp], final_act=False)

    def _ids(self, ids: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        """A feature's ids in its part of the fused table (1 .. R-1 above its base)."""
        return ids % (self.rows - 1) + 1 + base

    def forward(self, b: TensorBatch) -> torch.Tensor:
        n = b["label"].shape[0]
        dense = b["dense"] if b["dense"].shape[1] else b["label"].new_zeros(n, 1)
        parts = [self.bottom(dense)]
        sparse = b["sparse"] % self.rows
        for j, emb in enumerate(self.sparse):
            parts.append(emb(sparse[:, j:j + 1]))
        if self.seq is not None:
            if "seq_values" in b:
                offsets = b["seq_offsets"]
                starts = offsets[::n] if n else offsets.new_zeros(self.q + 1)
                lengths = starts[1:] - starts[:-1]
                values = b["seq_values"]
                base = torch.repeat_interleave(self.seq_base, lengths, output_size=values.numel())
                pooled = self.seq(self._ids(values, base), offsets)          # (Q*B, d)
                pooled = pooled.view(self.q, n, -1).transpose(0, 1)           # (B, Q, d)
            else:
                s = b["seq"]
                idx = torch.where(s >= 0, self._ids(s, self.seq_base.view(1, -1, 1)),
                                  torch.zeros_like(s))
                width = s.shape[2]
                bags = torch.arange(0, n * self.q * width + 1, max(width, 1), device=s.device)
                if not width:
                    bags = bags.new_zeros(n * self.q + 1)
                pooled = self.seq(idx.reshape(-1), bags).view(n, self.q, -1)
            parts.append(pooled.reshape(n, -1))
        return self.top(torch.cat(parts, dim=1)).squeeze(1)


class TorchCompute(Compute):
    """forward + BCE loss + backward + SGD step on a torch module."""

    def __init__(self, spec: ModelSpec, schema: FeatureSchema, module: nn.Module) -> None:
        super().__init__(spec, schema)
        torch.set_num_threads(spec.torch_threads)
        self.device = device()
        self.model = module.to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=spec.lr)
        self.loss = nn.BCEWithLogitsLoss()

    def step(self, batch: TensorBatch) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(self.model(batch), batch["label"])
        loss.backward()
        self.opt.step()


@MODELS.register("dlrm")
class DLRMCompute(TorchCompute):
    name = "dlrm"

    @classmethod
    def validate(cls, spec: ModelSpec, scenario_file: str = "<scenario>") -> None:
        if not spec.top_mlp or spec.top_mlp[-1] != 1:
            raise ScenarioError(scenario_file, "model.top_mlp",
                                "expected a list ending in 1 (one logit)")

    def __init__(self, spec: ModelSpec, schema: FeatureSchema) -> None:
        torch.manual_seed(0)
        super().__init__(spec, schema, DLRM(spec, schema))


class UserCompute(TorchCompute):
    """A user's ``factory(schema, spec) -> nn.Module`` whose forward returns logits.

    Its forward gets the documented batch dict (``dense``, ``sparse``, ``seq``, ``label``)
    whatever the format: from a jagged batch (the default), ``seq`` is padded on demand to the
    batch's longest sequence, at least ``sequence_max_len`` (``batch_format.documented``); the
    jagged keys ``seq_values`` / ``seq_offsets`` are there too, for a model that pools them
    without padding.

    The user's code failing anywhere (import, factory, its forward and backward in a step) is
    a ``UserCodeError`` naming ``model.kind`` and the scenario file, never a traceback."""

    name = "user"

    def __init__(self, spec: ModelSpec, schema: FeatureSchema,
                 scenario_file: str = "<scenario>") -> None:
        self.file = scenario_file
        self.spec = spec
        searched = user_dirs(scenario_file)
        try:
            with user_code():
                factory: Callable[..., Any] = import_object(  # type: ignore[assignment]
                    spec.kind, locate(spec.kind.partition(":")[0], searched), searched)
        except BaseException as exc:  # noqa: BLE001 - a user module may raise anything at import
            if is_real_signal(exc):
                raise
            raise self._error(f"cannot be imported: {describe_exception(exc)}{at_user_frame(exc)}") \
                from None
        if not callable(factory):
            raise self._error(f"is not callable (it is a {type(factory).__name__})")
        try:
            with user_code():
                module = factory(schema, spec)
        except BaseException as exc:  # noqa: BLE001 - sys.exit() in it too: never a silent end
            if is_real_signal(exc):
                raise
            raise self._error(f"raised {describe_exception(exc)}{at_user_frame(exc)}") from None
        if not isinstance(module, nn.Module):
            raise self._error(f"returned {type(module).__name__}, expected a torch.nn.Module")
        super().__init__(spec, schema, module)

    def _error(self, problem: str) -> UserCodeError:
        tb = traceback.format_exc() if sys.exc_info()[0] is not None else ""
        return UserCodeError(self.file, "model.kind", f"model {self.spec.kind!r}", problem,
                             where="the trainer", traceback_text=tb)

    def step(self, batch: TensorBatch) -> None:
        try:
            with user_code():
                super().step(documented(batch, self.schema))
        except BaseException as exc:  # noqa: BLE001 - the user's forward/backward
            if is_real_signal(exc):
                raise
            raise self._error(f"failed in a training step: {describe_exception(exc)}"
                              f"{at_user_frame(exc)}") from None


def build(spec: ModelSpec, schema: FeatureSchema, scenario_file: str = "<scenario>") -> Compute:
    if ":" in spec.kind:
        return UserCompute(spec, schema, scenario_file)
    return MODELS.get(spec.kind)(spec, schema)
