"""Scenario parsing: the public key contract, matrix expansion and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallbench import scenario
from stallbench.run import preflight as validate
from stallbench.errors import ScenarioError

ROOT = Path(__file__).resolve().parents[1]


def parse(text: str) -> scenario.Scenario:
    return scenario.parse(text, "s.toml")


def error(text: str) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        parse(text)
    return info.value


def test_defaults_and_sections() -> None:
    sc = parse('name = "x"\n[loader]\nbatch_size = 512\n')
    assert sc.name == "x"
    assert sc.base.loader.batch_size == 512
    assert sc.base.loader.num_workers == 0
    assert sc.base.dataset.path is None
    assert [v.name for v in sc.variants] == ["default"]


def test_matrix_expands_cartesian_product_in_order() -> None:
    sc = parse('name = "x"\n[matrix]\n"loader.num_workers" = [0, 1, 2]\n'
               '"loader.batch_format" = ["rows", "single_buffer"]\n')
    assert [v.name for v in sc.variants] == [
        "num_workers=0,batch_format=rows", "num_workers=0,batch_format=single_buffer",
        "num_workers=1,batch_format=rows", "num_workers=1,batch_format=single_buffer",
        "num_workers=2,batch_format=rows", "num_workers=2,batch_format=single_buffer"]
    v = sc.variants[3]
    assert v.config.loader.num_workers == 1 and v.config.loader.batch_format == "single_buffer"
    assert v.knobs == {"loader.num_workers": 1, "loader.batch_format": "single_buffer"}


def test_section_axis_varies_keys_together_and_fills_missing_from_base() -> None:
    sc = parse('name = "x"\n[loader]\nbatch_size = 64\n[matrix]\n'
               'loader = [{num_workers = 0}, {num_workers = 2, batch_format = "rows"}]\n'
               '"model.step_ms" = [1, 2]\n')
    assert [v.name for v in sc.variants] == [
        "num_workers=0,batch_format=jagged,step_ms=1", "num_workers=0,batch_format=jagged,step_ms=2",
        "num_workers=2,batch_format=rows,step_ms=1", "num_workers=2,batch_format=rows,step_ms=2"]
    assert sc.variants[2].config.loader.batch_size == 64


def test_section_axis_labels_name_the_variants_and_are_not_knobs() -> None:
    sc = parse('name = "x"\n[matrix]\n"model.step_ms" = [1, 2]\n'
               'loader = [{label = "naive", batch_format = "rows", collate = "trainer"},\n'
               '          {label = "fast", batch_format = "single_buffer", num_workers = 2}]\n')
    assert [v.name for v in sc.variants] == ["step_ms=1,naive", "step_ms=1,fast",
                                             "step_ms=2,naive", "step_ms=2,fast"]
    fast = sc.variants[1]
    assert fast.knobs == {"model.step_ms": 1, "loader.batch_format": "single_buffer",
                          "loader.collate": "producer", "loader.num_workers": 2}
    assert fast.config.loader.num_workers == 2


def test_committed_optimizations_scenario_is_a_ladder_from_naive_to_optimised() -> None:
    sc = scenario.load(ROOT / "scenarios" / "optimizations.toml")
    first, last = sc.variants[0].config.loader, sc.variants[-2].config.loader
    assert (first.batch_format, first.collate, first.num_workers, first.prefetch_batches) == \
        ("rows", "trainer", 0, 0)
    assert (last.batch_format, last.collate, last.num_workers, last.prefetch_batches) == \
        ("single_buffer", "producer", 2, 2)
    # a ladder: each step changes what the step before it had, never a full product
    assert len(sc.variants) == len(sc.matrix["loader"])


def test_int_accepted_for_float_but_bool_is_not_int() -> None:
    sc = parse('name = "x"\n[storage]\nbandwidth_mb_s = 100\n')
    assert sc.base.storage.bandwidth_mb_s == 100.0
    e = error('name = "x"\n[loader]\nbatch_size = true\n')
    assert e.key == "loader.batch_size" and "integer" in e.message


@pytest.mark.parametrize("text, key, fragment", [
    ('name = "x"\n[loader]\nbatch_sise = 3\n', "loader.batch_sise", "did you mean 'batch_size'"),
    ('name = "x"\n[loadr]\nbatch_size = 3\n', "loadr", "did you mean 'loader'"),
    ('name = "x"\n[loader]\nbatch_size = -3\n', "loader.batch_size", "expected a value >= 1, got -3"),
    ('name = "x"\n[dataset]\nrows = "many"\n', "dataset.rows", 'expected an integer, got "many"'),
    ('name = "x"\n[storage]\nbandwidth_mb_s = 0\n', "storage.bandwidth_mb_s", "expected a value > 0"),
    ('[loader]\nbatch_size = 3\n', "name", "expected a non-empty string"),
    ('name = "a/b"\n', "name", "file name"),
    ('name = "x"\n[matrix]\n"loader.workers" = [1]\n', "matrix.'loader.workers'",
     "did you mean 'num_workers'"),
    ('name = "x"\n[matrix]\n"loader.num_workers" = []\n', "matrix.'loader.num_workers'",
     "non-empty list"),
    ('name = "x"\n[matrix]\n"loader.num_workers" = [0, -1]\n', "loader.num_workers",
     "(from [matrix])"),
    ('name = "x"\n[preprocess]\ntransforms = [3]\n', "preprocess.transforms[0]", "a name or a table"),
    ('name = "x"\n[matrix]\nloader = [{label = "a", num_workers = 0}, {num_workers = 1}]\n',
     "matrix.loader[].label", "a label on every table"),
    ('name = "x"\n[matrix]\nloader = [{label = "a", num_workers = 0}, {label = "a", num_workers = 1}]\n',
     "matrix.loader[].label", "distinct labels"),
    ('name = "x"\n[matrix]\nloader = [{label = "a"}]\n', "matrix.loader[0]", "at least one key"),
    ('name = "x"\n[matrix]\nloader = [{num_workrs = 1}]\n', "matrix.loader[0].num_workrs",
     "did you mean 'num_workers'"),
])
def test_bad_input_names_file_key_and_expectation(text: str, key: str, fragment: str) -> None:
    e = error(text)
    assert e.file == "s.toml"
    assert e.key == key
    assert fragment in str(e)
    assert str(e).startswith(f"s.toml: {key}: ")
    assert "\n" not in str(e)


@pytest.mark.parametrize("text, key, fragment", [
    ('name = "x"\n[loader]\nbatch_format = "colunmar"\n', "loader.batch_format",
     "did you mean 'columnar'? (valid: arrow, columnar, jagged, rows, single_buffer)"),
    ('name = "x"\n[model]\nkind = "dlrn"\n', "model.kind",
     "did you mean 'dlrm'? (valid: dlrm, emulated, \"pkg.module:factory\")"),
    ('name = "x"\n[model]\ntop_mlp = [8, 2]\n', "model.top_mlp", "ending in 1"),
    ('name = "x"\n[executor]\nkind = "rey"\n', "executor.kind",
     "did you mean 'ray'? (valid: flight, local, ray)"),
    ('name = "x"\n[executor]\nkind = "ray"\nray_address = "auto"\nsimulated_nodes = 2\n',
     "executor.simulated_nodes", "a simulated cluster runs on this machine"),
    ('name = "x"\n[matrix]\n"executor.kind" = ["local", "rey"]\n', "executor.kind",
     "did you mean 'ray'? (valid: flight, local, ray) (from [matrix])"),
])
def test_registry_backed_keys_are_checked_against_the_registries(text: str, key: str,
                                                                  fragment: str) -> None:
    """Executor, model and batch format names come from their registries (scenario.py cannot
    import the implementations); each implementation checks its own cross-key rules."""
    sc = parse(text)                                     # structurally valid
    with pytest.raises(ScenarioError) as info:
        validate.check_scenario(sc)
    e = info.value
    assert (e.file, e.key) == ("s.toml", key)
    assert fragment in str(e) and str(e).startswith(f"s.toml: {key}: ") and "\n" not in str(e)


def test_registered_names_and_user_models_pass() -> None:
    validate.check_scenario(parse(
        'name = "x"\n[model]\nkind = "mypkg.models:factory"\n[matrix]\n'
        '"executor.kind" = ["local", "ray"]\n"loader.batch_format" = ["rows", "columnar", "single_buffer"]\n'))


def test_toml_syntax_error_is_one_line() -> None:
    e = error('name = "x"\n[loader\n')
    assert e.key is None and "TOML syntax error" in str(e) and "\n" not in str(e)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such scenario file"):
        scenario.load(tmp_path / "nope.toml")
    with pytest.raises(ScenarioError, match="directory"):
        scenario.load(tmp_path)


def test_fingerprint_ignores_comments_but_not_knobs() -> None:
    a = parse('name = "x"\n[loader]\nbatch_size = 512\n')
    b = parse('# a comment\nname = "x"\ndescription = "d"\n[loader]\nbatch_size = 512\n')
    c = parse('name = "x"\n[loader]\nbatch_size = 1024\n')
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert a.sha256 != b.sha256


def test_emulated_labels() -> None:
    sc = parse('name = "x"\n[model]\nkind = "emulated"\nstep_ms = 3\n[storage]\nlatency_ms = 2\n')
    assert set(sc.base.emulated()) == {"model.step_ms", "storage.latency_ms"}


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("**/*.toml")), ids=lambda p: p.name)
def test_committed_scenarios_parse(path: Path) -> None:
    sc = scenario.load(path)
    assert sc.variants
    validate.check_scenario(sc)


def test_reference_lists_every_key_and_the_registered_names() -> None:
    ref = validate.reference_markdown()
    for section, cls in scenario.SECTIONS.items():
        assert f"[{section}]" in ref
        for f in cls.__dataclass_fields__:
            assert f"`{f}`" in ref
    line = next(ln for ln in ref.splitlines() if ln.startswith("| `batch_format`"))
    assert line.endswith('One of: "arrow", "columnar", "jagged", "rows", "single_buffer". |'), line
    line = next(ln for ln in ref.splitlines() if ln.startswith("| `kind` | `\"local\"`"))
    assert line.endswith('One of: "flight", "local", "ray". |'), line


# ------------------------------------------------------------------------------ [trainers]

@pytest.mark.parametrize("text,key,fragment", [
    ("[trainers]\nranks = 0\n", "trainers.ranks", ">= 1"),
    ("[trainers]\nranks = 65\n", "trainers.ranks", "<= 64"),
    ("[trainers]\nranks = 2\nstraggler_rank = 2\nstraggler_delay_ms = 5\n",
     "trainers.straggler_rank", "below trainers.ranks = 2"),
    ("[trainers]\nranks = 2\nstraggler_delay_ms = 5\n", "trainers.straggler_delay_ms",
     "needs trainers.straggler_rank"),
    ("[trainers]\nranks = 2\nstraggler_rank = 1\nstraggler_delay_ms = 20000\n",
     "trainers.straggler_delay_ms", "<= 10,000"),
    ("[trainers]\nrank = 2\n", "trainers.rank", "did you mean 'ranks'"),
])
def test_trainers_keys_are_bounded_and_checked(text: str, key: str, fragment: str) -> None:
    e = error('name = "x"\n' + text)
    assert e.key == key and fragment in e.message and "\n" not in str(e)


def test_trainers_ranks_in_the_matrix_and_the_straggler_is_emulated() -> None:
    sc = parse('name = "x"\n[trainers]\nstraggler_rank = 0\nstraggler_delay_ms = 5\n'
               '[matrix]\n"trainers.ranks" = [1, 2, 4]\n')
    assert [v.name for v in sc.variants] == ["ranks=1", "ranks=2", "ranks=4"]
    assert [v.config.trainers.ranks for v in sc.variants] == [1, 2, 4]
    assert "trainers.straggler_delay_ms" in sc.variants[0].config.emulated()
    bad = 'name = "x"\n[trainers]\nranks = 4\nstraggler_rank = 2\nstraggler_delay_ms = 5\n' \
          '[matrix]\n"trainers.ranks" = [4, 2]\n'
    e = error(bad)
    assert e.key == "trainers.straggler_rank" and "(from [matrix])" in e.message


def test_an_unused_trainers_section_keeps_the_fingerprint() -> None:
    """Results recorded before [trainers] existed stay comparable (the gate pairs by it)."""
    base = 'name = "x"\n[loader]\nbatch_size = 512\n'
    assert parse(base).fingerprint == parse(base + "[trainers]\nranks = 1\n").fingerprint
    assert parse(base).fingerprint != parse(base + "[trainers]\nranks = 2\n").fingerprint
