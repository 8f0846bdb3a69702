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

# Printable ASCII without spaces (an HTTP header value), long enough not to be guessed.
_TOKEN = re.compile(r"[!-~]{16,4096}")
TOKEN_RULE = ("16 to 4096 printable ASCII characters without spaces (e.g. the output of: "
              "python -c 'import secrets; print(secrets.token_urlsafe(32))')")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")


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
