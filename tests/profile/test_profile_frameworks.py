"""The framework doors (issue 40), each as a user runs it (tests/profile/scripts/, importing
nothing of stallbench): a PyTorch Lightning ``Trainer.fit`` (its ``_DataFetcher`` asks for
exactly ``len(loader)`` batches and prefetches one ahead on the loop's thread) against
Lightning's own ``train_dataloader_next`` total from ``profiler="simple"`` in the same run, its
loaders named by the data module's hooks (``train_dataloader``, ``val_dataloader``); a
Hugging Face Accelerate loop over ``accelerator.prepare``'s ``DataLoaderShard`` against the
loop's own clocks; a Hugging Face ``Trainer`` (which owns its loop: the truth is what its
dataset paid on the loop's thread, 0 workers), its loader named ``train_dataloader`` after
the Trainer's ``get_train_dataloader``. Wait within 10% + 20 ms of the framework's or loop's
own figure, batches and samples exact. Lightning, Accelerate and transformers are the
``frameworks`` extra (pinned, part of ``dev``); an environment without them skips these
tests, saying so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import loadcheck
import profile_helpers as helpers

ITEM_MS, STEP_MS = 5.0, 5.0
SKIP = "the frameworks extra: pip install -e '.[frameworks]'"


def _profile(tmp_path: Path, script: str) -> tuple[dict, dict, str]:
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    cp = helpers.profile(["--out", str(out), "--", helpers.sys.executable,
                          helpers.script(script), str(ITEM_MS), str(STEP_MS)], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    loaders = {lo.name: lo for lo in helpers.load(out).variants[0].profile.loaders}
    return helpers.truth(cp.stdout), loaders, cp.stderr


def _lightning(tmp_path: Path) -> list[str]:
    truth, loaders, err = _profile(tmp_path, "user_lightning.py")
    assert sorted(loaders) == ["train_dataloader", "val_dataloader"], sorted(loaders)
    lo = loaders["train_dataloader"]
    assert lo.headline and (lo.batches, lo.samples) == (truth["batches"], truth["samples"])
    assert "ended its epoch" not in err, err    # len(loader) batches: every epoch whole
    if abs(lo.wait_s - truth["next_s"]) > 0.10 * truth["next_s"] + 0.02:
        return [f"wait {lo.wait_s:.3f} s vs Lightning's train_dataloader_next "
                f"{truth['next_s']:.3f} s"]
    return []


def _hf_trainer(tmp_path: Path) -> list[str]:
    truth, loaders, _ = _profile(tmp_path, "user_hf_trainer.py")
    # the Trainer makes a DataLoader it never iterates and the prepared copy it does, both
    # in its get_train_dataloader: one row, named as the Trainer names it
    assert sorted(loaders) == ["train_dataloader"], sorted(loaders)
    lo = loaders["train_dataloader"]
    assert (lo.batches, lo.samples) == (truth["batches"], truth["samples"]), (lo, truth)
    # 0 workers: every item is paid in the loop's next(); the wait is that, plus collate
    if abs(lo.wait_s - truth["item_s"]) > 0.10 * truth["item_s"] + 0.02:
        return [f"wait {lo.wait_s:.3f} s vs the items' own {truth['item_s']:.3f} s"]
    return []


def _accelerate(tmp_path: Path) -> list[str]:
    truth, loaders, _ = _profile(tmp_path, "user_accelerate.py")
    (lo,) = [x for x in loaders.values() if x.headline]
    assert (lo.batches, lo.samples) == (truth["batches"], truth["samples"]), (lo, truth)
    problems = []
    for mine, theirs in ((lo.wait_s, truth["next_s"]), (lo.step_s, truth["step_s"])):
        if abs(mine - theirs) > 0.10 * theirs + 0.02:
            problems.append(f"{mine:.3f} s vs the loop's {theirs:.3f} s")
    return problems


@pytest.mark.groundtruth     # figures read off timings: the timing pass (tests/run_suite.sh)
def test_lightning_fit_is_measured_as_lightning_times_it(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning", reason=SKIP)
    loadcheck.attempts("lightning", lambda: _lightning(tmp_path), 3, 1.0)


@pytest.mark.groundtruth
def test_a_hugging_face_trainer_is_measured_and_named(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason=SKIP)
    loadcheck.attempts("hf trainer", lambda: _hf_trainer(tmp_path), 3, 1.0)


@pytest.mark.groundtruth
def test_an_accelerate_loop_is_measured_as_it_waits(tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason=SKIP)
    loadcheck.attempts("accelerate", lambda: _accelerate(tmp_path), 3, 1.0)


def test_a_trainers_eval_loader_is_one_row_and_a_batch_encoding_counts_its_rows(
        tmp_path: Path) -> None:
    """Issue 57: the Trainer makes a new eval DataLoader at every evaluation (one loader
    shown as ``eval_dataloader``, ``#5``, ``#7``), and a collator's ``BatchEncoding`` (a
    ``UserDict``) of 8 rows was counted as 1 sample (samples/s half the Trainer's). Counts,
    not timings: exactly the Trainer's own."""
    pytest.importorskip("transformers", reason=SKIP)
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--", helpers.sys.executable,
                          helpers.script("user_hf_trainer.py"), "1", "1", "eval", "encoding"],
                         cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    truth = helpers.truth(cp.stdout)
    loaders = {lo.name: lo for lo in helpers.load(out).variants[0].profile.loaders}
    assert sorted(loaders) == ["eval_dataloader", "train_dataloader"], sorted(loaders)
    for name, pre in (("train_dataloader", ""), ("eval_dataloader", "eval_")):
        lo = loaders[name]
        assert (lo.batches, lo.samples) == (truth[pre + "batches"], truth[pre + "samples"]), \
            (name, lo.batches, lo.samples, truth)
