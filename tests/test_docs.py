"""The docs are part of the product: the key reference matches the code, every relative link
resolves, the README stays one screen deep, and the model example in docs/models.md trains."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from stallbench.data.schema import FeatureSchema
from stallbench.run import preflight
from stallbench.scenario import ModelSpec
from stallbench.stages import batch_format as bf
from stallbench.stages.compute import TorchCompute

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINKED = [README, *DOCS, ROOT / "benchmarks" / "README.md"]
README_MAX_LINES = 250


def test_key_reference_in_docs_is_generated_from_the_code() -> None:
    text = (ROOT / "docs" / "scenarios.md").read_text()
    assert preflight.reference_markdown().lstrip("\n") in text, (
        "docs/scenarios.md key reference is stale: paste reference_markdown() between the markers")


def test_readme_has_the_two_commands_and_ci_calls_the_test_one() -> None:
    readme = README.read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_is_one_screen_deep() -> None:
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; the guides belong in docs/"


def _anchors(md: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    out = set()
    for line in md.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def _links(md: str) -> list[str]:
    """Targets of inline markdown links outside code fences and code spans."""
    text = re.sub(r"```.*?```", "", md, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("doc", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in _links(doc.read_text()):
        if re.match(r"[a-z]+:", target):          # http:, https:, mailto: are not ours to check
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
            broken.append(f"{target} (no heading #{anchor})")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links: {broken}"


def test_the_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n\n[ok](a.md#top) [bad](missing.md) `[code](x.md)`\n")
    assert _links((tmp_path / "a.md").read_text()) == ["a.md#top", "missing.md"]
    assert "top" in _anchors((tmp_path / "a.md").read_text())


SCHEMA = FeatureSchema(dense=("d0", "d1"), sparse=("s0", "s1"), sequence=("q0", "q1"),
                       label="y", seq_len=4)


def _table(n: int = 7) -> pa.Table:
    rng = np.random.default_rng(0)
    seqs = {q: [[int(x) for x in rng.integers(0, 10**6, rng.integers(0, 7))] for _ in range(n)]
            for q in SCHEMA.sequence}
    return pa.table({"d0": pa.array(rng.random(n, dtype=np.float32)),
                     "d1": pa.array(rng.random(n, dtype=np.float32)),
                     "s0": pa.array(rng.integers(0, 10**9, n)), "s1": pa.array(rng.integers(0, 9, n)),
                     **{q: pa.array(v, pa.list_(pa.int64())) for q, v in seqs.items()},
                     "y": pa.array((np.arange(n) % 2).astype(np.float32))})


def _model_example() -> dict:
    md = (ROOT / "docs" / "models.md").read_text()
    block = re.search(r"```python\n(.*?)```", md, flags=re.S)
    assert block, "docs/models.md: no ```python block"
    ns: dict = {}
    exec(compile(block.group(1), "docs/models.md", "exec"), ns)  # noqa: S102 - our own docs
    return ns


@pytest.mark.parametrize("collate", ["producer", "trainer"])
@pytest.mark.parametrize("fmt", sorted(bf.FORMATS))
def test_the_documented_model_trains_on_every_batch_format(fmt: str, collate: str) -> None:
    """The contract docs/models.md states: forward takes the batch dict, returns (B,) logits;
    stallbench's step (BCE loss, SGD) trains it, whatever the batch format."""
    f = bf.FORMATS.get(fmt)(SCHEMA, collate)
    table = _table()
    batch = f.decode(f.encode(table, "b", False), "b", table.num_rows)
    module = _model_example()["factory"](SCHEMA, ModelSpec(kind="mymodel:factory", embedding_rows=1000))
    assert module(batch).shape == (table.num_rows,)
    step = TorchCompute(ModelSpec(kind="mymodel:factory", lr=1.0, embedding_rows=1000), SCHEMA, module)
    before = [p.detach().clone() for p in module.parameters()]
    step.step({k: v.to(step.device) for k, v in batch.items()})
    assert any(not torch.equal(b, p.detach().cpu()) for b, p in zip(before, module.parameters()))
