"""``stallbench tune -- CMD`` on user-style jobs (issue 41): the setting it chooses against an
exhaustive bare grid measured in the same test, in a handful of trials; the result contract;
a setting the job fails under recorded as a finding; ``--trial-batches``; one-line refusals.

The job is ``examples/tune_loader.py`` (it imports nothing of stallbench and prints its own
meter: samples/s from its second epoch on). Its costs are sleeps (``--burn`` aside), so
the best setting is known by construction whatever the cores: the persistent case's workers
pay 300 ms each at every start (forked again each epoch), its items 16 ms per batch against
a 20 ms step (knee: 1 worker); the knee-1 case's items 8 ms per batch against a 30 ms step;
the ceiling case's fetch well under 5% of its step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import loadcheck
import profile_helpers as helpers
from stallbench import results

EXAMPLE = str(helpers.ROOT / "examples" / "tune_loader.py")
RAY_EXAMPLE = str(helpers.ROOT / "examples" / "tune_ray.py")
PY = sys.executable
PERSISTENT = ["--item-ms", "2", "--step-ms", "20", "--worker-init-ms", "300", "--epochs", "8"]
KNEE_1 = ["--item-ms", "1", "--step-ms", "30", "--worker-init-ms", "0", "--epochs", "8",
          "--items", "80"]
CEILING = ["--item-ms", "0.05", "--step-ms", "60", "--worker-init-ms", "0", "--epochs", "6"]
MAX_TRIALS = 6          # the bound: trials beside the job as written and the ceiling


def tune(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "stallbench", "tune", *args], cwd=cwd, env=helpers.env(),
                          capture_output=True, text=True, timeout=timeout)


def bare_rate(job: list[str], cwd: Path) -> float:
    """The job's own steady rate, run bare (no stallbench)."""
    cp = subprocess.run([PY, EXAMPLE, *job], cwd=cwd, env=helpers.env(), capture_output=True,
                        text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    line = [x for x in cp.stdout.splitlines() if x.startswith("rate: ")][-1]
    return float(json.loads(line[len("rate: "):])["steady_samples_s"])


def flags(settings: dict) -> list[str]:
    """A trial's settings as the example's own flags (what the user would change)."""
    out = []
    assert set(settings) <= {"num_workers", "persistent_workers"}, settings
    if settings.get("num_workers"):
        out += ["--num-workers", str(settings["num_workers"])]
    if settings.get("persistent_workers"):
        out.append("--persistent-workers")
    return out


def _grid_case(tmp_path: Path, job: list[str], grid: list[list[str]]) -> list[str]:
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    cp = tune(["--out", str(out), "--keys", "dataloader.num_workers,dataloader.persistent_workers",
               "--", PY, EXAMPLE, *job], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    r = helpers.load(out)
    t = r.tune
    assert t.trials[0].name == "default" and t.trials[0].settings == {}
    assert len(t.trials) - 1 <= MAX_TRIALS, [x.name for x in t.trials]
    assert all(x.why for x in t.trials[1:]) and t.best is not None
    chosen = flags(t.best.settings)
    rates = {tuple(g): bare_rate(job + g, tmp_path) for g in grid}
    if tuple(chosen) not in rates:
        rates[tuple(chosen)] = bare_rate(job + chosen, tmp_path)
    top = max(rates.values())
    problems = []
    if rates[tuple(chosen)] < 0.9 * top:
        problems.append(f"chose {t.best.settings} at {rates[tuple(chosen)]:.0f} samples/s bare, "
                        f"under 90% of the grid's best {top:.0f}: {rates}; trials: "
                        + "; ".join(f"{x.name} {x.steady_samples_s:.0f}" for x in t.trials))
    assert "answer: " in cp.stdout and "of the compute-only ceiling" in cp.stdout, cp.stdout
    return problems


@pytest.mark.groundtruth
@pytest.mark.waits
def test_tune_finds_persistent_workers_where_only_they_pay(tmp_path: Path) -> None:
    """Workers forked every epoch cost more than they save (300 ms start-up per epoch of
    ~0.3 s): the grid's best keeps them; tune lands within 10% of it."""
    grid = [[], ["--num-workers", "1"], ["--num-workers", "1", "--persistent-workers"],
            ["--num-workers", "2", "--persistent-workers"]]
    loadcheck.attempts("persistent", lambda: _grid_case(tmp_path, PERSISTENT, grid), 2,
                       need=1.0)


@pytest.mark.groundtruth
@pytest.mark.waits
def test_tune_stops_at_one_worker_where_that_is_the_knee(tmp_path: Path) -> None:
    grid = [[], ["--num-workers", "1", "--persistent-workers"],
            ["--num-workers", "2", "--persistent-workers"]]
    loadcheck.attempts("knee-1", lambda: _grid_case(tmp_path, KNEE_1, grid), 2, need=1.0)


def _ceiling_case(tmp_path: Path) -> list[str]:
    out = tmp_path / "out"
    cp = tune(["--out", str(out), "--", PY, EXAMPLE, *CEILING], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    files = helpers.result_files(out)
    t = results.load(files[-1]).tune
    problems = []
    if t.best.stop_reason != "at_ceiling" or len(t.trials) != 1 or t.runs != 2:
        problems.append(f"stop {t.best.stop_reason} after {len(t.trials)} trial(s), "
                        f"{t.runs} runs: {t.best.stop_text}")
    else:
        assert "answer: keep the job as written" in cp.stdout, cp.stdout
        assert t.best.ceiling_share >= 0.95
    for f in files:
        f.unlink()
    return problems


@pytest.mark.groundtruth
@pytest.mark.waits
def test_tune_says_a_job_at_its_ceiling_is_there_after_the_baseline_and_the_ceiling(
        tmp_path: Path) -> None:
    loadcheck.attempts("ceiling", lambda: _ceiling_case(tmp_path), 2, need=1.0)


FAILS = """\
import sys, time, torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

class Items(Dataset):
    def __len__(self):
        return 48
    def __getitem__(self, i):
        if get_worker_info() is not None:
            raise RuntimeError("this dataset cannot run in a worker")
        time.sleep(0.004)
        return torch.zeros(4)

for epoch in range(4):
    for x in DataLoader(Items(), batch_size=4):
        time.sleep(0.004)
"""


def test_a_setting_the_job_fails_under_is_a_finding(tmp_path: Path) -> None:
    """The job fails with workers (its dataset refuses them): that trial is recorded as
    failed with its exit code, never tried twice, and the tune ends with the job as written
    as its answer, exit 0."""
    script = tmp_path / "fails_in_workers.py"
    script.write_text(FAILS)
    out = tmp_path / "out"
    cp = tune(["--out", str(out), "--keys", "dataloader.num_workers", "--", PY, str(script)],
              cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    t = helpers.load(out).tune
    failed = [x for x in t.trials if x.outcome == "failed"]
    assert failed and all(x.exit_code != 0 for x in failed), t.trials
    names = [x.name for x in t.trials]
    assert len(names) == len(set(names)), names
    assert t.best.settings == {} and "answer: keep the job as written" in cp.stdout
    assert "recorded, the search goes on" in cp.stderr
    assert [v.name for v in helpers.load(out).variants] == ["default"]


def test_trial_batches_end_a_long_epoch_and_say_so(tmp_path: Path) -> None:
    """One long epoch: the trial ends at --trial-batches, its rate is its steady window's
    (said), the job's processes are gone when the command returns, and --trace holds every
    run's batches (the job as written and its ceiling). The ceiling is measured though no
    epoch of either run ended (the epoch the tune stopped in is read as the merge reads it):
    by construction between the job as written's rate and 8 rows per 5 ms step (a sleep
    never ends early)."""
    out = tmp_path / "out"
    trace = tmp_path / "tune.trace.json"
    cp = tune(["--out", str(out), "--trial-batches", "40", "--keys", "torch.num_threads",
               "--trace", str(trace), "--", PY, EXAMPLE, "--epochs", "1", "--items", "4000", "--item-ms", "0.1",
               "--step-ms", "5", "--worker-init-ms", "0"], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    t = helpers.load(out).tune
    base = t.trials[0]
    assert base.ended_by_tune == "--trial-batches 40 reached", base
    assert "steady window" in base.rate_basis and 40 <= base.batches < 500, base   # flushed first
    assert base.steady_samples_s > 0 and t.best.stop_reason == "no_gain_predicted"
    assert t.ceiling_samples_s is not None, t.ceiling_note
    assert 0.95 * base.steady_samples_s <= t.ceiling_samples_s <= 8 / 0.005, (
        base.steady_samples_s, t.ceiling_note)
    assert "rate: " not in cp.stdout          # the job never reached its own end
    assert not list(out.glob(".stallbench-profile-*"))
    events = json.loads(trace.read_text())["traceEvents"]       # every run's batches
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert any(n.startswith("run 1 ") for n in names) and any(n.startswith("run 2 ")
                                                               for n in names), names
    assert sum(e["name"] == "wait" for e in events) >= 2 * 40


GOLDEN = helpers.ROOT / "tests" / "golden" / "tune_errors.txt"


def test_bad_input_lines_golden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every one-line refusal of `stallbench tune -- CMD`, as printed, exit 2
    (STALLBENCH_UPDATE_GOLDEN=1 refreshes the file)."""
    monkeypatch.delenv("STALLBENCH_NODE_TOKEN", raising=False)     # the across-nodes line
    cases = [["--keys", "dataloader.workers", "--", "python", "-c", "pass"],
             ["--keys", ",", "--", "python", "-c", "pass"],
             ["--trial-batches", "1", "--", "python", "-c", "pass"],
             ["--repeats", "0", "--", "python", "-c", "pass"],
             ["--budget-minutes", "0", "--", "python", "-c", "pass"],
             ["--cpu-node-cost", "1", "--", "python", "-c", "pass"],
             ["--name", "a/b", "--", "python", "-c", "pass"],
             ["x.toml", "--", "python", "-c", "pass"],
             ["--"], [],
             ["--trial-batches", "5", "x.toml"],
             # across nodes: refused before anything runs where node rank 0 could not hand
             # its trials on (no token beyond loopback), or the nodes are not known
             ["--", "torchrun", "--nnodes", "2", "--node-rank", "1", "--master-addr",
              "10.0.0.1", "train.py"],
             ["--node-port", "0", "--", "torchrun", "--nnodes", "2", "--node-rank", "0",
              "train.py"],
             ["--", "python", "-m", "torch.distributed.run", "--nnodes=1:4", "train.py"],
             ["--", "torchrun", "--nnodes", "2", "train.py"]]
    got = []
    for args in cases:
        cp = tune(args, cwd=tmp_path)
        got.append(f"$ stallbench tune {' '.join(args)}\nrc={cp.returncode}\n{cp.stderr}")
        assert cp.returncode == 2, (args, cp.stderr)
    text = "\n".join(got)
    if os.environ.get("STALLBENCH_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


@pytest.mark.slow       # ~7 runs of a job that starts its own Ray (~20 s each here)
@pytest.mark.ray
def test_a_ray_data_loop_is_tuned_by_its_prefetch_and_judged_on_its_epochs(
        tmp_path: Path) -> None:
    """A Ray Data loop makes one iterator per epoch: the tune's rate joins them as the loop's
    epochs (the job's own meter agrees within 10%), tries ``prefetch_batches`` only, and
    answers with a setting of the iterator or the job as written."""
    out = tmp_path / "out"
    cp = tune(["--out", str(out), "--", PY, RAY_EXAMPLE, "--epochs", "5"],
              cwd=tmp_path, timeout=900)
    assert cp.returncode == 0, cp.stderr
    t = helpers.load(out).tune
    assert t.loader_kind.startswith("ray.")
    assert all(set(x.settings) <= {"prefetch_batches"} for x in t.trials), t.trials
    bare = subprocess.run([PY, RAY_EXAMPLE, "--epochs", "5"],
                          cwd=tmp_path, env=helpers.env(), capture_output=True, text=True,
                          timeout=300)
    own = [json.loads(x[len("rate: "):])["steady_samples_s"] for x in bare.stdout.splitlines()
           if x.startswith("rate: ")]
    first = t.trials[0]
    assert "epochs 2-" in first.rate_basis, first.rate_basis
    assert abs(first.steady_samples_s / own[0] - 1) < 0.15, (first.steady_samples_s, own)
    assert t.best.settings == {} or "iter_torch_batches(..., prefetch_batches=" in t.best.apply
