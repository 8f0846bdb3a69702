"""The default keeps the user's data: a scenario that sets no ``batch_format`` loses no id.

Ground truth by construction: held-out Parquet written by ``benchmarks/heldout.py``'s own
generator (not stallbench's), sequences of 0..29 ids, longer than the default
``sequence_max_len = 20`` that a padded format would cut at. A model of the user's own, written
for the documented batch dict (it reads ``seq`` (B, Q, L) and nothing jagged), counts and sums
the ids it is handed; both must equal what pyarrow reads from the files, per feature, under
every executor (the local loader, Flight's Arrow wire, Ray's stock collate). The padded view it
reads is checked against the same files row by row on one batch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from stallbench import scenario
from stallbench.data.schema import FeatureSchema
from stallbench.executors import EXECUTORS
from stallbench.measure.probe import measured_run
from stallbench.pipeline import Plan, dataset_for
from stallbench.stages import batch_format as bf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import heldout  # noqa: E402

ROWS = 3000

USER_MODEL = '''
import torch

SEEN = []      # per step: (per feature: (ids, sum of ids)), padded width


class Counting(torch.nn.Module):
    """Written for the documented dict: dense, sparse, seq (B, Q, L, -1 after the end), label."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(1, 1)

    def forward(self, b):
        seq = b["seq"]
        real = seq >= 0
        SEEN.append(([(int(real[:, j].sum()), int(seq[:, j][real[:, j]].sum()))
                      for j in range(seq.shape[1])], int(seq.shape[2])))
        return self.w(b["dense"][:, :1]).squeeze(1) + 0 * b["sparse"][:, 0]


def factory(schema, spec):
    return Counting()
'''


@pytest.fixture
def heldout_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    for f, rows in enumerate((ROWS, ROWS // 3 + 7)):       # two files, ragged row groups
        rng = np.random.default_rng([11, f])
        pq.write_table(heldout._table(rows, rng), data / f"part-{f}.parquet",
                       row_group_size=1000, compression="snappy")
    (tmp_path / "idcount.py").write_text(USER_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    return data


def _truth(data: Path) -> list[tuple[int, int, int]]:
    """Per sequence feature: (ids, sum of ids, longest sequence), read by pyarrow."""
    table = pq.read_table(data)
    out = []
    for j in range(heldout.SEQUENCES):
        col = table[f"h{j}"].combine_chunks()
        lengths = np.diff(col.offsets.to_numpy())
        vals = col.flatten().to_numpy()
        out.append((int(vals.size), int(vals.sum()), int(lengths.max())))
    return out


# Every executor, with no batch_format set: the local loader (0 and 2 workers), Flight (its
# Arrow wire) and Ray's stock mode (its own collate); Ray shares the session's runtime.
EXECUTOR_KEYS = {
    "local-0": "[loader]\nnum_workers = 0\n",
    "local-2": "[loader]\nnum_workers = 2\n",
    "flight": '[executor]\nkind = "flight"\nflight_local_servers = 1\n',
    "ray-stock": '[executor]\nkind = "ray"\nray_mode = "stock"\n',
}


def _run(data: Path, tmp_path: Path, executor: str, request: pytest.FixtureRequest,
         loader: str = "") -> tuple[Any, Any, list[tuple[int, int]]]:
    """One measured run of the user's counting model: (figures, config, per sequence feature
    (ids, sum of ids) the model was handed)."""
    import idcount

    if executor.startswith("ray"):
        request.getfixturevalue("ray_session")
    idcount.SEEN.clear()
    text = (f'name = "default-keeps-ids"\n[dataset]\npath = "{data}"\n'
            f'[model]\nkind = "idcount:factory"\n'
            f"{EXECUTOR_KEYS[executor]}")
    if "[loader]" not in text:
        text += "[loader]\n"
    text += f"batch_size = 512\n{loader}"
    cfg = scenario.parse(text, "ids.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, tmp_path / "cache", "ids.toml"), scenario_file="ids.toml")
    ex = EXECUTORS.get(cfg.executor.kind)(cfg, "ids.toml")
    ex.start()
    try:
        fig, _, _ = measured_run(plan, ex, plan.build_compute("ids.toml"))
    finally:
        ex.stop()
    got = [(sum(s[0][j][0] for s in idcount.SEEN), sum(s[0][j][1] for s in idcount.SEEN))
           for j in range(heldout.SEQUENCES)]
    return fig, cfg, got


@pytest.mark.parametrize("executor", [
    "local-0", "local-2", "flight", pytest.param("ray-stock", marks=pytest.mark.ray)])
def test_a_scenario_without_batch_format_keeps_every_id(heldout_dir: Path, tmp_path: Path,
                                                        executor: str,
                                                        request: pytest.FixtureRequest) -> None:
    import idcount

    fig, cfg, got = _run(heldout_dir, tmp_path, executor, request)
    assert cfg.loader.batch_format == "jagged"          # the default, set by nobody here
    truth = _truth(heldout_dir)
    assert truth[0][2] > cfg.dataset.sequence_max_len     # a padded default would cut these
    assert got == [(ids, total) for ids, total, _ in truth]
    assert fig.samples == ROWS + ROWS // 3 + 7
    assert fig.sequence_cut is None                      # nothing to report: nothing was cut
    widths = {w for _, w in idcount.SEEN}
    assert min(widths) >= cfg.dataset.sequence_max_len   # never narrower than documented


@pytest.mark.parametrize("executor", ["flight", pytest.param("ray-stock", marks=pytest.mark.ray)])
def test_a_padded_format_counts_what_it_cut_under_every_executor(
        heldout_dir: Path, tmp_path: Path, executor: str, request: pytest.FixtureRequest) -> None:
    """A padded format chosen explicitly cuts at ``sequence_max_len``, and the run counts
    exactly what it cut (the local loader's count: ``test_jagged.py``): Flight's servers
    and Ray stock mode's collate alike. The model is handed the ids that were not cut."""
    fig, cfg, got = _run(heldout_dir, tmp_path, executor, request,
                         'batch_format = "columnar"\n')
    table = pq.read_table(heldout_dir)
    lengths = np.concatenate([np.diff(table[f"h{j}"].combine_chunks().offsets.to_numpy())
                              for j in range(heldout.SEQUENCES)])
    over = np.maximum(lengths - cfg.dataset.sequence_max_len, 0)
    cut = fig.sequence_cut
    assert cut is not None, "nothing counted"
    assert (cut.sequences, cut.sequences_cut, cut.ids, cut.ids_cut, cut.longest) == (
        lengths.size, int((over > 0).sum()), int(lengths.sum()), int(over.sum()),
        int(lengths.max()))
    assert sum(ids for ids, _ in got) == lengths.sum() - over.sum()


SCHEMA = FeatureSchema(dense=("d0",), sparse=("s0",), sequence=("q0", "q1"), label="y",
                       seq_len=4)


def test_the_padded_view_of_a_jagged_batch_matches_the_rows() -> None:
    """``seq`` built on demand: row by row the ids of the Arrow table, then -1; width the
    batch's longest (here 9 > seq_len = 4), never less than seq_len."""
    rng = np.random.default_rng(2)
    n = 13
    seqs = {q: [rng.integers(0, 100, rng.integers(0, 10)).tolist() for _ in range(n)]
            for q in SCHEMA.sequence}
    seqs["q0"][3] = list(range(9))
    table = pa.table({"d0": pa.array(rng.random(n, dtype=np.float32)),
                      "s0": pa.array(rng.integers(0, 10, n)),
                      **{q: pa.array(v, pa.list_(pa.int64())) for q, v in seqs.items()},
                      "y": pa.array(np.zeros(n, dtype=np.float32))})
    fmt = bf.FORMATS.get("jagged")(SCHEMA, "producer")
    batch = bf.documented(fmt.decode(fmt.encode(table, "0:0", False), "0:0"), SCHEMA)
    assert "seq" in batch and "seq" not in dict.keys(batch)      # built only when asked for
    seq: Any = batch["seq"]
    longest = max(len(s) for v in seqs.values() for s in v)
    assert seq.shape == (n, 2, max(longest, SCHEMA.seq_len)) and seq.is_contiguous()
    for j, q in enumerate(SCHEMA.sequence):
        for i in range(n):
            ids = seqs[q][i]
            assert seq[i, j, :len(ids)].tolist() == ids
            assert (seq[i, j, len(ids):] == bf.PAD_ID).all()
    short = table.set_column(2, "q0", pa.array([[1]] * n, pa.list_(pa.int64()))).set_column(
        3, "q1", pa.array([[]] * n, pa.list_(pa.int64())))
    b2 = bf.documented(fmt.decode(fmt.encode(short, "0:1", False), "0:1"), SCHEMA)
    assert b2["seq"].shape == (n, 2, SCHEMA.seq_len)           # the documented width
    assert torch.equal(b2["seq"][:, 0, 0], torch.ones(n, dtype=torch.int64))
    padded = bf.FORMATS.get("single_buffer")(SCHEMA, "producer")
    assert bf.documented(padded.decode(padded.encode(short, "0:2", False), "0:2"), SCHEMA) \
        .keys() == set(bf.COLLATED)                          # a padded batch passes as is
