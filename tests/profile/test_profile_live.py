"""``stallbench profile --live`` on real jobs (issue 60): a real Prometheus client (the
client library's own parser, over HTTP GETs) scrapes the endpoint while the job runs, and
what it read agrees with the final result; memory (the agent's kept records, the result's
windows) stays flat over a job 20x longer; a torchrun job shows one series per rank; a token
is required where one is set, and beyond loopback none listens without one; nothing is left
listening once the profile ends. No timing is asserted (the overhead goal is the
benchmark's: benchmarks/profile_overhead.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import profile_helpers as helpers

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = pytest.mark.waits
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
TOKEN = "t" * 8 + "0123456789abcdef"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, token: str | None = None) -> dict[tuple[str, tuple], float]:
    """The endpoint's samples as a real client parses them: (name, sorted labels) -> value."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _one(samples: dict, name: str, **labels: str) -> float:
    got = [v for (n, ls), v in samples.items() if n == name
           and all(dict(ls).get(k) == want for k, want in labels.items())]
    assert len(got) == 1, (name, labels, sorted(k for k in samples if k[0] == name))
    return got[0]


def _start(args: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stallbench", "profile", *args],
                            cwd=cwd, env=helpers.env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _scrape_until(proc: subprocess.Popen, port: int, done, limit_s: float = 240,
                  token: str | None = None) -> list[dict]:
    """Scrapes every 0.2 s until ``done(scrapes)`` (the job still running: a profile that
    ended first fails the test with its output)."""
    seen: list[dict] = []
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the profile ended (rc {proc.returncode}) first:\n{out}\n{err}")
        try:
            seen.append(scrape(port, token))
        except (urllib.error.URLError, ConnectionError):
            pass                    # not listening yet
        if seen and done(seen):
            return seen
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no scrape satisfied the test in {limit_s} s; last: {seen[-1:] or None}")


def _gone(port: int) -> bool:
    try:
        scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return True
    return False


def test_scraped_while_it_runs_agrees_with_the_result(tmp_path: Path) -> None:
    """A job of 40 short epochs: scraped while it runs (steps seen growing), and once its
    batches are done (it waits for the test before it exits) the scraped exposed wait, steps
    and samples agree with the result's headline loader within 1%; the result holds the stall
    over time; the endpoint is gone after the profile."""
    epochs, batches = 40, 10
    port, out, go = _free_port(), tmp_path / "out", tmp_path / "go"
    proc = _start(["--live", f"127.0.0.1:{port}", "--out", str(out), "--",
                   sys.executable, helpers.script("user_live.py"), str(epochs), str(batches),
                   "1", "2", str(go)], tmp_path)
    total = epochs * batches

    def finished(seen: list[dict]) -> bool:
        s = seen[-1]
        return (go.with_suffix(".done").exists() and
                _one(s, "stallbench_steps_total", rank="0", loader="Items#0") == total)
    seen = _scrape_until(proc, port, finished)
    last = seen[-1]
    steps = [_one(s, "stallbench_steps_total", loader="Items#0") for s in seen
             if any(n == "stallbench_steps_total" for n, _ in s)]
    assert len({x for x in steps if 0 < x < total}) >= 2, steps    # read while it ran
    assert _one(last, "stallbench_job_running") == 1.0
    go.touch()
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr
    assert f"live: serving metrics on http://127.0.0.1:{port}/metrics" in stderr
    assert _gone(port)
    r = helpers.load(out)
    lo = next(x for x in r.variants[0].profile.loaders if x.headline)
    wait = _one(last, "stallbench_exposed_wait_seconds_total", rank="0", loader="Items#0")
    assert wait == pytest.approx(lo.wait_s, rel=0.01), (wait, lo.wait_s)
    assert _one(last, "stallbench_samples_total", loader="Items#0") == lo.samples == total * 4
    assert lo.batches == total and lo.epochs == epochs
    assert _one(last, "stallbench_passes_total", loader="Items#0") == epochs
    ot = r.variants[0].profile.over_time
    assert ot is not None and [(s.loader, s.rank) for s in ot.series] == [("Items#0", 0)]
    s = ot.series[0]
    assert sum(s.batches) == total and sum(s.wait_s) == pytest.approx(lo.wait_s, rel=1e-6)


def _run_live(tmp_path: Path, name: str, epochs: int, batches: int):
    """One ``--live`` run of the job through the launcher (``run_once``, as the profile
    runs it) with a small per-batch cap and few windows: the run's parts and its streams."""
    from stallbench.profile import merge
    from stallbench.profile.agent import wire
    from stallbench.profile.launcher import run_once

    settings = wire.LiveSettings(window_s=0.05, max_windows=16, keep_batches=200)
    run = run_once([sys.executable, helpers.script("user_live.py"), str(epochs), str(batches),
                    "0", "0"], tmp_path / name, {}, None, live=settings)
    assert run.exit_code == 0
    return run, merge.streams(run.parts), settings


def test_memory_stays_flat_over_a_job_20x_longer(tmp_path: Path) -> None:
    """400 and 8,000 batches: the per-batch records the agent kept, the epochs it wrote, its
    windows and the result's series are the same size at both lengths (the cap's), while
    every total covers every batch."""
    from stallbench.profile import overtime

    kept = {}
    for name, epochs in (("short", 4), ("long", 80)):
        run, streams, settings = _run_live(tmp_path, name, epochs, 100)
        (s,) = streams
        assert s.total_batches == epochs * 100 and sum(s.rows) + s.rest.rows == epochs * 400
        per_batch = sum(len(e.wait) for p in run.parts.epochs for eps in p.streams.values()
                        for e in eps)
        epochs_kept = sum(len(eps) for p in run.parts.epochs for eps in p.streams.values())
        windows = [len(w) for p in run.parts.windows for w in p.streams.values()]
        ot = overtime.over_time(streams, settings.max_windows)
        kept[name] = (per_batch, epochs_kept, max(windows) <= settings.max_windows,
                      len(ot.series[0].batches) <= settings.max_windows)
        assert sum(ot.series[0].batches) == epochs * 100
        size = sum(f.stat().st_size for f in run.run_dir.iterdir())
        kept[name] += (size,)
    assert kept["short"][:4] == kept["long"][:4] == (200, 2, True, True), kept
    assert kept["long"][4] < 2 * kept["short"][4], kept          # the run directory's bytes


def test_torchrun_shows_one_series_per_rank(tmp_path: Path) -> None:
    """``--live`` on ``torchrun --nproc-per-node 2``: both ranks' series on the one endpoint,
    rank 1 (its items cost 2 ms) waiting more; the result's stall over time per rank."""
    port, out = _free_port(), tmp_path / "out"
    proc = _start(["--live", str(port), "--out", str(out), "--", TORCHRUN,
                   "--nproc-per-node", "2", "--master-port", str(_free_port()),
                   helpers.script("ddp_train.py"), "2", "5", "1", "1024"], tmp_path)

    def both(seen: list[dict]) -> bool:
        ranks = {dict(ls).get("rank") for (n, ls), v in seen[-1].items()
                 if n == "stallbench_steps_total" and v > 8}
        return ranks == {"0", "1"}
    seen = _scrape_until(proc, port, both)
    series = sorted(dict(ls)["rank"] for (n, ls) in seen[-1] if n == "stallbench_steps_total")
    assert series == ["0", "1"]
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr
    assert _gone(port)
    ot = helpers.load(out).variants[0].profile.over_time
    assert sorted(s.rank for s in ot.series) == [0, 1]
    slow, fast = (next(s for s in ot.series if s.rank == k) for k in (1, 0))
    assert sum(slow.wait_s) > sum(fast.wait_s)


def test_a_token_is_required_where_one_is_set(tmp_path: Path) -> None:
    """With ``--live-token-env`` (here on loopback, where it is optional): a request without
    the token, or with another, is refused (401); the scraper's ``Authorization: Bearer``
    is served. Beyond loopback without a token nothing starts (exit 2, tests/golden)."""
    port, go = _free_port(), tmp_path / "go"
    proc = _start(["--live", f"127.0.0.1:{port}", "--live-token-env", "LIVE_TOKEN",
                   "--out", str(tmp_path / "out"), "--", sys.executable,
                   helpers.script("user_live.py"), "2", "5", "0", "0", str(go)], tmp_path,
                  LIVE_TOKEN=TOKEN)
    try:
        _scrape_until(proc, port, lambda s: go.with_suffix(".done").exists() and any(
            n == "stallbench_steps_total" and v == 10 for (n, _), v in s[-1].items()),
            token=TOKEN)
        for bad in (None, TOKEN + "x"):
            with pytest.raises(urllib.error.HTTPError) as e:
                scrape(port, bad)
            assert e.value.code == 401
    finally:
        go.touch()
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert TOKEN not in stdout + stderr
    assert _gone(port)
    cp = helpers.profile(["--live", "0.0.0.0:0", "--", sys.executable, "-c", "pass"],
                         tmp_path)
    assert cp.returncode == 2 and "needs a token" in cp.stderr


def test_a_port_in_use_runs_nothing(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        marker = tmp_path / "ran"
        cp = helpers.profile(["--live", str(port), "--", sys.executable, "-c",
                              f"open({str(marker)!r}, 'w')"], tmp_path)
    assert cp.returncode == 2 and f"--live 127.0.0.1:{port}: cannot listen" in cp.stderr
    assert not marker.exists()
    assert not os.path.exists(tmp_path / "results")
