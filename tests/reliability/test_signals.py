"""Class 2 and 8 of issue 13: signals from the first instruction to the last.

The rule (``stallbench/interrupts.py``, installed by ``stallbench/cli.py``): SIGINT and SIGTERM
alike end the command with exit 130 / 143 and exactly one line ("interrupted by SIGTERM; no
result written"), no result, no temp data (result temp files, the dataset generator's temp
dir), and no process started under the command left alive, whenever the signal comes:
while the dataset is generated, as the first loader worker appears (Ctrl-C used to be lost
there: rc 0 with a result), while many workers are being forked, mid-epoch, and while Ray
starts (it used to end in rc 15 / -6 with a C++ stack dump and orphaned Ray agents).

Real signals to a real ``stallbench`` process; psutil records every process under it.
"""

from __future__ import annotations

import glob
import signal
import time
from pathlib import Path

import psutil
import pytest
from reliability_helpers import TINY, Watched, no_files, write

from stallbench import interrupts, results

EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
BOTH = [signal.SIGINT, signal.SIGTERM]


def _expect_interrupted(w: Watched, sig: int, out: Path, cache: Path | None = None) -> str:
    rc, stdout, err = w.finish()
    assert rc == EXIT[sig], (rc, err[-3000:])
    name = signal.Signals(sig).name
    assert err.splitlines()[-1] == f"stallbench: interrupted by {name}; no result written", err
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    assert no_files(out), list(out.iterdir())
    if cache is not None:
        leftovers = list((cache / "datasets").glob(".tmp-*")) if (cache / "datasets").exists() \
            else []
        assert not leftovers, leftovers
    left = w.leftovers()
    assert not left, f"processes left behind: {left}"
    return err


def _lines_ok(err: str) -> None:
    """Only torch's own warning about many workers may come before our line."""
    ours = [ln for ln in err.splitlines() if ln.startswith("stallbench:")]
    assert len(ours) == 1, err


@pytest.mark.parametrize("sig", BOTH, ids=["SIGINT", "SIGTERM"])
def test_signal_while_the_dataset_is_generated(tmp_path: Path, env: dict, sig: int) -> None:
    cache = tmp_path / "cache"
    e = {**env, "STALLBENCH_CACHE": str(cache)}
    write(tmp_path, TINY.replace("rows = 4096", "rows = 3000000").replace(
        "row_group_rows = 512", "row_group_rows = 20000"))
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"], e, tmp_path)
    seen = w.wait_for(lambda _: any((cache / "datasets").glob(".tmp-*/part-*"))
                      if (cache / "datasets").exists() else False)
    assert seen, "the generator never started: " + w.finish()[2][-2000:]
    time.sleep(0.2)
    w.proc.send_signal(sig)
    _expect_interrupted(w, sig, tmp_path / "out", cache)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGINT],
                         ids=["SIGINT", "SIGTERM", "SIGINT-again"])
def test_signal_as_the_first_loader_worker_appears(tmp_path: Path, env: dict, sig: int) -> None:
    """Used to be lost (rc 0, a result written, 7 of 7 tries): the KeyboardInterrupt was raised
    inside logging's at-fork callback, where Python drops it."""
    write(tmp_path, TINY.replace("batch_size = 512", "batch_size = 512\nnum_workers = 2"))
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path)
    assert w.wait_for(lambda kids: len(kids) >= 1), w.finish()[2][-2000:]
    w.proc.send_signal(sig)
    _expect_interrupted(w, sig, tmp_path / "out")


@pytest.mark.parametrize("sig", BOTH, ids=["SIGINT", "SIGTERM"])
def test_signal_while_many_workers_are_forked(tmp_path: Path, env: dict, sig: int) -> None:
    """The DataLoader forks its workers in one loop; each fork now checks for a signal, so
    the command ends within seconds instead of after forking them all."""
    write(tmp_path, TINY.replace("batch_size = 512", "batch_size = 512\nnum_workers = 96"))
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path)
    assert w.wait_for(lambda kids: len(kids) >= 6), w.finish()[2][-2000:]
    w.proc.send_signal(sig)
    t0 = time.monotonic()
    err = _expect_interrupted(w, sig, tmp_path / "out")
    _lines_ok(err)
    forked = len(w.seen)
    assert forked < 96, f"all {forked} workers were forked before the signal was acted on"
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("sig", BOTH, ids=["SIGINT", "SIGTERM"])
def test_signal_mid_epoch(tmp_path: Path, env: dict, sig: int) -> None:
    write(tmp_path, TINY.replace("step_ms = 1", "step_ms = 300").replace(
        "batch_size = 512", "batch_size = 512\nnum_workers = 1"))
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path)
    line = ""
    deadline = time.monotonic() + 180
    while "variant" not in line and time.monotonic() < deadline:
        line = w.proc.stdout.readline()
    w.children()
    time.sleep(1.5)                      # inside the measured run: 8 batches x 0.3 s
    w.children()
    w.proc.send_signal(sig)
    _expect_interrupted(w, sig, tmp_path / "out")


def _driver_connected(w: Watched) -> bool:
    """The command's own Ray core worker exists: its log file (``python-core-driver-*_PID.log``
    in the session's log directory, which the GCS's command line names) has appeared. From
    here until ``ray.init`` returns, Ray's C++ core held the signal (a stack dump, rc -6) or,
    once that was off, the half-made core worker crashed the exit (rc -11)."""
    for pid, name in list(w.seen.items()):
        if name != "gcs_server":
            continue
        try:
            logs = [a.split("=", 1)[1] for a in psutil.Process(pid).cmdline()
                    if a.startswith("--log_dir=")]
        except psutil.Error:
            continue
        if logs and glob.glob(f"{glob.escape(logs[0])}/python-core-driver-*_{w.proc.pid}.log"):
            return True
    return False


@pytest.mark.ray
@pytest.mark.parametrize("sig, when", [  # CI time: one instance in CI, the others with test-all
    pytest.param(signal.SIGTERM, "gcs_server", marks=pytest.mark.slow),
    pytest.param(signal.SIGTERM, "raylet", marks=pytest.mark.slow),
    (signal.SIGTERM, "core worker"),
    pytest.param(signal.SIGINT, "raylet", marks=pytest.mark.slow),
    pytest.param(signal.SIGINT, "core worker", marks=pytest.mark.slow)])
def test_signal_during_ray_start_up(tmp_path: Path, env: dict, sig: int, when: str) -> None:
    """Used to end in rc 15, 1 or -6 (Ray's C++ handler: a stack dump) and leave Ray agents;
    inside ``ray.init`` once the driver's core worker existed, rc -6 with a stack dump, then
    (the handler off) rc -11 after the right line."""
    pytest.importorskip("ray")
    write(tmp_path, TINY + '[executor]\nkind = "ray"\ncpus = 1\n')
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path)

    def started(kids: list) -> bool:
        if when == "core worker":
            return _driver_connected(w)
        return any(when in name for name in w.seen.values())

    assert w.wait_for(started), w.finish()[2][-2000:]
    w.proc.send_signal(sig)
    err = _expect_interrupted(w, sig, tmp_path / "out")
    assert "SIGTERM received" not in err and "*** " not in err, err
    assert len(err.splitlines()) == 1, err


# --------------------------------------------------------------------- the pieces, in-process

def test_a_swallowed_interrupt_is_raised_again_by_check() -> None:
    """What the at-fork callback did to Ctrl-C: the handler's exception dropped, the signal
    still recorded, so the next ``check`` raises it."""
    state = interrupts._state
    assert state.pending is None
    try:
        try:
            interrupts._handler(signal.SIGINT, None)
        except interrupts.Interrupted:
            pass                                   # swallowed, as in a __del__
        with pytest.raises(interrupts.Interrupted) as info:
            interrupts.check()
        assert info.value.exit_code == 130 and info.value.name == "SIGINT"
        interrupts._handler(signal.SIGTERM, None)   # a later signal while unwinding: no raise
    finally:
        state.pending = None


def test_a_signal_inside_a_deferred_section_is_raised_at_its_end() -> None:
    state = interrupts._state
    done = []
    try:
        with pytest.raises(interrupts.Interrupted):
            with interrupts.deferred():
                interrupts._handler(signal.SIGTERM, None)   # recorded, not raised
                done.append("finished")
        assert done == ["finished"]
    finally:
        state.pending = None


def test_no_result_is_published_after_a_signal(tmp_path: Path) -> None:
    r = results.load(Path(__file__).resolve().parents[2] / "results/examples/schema-v2.json")
    state = interrupts._state
    try:
        state.pending = signal.SIGTERM
        with pytest.raises(interrupts.Interrupted):
            results.save(r, tmp_path)
    finally:
        state.pending = None
    assert not list(tmp_path.iterdir())               # neither the result nor its temp file
    assert results.save(r, tmp_path).exists()


def test_sigterm_inside_a_finaliser_still_ends_a_rank(tmp_path: Path) -> None:
    """A rank's SIGTERM handler (``interrupts.sigterm_exits``) raising inside a ``__del__``
    (seen: a multiprocessing ``Connection`` closed by the garbage collector, with one core
    busy) was printed as "Exception ignored ... SystemExit: 143" on the user's terminal and
    dropped: the rank went on until the launcher's SIGKILL. The signal lands inside the
    finaliser here by construction (it is sent from it)."""
    import subprocess
    import sys

    script = tmp_path / "rank.py"
    script.write_text(
        "import os, signal, time\n"
        "from stallbench import interrupts\n"
        "interrupts.sigterm_exits()\n"
        "class Held:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        for _ in range(1000):\n"
        "            pass\n"
        "try:\n"
        "    h = Held()\n"
        "    del h\n"
        "    time.sleep(30)\n"
        "    print('not ended', flush=True)\n"
        "except SystemExit as exc:\n"
        "    print('ended', exc.code, flush=True)\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout == "ended 143\n", (r.stdout, r.stderr)
    assert r.stderr == "", r.stderr
