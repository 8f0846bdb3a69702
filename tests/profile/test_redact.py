"""``profile.redact``, the one rule every sink takes the command and variables through (issue
38, class 1), over generated names and shapes: a secret in any spelling goes, what is not a
secret stays readable. Pure and fast; the real profiled job that greps every output is
``tests/reliability/test_secrets_and_names.py``."""

from __future__ import annotations

import itertools
import random

import pytest

from stallbench.profile import redact

SECRET = "Zx9sekretQ"

# secret words, as users spell them in flags and variables; generated into names below
WORDS = ["token", "secret", "password", "passwd", "passphrase", "api_key", "apikey", "auth",
         "authorization", "bearer", "credential", "credentials", "access_key", "secret_key",
         "private_key", "access_key_id", "key", "pwd", "signature", "sig", "cookie"]
PREFIXES = ["", "hf", "my_service", "db", "wandb", "aws", "x2", "gh"]
SUFFIXES = ["", "value", "2"]


def _styles(prefix: str, word: str, suffix: str) -> list[str]:
    """One name in the spellings of flags and variables: kebab, snake, SCREAMING, camel."""
    parts = [p for p in (prefix, *word.split("_"), suffix) if p]
    return ["-".join(parts), "_".join(parts), "_".join(parts).upper(),
            parts[0] + "".join(p.title() for p in parts[1:])]


def _generated_names(n: int = 120) -> list[str]:
    rng = random.Random(38)
    combos = list(itertools.product(PREFIXES, WORDS, SUFFIXES))
    rng.shuffle(combos)
    names = []
    for prefix, word, suffix in combos:
        names.extend(_styles(prefix, word, suffix))
    return sorted(set(names))[:n] if n < len(names) else sorted(set(names))


NAMES = _generated_names()


@pytest.mark.parametrize("name", NAMES)
def test_a_generated_secret_name_loses_its_value_in_every_spelling(name: str) -> None:
    assert redact.secret_name(name), name
    spellings = [[f"--{name}", SECRET], [f"--{name}={SECRET}"], [f"--{name}:{SECRET}"],
                 [f"-{name}", SECRET], [f"{name}={SECRET}"],
                 ["bash", "-c", f"{name}={SECRET} python train.py --lr 1"],
                 ["bash", "-c", f"python train.py --{name} {SECRET} --lr 1"],
                 ["sh", "-c", f"sh -c 'python t.py --{name}={SECRET}' && echo ok"],
                 ["python", "t.py", f"https://h/p?a=1&{name}={SECRET}&b=2"],
                 ["python", "t.py", f'{{"{name}": "{SECRET}", "n": 1}}'],
                 ["python", "-c", f"import os; os.environ['{name}'] = '{SECRET}'"],
                 ["curl", "-H", f"{name}: {SECRET}"]]
    for argv in spellings:
        out = redact.argv(argv)
        assert SECRET not in " ".join(out), (argv, out)
        assert redact.REDACTED in " ".join(out), (argv, out)
    assert redact.env({name: SECRET}) == {name: redact.REDACTED}


@pytest.mark.parametrize("scheme", ["postgres", "postgresql", "mysql", "https", "http", "ray",
                                    "s3", "gs", "redis", "amqp", "mongodb+srv", "ftp"])
@pytest.mark.parametrize("where", ["arg", "shell", "env", "flag"])
def test_url_userinfo_of_any_scheme(scheme: str, where: str) -> None:
    url = f"{scheme}://admin:{SECRET}@db.example.com:5432/x?y=1"
    lone = f"{scheme}://{SECRET}@host.example.com/repo"
    for u, kept in ((url, f"{scheme}://admin:REDACTED@db.example.com:5432/x?y=1"),
                    (lone, f"{scheme}://REDACTED@host.example.com/repo")):
        if where == "env":
            text = redact.env({"RAY_ADDRESS": u})["RAY_ADDRESS"]
        elif where == "shell":
            text = redact.argv(["bash", "-c", f"python t.py --db {u}"])[2]
        elif where == "flag":
            text = redact.argv([f"--url={u}"])[0]
        else:
            text = redact.argv(["python", "t.py", u])[2]
        assert SECRET not in text and kept in text, text


@pytest.mark.parametrize("value, kept", [
    (f"ops:{SECRET}@10.0.0.1", "ops:REDACTED@10.0.0.1"),          # MASTER_ADDR, no scheme
    (f'{{"Authorization": "Bearer {SECRET}"}}', '"Authorization": "REDACTED"'),
    (f'{{"X-Api-Key": "{SECRET}", "Accept": "json"}}', '"Accept": "json"'),
    (f"Bearer {SECRET}", "Bearer REDACTED"),
    (f"Authorization: Basic {SECRET}", "Authorization: Basic REDACTED"),
    (f"https://b.s3.amazonaws.com/o?X-Amz-Algorithm=AWS4&X-Amz-Signature={SECRET}&X-Amz-Date=1",
     "X-Amz-Algorithm=AWS4&X-Amz-Signature=REDACTED&X-Amz-Date=1"),
    (f"https://a.blob.core.windows.net/c/f?sv=2020&se=2030&sig={SECRET}", "sig=REDACTED"),
    (f"https://storage.googleapis.com/b/o?X-Goog-Credential=a&X-Goog-Signature={SECRET}",
     "X-Goog-Signature=REDACTED"),
    (f"https://h/p?token={SECRET}#frag", "token=REDACTED#frag"),
    (f"https://h/p?access_token={SECRET}&page=2", "access_token=REDACTED&page=2"),
    (f"x=--token={SECRET}", "x=--token=REDACTED"),
])
def test_values_recognised_by_shape_whatever_the_name(value: str, kept: str) -> None:
    env = redact.env({"MASTER_ADDR": value, "RAY_JOB_HEADERS": value})
    for v in env.values():
        assert SECRET not in v and kept in v, v
    arg = redact.argv(["python", "t.py", value])[2]
    assert SECRET not in arg and kept in arg, arg


@pytest.mark.parametrize("token", [
    "ghp_" + "a1B2" * 9, "github_pat_11ABCDEFG0" + "x" * 40, "hf_" + "AbCdEfGh" * 5,
    "sk-proj-" + "Zz09" * 10, "AKIA" + "ABCDEFGHIJKLMNOP", "xoxb-1234-5678-" + "a" * 20,
    "AIza" + "B" * 35, "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.SflKxwRJSMeKKF2QT4fwpMeJf36",
    "glpat-" + "x9" * 10])
def test_tokens_with_an_issuers_prefix_go_wherever_they_stand(token: str) -> None:
    for argv in (["python", "t.py", token], ["bash", "-c", f"python t.py {token}"],
                 ["python", "t.py", f"--model-repo=https://h/{token}/x"]):
        assert token not in " ".join(redact.argv(argv)), argv
    assert token not in redact.env({"RAY_RUNTIME_ENV_HOOK": token})["RAY_RUNTIME_ENV_HOOK"]


@pytest.mark.parametrize("argv, kept", [
    (["curl", "-u", f"alice:{SECRET}", "https://h/"], "alice:REDACTED"),
    (["curl", f"--user=alice:{SECRET}"], "--user=alice:REDACTED"),
    (["bash", "-c", f"curl --proxy-user bob:{SECRET} https://h/"], "bob:REDACTED"),
])
def test_user_and_password_of_curl(argv: list[str], kept: str) -> None:
    out = " ".join(redact.argv(argv))
    assert SECRET not in out and kept in out, out



@pytest.mark.parametrize("argv", [
    ["curl", "-H", f"Authorization: Bearer {SECRET}"],
    ["t", "--auth", SECRET], ["t", "-p", SECRET], ["t", "--passphrase", SECRET],
    ["t", "--bearer", SECRET], ["t", "--access-key-id", SECRET], ["t", f"--api_key:{SECRET}"],
    ["t", f"--api-key={SECRET}"], ["t", "--token", f"two words {SECRET}"],
    ["t", f"MY_PASSWORD=a b {SECRET}"],                 # one argument, not a shell string
    ["env", f"EXTRA_ARGS=--lr 1 --hub-token {SECRET}", "python", "t.py"],
    ["t", f"--extra=--foo -p {SECRET}"],
    ["bash", "-c", f"HF_TOKEN={SECRET} python train.py"],
    ["bash", "-c", f"python t.py --api-key={SECRET}"],
    ["bash", "-c", f"curl -H 'Authorization: Bearer {SECRET}' https://h/"],
    ["bash", "-c", f"bash -c \"sh -c 'DB_PASSWORD={SECRET} true'\""],
    ["bash", "-c", f"echo 'unclosed --token={SECRET}"],        # no shell parse: by shape
    ["torchrun", "--nproc-per-node", "2", "t.py", "--hub-token", SECRET],
])
def test_the_issues_cases(argv: list[str]) -> None:
    out = redact.argv(argv)
    assert SECRET not in "\x00".join(out), out
    assert len(out) == len(argv)


def test_shell_strings_keep_what_is_not_secret() -> None:
    out = redact.argv(["bash", "-c", f"HF_TOKEN={SECRET} python train.py --lr 0.1 && echo ok"])
    assert out == ["bash", "-c", "HF_TOKEN=REDACTED python train.py --lr 0.1 && echo ok"]
    same = ["bash", "-c", "python train.py --lr 0.1 | tee 'log file.txt'"]
    assert redact.argv(same) == same                 # nothing to redact: spelled as given


@pytest.mark.parametrize("argv", [
    ["python", "train.py", "--tokenizer", "gpt2", "--max-tokens", "512", "--lr=0.1"],
    ["python", "-m", "pkg.train", "--pin-memory", "--author", "me", "--keys", "a,b"],
    ["torchrun", "--nproc-per-node=2", "--master-addr", "10.0.0.1:29500", "t.py"],
    ["python", "t.py", "user@example.com", "host:8080", "pkg.mod:fn", "git@github.com:o/r"],
    ["python", "t.py", "s3://bucket/key/part-0.parquet", "https://example.com/a?b=1&c=2"],
    ["bash", "-c", "python t.py --batch-size 64 && echo Basic usage: token count"],
])
def test_what_is_not_a_secret_stays(argv: list[str]) -> None:
    assert redact.argv(argv) == argv


def test_redaction_is_idempotent_and_error_words() -> None:
    argv = ["bash", "-c", f"A_TOKEN={SECRET} python t.py https://u:{SECRET}@h/"]
    once = redact.argv(argv)
    assert redact.argv(once) == once
    assert redact.word(f"API_KEY={SECRET}") == "API_KEY=REDACTED"
    assert redact.needed(f"API_KEY={SECRET}") and not redact.needed("train.py")


@pytest.mark.parametrize("argv, stem", [
    (["bash", "-c", f"HF_TOKEN={SECRET} python train.py"], "train"),
    (["python", "--token", "stolen.py", "real.py"], "real"),
    (["bash", "-c", f"python --api-key={SECRET}.py main.py"], "main"),
    ([f"API_KEY={SECRET}", "python"], "profile"),
    (["python", "-m", "pkg.fit"], "fit"),
    (["torchrun", "--nnodes", "1", "ddp.py"], "ddp"),
])
def test_the_default_name_is_the_scripts_stem_never_a_secret(argv: list[str], stem: str) -> None:
    from stallbench.profile.session import default_name

    assert default_name(argv) == stem
