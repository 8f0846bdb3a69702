"""Class 2 of issue 26: user code that ends the process is reported, never a silent exit.

The rule (``errors.is_real_signal``, ``UserTransform``/``UserCompute`` catching
``BaseException``, ``LocalExecutor._worker_died``, the rank launchers, ``errors.ProcessDied``):
``sys.exit(n)`` or a ``KeyboardInterrupt`` the user's code raised itself (no real SIGINT
arrived), in the trainer or a loader worker, is one line naming the scenario key, the user's
file and function, exit 2; a loader worker or a trainer rank that dies of anything
(``os._exit``, a segfault, ``kill -9``) is one line naming it and its exit status, exit 2. No
result either way, and no traceback. A real SIGINT still ends the run with 130
(``test_signals``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability_helpers import TINY, no_files, sb, write

CODE = '''
import os, sys, multiprocessing

def _do(how):
    if how == "exit0":
        sys.exit(0)
    if how == "exit3":
        sys.exit(3)
    if how == "exitmsg":
        raise SystemExit("bye")
    if how == "kbint":
        raise KeyboardInterrupt
    if how == "os_exit":
        os._exit(7)
    if how == "os_exit0":
        os._exit(0)
    if how == "kill9":
        os.kill(os.getpid(), 9)
    if how == "segv":
        import ctypes
        ctypes.string_at(0)
    if how == "big":
        raise ValueError("x" * 5_000_000)

def here(table, **kw):
    _do(os.environ["HOW"])
    return table

def in_worker(table, **kw):
    from torch.utils.data import get_worker_info
    if get_worker_info() is not None:
        _do(os.environ["HOW"])
    return table

def in_rank(table, **kw):
    if multiprocessing.parent_process() is not None:
        _do(os.environ["HOW"])
    return table

def in_rank1(table, **kw):
    if os.environ.get("RANK") == "1":
        _do(os.environ["HOW"])
    return table

def in_server(table, **kw):
    if sys.argv[0].endswith("server.py"):      # a local Flight server
        _do(os.environ["HOW"])
    return table

def factory(schema, spec):
    _do(os.environ["HOW"])

class Net:
    pass
'''

WORKERS = TINY.replace("batch_size = 512", "batch_size = 512\nnum_workers = 2")


def _run(tmp_path: Path, env: dict, text: str, how: str):
    (tmp_path / "usercode.py").write_text(CODE)
    write(tmp_path, text)
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], {**env, "HOW": how}, tmp_path)
    assert r.returncode == 2, (how, r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert no_files(tmp_path / "out")
    # ONE line: the whole of stderr (a hint to use --debug was a second line of its own)
    assert len(r.stderr.splitlines()) == 1, r.stderr[-3000:]
    assert r.stderr.startswith("stallbench: error: "), r.stderr[-3000:]
    return r.stderr.strip()


@pytest.mark.parametrize("how, says", [
    ("exit0", "raised SystemExit (sys.exit(0))"),
    ("exit3", "raised SystemExit (sys.exit(3))"),
    ("exitmsg", "raised SystemExit (sys.exit('bye'))"),
    ("kbint", "raised KeyboardInterrupt"),
])
def test_exit_in_a_transform_in_the_trainer(tmp_path: Path, env: dict, how: str,
                                            says: str) -> None:
    line = _run(tmp_path, env, TINY + '[preprocess]\ntransforms = ["usercode:here"]\n', how)
    assert "preprocess.transforms[0]: transform 'usercode:here'" in line, line
    assert says in line and "usercode.py:" in line and "in _do" in line, line


@pytest.mark.parametrize("how", ["os_exit0", "os_exit"])
def test_os_exit_in_the_trainers_process_is_the_user_codes_error(tmp_path: Path, env: dict,
                                                                 how: str) -> None:
    """Issue 59: ``os._exit(0)`` in a model's factory or a transform that runs in
    stallbench's own process ended ``stallbench run`` with exit 0 and no result; it is now
    raised in its place (``errors.user_code``) and reported as the code's error, exit 2."""
    code = "0" if how == "os_exit0" else "7"
    for text, key in ((TINY.replace('kind = "emulated"\nstep_ms = 1',
                                    'kind = "usercode:factory"'), "model.kind"),
                      (TINY + '[preprocess]\ntransforms = ["usercode:here"]\n',
                       "preprocess.transforms[0]")):
        line = _run(tmp_path, env, text, how)
        assert f"{key}: " in line and f"raised os._exit({code})" in line, line
        assert "usercode.py:" in line and "in _do" in line, line


@pytest.mark.parametrize("how", ["exit0", "kbint"])
def test_exit_in_a_model_factory(tmp_path: Path, env: dict, how: str) -> None:
    line = _run(tmp_path, env, TINY.replace('kind = "emulated"\nstep_ms = 1',
                                            'kind = "usercode:factory"'), how)
    assert "model.kind: model 'usercode:factory'" in line and "usercode.py:" in line, line


def test_exit_in_a_model_factory_of_a_rank_names_the_scenario_file(tmp_path: Path,
                                                                    env: dict) -> None:
    """A rank builds its model from the plan: its errors named ``<scenario>``."""
    line = _run(tmp_path, env, TINY.replace('kind = "emulated"\nstep_ms = 1',
                                            'kind = "usercode:factory"')
                + "[trainers]\nranks = 2\n", "exit3")
    assert "s.toml: model.kind: model 'usercode:factory'" in line and "<scenario>" not in line
    assert "trainer rank " in line and "raised SystemExit (sys.exit(3))" in line, line


@pytest.mark.parametrize("how", ["exit3", "kbint"])
def test_exit_in_a_loader_worker_is_the_transforms_error(tmp_path: Path, env: dict,
                                                          how: str) -> None:
    line = _run(tmp_path, env, WORKERS + '[preprocess]\ntransforms = ["usercode:in_worker"]\n',
                how)
    assert "(in loader worker " in line and "usercode.py:" in line, line


@pytest.mark.parametrize("how, status", [
    ("os_exit", "exited with status 7"),
    ("kill9", "killed by SIGKILL"),
    ("segv", "killed by SIGSEGV"),
])
def test_a_loader_worker_that_dies(tmp_path: Path, env: dict, how: str, status: str) -> None:
    line = _run(tmp_path, env, WORKERS + '[preprocess]\ntransforms = ["usercode:in_worker"]\n',
                how)
    assert "loader worker " in line and status in line, line
    assert "transform 'usercode:in_worker'" in line and "no result written" in line, line


@pytest.mark.parametrize("how, status", [
    ("os_exit", "exited with status 7"),
    ("kill9", "killed by SIGKILL"),
])
def test_a_trainer_rank_that_dies(tmp_path: Path, env: dict, how: str, status: str) -> None:
    line = _run(tmp_path, env, TINY + '[preprocess]\ntransforms = ["usercode:in_rank"]\n'
                                      '[trainers]\nranks = 2\n', how)
    assert "trainer rank " in line and status in line and "no result written" in line, line


@pytest.mark.parametrize("how", ["os_exit", pytest.param("kill9", marks=pytest.mark.slow)])
def test_a_ray_rank_actor_that_dies(tmp_path: Path, env: dict, how: str) -> None:
    """Rank 1's actor dies in its set-up (its ablation caches run the transform). Ray knows
    no exit status for a process that ends without Python's exit, and the actor is the
    raylet's child, not stallbench's: the line says so instead of quoting Ray's page."""
    line = _run(tmp_path, env, TINY.replace("differential = false", "differential = true")
                + '[preprocess]\ntransforms = ["usercode:in_rank1"]\n[trainers]\nranks = 2\n'
                '[executor]\nkind = "ray"\ncpus = 2\nobject_store_mb = 100\n', how)
    assert line.startswith("stallbench: error: trainer rank 1 (Ray actor, pid "), line
    assert "ended abruptly (os._exit, a signal or the OOM killer" in line, line
    assert "no result written" in line and "rank 0" not in line, line


@pytest.mark.parametrize("where, text", [
    ("rank", '[preprocess]\ntransforms = ["usercode:in_rank"]\n[trainers]\nranks = 2\n'),
    ("server", '[preprocess]\ntransforms = ["usercode:in_server"]\n'
               '[executor]\nkind = "flight"\nflight_local_servers = 1\n'),
])
def test_keyboard_interrupt_raised_in_a_rank_or_a_server_is_the_transforms_error(
        tmp_path: Path, env: dict, where: str, text: str) -> None:
    if where == "server":
        pytest.importorskip("pyarrow.flight")
    line = _run(tmp_path, env, TINY + text, "kbint")
    assert "raised KeyboardInterrupt" in line and "usercode.py:" in line, line
    assert ("trainer rank " in line) if where == "rank" else ("Flight server " in line), line


@pytest.mark.parametrize("base, text, cut", [
    (TINY, '[preprocess]\ntransforms = ["usercode:here"]\n', "cut at 1,000 of 5,000,000"),
    (WORKERS, '[preprocess]\ntransforms = ["usercode:in_worker"]\n', "cut at 1,000 of 5,000,000"),
    (TINY, '[preprocess]\ntransforms = ["usercode:in_rank"]\n[trainers]\nranks = 2\n',
     "cut at 1,000 of 5,000,000"),
    (TINY, '[preprocess]\ntransforms = ["usercode:in_server"]\n'
           '[executor]\nkind = "flight"\nflight_local_servers = 1\n', "cut at 600 of "),
])
def test_a_5_mb_exception_message_is_cut_and_says_so(tmp_path: Path, env: dict, base: str,
                                                     text: str, cut: str) -> None:
    if "flight" in text:
        pytest.importorskip("pyarrow.flight")
    line = _run(tmp_path, env, base + text, "big")
    assert "ValueError: xxx" in line and cut in line, line[-300:]
    assert len(line) < 2500, len(line)
