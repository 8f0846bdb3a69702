"""Issue 59: ``tune -- CMD`` with an ``--out`` that fills up mid-search (a real tmpfs): the
trial whose figures could not be written is failed and said, with why, never compared; the
search goes on; the job as written is measured as before. (Before: the trial was recorded as
"the job ran no batch of its loader under it" or "the job exited with code 0".)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]

# The job fills the disk on its third run (the first trial: after the job as written and its
# ceiling), and frees it again on any later run: invocations are counted outside the tmpfs.
JOB = '''\
import os, sys, time, torch
from torch.utils.data import DataLoader, Dataset
count_file, ballast = sys.argv[1], sys.argv[2]
n = int(open(count_file).read()) + 1 if os.path.exists(count_file) else 1
open(count_file, "w").write(str(n))
if n == 3:
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        pass
    os.close(fd)
elif os.path.exists(ballast):
    os.unlink(ballast)


class D(Dataset):
    def __len__(self):
        return 600

    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.tensor([float(i)])


for ep in range(3):
    for b in DataLoader(D(), batch_size=4):
        pass
'''


@pytest.fixture()
def tmpfs(tmp_path: Path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cp = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({cp.stderr.strip()}): needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_trial_whose_figures_were_lost_is_failed_and_said(tmp_path: Path, tmpfs: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    env.pop("STALLBENCH_PROFILE", None)
    cp = subprocess.run([PY, "-m", "stallbench", "tune", "--budget-minutes", "3", "--keys",
                         "dataloader.num_workers", "--out", str(tmpfs / "o"), "--", PY,
                         str(job), str(tmp_path / "count"), str(tmpfs / "ballast")],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    said = cp.stdout + cp.stderr
    assert int((tmp_path / "count").read_text()) >= 3, said     # the disk filled in a trial
    line = next((x for x in cp.stderr.splitlines() if x.startswith("stallbench: trial ")
                 and "could not write their figures" in x), None)
    assert line is not None, said
    assert "(disk full, or not writable): what was written is not the whole run" in line
    trial = next(x for x in cp.stdout.splitlines() if x.startswith("  2. "))
    assert "could not write their figures" in trial and "exited with code 0" not in trial
    assert "ran no batch" not in said
    assert "Traceback" not in said.replace("OSError: [Errno 28]", "")
    if cp.returncode == 0:          # published: the failed trial is no variant of it
        from stallbench import results
        (f,) = sorted((tmpfs / "o").glob("*.json"))
        r = results.load(f)
        assert r.tune.trials[1].outcome == "failed"
        assert "could not write their figures" in r.tune.trials[1].why
        assert all(v.name != r.tune.trials[1].name for v in r.variants)
    else:                           # the result itself could not be written: exit 2, none
        assert cp.returncode == 2 and not list((tmpfs / "o").glob("*.json")), said
