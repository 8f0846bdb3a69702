"""The wire (``stallbench/profile/agent/wire/``) is the only contract between the agent and the
launcher, both ways (issue 55): each record is written and read by one class, reads back as
written, and no module outside the wire reads wall data by key.

What counts as a string-key read of wall data (read from the source with ``ast``, so the rule
holds for code nobody runs in a test):

1. **JSON from the wall is parsed in the wire only.** No ``json.load`` / ``json.loads`` in
   ``stallbench/profile/`` outside ``agent/wire/``: the settings sent in, the part files, the
   beats are parsed by their record's ``from_json``. One exception, not wall data: the
   launcher's own node marker (``done.json``, written and read by the launcher of each node,
   never by the agent), a call whose source names it.
2. **The settings' channel is named in the wire only.** The literal ``"STALLBENCH_PROFILE"``
   appears in ``stallbench/`` in ``agent/wire/`` and in the bootstrap, which only tests that
   it is set (it runs before any module of the agent, in Python 2.7 syntax, and parses
   nothing).
3. **No key of a wall record is read by name outside the wire.** In ``stallbench/profile/``
   (the agent and the launcher side alike), a string constant that names a field of a wall
   record (``WALL_RECORDS``: the beats, the settings and replay plan sent in, the replay's
   part, its problems and stage counts) is neither the key of a subscript that reads
   (``b["last"]``) nor the first argument of ``.get`` / ``.pop`` / ``.setdefault``
   (``b.get("batches")``). On the launcher side the keys ``LoaderSettings`` reads for it
   (``LoaderSettings.TYPED``: ``num_workers``, ``pin_memory``, ...) are forbidden too; in the
   agent they are also the names of a loader's own arguments, which a door reads from the
   job's call before anything crosses the wall. Stores (``d["k"] = v``) and dict literals are
   not reads: building a dict is how a record's ``to_json`` and the knobs' overrides work.
   The rule names keys, not types, so an unrelated dict in ``profile/`` that happened to use
   one of these keys would be flagged too: none does, and one that did would read as wall
   data to its next reader as well.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from stallbench.profile.agent import wire

PKG = Path(wire.__file__).resolve().parents[3]          # stallbench/
PROFILE = PKG / "profile"
WIRE = PROFILE / "agent" / "wire"
AGENT = PROFILE / "agent"
BOOTSTRAP = AGENT / "bootstrap" / "sitecustomize.py"
WALL_RECORDS = (wire.Beat, wire.Settings, wire.ReplayPlan, wire.Mismatch, wire.Missing,
                wire.BudgetStop, wire.StageServe, wire.Replay)


def wall_keys(launcher_side: bool) -> frozenset[str]:
    keys = {f.name for cls in WALL_RECORDS for f in dataclasses.fields(cls)}
    return frozenset(keys | set(wire.LoaderSettings.TYPED) if launcher_side else keys)


def _reading_subscripts(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                yield node.lineno, f'[{key.value!r}]', key.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("get", "pop", "setdefault") and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            yield node.lineno, f'.{node.func.attr}({node.args[0].value!r})', node.args[0].value


def key_reads(src: str, keys: frozenset[str]) -> list[str]:
    """Rule 3 on one file's source: ``line: read`` for each key of ``keys`` read by name."""
    return [f"{line}: {what}" for line, what, key in _reading_subscripts(ast.parse(src))
            if key in keys]


def json_parses(src: str) -> list[str]:
    """Rule 1 on one file's source: ``line: call`` for each JSON parse (``done.json``'s
    excepted)."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("load", "loads") and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "json":
            text = ast.get_source_segment(src, node) or ""
            if "done.json" not in text:
                out.append(f"{node.lineno}: {text[:60]}")
    return out


def env_names(src: str) -> list[str]:
    """Rule 2 on one file's source."""
    return [f"{n.lineno}" for n in ast.walk(ast.parse(src))
            if isinstance(n, ast.Constant) and n.value == wire.ENV]


def _outside_the_wire(root: Path) -> list[Path]:
    return [p for p in sorted(root.rglob("*.py")) if WIRE not in p.parents]


def test_no_module_outside_the_wire_parses_json_from_the_wall() -> None:
    bad = [f"{p.relative_to(PKG)}:{hit}" for p in _outside_the_wire(PROFILE)
           for hit in json_parses(p.read_text())]
    assert not bad, "\n".join(bad)


def test_only_the_wire_names_the_settings_channel() -> None:
    bad = [f"{p.relative_to(PKG)}:{hit}" for p in _outside_the_wire(PKG) if p != BOOTSTRAP
           for hit in env_names(p.read_text())]
    assert not bad, "\n".join(bad)
    assert not json_parses(BOOTSTRAP.read_text())       # it tests the variable, never reads it


def test_no_key_of_wall_data_is_read_outside_the_wire() -> None:
    bad = []
    for p in _outside_the_wire(PROFILE):
        keys = wall_keys(launcher_side=AGENT not in p.parents)
        bad += [f"{p.relative_to(PKG)}:{hit}" for hit in key_reads(p.read_text(), keys)]
    assert not bad, "string-key reads of wall data (read the wire's record instead):\n" + \
        "\n".join(bad)


# Reads as they stood before issue 55 (launcher, session, tune, ablate, the hooks, replay)
BEFORE = '''
b = json.loads(p.read_text())
total = sum(int(b.get("batches") or 0) for b in self.beats)
name, epoch, index = (list(b["last"]) + [None, None, None])[:3]
gone = [b for b in beats if b.get("batches") and not b.get("exited")]
SETTINGS = json.loads(os.environ.get(ENV, "{}"))
if SETTINGS.get("replay"):
    _load_replay(SETTINGS["replay"])
why = f"worker {m['where'][1]}, call {m['call']}: recorded {m['recorded']}"
workers = int(st.get("num_workers") or 0)
if d.get("unkeyed"): pass
keep = int(CFG.get("keep", 8))
_STAT["budget_stop"] = {"where": list(where), "call": n, "bytes": 0}
'''


def test_the_rules_find_the_reads_of_before() -> None:
    """The rules can fail: every read above is found (line 13's store is not a read, its
    ``_STAT["budget_stop"]`` key is a store too), and a dict of the job's own is not."""
    got = key_reads(BEFORE, wall_keys(launcher_side=True))
    lines = sorted({int(x.split(":")[0]) for x in got})
    assert lines == [3, 4, 5, 7, 8, 9, 10, 11, 12], got
    assert [x.split(":")[0] for x in json_parses(BEFORE)] == ["2", "6"]
    assert key_reads('kw.get("batch_size", 256)\nrow["label"]', wall_keys(False)) == []
    assert key_reads('a.get("num_workers")', wall_keys(False)) == []     # a door's own
    assert key_reads('a.get("num_workers")', wall_keys(True)) != []      # the launcher's
    assert json_parses('m = json.loads((d / "done.json").read_text())') == []
    assert env_names('os.environ["STALLBENCH_PROFILE"] = x') == ["1"]


# ------------------------------------------------------------------ records read back

def test_the_settings_sent_in_read_back_as_written() -> None:
    plan = wire.ReplayPlan(mode="compute_only", keep=3, budget_mb=64.0, counts={"D#0": [5, 4]})
    s = wire.Settings(run_dir="/r", overrides={"dataloader": {"num_workers": 2}},
                      max_batches=6, replay=plan)
    env = {wire.ENV: s.to_env()}
    assert wire.Settings.from_env(env) == s
    assert s.group("dataloader") == {"num_workers": 2} and s.group("ray") == {}
    assert s.override("dataloader", "num_workers") == 2 and s.override("torch", "x") is None
    # none sent, not JSON, another version: no settings (the agent stays out of the job)
    for bad in ({}, {wire.ENV: "{"}, {wire.ENV: json.dumps({**s.to_json(), "v": 99})}):
        assert wire.Settings.from_env(bad) == wire.Settings() and not wire.Settings().run_dir


def test_a_beat_reads_back_with_its_pid_from_its_name(tmp_path: Path) -> None:
    """Its host too (a dash in it included), and its Ray node: what names a process whose
    figures never came home (issue 56)."""
    b = wire.Beat(pid=42, loaders=("D#0",), batches=7, last=("D#0", 2, 3), empty=1,
                  exited=True, host="host-a", node="127.0.0.2/1a2b3c4d")
    (tmp_path / wire.Beat.file_name("host-a", 42)).write_text(json.dumps(b.to_json()))
    (tmp_path / (wire.Beat.file_name("h", 9) + ".tmp")).write_text("{")     # mid-write
    (tmp_path / wire.Beat.file_name("h", 8)).write_text('{"batches": "x", "last": [1]}')
    got = sorted(wire.read_beats(tmp_path), key=lambda x: x.pid)
    assert got == [wire.Beat(pid=8, host="h"), b]   # a field it cannot read: its default


def test_a_beat_rewritten_in_place_reads_back_as_the_last_one(tmp_path: Path) -> None:
    """The beats sent while batches come are written over the file (issue 60: no rename, no
    truncation; ``sink.Files``): a shorter beat over a longer one reads back as itself (the
    rest is padding), the first one written whole stays readable, and nothing else is left
    in the run directory."""
    from stallbench.profile.agent import sink
    files, name = sink.Files(str(tmp_path)), wire.Beat.file_name("h", 7)
    first = wire.Beat(pid=7, loaders=("a-long-loader-name#0",), batches=1, host="h")
    files.put(name, json.dumps(first.to_json()))
    assert wire.read_beats(tmp_path) == [first]
    for n in (2, 1000, 3):
        later = wire.Beat(pid=7, loaders=("L#0",) if n == 3 else (), batches=n, host="h")
        files.put(name, json.dumps(later.to_json()), wait=False, in_place=True)
        assert wire.read_beats(tmp_path) == [later]
    assert [p.name for p in tmp_path.iterdir()] == [name]


@pytest.mark.parametrize("problem", [
    wire.Mismatch(where=(0, 1, 2), call=3, recorded="[1, 2]", asked="[2, 1]"),
    wire.Missing(where=("decode",), call="(3,)", recorded=40),
    wire.BudgetStop(where=(0, -1, 0), call=5, bytes=2**20),
    wire.BudgetStop(where=(0, -1, 0), call=5, error="cannot pickle the outputs (TypeError)")])
def test_a_replays_problems_read_back_as_written(problem) -> None:
    field = {wire.Mismatch: "mismatch", wire.Missing: "missing",
             wire.BudgetStop: "budget_stop"}[type(problem)]
    rec = wire.Replay(pid=7, mode="serve", serve="items", served=3, computed=1,
                      stages={"decode": wire.StageServe(recorded=2, unkeyed=1)},
                      **{field: problem})
    assert wire.Replay.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    assert rec.stage("decode").recorded == 2 and not rec.stage("other")
    if isinstance(problem, wire.Mismatch):
        assert (problem.worker, problem.epoch) == (1, 2)


def test_a_loaders_settings_are_a_mapping_with_typed_reads() -> None:
    s = wire.LoaderSettings({"num_workers": 4, "pin_memory": True, "prefetch_factor": 2,
                             "batch_size": 32, "dataset": "m.D"})
    assert dict(s) == s.to_json() and s == {**s.to_json()}
    assert (s.num_workers, s.pin_memory, s.persistent_workers, s.prefetch_factor,
            s.prefetch_batches, s.batch_rows) == (4, True, False, 2, 1, 32)
    none = wire.LoaderSettings()
    assert (none.num_workers, none.prefetch_factor, none.batch_rows) == (0, None, 1)
