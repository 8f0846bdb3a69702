"""What a result records about the job it was given: the allow-list (``profile.record``).

The property test plants random secrets in random shapes of a command line, an environment
and a working directory (the shapes four hostile campaigns used, drawn and combined at random,
each secret from a random alphabet: URL-safe, hex, with ``/``, ``?`` or ``'`` inside, with an
issuer's prefix) and checks that no sink of the record carries any of them, nor any run of
six of their letters and digits. The draws are seeded (the seed is in the failure message) and
differ per case; nothing in the rule knows the shapes, which is the point of an allow-list.
"""

from __future__ import annotations

import json
import random
import re
import string

import pytest

from stallbench.profile import record, session

HIDDEN = record.HIDDEN


def _secret(rng: random.Random) -> str:
    kind = rng.randrange(6)
    body = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(rng.randint(10, 28)))
    body = re.sub(r"^\d+", "", body) or "x" + body        # a letter in it: numbers are values
    if not re.search(r"[A-Za-z]", body):
        body = "q" + body
    if kind == 0:
        return body
    if kind == 1:
        return rng.choice(["ghp_", "hf_", "sk-", "AKIA", "xoxb-", "glpat-"]) + body
    if kind == 2:
        return body[:6] + rng.choice("/?&#%+'") + body[6:]
    if kind == 3:
        return "".join(rng.choice("0123456789abcdef") for _ in range(32)) + "g"
    if kind == 4:
        return body.upper()
    return body + "-" + body[::-1]


def _name(rng: random.Random) -> str:
    return rng.choice(["token", "api-key", "hub-tok", "pw", "pass", "auth", "data", "x", "lr",
                       "config", "secret", "aws-secret", "bucket", "db_password", "key"])


def _shape(rng: random.Random, s: str) -> list[str]:
    """One way a secret stands in a command line (the campaigns' shapes, and more)."""
    n = _name(rng)
    shapes = [
        [f"--{n}", s], [f"--{n}={s}"], [f"--{n}:{s}"], [f"-p{s}"], [f"-{rng.choice('pPuk')}", s],
        [f"{n.upper().replace('-', '_')}={s}"], [f"--{n} {s}"], [s],
        [f"postgres://admin:{s}@db:5432/x"], [f"https://{s}@github.com/o/r.git"],
        [f"https://h/x?token={s}&a=1"], ["-H", f"Authorization: Bearer {s}"],
        [json.dumps({"auth": {"user": "u", "value": s}})], [json.dumps({"note": f"it's {s}"})],
        ["--netrc", f"machine h login u password {s}"],
        ["aws", "configure", "set", "aws_secret_access_key", s],
        ["-u", f"alice:{s}"], [f"db.password={s}"], [f"trainer.{n.replace('-', '_')}={s}"],
        ["bash", "-c", f"{n.upper().replace('-', '_')}={s} python t.py --x {s}"],
        ["sh", "-c", f"curl -H 'X-Key: {s}' https://h && echo {s}"],
        ["python", "-c", f"import os; os.environ['T'] = '{s}'"],
        [f"{s}.txt"], [f"/data/{s}/part-0.parquet"],
    ]
    return rng.choice(shapes)


def _command(rng: random.Random, secrets: list[str], cwd: str) -> list[str]:
    prog = rng.choice([["python", "train.py"], ["python3", f"{cwd}/sub/train.py"],
                       ["torchrun", "--nnodes", "2", "--nproc-per-node=4", "train.py"],
                       ["bash", "-lc"], ["python", "-m", "pkg.train"], ["env", "RANK=0", "python"]])
    argv = list(prog)
    if prog == ["bash", "-lc"]:
        inner = []
        for s in secrets:
            inner += _shape(rng, s)
        return argv + [" ".join(_quote(w) for w in ["python", "t.py", *inner])]
    for s in secrets:
        argv += _shape(rng, s)
        if rng.random() < 0.5:
            argv += rng.choice([["--lr", "0.001"], ["--epochs", "3"], ["--fp16"], ["-v"]])
    return argv


def _quote(w: str) -> str:
    import shlex
    return shlex.quote(w)


def _runs(text: str, secret: str) -> list[str]:
    """The secret's runs of six or more letters and digits: none may show."""
    return [r for r in re.findall(r"[A-Za-z0-9]+", secret) if len(r) >= 6]


def _sinks(argv: list[str], env: dict[str, str], cwd: str) -> dict[str, str]:
    return {"command": json.dumps(record.command(argv, cwd=cwd)),
            "shown": record.shown(argv),
            "word": record.word(argv[0]),
            "own argv": json.dumps(record.own_argv(["stallbench", "profile", "--out", cwd,
                                                    "--", *argv])),
            "environment": json.dumps(record.environment(env)),
            "workdir": record.workdir(cwd),
            "default name": session.default_name(argv),
            # the script as given is read for its digest, never recorded: only these are
            "found": repr((record.found(argv, cwd).script, record.found(argv, cwd).module))}


@pytest.mark.parametrize("seed", range(300))
def test_random_secrets_in_random_shapes_reach_no_sink(seed: int) -> None:
    rng = random.Random(seed)
    secrets = [_secret(rng) for _ in range(rng.randint(1, 4))]
    cwd = f"/home/u/{rng.choice(secrets)}/proj" if rng.random() < 0.3 else "/home/u/proj"
    argv = _command(rng, secrets, cwd)
    env = {"OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "0,1"}
    for s in secrets:
        env[rng.choice(["HF_TOKEN", "MY_SERVICE_PASSWORD", "NCCL_SOCKET_IFNAME", "MASTER_ADDR",
                        "RAY_ADDRESS", "RAY_JOB_HEADERS", "TORCH_HUB_AUTH", "WANDB_NOTES",
                        "PYTORCH_CUDA_ALLOC_CONF", "SLURM_JOB_NAME", "RANK"])] = rng.choice(
            [s, f"ray://svc:{s}@head:10001", f"ops:{s}@10.0.0.1", json.dumps({"k": s})])
    for sink, text in _sinks(argv, env, cwd).items():
        for s in secrets:
            leaked = [r for r in _runs(text, s) if r in text]
            assert not leaked, (f"seed {seed}: {leaked} of secret {s!r} in {sink}: {text!r} "
                                f"(argv {argv!r}, env {env!r}, cwd {cwd!r})")


@pytest.mark.parametrize("argv,recorded", [
    (["python", "train.py", "--lr", "0.001", "--epochs=3", "--fp16", "--device", "cuda:0"],
     ["python", "train.py", "--lr", "0.001", "--epochs=3", "--fp16", "--device", "cuda:0"]),
    (["torchrun", "--nnodes", "2", "--nproc-per-node=4", "--rdzv-backend", "c10d",
      "--rdzv-endpoint", "127.0.0.1:29500", "-m", "pkg.train", "trainer.max_epochs=10",
      "data.path=/mnt/d", "--data", "/mnt/d"],
     ["torchrun", "--nnodes", "2", "--nproc-per-node=4", "--rdzv-backend", "c10d",
      "--rdzv-endpoint", "127.0.0.1:29500", "-m", "pkg.train", "trainer.max_epochs=10",
      f"data.path={HIDDEN}", "--data", HIDDEN]),
    (["python", "/home/u/proj/sub/train.py", "--password", "1234", "--pin", "8"],
     ["python", "sub/train.py", "--password", HIDDEN, "--pin", "8"]),
    (["python", "/elsewhere/x/train.py"], ["python", "train.py"]),
    (["bash", "-lc", "HF_TOKEN=x python t.py --workers 2 && echo done"],
     ["bash", "-lc", f"HF_TOKEN={HIDDEN} python t.py --workers 2 && echo {HIDDEN}"]),
    (["python", "-c", "print(1)"], ["python", "-c", HIDDEN]),
    (["python", "-u", "-pSECRET", "-O"], ["python", "-u", f"-p{HIDDEN}", "-O"]),
])
def test_what_is_kept(argv: list[str], recorded: list[str]) -> None:
    """The program, the script (relative to the working directory, or its name alone), flag
    names, numbers, booleans, enumerations and dotted overrides of them, addresses without
    credentials; a number after a secret-named flag is hidden all the same."""
    assert record.command(argv, cwd="/home/u/proj") == recorded


def test_record_argv_keeps_values_redacted_as_before() -> None:
    argv = ["python", "t.py", "/data/x", "--token", "abc", "caf\udce9"]
    assert record.command(argv, keep_values=True) == ["python", "t.py", "/data/x", "--token",
                                                      "REDACTED", "caf\udce9"]


def test_environment_by_name_then_by_value() -> None:
    env = {"OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "GPU-1a2b3c4d-0000-1111,1",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "RAY_ADDRESS": "auto",
           "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0", "HF_TOKEN": "x",
           "RAY_AUTH_TOKEN": "y", "HOME": "/root", "PATH": "/usr/bin", "WANDB_API_KEY": "z",
           "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128"}
    assert record.environment(env) == {
        "CUDA_VISIBLE_DEVICES": "GPU-1a2b3c4d-0000-1111,1", "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": HIDDEN,
        "OMP_NUM_THREADS": "4", "PYTORCH_CUDA_ALLOC_CONF":
            "expandable_segments:True,max_split_size_mb:128", "RAY_ADDRESS": "auto"}


def test_the_working_directory_is_a_fingerprint() -> None:
    a, b = record.workdir("/home/u/ghp_abcdefghijklmnop"), record.workdir("/home/u/other")
    assert a.startswith("sha256:") and a != b and "ghp" not in a


@pytest.mark.parametrize("argv,name", [
    (["python", "train.py"], "train"), (["python", "-m", "pkg.train"], "train"),
    (["bash", "-c", "HF_TOKEN=hf_x python sub/train.py"], "train"),
    (["torchrun", "--nproc-per-node", "2", "train.py"], "train"),
    (["API_KEY=x", "python"], "profile"), (["./run_job"], "run_job"),
])
def test_the_default_name_comes_from_recorded_words(argv: list[str], name: str) -> None:
    assert session.default_name(argv) == name
