"""Issue 38, classes 2 and 3: the hooks are a guest in the user's job. They never change what
the job does (loaders and batches whose classes answer every attribute, a loader the job
pickles or copies, a re-iterable looped every epoch, a ``next(it)`` loop past
``--max-batches``, a ``--set`` value the job cannot run with, the user's own
``sitecustomize``), and they never publish lost figures as whole (two threads over one
loader, an ``os.execv`` into a second training, a helper process with its own loader, part
files that cannot be written).

One profiled job (``scripts/user_hostile.py all``) holds every case that must end rc 0, so the
whole class costs one job of two variants; the lost-parts case, which must end 2, is a second.
The truth: the job prints each case's batches per epoch; the lines below are what the same
script prints run without stallbench (its datasets' sizes / batch sizes)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import profile_helpers as helpers

from stallbench.profile.launcher import BOOTSTRAP

PY = sys.executable

UNPROFILED = ["count exec-first [4]", "count spawn [2]", "count forwarding [5, 5]",
              "count lookup [12, 12]", "count pickled-before [2]", "unpickled 0 2 False",
              "count unpickled-here [2]", "count copy-original [3]", "count copy-deep [3]",
              "count watch-reiterable [5, 5, 5]", "count next-loop [12]",
              "count threads [12, 12]", "count odd [2]", "count fsize-transient [4, 4]",
              "helper-python user-site True", "job-python user-site True",
              "count helper [3]", "count helper-val [5]", "count exec-second [4]"]


def _loaders(result) -> dict[str, list]:
    out: dict[str, list] = {}
    for lo in result.variants[0].profile.loaders:
        out.setdefault(lo.name.split("#")[0], []).append(lo)
    return out


def test_the_hooks_never_change_the_job_nor_publish_lost_figures(tmp_path: Path) -> None:
    site = tmp_path / "site"            # the user's own sitecustomize, on their PYTHONPATH
    site.mkdir()
    (site / "sitecustomize.py").write_text("USER_SITE = True\n")
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--max-batches", "6",
                          "--set", "dataloader.num_workers=0,2", "--",
                          PY, helpers.script("user_hostile.py"), "all"],
                         cwd=tmp_path, timeout=600, PYTHONPATH=str(site))
    assert cp.returncode == 0, cp.stderr[-4000:]
    # the one traceback is the job's own, of the variant it cannot run (spawn pickling)
    assert cp.stderr.count("Traceback") == 1 and "Can't pickle local object" in cp.stderr, \
        cp.stderr[-4000:]
    # class 2: every case ran as it runs without stallbench, the user's sitecustomize in the
    # job, in a Python a helper ran, and in the exec'd image; the pickled loader unpickles in
    # a Python that never saw stallbench, and holds nothing of it
    lines = cp.stdout.splitlines()
    for line in UNPROFILED:
        assert line in lines, (line, cp.stdout)
    # a --set value the job cannot run with: that variant failed, the other is kept
    assert "variant num_workers=2: the job exited with code 1" in cp.stderr, cp.stderr[-3000:]
    r = helpers.load(out)
    assert [v.name for v in r.variants] == ["num_workers=0"]
    assert "exited with code 1 under variant num_workers=2" in " ".join(
        r.variants[0].notes.values()), r.variants[0].notes
    lo = _loaders(r)
    one = {k: v[0] for k, v in lo.items() if len(v) == 1}
    assert (one["FwdDS"].epochs, one["FwdDS"].batches) == (2, 10)     # forwarding __getattr__
    assert (one["LookupDS"].batches, one["LookupDS"].samples) == (6, 24)   # lookup __getattr__
    assert [x.batches for x in lo["PickDS"]] == [2, 2]      # before pickling, and the unpickled
    assert [x.batches for x in lo["CopyDS"]] == [3, 3]      # the loader and its deepcopy
    assert (one["Chunks"].epochs, one["Chunks"].batches) == (3, 15)   # re-iterable watched
    assert one["NextDS"].batches == 6                       # next(it) loop: the cap's batches
    assert (one["FsizeDS"].epochs, one["FsizeDS"].batches) == (2, 8)   # written again later
    # class 3: an exec'd second training adds to the first image's figures
    assert (one["ExecDS"].epochs, one["ExecDS"].batches) == (2, 8)
    # a spawned helper with its own loader of a Dataset class: a helper, not a second rank
    assert one["HelperDS"].name == "HelperDS#0 (helper process 1)"
    assert r.profile.world_size == 1 and r.variants[0].ranks is None
    # ... ended without atexit right after its validation epoch: that epoch was written
    # when it ended (within a second of the first loader's)
    assert one["ValDS"].name == "ValDS#1 (helper process 1)" and one["ValDS"].batches == 5
    # two threads over one loader; a loader whose settings the hooks cannot read: one line
    # each, no exception class named, not published, the job ran on
    off = [x for x in cp.stderr.splitlines() if ": not measured (" in x]
    assert len(off) == 2, off
    assert off[0].startswith("stallbench: ThreadDS#") and "two threads" in off[0]
    assert off[1] == ("stallbench: DataLoader of OddDS: not measured (its settings could not "
                      "be read)")
    assert "ThreadDS" not in lo and "OddDS" not in lo
    assert "Error" not in " ".join(off)


@pytest.mark.parametrize("mode,stdout,last", [
    ("fsize", "count fsize [8, 8, 8]", "stallbench: error: profile: variant default, repeat 1: "
     "1 process(es) could not write their figures"),
    ("alone", "count alone [12, 12]", "stallbench: error: no loader of the job was measured "
     "(variant default): ThreadDS#0 not measured"),
])
def test_lost_or_unmeasured_figures_end_2(tmp_path: Path, mode: str, stdout: str,
                                          last: str) -> None:
    """Part files that could not be written (a full disk from epoch 2 on: RLIMIT_FSIZE), or
    no loader left measured: the job ran as it would (its own output), the profile ends 2."""
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--", PY, helpers.script("user_hostile.py"), mode],
                         cwd=tmp_path, timeout=300)
    assert stdout in cp.stdout, cp.stdout
    assert cp.returncode == 2, cp.stderr[-3000:]
    final = cp.stderr.strip().splitlines()[-1]
    assert final.startswith(last) and final.endswith("no result written"), final
    assert helpers.result_files(out) == []


def test_the_bootstrap_parses_on_every_python() -> None:
    """Every Python a helper runs reads the bootstrap (3.6, 2.7 too): no syntax of 3.6+ in it
    (f-strings, annotations), so an old Python neither fails nor prints a line."""
    tree = ast.parse((BOOTSTRAP / "sitecustomize.py").read_text())
    for node in ast.walk(tree):
        assert not isinstance(node, (ast.JoinedStr, ast.AnnAssign)), ast.dump(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            assert node.returns is None and all(
                x.annotation is None for x in a.args + a.kwonlyargs), node.name


@pytest.mark.parametrize("python,hooked", [("python2.7", False), ("python3.6", False),
                                           ("python3.7", True), ("python3.8", True)])
def test_other_pythons_a_helper_runs(tmp_path: Path, python: str, hooked: bool) -> None:
    """Another Python a helper of the job runs sees the same PYTHONPATH: the user's own
    sitecustomize runs in it, it prints nothing, and it is hooked where the hooks can run."""
    import json
    import shutil
    import subprocess

    found = sorted(Path.home().glob(f".pyenv/versions/*/bin/{python}"))   # pyenv's own
    exe = str(found[0]) if found else shutil.which(python)
    if exe is None:
        pytest.skip(f"no {python} on this machine")
    (tmp_path / "sitecustomize.py").write_text("USER_SITE = True\n")
    env = helpers.env(PYTHONPATH=f"{BOOTSTRAP}:{tmp_path}", STALLBENCH_PROFILE=json.dumps(
        {"run_dir": str(tmp_path)}))
    code = ("import sys; m = sys.modules.get('sitecustomize'); "
            "sys.stdout.write('%s %s' % (getattr(m, 'USER_SITE', False), "
            "'_stallbench_profile_agent.install' in sys.modules))")
    cp = subprocess.run([exe, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    if cp.returncode != 0 and "pyenv: " in cp.stderr:
        pytest.skip(f"{python} is a pyenv shim without that version")
    assert (cp.returncode, cp.stderr, cp.stdout) == (0, "", f"True {hooked}")
