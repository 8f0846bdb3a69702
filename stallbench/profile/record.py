"""What stallbench records and prints about the job it was given: decided by an ALLOW-LIST,
here, for every sink (the terminal's lines, the result's ``scenario``, ``settings`` and
``profile`` fields, the result's file name, the report, ``history``, error lines).

Why an allow-list: four hostile campaigns each found a secret in a shape the deny-list
(``redact.py``: secret names, URL passwords, known token prefixes) did not know: an attached
``-pSECRET``, netrc content as a flag's value, ``aws configure set aws_secret_access_key X``
(a secret name, then its value as a plain word), ``'--token X'`` as one argument, a secret
under an ``"auth"`` object, a working directory named like a token. A deny-list has to know
every shape of a secret; an allow-list has to know only what explains a run, and what it
does not know is never shown. So a word is kept only when it is one of:

- the **program** (``python``, ``/usr/bin/torchrun``): a path-shaped first word;
- the **script** (``train.py``, ``run.sh``; ``-m pkg.train``): relative to the working
  directory when it lies inside it;
- a **flag name** (``--lr``, ``-m``, ``--nproc-per-node``; ``--name=`` of ``--name=VALUE``);
- a **value that is a number, a boolean or a known enumeration** (``0.1``, ``true``,
  ``nccl``, ``cuda:0``, ``bf16``), lists of them (``0,1``), and dotted overrides of them
  (``trainer.max_epochs=10``, ``dataloader.num_workers=0,2``);
- the words of a shell string (``bash -c "..."``), each judged the same way;

and every other word is ``<value>``: paths, names, URLs, JSON, free text, a token pasted
anywhere. A value after a flag whose name is a secret name (``--password 1234``) is
``<value>`` even when it is a number. ``--record-argv`` keeps every value, redacted by the
deny-list as before (``redact.argv``): the user's choice, for a command they know is clean.

Environment variables: by an allow-list of NAMES that explain a run (threads, devices, ranks,
torch, NCCL and Ray settings, Slurm's job shape), each value again only when it is a number,
a boolean, an enumeration, a device list or an address without credentials; every other
variable is not recorded at all. The working directory: a fingerprint (``sha256:...``), never
its path (a directory named like a token was recorded whole).

The fingerprint that says whether two profiles may be compared is made from the deny-list's
redaction (``session.fingerprint``): two runs of one script with other data paths differ, a
rotated token does not.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from dataclasses import dataclass
from typing import Mapping

from . import redact

HIDDEN = "<value>"

_NUMBER = re.compile(r"[+-]?(?:\d{1,16}(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?[kKmMgG]?\Z")
_BOOLS = {"true", "false", "yes", "no", "on", "off", "none", "null", "nil"}
# Enumerations that explain a run: devices, backends, precisions, start methods, modes,
# log levels, launchers' rendezvous backends. A word outside this set is a <value>.
_ENUMS = {
    "cpu", "cuda", "gpu", "mps", "xla", "tpu", "hpu", "xpu", "meta", "auto", "default",
    "gloo", "nccl", "mpi", "ucc", "c10d", "static", "etcd", "etcd-v2",
    "fp16", "bf16", "fp32", "fp64", "fp8", "float16", "bfloat16", "float32", "float64",
    "half", "float", "double", "int8", "amp", "mixed", "16-mixed", "bf16-mixed", "32-true",
    "ddp", "fsdp", "deepspeed", "dp", "zero1", "zero2", "zero3",
    "fork", "spawn", "forkserver", "thread", "threads", "process", "processes",
    "train", "eval", "test", "val", "validate", "fit", "predict", "debug", "info", "warn",
    "warning", "error", "critical", "trace", "version", "all", "subsys",
    "max", "min", "mean", "sum", "first", "last", "random", "sequential", "shuffle",
    "local", "streaming", "bulk", "rows", "columnar", "jagged", "arrow", "single_buffer",
    "zstd", "lz4", "gzip", "snappy", "uncompressed",
    # stallbench's own verbs (its own command line is recorded by the same rule)
    "run", "profile", "tune", "report", "gate", "whatif", "history", "serve",
}
_FLAG = re.compile(r"(-{1,2})([A-Za-z][A-Za-z0-9_.\-]{0,63})\Z")
_FLAG_VALUE = re.compile(r"(--?[A-Za-z][A-Za-z0-9_.\-]{0,63})([=:])(.*)\Z", re.DOTALL)
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}(?:\.[A-Za-z_][A-Za-z0-9_]{0,63}){0,15}\Z")
_OVERRIDE = re.compile(r"(\+{0,2}[A-Za-z_][A-Za-z0-9_.]{0,127})=(.*)\Z", re.DOTALL)
_PATH = re.compile(r"[A-Za-z0-9_./+\-]{1,4096}\Z")
_SCRIPT = re.compile(r"[^\s=@'\"`$;&|<>(){}\[\]*?!]{1,4096}\.(?:py|sh)\Z")
_SHELLS = {"sh", "bash", "zsh", "dash", "ksh"}
_IPV4 = re.compile(r"(?:\d{1,3}\.){3}\d{1,3}\Z")
_IPV6 = re.compile(r"\[?[0-9a-fA-F:]{2,45}\]?\Z")
_OPERATORS = set("();<>|&")


# ------------------------------------------------------------------------------ values
def plain_value(v: str) -> bool:
    """A number, a boolean, a known enumeration, or a list (``,`` / ``:``-pairs) of them."""
    if not v or len(v) > 256:
        return False
    low = v.lower()
    if _NUMBER.match(v) or low in _BOOLS or low in _ENUMS:
        return True
    if re.fullmatch(r"(cuda|xpu|hpu|npu|mps):\d{1,3}", low):
        return True
    if "," in v:
        return all(plain_value(p) for p in v.split(",") if p) and any(v.split(","))
    key, sep, val = v.partition(":")       # expandable_segments:True
    return bool(sep) and _DOTTED.match(key) is not None and plain_value(val)


def _value(v: str, secret: bool = False) -> str:
    """A value as recorded: itself when plain or an address without credentials, ``key=``
    kept for a dotted override, else hidden. ``secret``: it follows a secret-named flag:
    always hidden."""
    if secret:
        return HIDDEN
    if plain_value(v) or _host(v):
        return v
    m = _OVERRIDE.match(v)
    if m and not redact.secret_name(m.group(1)):
        return f"{m.group(1)}={_value(m.group(2))}"
    if m:
        return f"{m.group(1)}={HIDDEN}"
    return HIDDEN


def _script(w: str, cwd: str | None) -> str | None:
    """A script path as recorded, or None: not one. Relative to ``cwd`` when it lies inside
    it; else its file name alone (the directories above are the user's, not the run's)."""
    if not _SCRIPT.match(w):
        return None
    rel = os.path.normpath(w)
    if os.path.isabs(w):
        try:
            rel = os.path.relpath(w, cwd) if cwd else ".."
        except ValueError:
            rel = ".."
    return os.path.basename(w) if rel.startswith("..") else rel


def _program(w: str) -> str:
    return w if _PATH.match(w) and "=" not in w else HIDDEN


# ---------------------------------------------------------------------------- commands
@dataclass
class Found:
    """What the walk over a command met that names the job: the first script (as given, to
    read it; as recorded, to show it) and the first ``-m`` module."""

    script_given: str | None = None
    script: str | None = None
    module: str | None = None


def _command(words: list[str], cwd: str | None, depth: int,
             found: Found | None = None) -> list[str]:
    """One command's words as recorded (see the module docstring)."""
    found = found if found is not None else Found()
    out: list[str] = []
    prog = ""
    expect_program = True
    shell_next = code_next = module_next = secret_next = False
    for w in words:
        if w and set(w) <= _OPERATORS:             # && | ; inside a shell string
            out.append(w)
            expect_program = True
            continue
        if expect_program:
            m = _OVERRIDE.match(w)
            if m and not w.startswith("-") and "/" not in m.group(1):
                # NAME=VALUE before a command (a shell string's, env's)
                name = m.group(1)
                out.append(f"{name}={_value(m.group(2), redact.secret_name(name))}")
                continue
            out.append(_program(w))
            prog = os.path.basename(w)
            expect_program = prog == "env"         # env NAME=V ... program
            continue
        if shell_next:
            shell_next = False
            out.append(_shell(w, cwd, depth + 1, found))
            continue
        if code_next:                              # python -c CODE: source, never shown
            code_next = False
            out.append(HIDDEN)
            continue
        if module_next:
            module_next = False
            out.append(w if _DOTTED.match(w) else HIDDEN)
            if _DOTTED.match(w) and found.module is None and found.script is None:
                found.module = w
            continue
        secret, secret_next = secret_next, False
        fl = _FLAG.match(w)
        if fl:
            if fl.group(1) == "-" and len(fl.group(2)) > 2:   # -pSECRET, -lc: attached values
                out.append(f"-{fl.group(2)[0]}{HIDDEN}")
                continue
            out.append(w)
            secret_next = redact.secret_name(w)
            if re.fullmatch(r"-[a-z]?c", w):     # sh -c, bash -lc, python -c
                if prog.split(".")[0].startswith("python"):
                    code_next = True
                elif prog in _SHELLS:
                    shell_next = True
            elif w == "-m":
                module_next = True
            continue
        fv = _FLAG_VALUE.match(w)
        if fv:
            out.append(f"{fv.group(1)}{fv.group(2)}{_value(fv.group(3), redact.secret_name(fv.group(1)))}")
            continue
        script = None if secret else _script(w, cwd)
        if script is not None:
            out.append(script)
            if found.script is None and found.module is None:
                found.script_given, found.script = w, script
            continue
        out.append(_value(w, secret))
    return out


def _quote(w: str) -> str:
    """A recorded word as a line shows it: as it is when a shell would read it as one word
    (``<value>`` included: a record, not a command to paste), else in quotes."""
    if w and (set(w) <= _OPERATORS or re.fullmatch(r"[\w@%+=:,./<>\-]+", w)):
        return w
    return f"'{w}'" if "'" not in w else shlex.quote(w)


def _shell(s: str, cwd: str | None, depth: int, found: Found) -> str:
    """A shell string's words, each judged as a command's, joined again."""
    if depth > redact.MAX_DEPTH:
        return HIDDEN
    words = redact.shell_words(s)
    if not words:
        return HIDDEN
    return " ".join(_quote(w) for w in _command(words, cwd, depth, found))


def command(argv: list[str], cwd: str | None = None, keep_values: bool = False) -> list[str]:
    """The job's command as every sink records it. ``keep_values``: ``--record-argv``."""
    if keep_values:
        return redact.argv(argv)
    return _command(list(argv), cwd if cwd is not None else _cwd(), 0)


def found(argv: list[str], cwd: str | None = None) -> Found:
    """The script or module the command runs, as the allow-list sees it."""
    out = Found()
    _command(list(argv), cwd if cwd is not None else _cwd(), 0, out)
    return out


def shown(argv: list[str], keep_values: bool = False) -> str:
    """The command as a terminal line shows it: recorded words, on ONE line."""
    from ..outputs import one_line
    return one_line(" ".join(map(_quote, command(argv, keep_values=keep_values))))


def word(a: str) -> str:
    """The command's first word as an error line names it (``cannot start X``): the program's
    path when it is one, ``NAME=<value>`` for an assignment, else ``<value>``."""
    return _command([a], _cwd(), 0)[0]


def own_argv(argv: list[str]) -> list[str]:
    """stallbench's own command line (``stallbench profile --set ... -- python t.py ...``):
    the same rule, so the job's command after ``--`` is recorded as ``command`` does."""
    if "--" in argv:
        i = argv.index("--")
        return _command(argv[:i], _cwd(), 0) + ["--"] + command(argv[i + 1:])
    return _command(list(argv), _cwd(), 0)


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


# ------------------------------------------------------------------------- environment
_ENV_NAMES = {
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS", "VECLIB_MAXIMUM_THREADS", "OMP_PROC_BIND", "OMP_DYNAMIC",
    "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "MKL_DYNAMIC", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
    "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS", "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONOPTIMIZE",
    "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE",
    "RAY_ADDRESS",
}
_ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "NCCL_", "TORCH", "PYTORCH_", "RAY_", "CUDA_")
_DEVICE_ID = re.compile(r"(?:GPU|MIG)-[0-9a-fA-F\-/]{8,64}\Z")


def _host(v: str) -> bool:
    """An address that names no credential: an IP (v4 or v6) or localhost, with a port."""
    host, _, port = v.rpartition(":") if v.count(":") == 1 else (v, "", "")
    if port and not port.isdigit():
        return False
    return bool(host) and (host == "localhost" or _IPV4.match(host) is not None
                           or (v.count(":") > 1 and _IPV6.match(v) is not None))


def env_value(name: str, v: str) -> str:
    """An allow-listed variable's value as recorded."""
    if plain_value(v) or _DEVICE_ID.match(v) or (
            "," in v and all(_DEVICE_ID.match(p) or plain_value(p) for p in v.split(","))):
        return v
    if _host(v):
        return v
    if name == "RAY_ADDRESS" and v.startswith("ray://") and _host(v[6:]):
        return v
    return HIDDEN


def env_name_recorded(name: str) -> bool:
    """Whether a variable explains a run (and is no credential by its name)."""
    if redact.secret_name(name):
        return False
    return name in _ENV_NAMES or name.startswith(_ENV_PREFIXES)


def environment(variables: Mapping[str, str]) -> dict[str, str]:
    """The variables recorded with a result: allow-listed names only, values judged."""
    return {k: env_value(k, v) for k, v in sorted(variables.items()) if env_name_recorded(k)}


def workdir(cwd: str | None = None) -> str:
    """The working directory as recorded: a fingerprint of its path, never the path."""
    path = cwd if cwd is not None else (_cwd() or "")
    digest = hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"sha256:{digest}"
