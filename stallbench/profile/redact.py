"""Secret-looking values out of what a profile result records (the command and environment).

One rule for arguments and variables: a name that looks like a secret (``token``, ``*_KEY``,
``*KEY``, ``*_SECRET``, ``*PASSWORD*``, ``*PASSWD*``, ``api-key``; case-insensitive) has its
value replaced by ``REDACTED``. Arguments come as ``--token VALUE``, ``--token=VALUE`` or
``NAME=VALUE``. The fingerprint is made from the redacted command too, so a rotated token
does not make two runs incomparable."""

from __future__ import annotations

import re

REDACTED = "REDACTED"
_SECRET = re.compile(r"(token|secret|passw(or)?d|(^|[_\-.])key$|api[_\-]?key|credential)",
                     re.IGNORECASE)


def secret_name(name: str) -> bool:
    return bool(_SECRET.search(name.lstrip("-")))


def argv(args: list[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for a in args:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = a.partition("=")
        if eq and (name.startswith("-") or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", name)) \
                and secret_name(name):
            out.append(f"{name}={REDACTED}")
        elif a.startswith("-") and not eq and secret_name(a):
            out.append(a)
            hide_next = True
        else:
            out.append(a)
    return out


def env(variables: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if secret_name(k) else v) for k, v in variables.items()}
