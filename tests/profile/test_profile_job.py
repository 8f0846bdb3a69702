"""``stallbench profile`` around the user's command: the import path it keeps, the job's exit
code, early exits (with the secrets' runs), no loader, bad --set keys, secrets, and Ctrl-C
(130, nothing written, no process of the job left)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import profile_helpers as helpers

PY = sys.executable


def _path_line(stdout: str) -> dict:
    line = [x for x in stdout.splitlines() if x.startswith("path: ")][-1]
    return json.loads(line[len("path: "):])


@pytest.mark.parametrize("user_pythonpath", [None, "", "/nonexistent/user/dir"])
def test_import_path_is_what_python_gives_the_job(tmp_path: Path,
                                                  user_pythonpath: str | None) -> None:
    extra = {} if user_pythonpath is None else {"PYTHONPATH": user_pythonpath}
    base = helpers.env(**extra)
    if user_pythonpath is None:
        base.pop("PYTHONPATH", None)
    plain = subprocess.run([PY, helpers.script("show_path.py")], cwd=tmp_path, env=base,
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    # stallbench itself must be importable in the test's own env; the job gets `base`
    (tmp_path / "run").mkdir()
    launcher_env = dict(base)
    launcher_env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(helpers.ROOT), base.get("PYTHONPATH", "")] if p)
    cp = subprocess.run([PY, "-c", "import sys, os; from stallbench.profile import launcher; "
                         "import subprocess; from pathlib import Path; "
                         "env = launcher.job_env(" + repr(base) + ", Path(sys.argv[1]), {}, None); "
                         "sys.exit(subprocess.run(sys.argv[2:], env=env).returncode)",
                         str(tmp_path / "run"), PY, helpers.script("show_path.py")],
                        cwd=tmp_path, env=launcher_env, capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    a, b = _path_line(plain.stdout), _path_line(cp.stdout)
    assert b["main"] == a["main"]
    assert b["spawned"] == a["spawned"]
    assert b["modules"] == a["modules"] == []   # the hooks imported neither torch nor stallbench
    assert list((tmp_path / "run").glob("part-*.json")), "the job was not hooked"


def test_failing_job_keeps_its_exit_code_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--", PY, helpers.script("user_train.py"),
                          str(tmp_path / "d"), "0", "0", "0", "1", "3", "3"], cwd=tmp_path)
    assert cp.returncode == 3, cp.stderr
    assert "stallbench: the job exited with code 3" in cp.stderr
    assert "no result written" in cp.stderr
    assert helpers.result_files(out) == []
    assert not list(out.glob(".stallbench-profile-*")) if out.exists() else True


def test_no_loader_says_so_and_shows_watch(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--", PY, "-c", "print('hello')"], cwd=tmp_path)
    assert cp.returncode == 2
    assert "hello" in cp.stdout
    assert "no DataLoader or Ray Data iteration was seen" in cp.stderr
    assert "stallbench.watch(" in cp.stderr
    assert helpers.result_files(out) == []


@pytest.mark.parametrize("args, line", [
    (["--set", "dataloader.workers=2"],
     "stallbench: error: --set dataloader.workers: unknown key; valid keys: "
     "dataloader.num_workers, dataloader.pin_memory, dataloader.prefetch_factor, "
     "dataloader.persistent_workers, ray.prefetch_batches, torch.num_threads\n"),
    (["--set", "dataloader.num_workers=two"],
     "stallbench: error: --set dataloader.num_workers: expected an integer 0..1024, got 'two'\n"),
    (["--set", "dataloader.pin_memory=maybe"],
     "stallbench: error: --set dataloader.pin_memory: expected true or false, got 'maybe'\n"),
    ([], "stallbench: error: profile: expected the command after --: stallbench profile "
         "[options] -- python train.py [ARGS...]\n"),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], line: str) -> None:
    cmd = [] if not args else ["--", PY, "-c", "pass"]
    cp = helpers.profile([*args, *cmd], cwd=tmp_path)
    assert cp.returncode == 2
    assert cp.stderr == line
    assert not (tmp_path / "results").exists()


def test_refused_combination_is_skipped_with_one_line(tmp_path: Path) -> None:
    """Also (issue 42): the thread budget the job ran with is read inside it: torch's threads
    in the job's process, as the job itself reads them at its end (OMP_NUM_THREADS=1 asked
    here), and in its loader worker (torch sets 1 there)."""
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--set", "dataloader.num_workers=0,1",
                          "--set", "dataloader.prefetch_factor=2", "--", PY,
                          helpers.script("user_train.py"), str(tmp_path / "d"), "0", "0", "0"],
                         cwd=tmp_path, OMP_NUM_THREADS="1")
    assert cp.returncode == 0, cp.stderr
    assert ("stallbench: variant num_workers=0,prefetch_factor=2: skipped: torch refuses "
            "prefetch_factor with num_workers=0\n") in cp.stderr
    r = helpers.load(out)
    assert [v.name for v in r.variants] == ["num_workers=1,prefetch_factor=2"]
    assert r.variants[0].profile.loaders[0].settings["num_workers"] == 1
    assert r.variants[0].profile.loaders[0].settings["prefetch_factor"] == 2
    t = r.variants[0].threads
    own = helpers.truth(cp.stdout)["torch_threads"]
    assert (t.trainer_torch_threads, t.local_producers, t.producer_threads) == (own, 1, 1), \
        (t, own)


COUNTED_JOB = """\
import sys, time
from torch.utils.data import DataLoader
loader = DataLoader(list(range(40)), batch_size=4)
for epoch in range(2):
    it = iter(loader)
    for _ in range(len(loader) - int(sys.argv[1])):    # as Lightning reads: len(loader) batches,
        next(it)                                        # never the final StopIteration
        time.sleep(0.002)
"""


@pytest.mark.parametrize("short", [0, 3])
def test_a_loop_that_reads_exactly_len_batches_ended_its_epochs(tmp_path: Path,
                                                                short: int) -> None:
    """Issue 40: a loop that takes exactly ``len(loader)`` batches and never asks for the
    final StopIteration (Lightning's ``_DataFetcher``) ended its epoch: no "exited 0 before
    ... ended its epoch"; one that stops 3 batches short of it at exit is still said."""
    script = tmp_path / "counted.py"
    script.write_text(COUNTED_JOB)
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--", PY, str(script), str(short)], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    v = helpers.load(out).variants[0]
    assert v.repeats[0].batches == 2 * (10 - short)
    if short:
        assert "ended its epoch, after 14 batches" in v.profile.ended_early, v.profile
    else:
        assert not v.profile.ended_early and "ended its epoch" not in cp.stdout, cp.stdout


THREADS_JOB = """\
import os, sys, torch
from torch.utils.data import DataLoader
if os.environ.get("OWN_THREADS"):
    torch.set_num_threads(int(os.environ["OWN_THREADS"]))     # the job's own choice
for x in DataLoader(list(range(8)), batch_size=4):
    torch.ones(4) * x
print("threads", torch.get_num_threads())
"""


def test_set_torch_num_threads_sets_the_trainers_threads_before_its_first_op(
        tmp_path: Path) -> None:
    """Issue 41: ``--set torch.num_threads=1,3`` gives the trainer that many intra-op threads
    from its import of torch on; a job that sets its own afterwards keeps its choice (torch's
    functions are never replaced), and the value is then said not applied, never advised."""
    script = tmp_path / "threads_job.py"
    script.write_text(THREADS_JOB)
    for own, ran in (("", [1, 3]), ("2", [2, 2])):
        out = tmp_path / f"out{own}"
        cp = helpers.profile(["--out", str(out), "--set", "torch.num_threads=1,3", "--", PY,
                              str(script)], cwd=tmp_path, OWN_THREADS=own)
        assert cp.returncode == 0, cp.stderr
        assert [x for x in cp.stdout.splitlines() if x.startswith("threads")] == \
            [f"threads {n}" for n in ran]
        r = helpers.load(out)
        assert [v.threads.trainer_torch_threads for v in r.variants] == ran
        assert "reached no loader" not in cp.stdout
        from stallbench.analysis.loader_search import not_applied
        said = [not_applied(v) for v in r.variants]
        if own:             # never advised (loader_search.advisable leaves such variants out)
            assert said == [{"num_threads=1": "the trainer ran with 2 torch threads (the job "
                                              "sets its own after importing torch)"},
                            {"num_threads=3": "the trainer ran with 2 torch threads (the job "
                                              "sets its own after importing torch)"}], said
        else:
            assert said == [{}, {}]


def test_secrets_are_redacted_and_fingerprint_ignores_them(tmp_path: Path) -> None:
    """Both runs also exit 0 after 5 batches, before their epoch ends (CI time: the early
    exit's own test was a third run of the same job): what ran is kept and said."""
    outs = []
    for i, token in enumerate(("s3cr3t-one", "s3cr3t-two")):
        out = tmp_path / f"out-{i}"
        cp = helpers.profile(["--out", str(out), "--", PY, helpers.script("user_train.py"),
                              str(tmp_path / "d"), "0", "0", "0", "1", "5", "0",
                              "--token", token, f"API_KEY={token}"],
                             cwd=tmp_path, MY_SERVICE_PASSWORD=token)
        assert cp.returncode == 0, cp.stderr
        text = helpers.result_files(out)[0].read_text()
        assert token not in text
        r = helpers.load(out)
        v = r.variants[0]
        assert v.repeats[0].batches == 5
        assert ("before ParquetItems#0 (rank 0) ended its epoch, after 5 batches"
                in v.profile.ended_early)
        assert v.profile.ended_early in cp.stdout
        outs.append(r)
    a, b = outs
    assert "--token <value> API_KEY=<value>" in a.scenario.text      # the allow-list
    assert "MY_SERVICE_PASSWORD" not in a.profile.environment
    assert a.scenario.fingerprint == b.scenario.fingerprint
    assert a.variants[0].executor.kind == "profile"


def _job_pids(root: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.parametrize("sig, code", [pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow),
                                       (signal.SIGTERM, 143)])   # CI time: one signal in CI
def test_signal_stops_the_job_and_writes_nothing(tmp_path: Path, sig: int, code: int) -> None:
    out = tmp_path / "out"
    p = subprocess.Popen([PY, "-m", "stallbench", "profile", "--out", str(out), "--", PY,
                          helpers.script("user_train.py"), str(tmp_path / "d"), "2", "20", "5",
                          "50"], cwd=tmp_path, env=helpers.env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    job: list[int] = []
    while time.time() < deadline and len(job) < 3:    # the job and its two loader workers
        job = _job_pids(p.pid)
        time.sleep(0.2)
    assert len(job) >= 3, job
    time.sleep(0.5)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    assert f"interrupted by {signal.Signals(sig).name}; no result written" in err
    assert helpers.result_files(out) == []
    assert not list(out.glob(".stallbench-profile-*"))
    assert not out.exists()          # profile made --out and wrote nothing: removed
    time.sleep(0.5)
    left = [pid for pid in job if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert left == []


def test_out_dir_made_and_left_empty_is_removed_a_users_is_kept(tmp_path: Path) -> None:
    """A job profile cannot measure (no loader seen: an error, exit 2) writes nothing: the
    --out directory it created (with a missing parent) is gone, the user's own stays."""
    made, users = tmp_path / "made" / "out", tmp_path / "mine"
    users.mkdir()
    for out in (made, users):
        cp = helpers.profile(["--out", str(out), "--", PY, "-c", "pass"], cwd=tmp_path)
        assert cp.returncode == 2 and "no result written" in cp.stderr, cp.stderr
    assert not (tmp_path / "made").exists()
    assert users.is_dir() and not list(users.iterdir())


def test_default_name_follows_the_name_rule(tmp_path: Path) -> None:
    """The result name from the script's stem follows --name's rule (a scenario name's)."""
    script = tmp_path / "::error::x.py"
    script.write_text("pass\n")
    cp = helpers.profile(["--out", str(tmp_path / "out"), "--", PY, str(script)], cwd=tmp_path)
    assert cp.returncode == 2, cp.stderr
    assert cp.stderr.startswith("stallbench: error: profile: the result name (the script's "
                                "stem; give one with --name): expected a name that does not "
                                "start with '::'"), cp.stderr
    assert not (tmp_path / "out").exists()


def test_trace_holds_every_batch_and_replaces_only_its_own_kind(tmp_path: Path) -> None:
    out, trace = tmp_path / "out", tmp_path / "t.json"
    cp = helpers.profile(["--out", str(out), "--trace", str(trace), "--", PY,
                          helpers.script("user_train.py"), str(tmp_path / "d"), "0", "0", "1"],
                         cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    d = json.loads(trace.read_text())
    waits = [e for e in d["traceEvents"] if e["name"] == "wait"]
    steps = [e for e in d["traceEvents"] if e["name"] == "step"]
    assert len(waits) == len(steps) == helpers.load(out).variants[0].repeats[0].batches == 32
    assert all(w["ts"] + w["dur"] <= s["ts"] + 1 for w, s in zip(waits, steps))
    other = tmp_path / "notes.json"
    other.write_text("{}")
    cp = helpers.profile(["--out", str(out), "--trace", str(other), "--", PY, "-c", "pass"],
                         cwd=tmp_path)
    assert cp.returncode == 2
    assert cp.stderr.startswith(f"stallbench: error: --trace: {other}: exists and is not a "
                                "stallbench trace")


GOLDEN = helpers.ROOT / "tests" / "golden" / "profile_errors.txt"


def test_bad_input_lines_golden(tmp_path: Path) -> None:
    """Every one-line refusal of `stallbench profile`, as printed (STALLBENCH_UPDATE_GOLDEN=1
    refreshes the file)."""
    cases = [["--set", "dataloader.workers=2"], ["--set", "dataloader.num_workers=two"],
             ["--set", "dataloader.num_workers=0,0"], ["--set", "dataloader.num_workers"],
             ["--set", "ray.prefetch_batches=-1"],
             # capped as a scenario's matrix is (issue 38, class 11)
             ["--set", "dataloader.num_workers=" + ",".join(map(str, range(41))),
              "--set", "dataloader.prefetch_factor=" + ",".join(map(str, range(1, 31)))],
             ["--repeats", "0"],
             ["--analyze", "--no-analyze"], [],
             # the name rule of scenario names (scenario.name_problem): refused at entry
             ["--name", "a\nb"], ["--name", "::error::x"], ["--name", "x\x1b[2J"],
             ["--name", "a/b"], ["--progress-timeout", "0"],
             # torchrun across machines (issue 56)
             ["--node-port", "0"], ["--node-wait", "nan"],
             # --live (issue 60): its address, its token, one run of the job
             ["--live", "0.0.0.0:9400"], ["--live", "abc"], ["--live", "::1:9400"],
             ["--live", "9400", "--repeats", "2"],
             ["--live", "9400", "--set", "dataloader.num_workers=0,2"],
             ["--live", "9400", "--analyze"], ["--live-token-env", "X"],
             ["--live", "9400", "--live-token-env", "STALLBENCH_NO_SUCH_TOKEN"],
             ["--live", "9400", "--live-token-env", "not a name"]]
    got = []
    for args in cases:
        cmd = ["--", PY, "-c", "pass"] if args else []
        cp = helpers.profile([*args, *cmd], cwd=tmp_path)
        shown = " ".join(a.encode("unicode_escape").decode("ascii") for a in args)
        got.append(f"$ stallbench profile {shown}{' -- python -c pass' if args else ''}"
                   f"\nrc={cp.returncode}\n{cp.stderr}")
    text = "\n".join(got)
    if os.environ.get("STALLBENCH_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


@pytest.mark.parametrize("workers", ["0", "2"])
def test_loop_that_breaks_out_of_epochs(tmp_path: Path, workers: str) -> None:
    """Two epochs left with ``break`` and one run to its end, with ``num_workers`` a numpy
    int: the job runs as without the profile, no "exited before it ended its epoch", every
    batch counted, and the trainer's CPU over the epochs no more than the loop's own (an
    abandoned epoch left open counted its CPU to exit: about 2x here)."""
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--", PY, helpers.script("user_break.py"),
                          workers, "20", "3", "3"], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert "flush" not in cp.stderr and "cannot write" not in cp.stderr, cp.stderr
    t = helpers.truth(cp.stdout)
    r = helpers.load(out)
    v = r.variants[0]
    assert not v.profile.ended_early
    assert "ended its epoch" not in cp.stdout
    f = v.repeats[0]
    assert f.batches == t["batches"] == 3 + 3 + 8
    # the loop burnt 14 x 20 ms of CPU; the epochs' CPU covers it and not twice over
    assert 14 * 0.020 * 0.9 <= f.trainer_cpu_s <= t["loop_cpu_s"] * 1.2 + 0.05, (
        f.trainer_cpu_s, t)


def test_a_cold_first_item_is_not_counted_for_every_item(tmp_path: Path) -> None:
    """The thread CPU of a fetch is read on one fetch in ``torch_dataloader.CPU_EVERY`` and scaled to the
    rest: a dataset that pays a one-off cost on its first item (a lazy open, 300 ms of CPU
    here by construction) must not have that cost multiplied into every unread fetch. A
    thread's CPU cannot exceed its wall time; the steady rate is not refused for CPU the
    data work never spent (both held on any machine: the cost is a CPU-clock busy loop)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"x": list(range(160)), "y": [i % 2 for i in range(160)]}), data)
    out = tmp_path / "res"
    p = helpers.profile(["--out", str(out), "--", sys.executable,
                         helpers.script("user_cold.py"), str(data), "0", "300"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "rows 160" in p.stdout
    r = helpers.load(out)
    (loader,) = r.variants[0].profile.loaders
    assert loader.samples == 160 and loader.batches == 40
    item = next(s for s in loader.stages if s.name == "dataset.__getitem__")
    assert item.cpu_s <= item.wall_s * 1.05 + 0.01, item
    why = [rep.phases.no_steady_reason for rep in r.variants[0].repeats
           if rep.phases is not None and rep.phases.no_steady_reason]
    assert not any("refused a steady rate" in w for w in why), why


def test_a_knob_that_reached_no_loader_is_never_recommended(tmp_path: Path) -> None:
    """``--set dataloader.num_workers=0,2`` on a job whose only loader is a watched generator:
    both variants ran the same job (the knob reached nothing), so which one measured faster
    is noise; the profile says the knob reached no loader instead of keeping or setting it.
    ``--analyze``: a watched iterable is not served from memory, and the reason says so (it
    said the 20-batch epoch left fewer than 2 batches after the 5 kept)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"x": list(range(320)), "y": [float(i % 2) for i in range(320)]}),
                   data, row_group_size=64)
    out = tmp_path / "res"
    p = helpers.profile(["--out", str(out), "--analyze", "--set", "dataloader.num_workers=0,2",
                         "--", sys.executable, helpers.script("user_watch_only.py"), str(data)],
                        cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("rows 320") >= 2
    assert "compute_only): the headline loader is a stallbench.watch'ed iterable" in p.stdout
    rec = next(x for x in p.stdout.splitlines() if x.startswith("recommendation:"))
    assert "reached no loader" in rec and "num_workers" in rec, rec
    r = helpers.load(out)
    assert r.analysis.recommendation.measured_speedup is None
    assert r.analysis.recommendation.action == "keep"
    assert r.analysis.best_variant is None and r.analysis.whatif is None
    assert "what-if" not in p.stdout


def test_a_batch_that_is_a_list_of_samples_counts_its_samples(tmp_path: Path) -> None:
    """An identity ``collate_fn`` hands the loop the list of its samples (dicts here, each a
    sequence of 12 ids): the samples are the list's items, not the leading dimension of the
    first sample's first tensor (12 per batch). 100 rows at batch_size 8: 13 batches, the
    last of 4 rows; by construction the count is the rows of the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "seqs.parquet"
    pq.write_table(pa.table({"ids": [[i] * 12 for i in range(100)],
                             "y": [float(i % 2) for i in range(100)]}), data)
    out = tmp_path / "res"
    p = helpers.profile(["--out", str(out), "--", sys.executable,
                         helpers.script("user_identity_collate.py"), str(data), "8"],
                        cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "rows 100" in p.stdout
    (loader,) = helpers.load(out).variants[0].profile.loaders
    assert (loader.batches, loader.samples) == (13, 100)
