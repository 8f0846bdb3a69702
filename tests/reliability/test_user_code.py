"""Class 9 (user code) of issue 13: a user's transform or model failing is one clear block.

The rule (``errors.UserCodeError``, raised by ``stages/transforms.UserTransform`` and
``stages/compute.UserCompute``): whatever goes wrong in the user's own code (the import, the
call, the type it returns, a training step), in whichever process (the trainer, a loader
worker, a Ray worker), the command prints one block naming the scenario file and key, the
transform or model, where it ran and its exception, and exits 2; the traceback only with
``stallbench --debug`` (the line ends by saying so). Loader workers hand the error back as a value, Ray workers raise it
as itself (``raise_original_map_exception``), so it is never a DataLoader or Ray traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability_helpers import TINY, no_files, sb, write

USER = '''
import sys
import torch

CONST = 3

def fail(table, **kw):
    raise RuntimeError("injected failure")

def wrong(table, **kw):
    return 42

def drops(table, **kw):
    return table.drop_columns(["dense_0"])

def fail_in_worker(table, **kw):
    from torch.utils.data import get_worker_info
    if get_worker_info() is not None or "default_worker" in sys.argv[0]:
        raise ValueError("only in a worker")
    return table

def bad_factory(schema, spec):
    raise KeyError("no such layer")

def str_factory(schema, spec):
    return "a model"

class Broken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(1, 1)
    def forward(self, b):
        raise ArithmeticError("forward exploded")

def broken_factory(schema, spec):
    return Broken()
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "usercode.py").write_text(USER)
    (tmp_path / "explodes.py").write_text("raise RuntimeError('module-level failure')\n")
    return tmp_path


def _block(stderr: str, key: str, what: str, problem: str, where: str = "",
           hint: bool = True) -> None:
    lines = stderr.splitlines()
    assert "Traceback" not in stderr, stderr[-3000:]
    assert len(lines) == 1, stderr[-3000:]     # the hint was a second line: now its end
    head = lines[0]
    assert head.startswith(f"stallbench: error: s.toml: {key}: {what}"), head
    assert problem in head, head
    assert where in head, head
    assert head.endswith(" (run `stallbench --debug ...` to see its traceback)") == hint, head


def _run(project: Path, env: dict, extra: str, *flags: str, base: str = TINY):
    write(project, base + extra)
    r = sb([*flags, "run", "s.toml", "--out", "out", "--no-progress"], env, project)
    assert r.returncode == 2, r.stderr[-3000:]
    assert no_files(project / "out")
    return r


@pytest.mark.parametrize("transform, problem, hint", [
    ("usercode:fail", "raised RuntimeError: injected failure", True),
    ("usercode:wrong", "returned int, expected a pyarrow.Table", False),
    ("usercode:drops", "returned a table without column(s) 'dense_0'", False),
    ("usercode:CONST", "is not callable (it is a int)", False),
    ("usercode:missing", "cannot be imported: ImportError: module 'usercode' has no attribute",
     True),
    ("nosuchmodule:fn", "cannot be imported: ModuleNotFoundError: No module named "
                        "'nosuchmodule'", True),
    ("explodes:fn", "cannot be imported: RuntimeError: module-level failure", True),
])
def test_transform_failures_are_one_block(project: Path, env: dict, transform: str, problem: str,
                                          hint: bool) -> None:
    r = _run(project, env, f'[preprocess]\ntransforms = ["log_dense", "{transform}"]\n')
    _block(r.stderr, "preprocess.transforms[1]", f"transform '{transform}'", problem, hint=hint)


def test_debug_shows_the_users_traceback(project: Path, env: dict) -> None:
    r = _run(project, env, '[preprocess]\ntransforms = ["usercode:fail"]\n', "--debug")
    assert r.stderr.startswith("stallbench: error: s.toml: preprocess.transforms[0]: ")
    assert "Traceback (most recent call last)" in r.stderr
    assert 'usercode.py", line' in r.stderr and "injected failure" in r.stderr


def test_transform_failing_in_a_loader_worker(project: Path, env: dict) -> None:
    r = _run(project, env, '[preprocess]\ntransforms = ["usercode:fail_in_worker"]\n',
             base=TINY.replace("batch_size = 512", "batch_size = 512\nnum_workers = 2"))
    assert "DataLoader" not in r.stderr
    _block(r.stderr, "preprocess.transforms[0]", "transform 'usercode:fail_in_worker'",
           "raised ValueError: only in a worker", where="(in loader worker ")


@pytest.mark.ray
def test_transform_failing_in_a_ray_worker(project: Path, env: dict) -> None:
    pytest.importorskip("ray")
    r = _run(project, env, '[preprocess]\ntransforms = ["usercode:fail_in_worker"]\n'
                           '[executor]\nkind = "ray"\ncpus = 1\n')
    _block(r.stderr, "preprocess.transforms[0]", "transform 'usercode:fail_in_worker'",
           "raised ValueError: only in a worker", where="(in a Ray worker, pid ")


@pytest.mark.parametrize("factory, problem, hint", [
    ("usercode:bad_factory", "raised KeyError: 'no such layer'", True),
    ("usercode:str_factory", "returned str, expected a torch.nn.Module", False),
    ("usercode:broken_factory", "failed in a training step: ArithmeticError: forward exploded",
     True),
    ("nosuchmodule:factory", "cannot be imported: ModuleNotFoundError", True),
])
def test_model_failures_are_one_block(project: Path, env: dict, factory: str, problem: str,
                                      hint: bool) -> None:
    text = TINY.replace('kind = "emulated"\nstep_ms = 1', f'kind = "{factory}"')
    write(project, text)
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, project)
    assert r.returncode == 2, r.stderr[-3000:]
    _block(r.stderr, "model.kind", f"model '{factory}'", problem, where="(in the trainer)",
           hint=hint)
