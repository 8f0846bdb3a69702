"""Issue 38, classes 1, 9, 10 and 11, on one real profiled job (a user-style DataLoader script
run by ``stallbench profile`` in a subprocess, as a user runs it):

1. a DISTINCT secret planted in every form a command and its environment carry one (by name:
   generated flag and variable names; by shape: URL userinfo of several schemes, signed-URL
   parameters, Authorization headers, a value of a variable whose name says nothing) is in
   no output: stdout, stderr, any file under ``--out`` (its name and its bytes), the trace,
   the rendered report, ``history``'s output;
9. argv bytes that are not UTF-8 round-trip through the result (surrogate escapes), and the
   report and ``history`` render it;
10. a Dataset class named ``"X\\n::error title=pwned::..."`` never starts a printed line (a
    GitHub Actions runner executes a line starting with ``::``), in any sink;
11. a ``--set`` value the hooks did not apply (``persistent_workers=true`` on a job at
    ``num_workers=0``: torch refuses it) is never advised; a ``--set`` matrix is capped as
    a scenario's is.

The job runs once (a module fixture); each form is a test of its own, so a leak names its form.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]

JOB = '''\
"""A user's training script: a DataLoader over a Dataset whose class name is hostile."""
import json, os, sys
import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        return torch.tensor([float(i)])


Items.__name__ = Items.__qualname__ = sys.argv[1]
# what the job got, for the test to prove that every secret reached it (argv as bytes)
with open(os.environ["SEEN_FILE"], "w") as fh:
    json.dump({"argv": [os.fsencode(a).hex() for a in sys.argv],
               "env": dict(os.environ), "cwd": os.getcwd()}, fh)
for x in DataLoader(Items(), batch_size=8, num_workers=0):
    pass
print("trained", flush=True)
'''

HOSTILE_CLASS = "X\n::error title=pwned::{secret}"
BAD_BYTES = b"caf\xe9-\xff\xfe-data"        # latin-1 and invalid UTF-8


def _secret(rng: random.Random, i: int) -> str:
    return f"Sq{i:02d}" + "".join(rng.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(10))


def _generated_names(rng: random.Random) -> dict[str, str]:
    """Flag and variable names the rule must know by their parts, not from a list."""
    def pick(xs: list[str]) -> str:
        return rng.choice(xs)
    pre = ["corp", "wandb", "mlflow", "db", "vault", "hub", "s3", "acme"]
    return {
        "flag_space": f"--{pick(pre)}-{pick(['token', 'password', 'secret', 'passphrase'])}",
        "flag_eq": f"--{pick(pre)}_{pick(['api_key', 'access_key', 'credential', 'auth'])}",
        "flag_colon": f"--{pick(pre)}{pick(['Token', 'Secret', 'ApiKey', 'Password'])}",
        "arg_assign": f"{pick(pre).upper()}_{pick(['TOKEN', 'SECRET_KEY', 'PASSWD', 'PRIVATE_KEY'])}",
        "env_named": f"{pick(pre).upper()}_{pick(['API_KEY', 'TOKEN', 'PASSWORD', 'CREDENTIALS'])}",
        "shell_assign": f"{pick(pre).upper()}_{pick(['AUTH_TOKEN', 'SECRET', 'PWD'])}",
    }


def _plant(tmp: Path) -> NS:
    """The command and environment, one distinct secret per form."""
    rng = random.Random(os.getpid())
    names = _generated_names(rng)
    forms = ["shell_env", "shell_flag", "shell_generated", "url_postgres", "url_https",
             "url_ray", "url_s3", "url_lone_user", "query_amz", "query_sig", "query_token",
             "header_bearer", "header_basic", "header_api_key", "flag_auth", "flag_p",
             "flag_passphrase", "flag_bearer", "flag_access_key_id", "flag_api_key_colon",
             "flag_api_key_eq", "gen_flag_space", "gen_flag_eq", "gen_flag_colon",
             "gen_arg_assign", "nested_shell", "json_headers_arg", "env_master_addr",
             "env_ray_job_headers", "env_torch_hub_auth", "env_generated", "env_ray_address",
             "issuer_token", "curl_user", "dataset_class",
             # issue 59's shapes, which the deny-list did not know
             "attached_p", "netrc_value", "aws_set", "json_apostrophe", "auth_object",
             "token_one_arg", "url_slash", "url_query", "flag_pw", "flag_dash_pw",
             "flag_hub_tok", "positional", "cwd_token"]
    s = {f: _secret(rng, i) for i, f in enumerate(forms)}
    s["issuer_token"] = "hf_" + (s["issuer_token"] * 3)[:34]     # a Hugging Face token's shape
    s["url_slash"] = s["url_slash"][:6] + "/" + s["url_slash"][6:]  # URL passwords with / or ?
    s["url_query"] = s["url_query"][:6] + "?" + s["url_query"][6:]
    script = tmp / "userjob.py"
    script.write_text(JOB)
    shell = (f"HF_TOKEN={s['shell_env']} {names['shell_assign']}={s['shell_generated']} "
             f"{PY} {script} \"$1\" --api-key={s['shell_flag']} \"${{@:2}}\"")
    args: list[str | bytes] = [
        HOSTILE_CLASS.format(secret=s["dataset_class"]),
        f"postgres://admin:{s['url_postgres']}@db.internal:5432/feats",
        f"https://builder:{s['url_https']}@artifacts.example.com/x",
        f"ray://ops:{s['url_ray']}@head:10001", f"s3://AKIAEXAMPLE:{s['url_s3']}@bucket/p",
        f"https://{s['url_lone_user']}@github.com/org/repo.git",
        f"https://b.s3.amazonaws.com/o?X-Amz-Algorithm=AWS4&X-Amz-Signature={s['query_amz']}",
        f"https://acct.blob.core.windows.net/c?sv=2021&sig={s['query_sig']}&se=2030",
        f"https://hub.example.com/file?token={s['query_token']}&rev=main",
        "-H", f"Authorization: Bearer {s['header_bearer']}",
        "-H", f"Authorization: Basic {s['header_basic']}",
        "-H", f"X-Api-Key: {s['header_api_key']}",
        "--auth", s["flag_auth"], "-p", s["flag_p"], "--passphrase", s["flag_passphrase"],
        "--bearer", s["flag_bearer"], "--access-key-id", s["flag_access_key_id"],
        f"--api_key:{s['flag_api_key_colon']}", f"--api-key={s['flag_api_key_eq']}",
        names["flag_space"], s["gen_flag_space"], f"{names['flag_eq']}={s['gen_flag_eq']}",
        f"{names['flag_colon']}:{s['gen_flag_colon']}",
        f"{names['arg_assign']}={s['gen_arg_assign']}",
        f"sh -c 'DB_PASSWORD={s['nested_shell']} true'",
        json.dumps({"Authorization": f"Bearer {s['json_headers_arg']}", "Accept": "json"}),
        s["issuer_token"], "-u", f"alice:{s['curl_user']}",
        f"-p{s['attached_p']}", "--netrc", f"machine h login u password {s['netrc_value']}",
        "aws", "configure", "set", "aws_secret_access_key", s["aws_set"],
        json.dumps({"note": f"it's {s['json_apostrophe']}"}),
        json.dumps({"auth": {"user": "u", "value": s["auth_object"]}}),
        f"--token {s['token_one_arg']}", f"https://u:{s['url_slash']}@h/x",
        f"https://u:{s['url_query']}@h/x", "--pw", s["flag_pw"], "-pw", s["flag_dash_pw"],
        "--hub-tok", s["flag_hub_tok"], s["positional"],
        BAD_BYTES,
    ]
    env = {"MASTER_ADDR": f"ops:{s['env_master_addr']}@10.0.0.1",
           "RAY_JOB_HEADERS": json.dumps({"Authorization": f"Bearer {s['env_ray_job_headers']}"}),
           "TORCH_HUB_AUTH": s["env_torch_hub_auth"],
           names["env_named"]: s["env_generated"],
           "RAY_ADDRESS": f"ray://svc:{s['env_ray_address']}@head.internal:10001"}
    cwd = tmp / s["cwd_token"]          # a working directory named like a token
    cwd.mkdir()
    return NS(secrets=s, names=names, argv=["bash", "-c", shell, "bash", *args], env=env,
              script=script, cwd=cwd)


def _run(args: list, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "stallbench", *args], cwd=cwd, env=env,
                          capture_output=True, timeout=300)


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> NS:
    tmp = tmp_path_factory.mktemp("secrets")
    p = _plant(tmp)
    env = dict(os.environ, PYTHONUNBUFFERED="1", SEEN_FILE=str(tmp / "seen.json"), **p.env)
    env.pop("STALLBENCH_PROFILE", None)
    # output paths not UTF-8 either (class 9): printed escaped, never a traceback
    out, trace = tmp / os.fsdecode(b"out-\xfe"), tmp / os.fsdecode(b"trace-\xff.json")
    cp = _run(["profile", "--no-analyze", "--out", str(out), "--trace", str(trace),
               "--set", "dataloader.persistent_workers=false,true", "--", *p.argv], env, p.cwd)
    files = sorted(out.iterdir()) if out.exists() else []
    rep = _run(["report", str(out), "-o", str(tmp / "report.html")], env, tmp)
    hist = _run(["history", str(out)], env, tmp)
    seen = json.loads((tmp / "seen.json").read_text()) if (tmp / "seen.json").exists() else {}
    p.cp, p.out, p.files, p.trace, p.rep, p.hist, p.tmp, p.seen = (cp, out, files, trace, rep,
                                                                    hist, tmp, seen)
    return p


def _outputs(job: NS) -> dict[str, str]:
    """Every output of the profile, its report and history: streams, file names and bytes."""
    got = {"profile stdout": _text(job.cp.stdout), "profile stderr": _text(job.cp.stderr),
           "report stdout+stderr": _text(job.rep.stdout + job.rep.stderr),
           "history stdout+stderr": _text(job.hist.stdout + job.hist.stderr),
           "names under --out": "\n".join(str(f) for f in job.out.rglob("*")),
           "names beside --out": "\n".join(str(f) for f in job.tmp.iterdir()
                                           if f.name not in ("seen.json", job.cwd.name))}
    for f in [*job.files, job.trace, job.tmp / "report.html"]:
        if f.is_file():
            got[str(f)] = _text(f.read_bytes())
    return got


def test_the_job_ran_and_its_sinks_were_written(job: NS) -> None:
    assert job.cp.returncode == 0, _text(job.cp.stderr)[-3000:]
    assert b"Traceback" not in job.cp.stderr + job.rep.stderr + job.hist.stderr
    assert job.rep.returncode == 0, _text(job.rep.stderr)
    assert job.hist.returncode == 0, _text(job.hist.stderr)
    assert [f.name.split("-")[0] for f in job.files] == ["userjob"], job.files  # the stem
    assert job.trace.is_file()


@pytest.mark.parametrize("form", [
    "shell_env", "shell_flag", "shell_generated", "url_postgres", "url_https", "url_ray",
    "url_s3", "url_lone_user", "query_amz", "query_sig", "query_token", "header_bearer",
    "header_basic", "header_api_key", "flag_auth", "flag_p", "flag_passphrase", "flag_bearer",
    "flag_access_key_id", "flag_api_key_colon", "flag_api_key_eq", "gen_flag_space",
    "gen_flag_eq", "gen_flag_colon", "gen_arg_assign", "nested_shell", "json_headers_arg",
    "env_master_addr", "env_ray_job_headers", "env_torch_hub_auth", "env_generated",
    "env_ray_address", "issuer_token", "curl_user", "attached_p", "netrc_value", "aws_set",
    "json_apostrophe", "auth_object", "token_one_arg", "url_slash", "url_query", "flag_pw",
    "flag_dash_pw", "flag_hub_tok", "positional", "cwd_token"])
def test_a_planted_secret_reaches_no_output(job: NS, form: str) -> None:
    secret = job.secrets[form]
    # it reached the job (so a leak could be seen): in its argv, environment or directory
    seen = " ".join(bytes.fromhex(a).decode("utf-8", "replace") for a in job.seen["argv"]) + \
        json.dumps(job.seen["env"]) + job.seen.get("cwd", "")
    assert secret in seen, (form, job.names)
    for sink, text in _outputs(job).items():
        assert secret not in text, f"{form}: the secret is in {sink} (names: {job.names})"


def test_what_is_recorded_is_what_the_allow_list_keeps(job: NS) -> None:
    """Issue 59: the program, the script (relative to the working directory, or its name),
    flag names and plain values; every other value ``<value>``; the environment by names that
    explain a run (a credential's name not at all); the working directory a fingerprint."""
    from stallbench import results

    r = results.load(job.files[0])
    text = r.scenario.text
    for kept in ("bash -c", "HF_TOKEN=<value>", "--api-key=<value>", "--auth <value>",
                 "-p <value>", "-H <value>", f"{job.names['flag_space']} <value>",
                 "--hub-tok <value>", "--pw <value>", "-p<value>", "userjob.py"):
        assert kept in text, (kept, text)
    assert str(job.tmp) not in text and str(job.tmp) not in json.dumps(r.profile.argv)
    env = r.profile.environment
    assert env["MASTER_ADDR"] == "<value>" and env["RAY_ADDRESS"] == "<value>"
    assert job.names["env_named"] not in env and "TORCH_HUB_AUTH" not in env
    assert "RAY_JOB_HEADERS" not in env or env["RAY_JOB_HEADERS"] == "<value>"
    assert r.profile.cwd.startswith("sha256:")
    assert r.scenario.name == "userjob"
    assert r.scenario.path == "userjob.py"   # found inside the bash -c string, outside the cwd
    assert r.settings.argv[r.settings.argv.index("--set") + 1] == \
        "dataloader.persistent_workers=false,true"


def test_cannot_start_never_quotes_the_secret(tmp_path: Path) -> None:
    secret = "Sqstart7x9k2m"
    cp = _run(["profile", "--no-analyze", "--out", str(tmp_path / "o"), "--",
               f"API_KEY={secret}", "python", "t.py"], dict(os.environ), tmp_path)
    err = _text(cp.stderr)
    assert cp.returncode == 2
    last = err.splitlines()[-1]
    assert last == "stallbench: error: cannot start 'API_KEY=<value>': No such file or directory"
    assert secret not in err + _text(cp.stdout)


def test_non_utf8_paths_print_escaped(job: NS) -> None:
    """Class 9: output paths that are not UTF-8 print escaped; an argument that is not UTF-8
    is a value like any other (``<value>``)."""
    from stallbench import results

    r = results.load(job.files[0])
    assert r.profile.argv[-1] == "<value>"
    assert bytes.fromhex(job.seen["argv"][-1]) == BAD_BYTES     # the job got them unchanged
    assert "result: " + str(job.out).replace("\udcfe", "\\udcfe") in _text(job.cp.stdout)
    assert "trace: " + str(job.trace).replace("\udcff", "\\udcff") in _text(job.cp.stdout)


def test_record_argv_keeps_values_and_non_utf8_bytes_round_trip(tmp_path: Path) -> None:
    """``--record-argv``: every value recorded, redacted by the deny-list as before; bytes
    that are not UTF-8 round-trip through the result (surrogate escapes), and the report and
    ``history`` render them."""
    from stallbench import results

    script = tmp_path / "job.py"
    script.write_text("import torch\nfrom torch.utils.data import DataLoader\n"
                      "for _ in DataLoader(list(range(16)), batch_size=4): pass\n")
    out = tmp_path / "out"
    cp = _run(["profile", "--no-analyze", "--record-argv", "--out", str(out), "--", PY,
               str(script), "/data/kept", "--token", "Sqrecordargv77", BAD_BYTES],
              dict(os.environ), tmp_path)
    assert cp.returncode == 0, _text(cp.stderr)
    (f,) = sorted(out.glob("*.json"))
    r = results.load(f)
    assert r.profile.argv[2:5] == ["/data/kept", "--token", "REDACTED"]
    assert os.fsencode(r.profile.argv[-1]) == BAD_BYTES
    assert b"Sqrecordargv77" not in cp.stdout + cp.stderr + f.read_bytes()
    rep = _run(["report", str(out), "-o", str(tmp_path / "r.html")], dict(os.environ), tmp_path)
    hist = _run(["history", str(out)], dict(os.environ), tmp_path)
    assert rep.returncode == 0 and hist.returncode == 0, _text(rep.stderr + hist.stderr)
    assert "\\udcff\\udcfe" in (tmp_path / "r.html").read_text()


def test_names_from_the_job_never_start_a_line(job: NS) -> None:
    """Class 10: the class name's newline is shown escaped, in every sink, and no printed or
    written line starts with '::' (what a CI runner executes)."""
    for sink, text in _outputs(job).items():
        for line in text.splitlines():
            assert not line.lstrip().startswith("::"), (sink, line)
    assert "X\\n::error title=pwned::" in _text(job.cp.stdout)
    from stallbench import results
    r = results.load(job.files[0])
    assert r.variants[0].profile.loaders[0].name.startswith("X\\n::error")


def test_a_setting_that_did_not_run_is_never_advised(job: NS) -> None:
    """Class 11: the job's loader is at num_workers=0, where torch refuses
    persistent_workers=true: the hooks drop it, and the advice never names it."""
    out = _text(job.cp.stdout)
    rec = [x for x in out.splitlines() if x.startswith("recommendation:")]
    assert rec, out
    assert "set persistent_workers=true" not in out
    assert "persistent_workers=true (persistent_workers not applied" in rec[-1], rec


def _variant(name: str, knobs: dict, steady: float, ran_with: dict, notes: list[str]) -> NS:
    loader = NS(kind="torch.DataLoader", name="Items#0", settings=ran_with, notes=notes,
                set_keys=["dataloader", "torch"])
    return NS(name=name, knobs=knobs, phases=NS(steady_samples_s=NS(median=steady)),
              throughput_samples_s=NS(median=steady), profile=NS(loaders=[loader]))


def test_advice_counts_only_values_the_loaders_ran_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """Class 11 without the noise of a real run: the variant whose value was dropped measured
    fastest; it is never the advice, and a variant whose values ran still is. Whether a gain
    is the knob's (the wait explains it: issue 39's ``waits.check_gain``, tested in
    tests/analysis/test_waits.py) is taken as yes here: these fakes measured no wait."""
    from stallbench.analysis import waits
    from stallbench.analysis import loader_search

    monkeypatch.setattr(waits, "check_gain", lambda base, other, gain: waits.GainCheck(
        gain=gain, bound=math.inf, step_ratio=1.0, step_noise_share=0.05))

    why = "persistent_workers not applied: torch refuses it with num_workers=0"
    base = _variant("persistent_workers=false", {"dataloader.persistent_workers": False},
                    1000.0, {"num_workers": 0, "persistent_workers": False}, [])
    dropped = _variant("persistent_workers=true", {"dataloader.persistent_workers": True},
                       5000.0, {"num_workers": 0, "persistent_workers": False}, [why])
    rec = loader_search.recommend([base, dropped])
    assert rec.action == "keep" and "set persistent_workers" not in rec.text
    assert "never applied: persistent_workers=true (" + why in rec.text
    pinned = _variant("pin_memory=true", {"dataloader.pin_memory": True}, 2000.0,
                      {"num_workers": 0, "pin_memory": True}, [])
    rec = loader_search.recommend([base, dropped, pinned])
    assert rec.variant == "pin_memory=true" and "set pin_memory=true" in rec.text


def test_set_matrix_is_capped_like_a_scenarios(tmp_path: Path) -> None:
    big = ["--set", "dataloader.num_workers=" + ",".join(map(str, range(0, 41))),
           "--set", "dataloader.prefetch_factor=" + ",".join(map(str, range(1, 31))),
           "--set", "dataloader.pin_memory=true,false"]
    cp = _run(["profile", *big, "--", PY, "-c", "pass"], dict(os.environ), tmp_path)
    assert cp.returncode == 2
    err = _text(cp.stderr)
    assert err == ("stallbench: error: --set: 41 (dataloader.num_workers) x 30 "
                   "(dataloader.prefetch_factor) x 2 (dataloader.pin_memory) = 2,460 variants; "
                   "at most 1,000 per profile, as per scenario (each variant runs the whole "
                   "job)\n"), err
    assert not (tmp_path / "results").exists()


def test_a_loader_name_read_back_from_a_result_file_is_escaped(job: NS, tmp_path: Path) -> None:
    """Class 10 for results from elsewhere: a file whose loader name holds a raw newline and
    '::' (written by hand, or by an older stallbench) is escaped when read, as result and
    variant names are: every reader (profile's table of a loaded result) shows it so."""
    from stallbench import results

    d = json.loads(job.files[0].read_text())
    d["variants"][0]["profile"]["loaders"][0]["name"] = "Y\n::warning::raw"
    f = tmp_path / "hand.json"
    f.write_text(json.dumps(d))
    assert results.load(f).variants[0].profile.loaders[0].name == "Y\\n::warning::raw"
