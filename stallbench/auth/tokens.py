"""Shared-secret tokens: their shape, where they are read from, how they are compared, and which
addresses may go without one. One rule for every stallbench endpoint that takes a token:
``stallbench serve`` (Flight, ``executors/flight/auth.py``) and the endpoint of a multi-node
``profile``'s node rank 0 (``profile/nodes.py``).

Why on the ground floor: both users sit in wings that must not import each other, and the
Flight side imports ``pyarrow.flight`` (seconds) where the profile launcher must stay light.
Standard library only; nothing here prints or returns a token in a message.

The rules:

- a token is 16 to 4096 printable ASCII characters without spaces (``TOKEN_RULE``): long
  enough not to be guessed, short enough to travel in a header;
- it is read from an environment variable by NAME (a flag takes the name, never the value, so
  it never lands in a shell history, a process list or a recorded command);
- compared in constant time (``same``: ``hmac.compare_digest``);
- an endpoint listens beyond loopback only with one (``is_loopback`` says what loopback is:
  every address the host resolves to is 127.0.0.0/8 or ::1; ``0.0.0.0`` is not).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import secrets
import socket
from pathlib import Path

# Printable ASCII without spaces (an HTTP header value), long enough not to be guessed.
_TOKEN = re.compile(r"[!-~]{16,4096}")
TOKEN_RULE = ("16 to 4096 printable ASCII characters without spaces (e.g. the output of: "
              "python -c 'import secrets; print(secrets.token_urlsafe(32))')")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
_FILE_MAX = 64 * 1024


def new_token() -> str:
    """A fresh token (256 random bits)."""
    return secrets.token_urlsafe(32)


def valid_token(token: str) -> bool:
    return bool(_TOKEN.fullmatch(token))


def valid_env_name(name: str) -> bool:
    return bool(_ENV_NAME.fullmatch(name))


def token_from_env(name: str) -> str | None:
    """The token in environment variable ``name`` (None: unset or empty). Never printed."""
    value = os.environ.get(name, "")
    return value.strip() or None


def same(given: bytes, want: bytes) -> bool:
    """``given == want`` in time that does not depend on where they differ."""
    return hmac.compare_digest(given, want)


def is_loopback(host: str) -> bool:
    """``host`` names only this machine's loopback (127.0.0.0/8, ::1): every address it
    resolves to is one. ``0.0.0.0``, ``::`` and names of this machine's interfaces are not."""
    bare = host.strip("[]")
    if bare.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(bare, None)
    except (OSError, UnicodeError):
        return False
    addrs = {str(i[4][0]).split("%")[0] for i in infos}
    try:
        return bool(addrs) and all(ipaddress.ip_address(a).is_loopback for a in addrs)
    except ValueError:
        return False


def read_token(env_name: str | None, file: Path | None, env_flag: str = "--token-env",
               file_flag: str = "--token-file") -> str | None:
    """A token given by the NAME of an environment variable (``env_flag``) or a file
    (``file_flag``), None when neither is given; a ``UserError`` naming the flag, never
    quoting the token, otherwise. One rule for ``stallbench serve`` and ``profile --live``."""
    from ..errors import UserError

    if env_name is not None:
        if not valid_env_name(env_name):
            raise UserError(f"{env_flag}: expected the name of an environment variable "
                            "(letters, digits, _), not the token itself")
        token = token_from_env(env_name)
        if token is None:
            # the name is not repeated: a token pasted where the name belongs has a name's shape
            raise UserError(f"{env_flag}: no environment variable of the name given is set "
                            "(or it is empty); it must hold the token, and the flag takes "
                            "the variable's NAME, never the token itself")
        if not valid_token(token):
            raise UserError(f"{env_flag} {env_name}: the token must be {TOKEN_RULE}")
        return token
    if file is not None:
        try:
            with open(file, "rb") as f:
                raw = f.read(_FILE_MAX + 1)
        except OSError as exc:
            raise UserError(f"{file_flag} {file}: cannot read it ({exc.strerror or exc})") \
                from None
        try:
            token = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            token = ""
        if len(raw) > _FILE_MAX or not valid_token(token):
            raise UserError(f"{file_flag} {file}: the file must hold one token, {TOKEN_RULE}")
        return token
    return None
