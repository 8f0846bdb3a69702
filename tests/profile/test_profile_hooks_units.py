"""The agent's bookkeeping without a job: a loader's pin thread adds to that loader's bucket
(not the process's "trainer" bucket every loader would be charged with), and a flush that
cannot write says so on stderr instead of raising inside the job's loop."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import profile_helpers as helpers


def _agent():
    return helpers.load_agent("_agent_under_test")


def test_pin_thread_time_goes_to_its_own_loader() -> None:
    a = _agent()

    def loop():
        a.stages.stage_add("pin_memory", 0.25, 0.01, where="trainer")
    for key in ("9:0", "9:1"):
        pin_loop = a.util.door_of("torch.DataLoader")._keyed_pin_loop
        t = threading.Thread(target=pin_loop, args=(loop, key))
        t.start()
        t.join()
    records = a.state.STAGE_RECORDS
    assert records["9:0"]["pin_memory"][:2] == [1, 0.25]
    assert records["9:1"]["pin_memory"][:2] == [1, 0.25]
    assert not any(k.endswith(":trainer") for k in records)


def test_a_flush_that_cannot_write_never_raises(tmp_path: Path, capsys) -> None:
    a = _agent()
    a.state.SETTINGS = a.wire.Settings(run_dir=str(tmp_path))

    class Odd:                      # neither JSON nor a scalar: written as its type's name
        def __str__(self) -> str:   # (never its __str__: no user code runs in hook code)
            raise KeyError("user code ran")
    st = a.streams.Stream("stallbench.watch", "x", {"batch_size": 4, "odd": Odd()})
    a.writer.flush()
    part = json.loads(next(tmp_path.glob("part-*.json")).read_text())
    assert part["streams"][0]["settings"]["odd"].endswith(".Odd>")
    a.state.SETTINGS = a.wire.Settings(run_dir=str(tmp_path / "gone"))    # no such dir
    a.writer.flush()
    a.writer.flush()
    err = capsys.readouterr().err
    assert err.count("cannot write its figures") == 1, err
    assert st.key in part["streams"][0]["key"]


def test_torch_threads_are_read_never_imported_and_never_raise() -> None:
    """Issue 42: the part header carries torch's threads as the job runs; a process without
    torch, or with a torch that fails the call (half-imported, torn down at exit), gets None."""
    import torch

    w = _agent().writer

    class Broken:
        def get_num_threads(self) -> int:
            raise RuntimeError("torn down")

    assert w.torch_threads(None) is None
    assert w.torch_threads(Broken()) is None
    assert w.torch_threads(torch) == torch.get_num_threads()
    assert w.header().torch_threads == torch.get_num_threads()


def _written_epochs(run_dir: Path, key: str) -> list[dict]:
    out = []
    for f in sorted(run_dir.glob("epochs-*.json")):
        out.extend(json.loads(f.read_text())["streams"].get(key, []))
    return out


def test_a_ray_train_worker_writes_its_last_epoch_at_shutdown(tmp_path: Path) -> None:
    """Ray Train ends a worker with ``ray.kill`` right after ``RayTrainWorker.shutdown``: no
    ``atexit``. A last epoch whose end-of-epoch write the flush budget deferred (a mid-epoch
    write just before it) was lost with the process (a 2-worker job read 14 of each rank's 16
    batches, in about one run in two). The Ray door's ``shutdown`` writes it, after Ray's own
    shutdown ran, and also when that raised."""
    import types

    a = _agent()
    a.state.SETTINGS = a.wire.Settings(run_dir=str(tmp_path))
    door = a.util.door_of("ray.iter_torch_batches")
    st = a.streams.Stream("ray.iter_torch_batches", "StreamSplitDataIterator", {"batch_size": 4})
    for epoch in range(2):
        assert sum(1 for _ in a.passes.Passes(st, [[1, 2, 3, 4]] * 3)) == 3
        if epoch == 0:      # as a mid-epoch write would: the next epoch end is deferred
            a.writer._next_epoch_flush = a.state.perf() + 3600.0
    assert len(_written_epochs(tmp_path, st.key)) == 1      # what a killed worker kept

    class RayTrainWorker:
        calls: list = []

        def shutdown(self) -> None:
            self.calls.append(len(_written_epochs(tmp_path, st.key)))
            raise RuntimeError("Ray's own")

    mod = types.ModuleType("ray.train.v2._internal.execution.worker_group.worker")
    mod.RayTrainWorker = RayTrainWorker
    door.patch_ray_train_worker(mod)
    try:
        RayTrainWorker().shutdown()
    except RuntimeError as exc:
        assert str(exc) == "Ray's own"
    else:
        raise AssertionError("Ray's exception was swallowed")
    assert RayTrainWorker.calls == [1]                       # written after Ray's shutdown
    eps = _written_epochs(tmp_path, st.key)
    assert [(len(e["wait"]), e["ended"]) for e in eps] == [(3, True), (3, True)]


def _frames(path: str, src: str) -> dict:
    """Functions compiled as if they lived in ``path`` (their frames carry that file)."""
    ns: dict = {}
    exec(compile(src, path, "exec"), ns)
    return ns


def test_a_loader_is_named_by_the_jobs_hook_else_by_its_frameworks() -> None:
    """``framework_name``: the job's own ``*dataloader`` function first (Lightning's hooks),
    then a library's public one with ``get_`` dropped (Hugging Face's Trainer makes its
    loaders in ``get_train_dataloader``); a library's private helper and a plain script name
    nothing."""
    a = _agent()
    lib = _frames("/venv/lib/python3.11/site-packages/fw/trainer.py", (
        "def get_train_dataloader(make):\n    return make()\n"
        "def _request_dataloader(make):\n    return make()\n"
        "def build_dataloader(make):\n    return make()\n"))
    job = _frames("/home/me/train.py", (
        "def val_dataloader(call, make):\n    return call(make)\n"
        "def main(call, make):\n    return call(make)\n"))
    name = a.util.framework_name
    assert lib["get_train_dataloader"](name) == "train_dataloader"
    assert lib["_request_dataloader"](name) == ""
    # the job's hook wins over the library helper it calls
    assert job["val_dataloader"](lib["build_dataloader"], name) == "val_dataloader"
    assert job["val_dataloader"](lib["_request_dataloader"], name) == "val_dataloader"
    assert job["main"](lambda make: make(), name) == ""
