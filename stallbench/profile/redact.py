"""Secrets out of everything stallbench records or prints about the user's command: ONE rule
for every sink (the terminal's lines, the result's ``scenario``/``profile``/``settings``, the
result's file name, the trace, the report, ``history``, error lines). Issue 38, class 1.

Why one module: a secret that one sink redacts and another prints is a leak all the same (the
file name came from the unredacted command while ``scenario.text`` was redacted). Every sink
takes the command as ``argv(...)`` returns it, a single word as ``word(...)``, free text as
``text(...)``, variables as ``env(...)``; nothing formats the raw command itself.

What is a secret, by name and by shape (both, always):

- by NAME (``secret_name``): a name whose parts (split at ``-_.:`` and camelCase) hold a
  secret word: token, secret, password/passwd/pwd, passphrase, pass, auth/authorization,
  bearer, credential(s), cookie, signature/sig, ``key`` as the last part, before ``id`` or a
  number, or after ``api``/``access``/``private``/... (``API_KEY``, ``--access-key-id``,
  ``ACCESS_KEY_2``; not ``--key-column``), or ``apikey``/``privatekey``-style compounds;
  plus the short flag ``-p`` (a password for mysql, sshpass, ...). Its value goes, in every
  spelling: ``--name VALUE``, ``--name=VALUE``, ``--name:VALUE``, ``NAME=VALUE`` (at any
  depth: inside a shell string, a query string, a JSON object, Python source), and the value
  of an environment variable with that name.
- by SHAPE, whatever the name: URL userinfo of any scheme (``postgres://admin:X@db``,
  ``ray://``, ``s3://``, ``https://TOKEN@host``; the user is kept when a password follows),
  ``user:X@host`` without a scheme (``MASTER_ADDR=ops:X@10.0.0.1``), ``Bearer X`` /
  ``Authorization: Basic X`` headers (``-H 'Authorization: Bearer X'``, a JSON headers
  object), query parameters of signed URLs (``X-Amz-Signature``, ``sig``, ``token``:
  their names are secret names), ``-u user:X`` (curl's credentials), and tokens whose issuers
  give them a prefix (``ghp_``, ``hf_``, ``sk-``, ``AKIA``, ``xoxb-``, ``AIza``, JWTs).
- shell strings (``bash -c "HF_TOKEN=x python t.py --api-key=X"``) are parsed as a shell
  parses them (``shlex``, operators kept) and each word redacted as an argument, recursively;
  a string that changed is re-joined with shell quoting, so it still reads as the command.

Over-redaction is the accepted error: ``--tokenizer`` keeps its value (its parts are not
secret words) but ``-p 8080`` loses its port. The fingerprint is made from the redacted
command too, so a rotated token does not make two runs incomparable.
"""

from __future__ import annotations

import re
import shlex

REDACTED = "REDACTED"
MAX_DEPTH = 8           # shell strings inside shell strings: deeper ones are redacted whole

# A secret word, as one part of a name (parts: split at non-alphanumerics and camelCase).
_WORDS = {"token", "secret", "secrets", "password", "passwords", "passwd", "pwd",
          "passphrase", "pass", "auth", "authorization", "authz", "authn", "oauth",
          "authentication", "bearer", "credential", "credentials", "creds", "cred", "cookie",
          "cookies", "signature", "sig", "sessionid", "apikey", "privatekey",
          "accesskey", "secretkey", "authkey", "authtoken", "accesstoken", "refreshtoken",
          "hftoken", "sas", "jwt"}
# compounds written as one part ("APIKEY", "mytoken", "dbpassword")
_COMPOUND = re.compile(r"(token$|secret|passw(or)?d|passphrase|apikey|privatekey|accesskey|"
                       r"secretkey|authkey|credential|bearer)", re.IGNORECASE)
_SHORT_SECRET_FLAGS = {"-p"}
# "key" is a secret word as the last part, before one of these, before a number, or after one
# of _KEY_BEFORE ("--key-column" is not; "ACCESS_KEY_2", "--api-key-file-value" are)
_KEY_NEXT = {"id", "secret", "value", "data", "string", "text", "b64", "base64", "hex", "pem"}
_KEY_BEFORE = {"api", "access", "secret", "private", "auth", "signing", "encryption", "client",
               "ssh", "license", "licence", "subscription", "master", "service", "account",
               "app", "consumer", "hmac", "shared", "storage", "openai", "wandb", "hf"}
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NAME_CHARS = r"[A-Za-z_][A-Za-z0-9_.\-]*"


def _parts(name: str) -> list[str]:
    return [p for p in re.split(r"[^A-Za-z0-9]+", _CAMEL.sub("_", name).lower()) if p]


def secret_name(name: str) -> bool:
    """Whether a variable, flag, header, query or JSON key NAME holds a secret value."""
    if name in _SHORT_SECRET_FLAGS:
        return True
    parts = _parts(name)
    for i, p in enumerate(parts):
        if p in _WORDS or _COMPOUND.search(p):
            return True
        if p == "key" and (i == len(parts) - 1 or parts[i + 1] in _KEY_NEXT
                                     or parts[i + 1].isdigit()
                                     or (i > 0 and parts[i - 1] in _KEY_BEFORE)):
            return True
    return False


# ------------------------------------------------------------------------------ by shape
# Every pattern is linear in its input (a start only where a name can start, bounded runs): an
# argument may be 128 KB of base64, and a quadratic scan of it took a minute.
_URL_USERINFO = re.compile(r"(?<![A-Za-z0-9+.\-])(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]{0,31}://)"
                           r"(?P<info>[^/?#\s'\"]*)@")
_BARE_USERINFO = re.compile(            # user:secret@host, no scheme (MASTER_ADDR=ops:X@h)
    r"(?<![\w/:@.%+\-])(?P<user>[\w.%+\-]{1,256}):(?P<pw>[^\s/@'\":]+)@(?=[\w\[])")
_AUTH_KINDS = ("bearer", "basic", "digest", "token", "bot", "negotiate", "aws4-hmac-sha256")
_AUTH_SCHEME = re.compile(r"\b(?P<kind>Bearer|Basic|Digest|Token|Bot|Negotiate|AWS4-HMAC-SHA256)"
                          r"(?P<sp>\s+)(?P<v>[^\s'\",}\]]+)", re.IGNORECASE)
# NAME=VALUE / NAME: VALUE / "NAME": "VALUE" / ['NAME']='VALUE' / ?NAME=VALUE&, anywhere: the
# name and separator first; the value is read only after a secret name (reading every value
# of "a:a:a:..." to its end made the scan quadratic)
_PAIR = re.compile(
    r"(?P<q1>['\"]?)(?P<name>(?<![\w])-{0,2}[A-Za-z_][\w.\-]{0,127})(?P=q1)\]?"
    r"(?P<sep>\s{0,8}(?:=|:(?!//))\s{0,8})")
_VALUE = re.compile(r"(?P<q2>['\"])(?P<qv>[^'\"]*)(?P=q2)|(?P<v>[^\s&;,#'\")}\]]+)")


def _userinfo(m: re.Match[str]) -> str:
    info = m.group("info")
    if not info or info == REDACTED:
        return m.group(0)
    user, colon, _ = info.partition(":")
    return f"{m.group('scheme')}{user}:{REDACTED}@" if colon else f"{m.group('scheme')}{REDACTED}@"


def _pairs(s: str) -> str:
    """Every ``NAME=VALUE`` (and ``NAME: VALUE``, quoted or not) whose name is a secret name,
    with its value redacted. A pair whose name is not secret is stepped over only up to its
    separator: its value may hold a pair of its own (``x=--token=X``)."""
    out, pos = [], 0
    while True:
        m = _PAIR.search(s, pos)
        if m is None:
            break
        v = _VALUE.match(s, m.end()) if secret_name(m.group("name")) else None
        value = (v.group("qv") if v.group("q2") else v.group("v")) if v else ""
        if not value or value == REDACTED or value.lower() in _AUTH_KINDS:
            out.append(s[pos:m.end("sep")])      # "Authorization: Bearer X": _auth's
            pos = m.end("sep")
            continue
        start, end = v.span("qv") if v.group("q2") else v.span("v")
        out.append(s[pos:start] + REDACTED)
        pos = end
    out.append(s[pos:])
    return "".join(out)


def _auth(m: re.Match[str]) -> str:
    if m.group("v") == REDACTED:
        return m.group(0)
    # "Token" and "Basic" are words of prose too: only as a secret-named header's value
    kind = m.group("kind").lower()
    if kind in ("token", "basic", "digest", "bot", "negotiate") and not _header_before(m):
        return m.group(0)
    return f"{m.group('kind')}{m.group('sp')}{REDACTED}"


_HEADER_BEFORE = re.compile(r"(?<![\w.\-])([A-Za-z_][\w.\-]{0,127})['\"]?\s{0,8}[:=]\s{0,8}['\"]?\Z")


def _header_before(m: re.Match[str]) -> bool:
    """Whether ``Basic X`` is the value of a secret-named header or key (``Authorization:``,
    ``"Proxy-Authorization": "``, ``auth=``); "usage: Token count" is prose."""
    h = _HEADER_BEFORE.search(m.string[max(0, m.start() - 300):m.start()])
    return bool(h) and secret_name(h.group(1))


# tokens whose issuers give them a recognisable prefix, wherever they stand (a positional
# argument, a variable with a neutral name): GitHub, GitLab, Hugging Face, OpenAI/Anthropic-
# style "sk-", AWS access key ids, Slack, Google API keys, JWTs
_KNOWN_TOKEN = re.compile(
    r"(?<![A-Za-z0-9])(?:(?:ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{20,}|glpat-[\w\-]{20,}"
    r"|hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_\-]{20,}|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}|AIza[0-9A-Za-z_\-]{35}"
    r"|eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,})")


def shapes(s: str) -> str:
    """``s`` with every secret recognised by shape or by a secret name beside it replaced."""
    if not s:
        return s
    s = _KNOWN_TOKEN.sub(REDACTED, s)
    s = _URL_USERINFO.sub(_userinfo, s)
    s = _BARE_USERINFO.sub(lambda m: m.group(0) if m.group("pw") == REDACTED
                           else f"{m.group('user')}:{REDACTED}@", s)
    s = _AUTH_SCHEME.sub(_auth, s)
    s = _pairs(s)
    return s


# ------------------------------------------------------------------------------ commands
_OPERATORS = set("();<>|&")
_USER_FLAGS = {"-u", "--user", "-U", "--proxy-user"}    # their value: user[:password]


def shell_words(s: str) -> list[str] | None:
    """``s`` split as a POSIX shell splits it (operators ``&& | ;`` as words of their own);
    None when it does not parse (an unclosed quote): then it is redacted as text."""
    try:
        lex = shlex.shlex(s, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        return list(lex)
    except ValueError:
        return None


def _join(words: list[str]) -> str:
    return " ".join(w if w and set(w) <= _OPERATORS else shlex.quote(w) for w in words)


def _shell(s: str, depth: int) -> str:
    """A shell string (``bash -c "..."``): its words redacted as a command, re-joined when any
    changed (the original spelling otherwise)."""
    if depth >= MAX_DEPTH:
        return REDACTED
    s = shapes(s)
    words = shell_words(s)
    if words is None:
        return shapes(s)
    red = _words(words, depth + 1)
    return s if red == words else _join(red)


def _flag_name(a: str) -> tuple[str, str, str] | None:
    """``--name=V`` / ``--name:V`` / ``NAME=V`` -> (name, separator, value); None otherwise."""
    m = re.match(rf"(-{{1,2}}{_NAME_CHARS}|{_NAME_CHARS})([=:])(.*)\Z", a, re.DOTALL)
    if not m:
        return None
    if m.group(2) == ":" and not m.group(1).startswith("-"):
        return None                 # "host:port", "pkg.mod:fn": not an assignment
    return m.group(1), m.group(2), m.group(3)


def _words(args: list[str], depth: int) -> list[str]:
    out: list[str] = []
    hide_next = False
    shell_next = False
    user_next = False
    for a in args:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if user_next:               # curl -u user:password, --proxy-user user:password
            user_next = False
            if ":" in a:
                out.append(a.split(":", 1)[0] + ":" + REDACTED)
                continue
        if a in _USER_FLAGS:
            out.append(a)
            user_next = True
            continue
        is_shell, shell_next = shell_next, False
        fl = _flag_name(a)
        if fl and fl[0] in _USER_FLAGS and ":" in fl[2]:
            out.append(f"{fl[0]}{fl[1]}{fl[2].split(':', 1)[0]}:{REDACTED}")
            continue
        if fl and secret_name(fl[0]):
            name, sep, value = fl
            if name.startswith("-") or not (is_shell or depth > 0) or not re.search(r"\s", value):
                out.append(f"{name}{sep}{REDACTED}")
                continue
            # NAME=value inside a shell string: the shell ends the value at a blank
        if a.startswith("-") and not fl and secret_name(a):
            out.append(a)
            hide_next = True
            continue
        if re.search(r"\s", a) and fl and not (is_shell or depth > 0):
            # one argument NAME=VALUE whose value holds blanks (env EXTRA="--token X" ...):
            # the value is what a shell will be given
            out.append(f"{fl[0]}{fl[1]}{_shell(fl[2], depth)}")
        elif re.search(r"\s", a):
            out.append(_shell(a, depth))
        else:
            out.append(shapes(a))
        if re.fullmatch(r"-[a-z]*c", a):        # sh -c / bash -lc / python -c: a program next
            shell_next = True
    return out


def argv(args: list[str]) -> list[str]:
    """The command as every sink records and prints it."""
    return _words(list(args), 0)


def shown(args: list[str]) -> str:
    """The command as a terminal line shows it: redacted, shell-quoted, on ONE line (a
    newline inside an argument, a job's ``"X\\n::error ..."``, would otherwise start a line
    of its own, and a CI runner executes a line that starts with ``::``)."""
    from ..outputs import one_line
    return one_line(shlex.join(argv(args)))


def word(a: str) -> str:
    """One word of a command (``cannot start 'API_KEY=X'``), redacted as an argument."""
    return argv([a])[0]


def text(s: str) -> str:
    """Free text that may quote the command (an error line, a variable's value): redacted by
    shape and name, then word by word as a shell would split it."""
    return _shell(s, 0) if re.search(r"\s", s) else word(s)


def needed(a: str) -> bool:
    """Whether ``a`` (one word) holds a secret: such a word never names anything."""
    return word(a) != a


def env(variables: dict[str, str]) -> dict[str, str]:
    """Variables as recorded: a secret name's value goes whole; any other value is redacted by
    shape (``MASTER_ADDR=ops:X@10.0.0.1``, ``RAY_JOB_HEADERS={"Authorization": "Bearer X"}``)."""
    return {k: (REDACTED if secret_name(k) else text(v)) for k, v in variables.items()}
