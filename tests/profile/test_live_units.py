"""``--live``'s rules without a job (issue 60): the agent's windows keep every second and every
batch whatever their width and however often they coarsen, and never more than their cap;
a stream's per-batch records stop at the cap while its totals stay whole; the wire's live
records read back as written; the launcher's board, address and token rules."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

import profile_helpers as helpers
from stallbench.errors import UserError
from stallbench.profile import live as live_mod
from stallbench.profile.agent import wire


@pytest.fixture(scope="module")
def agent():
    return helpers.load_agent("_live_units_agent")


def _tally(agent, width=1.0, most=8, keep=100):
    return agent.windows.Tally(agent.wire.LiveSettings(window_s=width, max_windows=most,
                                                        keep_batches=keep), 0.0)


def _sums(t) -> list[float]:
    rows = [row for _, row in t.closed.items()] + [t.cur]
    return [sum(r[i] for r in rows) for i in range(5)]


def test_windows_keep_every_second_and_batch_and_stay_under_their_cap(agent) -> None:
    rng = random.Random(7)
    t = _tally(agent, width=1.0, most=8)
    now, want = 1000.0, [0, 0, 0.0, 0.0, 0.0]
    for i in range(5000):
        step, wait = rng.uniform(0, 0.02), rng.expovariate(50)
        if i % 700 == 0:
            wait += 3.5                     # a stall spanning windows
        now += step + wait
        first = i % 500 == 0
        t.add(now, wait, 0.0 if first else step, 32, first)
        want = [want[0] + 1, want[1] + 32, want[2] + wait, want[3] + (0.0 if first else step),
                want[4] + (wait if first else 0.0)]
        assert len(t.closed) <= 8
    got = _sums(t)
    assert got[:2] == want[:2]
    for g, w in zip(got[2:], want[2:]):
        assert g == pytest.approx(w, rel=1e-9)
    assert t.width >= 16 and math.log2(t.width).is_integer()     # coarsened, on the grid
    assert all(k * t.width <= now for k in t.closed)


def test_a_long_wait_is_split_over_the_windows_it_lasted(agent) -> None:
    t = _tally(agent, width=1.0, most=64)
    t.add(100.5, 0.1, 0.0, 1, True)
    t.add(110.5, 10.0, 0.0, 1, False)       # waited from 100.5 to 110.5
    waits = {k: round(r[2], 6) for k, r in t.closed.items()}
    assert waits[100] == pytest.approx(0.1 + 0.5)
    assert all(waits[k] == pytest.approx(1.0) for k in range(101, 110))
    assert t.cur[2] == pytest.approx(0.5) and t.cur[0] == 1      # the batch: where it came
    assert sum(r[0] for r in t.closed.values()) == 1


def test_a_stream_keeps_per_batch_records_up_to_its_cap_only(agent) -> None:
    agent.state.SETTINGS = agent.wire.Settings(
        live=agent.wire.LiveSettings(window_s=0.01, max_windows=4, keep_batches=50))
    try:
        st = agent.streams.Stream("torch.DataLoader", "Rows")
        for _ in range(30):                 # 30 passes of 10 batches: 300 batches
            ep = st.new_epoch(agent.state.perf())
            it = iter(range(10))
            while True:
                try:
                    st.next_batch(ep, next, it)
                except StopIteration:
                    break
        kept = sum(len(e.wait) for e in st.epochs)
        assert kept == 50 and len(st.epochs) <= 6     # 5 kept passes and the latest
        r = st.tally.rest
        assert (r[0], r[1]) == (25, 250)              # passes and batches past the cap
        assert len(st.tally.closed) <= 4
        rec = st.tally.record(st, lambda p: p)
        assert (rec.batches, rec.passes) == (300, 30)
        assert rec.wait_s == pytest.approx(sum(sum(e.wait) for e in st.epochs if e.t_req)
                                           + r[3])
    finally:
        agent.state.SETTINGS = agent.wire.Settings()


def test_live_records_read_back_as_written() -> None:
    w = wire.Windows(width_s=2.0, start=(5, 7), batches=(3, 4), rows=(30, 40),
                     wait=(0.5, 0.25), step=(1.0, 1.5), startup=(0.1, 0.0),
                     max_wait=(0.3, 0.1))
    h = wire.Header(host="h", pid=1, image="ab", rank=1, launched=True, world_size=2)
    rec = wire.Live(header=h, streams=(wire.LiveStream(
        key="1-ab:0", name="Rows#0", passes=2, batches=7, rows=70, wait_s=0.75, step_s=2.5,
        first_wait_s=0.1, open=w, rest=wire.Rest(1, 2, 3, 0.5, 0.25)),), exiting=True)
    assert wire.Live.from_json(rec.to_json()) == rec
    part = wire.WindowsPart("h", 1, "ab", {"1-ab:0": w})
    assert wire.WindowsPart.from_json(part.to_json()) == part
    # a torn windows record (columns of different lengths) is none, never misread
    bad = dict(w.to_json(), wait=[1.0])
    assert len(wire.Windows.from_json(bad)) == 0
    s = wire.Settings(run_dir="r", live=wire.LiveSettings(window_s=5.0))
    assert wire.Settings.from_env({wire.ENV: s.to_env()}) == s
    assert wire.Settings.from_env({wire.ENV: wire.Settings(run_dir="r").to_env()}).live is None


def test_windows_of_two_grids_join_on_the_coarser() -> None:
    a = wire.Windows(width_s=1.0, start=(10, 11, 12, 13), batches=(1, 1, 1, 1),
                     rows=(1, 1, 1, 1), wait=(1.0, 1.0, 1.0, 1.0), step=(0, 0, 0, 0),
                     startup=(0, 0, 0, 0), max_wait=(1.0, 2.0, 1.0, 1.0))
    b = wire.Windows(width_s=2.0, start=(6,), batches=(5,), rows=(5,), wait=(5.0,),
                     step=(1.0,), startup=(0.0,), max_wait=(4.0,))
    j = wire.live.join([a, b])
    assert j.width_s == 2.0 and j.start == (5, 6)
    assert j.batches == (2, 7) and j.wait == (2.0, 7.0) and j.max_wait == (2.0, 4.0)
    assert len(wire.live.coarsen(j, 1)) == 1


def _live(rank: int, wait: float, startup: float = 0.0, step: float = 10.0) -> wire.Live:
    h = wire.Header(host="h", pid=10 + rank, image="x", rank=rank, launched=True,
                    world_size=2)
    return wire.Live(header=h, streams=(wire.LiveStream(
        key="k", name="Rows#0", passes=1, batches=100, rows=800, wait_s=wait, step_s=step,
        startup_wait_s=startup, first_wait_s=startup),))


def test_the_board_slides_and_names_the_rank_that_waits_most() -> None:
    b = live_mod.Board(slide_s=60.0)
    b.update([_live(0, 1.0, 0.5), _live(1, 1.0, 0.5)], True, now=0.0)
    b.update([_live(0, 2.0, 0.5, 20.0), _live(1, 6.0, 0.5, 15.0)], True, now=30.0)
    got, running = b.snapshot()
    s0, s1 = got[("0", "Rows#0", "h")], got[("1", "Rows#0", "h")]
    assert running and s1.candidate and not s0.candidate
    assert s1.steady_wait_share == pytest.approx(5.0 / (5.0 + 5.0))
    assert b.excess["Rows#0"] == pytest.approx(5.0 - 3.0)
    b.update([_live(0, 2.0, 0.5, 20.0), _live(1, 6.0, 0.5, 15.0)], False, now=200.0)
    got, running = b.snapshot()
    assert not running and math.isnan(got[("1", "Rows#0", "h")].steady_wait_share)


@pytest.mark.parametrize("text, want", [("9400", ("127.0.0.1", 9400)),
                                        ("localhost:0", ("localhost", 0)),
                                        ("[::1]:9400", ("::1", 9400))])
def test_address(text: str, want: tuple[str, int]) -> None:
    assert live_mod.parse_address(text) == want


@pytest.mark.parametrize("text", ["", "x", "70000", "::1:9400", "h:-1", "h:9x"])
def test_address_refused(text: str) -> None:
    with pytest.raises(UserError):
        live_mod.parse_address(text)


def test_beyond_loopback_only_with_a_token(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(UserError, match="needs a token"):
        live_mod.options("0.0.0.0:9400", None, None)
    monkeypatch.setenv("LIVE_TOKEN", "x" * 32)
    opts = live_mod.options("0.0.0.0:9400", "LIVE_TOKEN", None)
    assert opts.token == "x" * 32 and opts.host == "0.0.0.0"
    short = tmp_path / "t"
    short.write_text("short")
    with pytest.raises(UserError, match="--live-token-file"):
        live_mod.options("127.0.0.1:9400", None, short)
