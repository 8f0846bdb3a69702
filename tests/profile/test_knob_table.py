"""One knob table (issue 55): every ``--set``/tune key is one row of ``analysis.knob_table``, and
the parser, the help, ``tune --keys``, the tune's search and advice, and the docs derive from
it. A row added to the table (here, monkeypatched) is parsed, listed, searched and advised
with no other edit; no module outside the table (and the in-job side, which applies what it is
sent) spells a key; the table's groups are the doors' groups."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from stallbench.analysis import knob_table
from stallbench.analysis import loader_search as ls
from stallbench.analysis.knob_table import Knob, Search
from stallbench.commands import profile as profile_cmd
from stallbench.commands import tune as tune_cmd
from stallbench.errors import UserError
from stallbench.profile import knobs
from stallbench.profile.agent import doors
from stallbench.profile import tune as job_tune

PKG = Path(knob_table.__file__).resolve().parents[1]         # stallbench/
ROOT = PKG.parent
TABLE_MODULE = Path(knob_table.__file__).resolve()
# the in-job side receives ``{group: {name: value}}`` and applies it: it imports nothing of the
# launcher's (standard library only), so a door names what it honours itself
IN_JOB = [PKG / "profile" / "agent"]

# a knob no door knows yet: a DataLoader keyword (the torch door passes every ``dataloader``
# name as that keyword), doubled while the loop waits (the rule Ray's prefetch has)
NEW = Knob("dataloader", "in_flight", int, 1, 64, knob_table.EVERY_DATALOADER,
           knob_table.DATALOADER,
           search=Search("waiting", "while the loop waits and a doubling pays: doubled", 7,
                         start=1, most=16))


def _door_with(group: str) -> doors.Door:
    return next(d for d in doors.table().values() if d.reaches(group))


def _help(module) -> str:
    sub = argparse.ArgumentParser(prog="stallbench").add_subparsers()
    return " ".join(module.add_parser(sub).format_help().split())


def _trial(settings=None, *, rate=100.0, wait_s=0.02, step_s=0.02) -> ls.Trial:
    return ls.Trial(settings=dict(settings or {}), rate=rate,
                    wait_share=wait_s / (wait_s + step_s), step_s=step_s, wait_s=wait_s,
                    wait_p90_s=wait_s, startup_share=0.0, rows=8.0, workers=0,
                    persistent=False, prefetch_factor=None, pin_memory=False, cuda=False,
                    threads=1, epochs=6)


def test_the_tables_groups_are_the_doors_groups() -> None:
    """A row's group is honoured by some door, and every group a door declares has a row:
    which loaders a key reaches is the doors' to say, never a kind's name."""
    declared = {g for d in doors.table().values() for g in d.set_keys}
    assert {k.group for k in knob_table.rows()} == declared
    for k in knob_table.rows():
        assert k.key == f"{k.group}.{k.name}" and knob_table.by_key(k.key) is k
        assert k.type in (int, bool) and k.lo <= k.hi
        assert k.search is None or k.search.rule in ls.RULES, k
        assert k.process or k.recorded in (None, k.name), k    # a loader keyword, recorded
    assert len(set(knob_table.keys())) == len(knob_table.rows())
    listed = [k.search.listed for k in knob_table.searched()]
    assert len(set(listed)) == len(listed)


def test_the_help_and_errors_keep_their_words() -> None:
    """Generated from the table, the strings are today's (golden errors:
    tests/golden/profile_errors.txt, tune_errors.txt)."""
    assert knob_table.listed() == (
        "dataloader.num_workers, dataloader.pin_memory, dataloader.prefetch_factor, "
        "dataloader.persistent_workers, ray.prefetch_batches, torch.num_threads (the "
        "trainer's intra-op threads)")
    assert knob_table.listed(knob_table.searched(), notes=False) == (
        "dataloader.num_workers, dataloader.persistent_workers, dataloader.prefetch_factor, "
        "dataloader.pin_memory, torch.num_threads, ray.prefetch_batches")
    assert ("--set KEY=V1,V2 try these values on the job (repeatable): "
            + knob_table.listed()) in _help(profile_cmd)
    assert ("the settings it may change (default all it knows: "
            + knob_table.listed(knob_table.searched(), notes=False) + ")") in _help(tune_cmd)


def test_which_keys_tune_searches_come_from_the_doors() -> None:
    """Torch's DataLoader: its loader keywords and the trainer's threads; Ray Data: its own
    prefetch alone; a loader no group reaches: the trainer's threads only."""
    opts = job_tune.Options(argv=[], name="x", out=Path("."))
    torch_dl = job_tune._keys(opts, frozenset(_door_with("dataloader").set_keys))
    assert torch_dl == {k.key for k in knob_table.rows() if k.group in ("dataloader", "torch")}
    assert job_tune._keys(opts, frozenset(_door_with("ray").set_keys)) == \
        {knob_table.RAY_PREFETCH.key}
    assert job_tune._keys(opts, frozenset()) == {knob_table.THREADS.key}
    assert not knob_table.reaches_a_loader(frozenset())


def test_a_new_row_is_parsed_listed_searched_and_advised(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(knob_table, "TABLE", knob_table.TABLE + (NEW,))
    key = NEW.key
    # profile --set: parsed, range-checked, in the help and the errors, sent to its door
    assert knobs.parse([f"{key}=1,4"]) == {key: [1, 4]}
    with pytest.raises(UserError, match=re.escape(f"--set {key}: expected an integer 1..64, "
                                                  "got 65")):
        knobs.parse([f"{key}=65"])
    with pytest.raises(UserError, match=re.escape(key)):
        knobs.parse(["dataloader.nothing=1"])
    assert key in _help(profile_cmd)
    assert knobs.Variant("v", {key: 2}).overrides() == {"dataloader": {"in_flight": 2}}
    # tune --keys: accepted, and in its help
    assert tune_cmd._keys(key) == [key]
    assert key in _help(tune_cmd)
    # tune: searched on a loader whose door honours the group, by the row's rule
    opts = job_tune.Options(argv=[], name="x", out=Path("."), keys=[key])
    keys = job_tune._keys(opts, frozenset(_door_with(NEW.group).set_keys))
    assert keys == {key}
    assert key in job_tune._keys(job_tune.Options(argv=[], name="x", out=Path(".")),
                                 frozenset(_door_with(NEW.group).set_keys))
    ctx = ls.Context(cores=4.0, ceiling=None, keys=keys)
    d = ls.decide(ctx, [_trial()], [{}])
    assert d.choice is not None and d.choice.settings == {key: 2}
    assert d.choice.change == "in_flight: 1 -> 2"
    assert "on DataLoader at in_flight=1" in d.choice.why
    spent = _trial({key: 2}, rate=101.0)             # +1%: the direction is spent
    assert ls.decide(ctx, [_trial(), spent], [{}, {key: 2}]).choice is None
    # its advice and its recorded form
    assert ls.apply_text({key: 2}) == "DataLoader(..., in_flight=2)"
    assert ls.bare({key: 2}) == {"in_flight": 2}
    assert ls.dotted({"in_flight": 2}, _door_with(NEW.group).set_keys) == {key: 2}
    best = type("Best", (), {"name": "in_flight=2", "speedup": 1.5, "stop_text": ""})()
    rec = ls.recommendation(best, {key: 2})
    assert rec.action == "set DataLoader(..., in_flight=2)" and rec.knob == key
    assert knob_table.where([key]) == "DataLoader"
    # the docs' reference lists it
    assert f"| `{key}` | an integer 1..64 |" in knobs.reference_markdown()


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}


def _spelled(tree: ast.AST, keys: list[str], groups: set[str]) -> list[tuple[int, str]]:
    """String constants, docstrings apart, that spell a key (alone or inside a text or an
    f-string's literal part: ``"--set dataloader.num_workers="``) or are a group's prefix
    (``"ray."``: the family test a second taxonomy made)."""
    pat = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, keys)) + r")(?!\w)")
    skip = _docstrings(tree)
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip:
            if pat.search(n.value) or n.value in {f"{g}." for g in groups}:
                out.append((n.lineno, n.value))
    return out


def test_no_module_outside_the_table_spells_a_key() -> None:
    keys, groups = knob_table.keys(), {k.group for k in knob_table.rows()}
    outside = [p for p in sorted(PKG.rglob("*.py")) if p.resolve() != TABLE_MODULE
               and not any(d in p.resolve().parents for d in IN_JOB)]
    found = [f"{p.relative_to(ROOT)}:{line}: {text!r}" for p in outside
             for line, text in _spelled(ast.parse(p.read_text()), keys, groups)]
    assert outside and not found, "\n".join(found)


def test_the_key_check_finds_a_spelled_key() -> None:
    """The check above can fail: each form it looks for is found, a docstring is not."""
    src = ('"""dataloader.num_workers in a docstring is prose."""\n'
           'a = "dataloader.num_workers"\n'
           'b = f"--set torch.num_threads={n}"\n'
           'c = k.startswith("ray.")\n'
           'd = "dataloader.num_workers_x"\n')
    got = _spelled(ast.parse(src), knob_table.keys(), {"ray", "dataloader", "torch"})
    assert sorted(n for n, _ in got) == [2, 3, 4], got


def test_the_docs_reference_is_generated_from_the_table() -> None:
    text = (ROOT / "docs" / "profile.md").read_text()
    assert knobs.reference_markdown() in text, (
        "docs/profile.md's --set key reference is stale: paste "
        "stallbench.profile.knobs.reference_markdown() between its markers")
    tune_doc = (ROOT / "docs" / "whatif-and-tune.md").read_text()
    missing = [k.key for k in knob_table.searched()
               if f"*{k.key}*" not in tune_doc and f"*{k.name}*" not in tune_doc]
    assert not missing, f"docs/whatif-and-tune.md does not say how tune searches {missing}"


def test_advice_is_written_as_before() -> None:
    """The answers a tune prints, from the rows' ``Advice``."""
    s = {knob_table.WORKERS.key: 1, knob_table.PERSISTENT_WORKERS.key: True,
         knob_table.RAY_PREFETCH.key: 4, knob_table.THREADS.key: 1}
    assert ls.apply_text(s) == (
        "DataLoader(..., num_workers=1, persistent_workers=True); "
        "iter_torch_batches(..., prefetch_batches=4); "
        "torch.set_num_threads(1) before the first op (or OMP_NUM_THREADS)")
    assert ls.apply_text({}) == "keep the job as written"
    assert knob_table.where([knob_table.RAY_PREFETCH.key]) == "Ray Data's iterator"
    assert knob_table.where([knob_table.THREADS.key]) == \
        "trainer (torch.set_num_threads before its first op)"
    assert knob_table.where([knob_table.WORKERS.key, knob_table.THREADS.key]) == "DataLoader"
