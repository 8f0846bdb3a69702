"""The part files (``profile/agent/wire/parts.py``): what the agent writes is what the
launcher reads, one record type per file kind, versioned, parsed once per run (issue 40)."""

from __future__ import annotations

import json
from pathlib import Path

from stallbench.profile import merge
from stallbench.profile.agent import wire


def _epoch(t0: float, n: int) -> wire.Epoch:
    return wire.Epoch(t_iter=t0, t_req=tuple(t0 + i * 0.1 for i in range(n)),
                       wait=(0.05,) * n, step=(0.05,) * n, rows=(4,) * n, ended=True,
                       capped=False, t_end=t0 + n * 0.1, cpu_s=0.2)


def _write(d: Path, rec, name: str) -> None:
    (d / name).write_text(json.dumps(rec.to_json()))


def test_every_record_reads_back_as_written(tmp_path: Path) -> None:
    head = wire.Header(host="h", pid=7, image="a1", rank=1, world_size=2, launched=True,
                        t0_wall=100.0, torch="2.13.0", torch_threads=2, cpu_s=1.5)
    st = wire.Stream(kind="torch.DataLoader", name="D#0", order=0, key="7-a1:0",
                      settings={"num_workers": 2, "batch_size": 4}, notes=("n",))
    tr = wire.Trainer(header=head, streams=(st,), stages={"7-a1:0": {"collate_fn":
                       [3, 0.1, 0.05, "workers", 3, 0.0, 0]}}, exiting=True,
                       open={"7-a1:0": (1, (_epoch(9.0, 2),))})
    ep = wire.Epochs(host="h", pid=7, image="a1", seq=3, streams={"7-a1:0": (_epoch(1.0, 5),)})
    wk = wire.Worker(header=wire.Header(host="h", pid=8, image="b2"), loader="7-a1:0",
                      stages={"7-a1:0": {"dataset.__getitem__": [8, 0.4, 0.3, "workers",
                                                                 8, 0.0, 0]}})
    rp = wire.Replay(pid=7, mode="compute_only", served=5, served_from={"D#0": [2]})
    _write(tmp_path, tr, "part-h-7-a1.json")
    _write(tmp_path, ep, "epochs-h-7-a1-000003.json")
    _write(tmp_path, wk, "stage-h-8-b2.json")
    _write(tmp_path, rp, "replay-h-7.json")
    got = wire.read(tmp_path)
    assert got.trainers == (tr,) and got.epochs == (ep,) and got.workers == (wk,)
    assert got.replays == (rp,) and got.skipped == 0


def test_other_versions_and_torn_files_are_not_read_as_this_one(tmp_path: Path) -> None:
    ep = wire.Epochs(host="h", pid=7, image="a", seq=0, streams={"k": (_epoch(0.0, 1),)})
    old = {**ep.to_json(), "v": wire.VERSION + 1}
    (tmp_path / "epochs-h-7-a-000000.json").write_text(json.dumps(old))
    (tmp_path / "part-h-7-a.json").write_text('{"role": "trainer", "pid"')    # torn by a kill
    (tmp_path / "beat-h-7").write_text("{}")                                 # not a part
    got = wire.read(tmp_path)
    assert not got and got.skipped == 1


def test_a_runs_streams_are_merged_once_however_many_ask(tmp_path: Path) -> None:
    head = wire.Header(host="h", pid=7, image="a", t0_wall=50.0)
    st = wire.Stream(kind="torch.DataLoader", name="D#0", order=0, key="7-a:0")
    _write(tmp_path, wire.Trainer(header=head, streams=(st,)), "part-h-7-a.json")
    for seq in (1, 0):          # written out of order: read in ``seq`` order
        _write(tmp_path, wire.Epochs(host="h", pid=7, image="a", seq=seq,
                                      streams={"7-a:0": (_epoch(10.0 * seq, 3 + seq),)}),
               f"epochs-h-7-a-{seq:06d}.json")
    got = wire.read(tmp_path)
    first = merge.streams(got)
    assert [s.batches for s in first] == [7] and first[0].spans[0][2] == 3
    again = merge.streams(got)
    assert again[0] is first[0]         # the same merge, not a second parse
