"""Who may call a Flight server, and what: bearer tokens checked by server middleware.

A server streams a whole dataset, so who may call it is decided before any handler runs:
Flight's server middleware (``Gate``) reads each call's ``authorization: Bearer <token>``
header and compares it with the server's tokens in constant time (``hmac.compare_digest``,
every token compared whatever matched), on every call: ``ping``, ``do_get``, every action.
A call without a matching token is refused (``FlightUnauthenticatedError``) before the
server reads its ticket or body, so it learns nothing, not even which variants are served.

Two roles, because two kinds of caller share one server's process-wide state:

- ``OWNER``: the trainer that started a *local* server. It makes a random token
  (``new_token``) and hands it to the server as the first line of the server's stdin, a pipe
  only the trainer holds; local servers take no other token and no anonymous call. The owner
  may do everything: ``release`` the ablation caches, and give a stream any thread budget the
  ticket allows (1..1024 threads, which resizes the server's process-wide pools).
- ``READER``: a client of ``stallbench serve`` holding its token (``--token-env NAME`` or
  ``--token-file PATH``), or any client of a ``serve`` started without one, which is allowed
  on loopback only. A reader may ``ping``, stream, and have the server build the ablation
  caches of the row groups it reads (``prepare``: the trainer's differential analysis needs
  them, and they are bounded by the server's own dataset). It may not ``release`` caches
  another trainer may be using, and a stream's thread budget is bounded by the server's
  cores (``reader_threads_max``), so no reader grows the pools of every later stream.

``stallbench serve`` has no owner over the network: the person who started it owns it and
stops it with Ctrl-C or SIGTERM. The trainer sends its token (``[executor]
flight_token_env``) with every call through Flight's client middleware (``Bearer``).
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

import pyarrow.flight as flight

from ... import threads
# the token rules every stallbench endpoint shares (``tokens``), re-exported as they were
from ...auth.tokens import (TOKEN_RULE, is_loopback, new_token, read_token, token_from_env,
                            valid_env_name, valid_token)

__all__ = ["Bearer", "Gate", "HEADER", "MIDDLEWARE", "OWNER", "READER", "TOKEN_RULE", "connect",
           "is_loopback", "new_token", "reader_threads_max", "role_of", "serve_token",
           "token_from_env", "valid_env_name", "valid_token"]

OWNER = "owner"
READER = "reader"
HEADER = "authorization"
MIDDLEWARE = "stallbench-auth"     # the key handlers find the caller's role under


def serve_token(env_name: str | None, file: Path | None) -> str | None:
    """The token of ``stallbench serve`` from ``--token-env`` or ``--token-file`` (None when
    neither is given); a UserError naming the flag, never quoting the token, otherwise (the
    rule every endpoint's token flags share: ``tokens.read_token``)."""
    return read_token(env_name, file)


def reader_threads_max() -> int:
    """The most threads a reader's stream may budget: this machine's cores."""
    return threads.machine_cores()


# ------------------------------------------------------------------------ server side

class _Caller(flight.ServerMiddleware):
    """The role of one call, for its handler (``role_of``)."""

    def __init__(self, role: str) -> None:
        self.role = role


class Gate(flight.ServerMiddlewareFactory):
    """Refuses every call without a matching bearer token; tells handlers the caller's role.

    ``owner``/``reader``: the tokens of each role (None: no such token). A server with
    neither (``serve`` on loopback without a token) takes every caller as a reader."""

    def __init__(self, owner: str | None = None, reader: str | None = None) -> None:
        super().__init__()
        self._want = [(role, f"Bearer {tok}".encode())
                      for role, tok in ((OWNER, owner), (READER, reader)) if tok is not None]
        self.open = not self._want

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> _Caller:
        if self.open:
            return _Caller(READER)
        values = headers.get(HEADER, [])
        given = values[0] if len(values) == 1 else b""
        if isinstance(given, str):
            given = given.encode("utf-8", "replace")
        role = None
        for r, want in self._want:          # every token compared: no early exit
            if hmac.compare_digest(given, want) and role is None:
                role = r
        if role is None:
            raise flight.FlightUnauthenticatedError(
                "this stallbench Flight server refused the call: no valid bearer token "
                "(it was started with one)")
        return _Caller(role)


def role_of(context: Any) -> str:
    """The caller's role in a handler (a server without a ``Gate``: a reader)."""
    caller = context.get_middleware(MIDDLEWARE)
    return caller.role if caller is not None else READER


# ------------------------------------------------------------------------ client side

class _Sends(flight.ClientMiddleware):
    def __init__(self, header: str) -> None:
        self._header = header

    def sending_headers(self) -> dict[str, str]:
        return {HEADER: self._header}

    def received_headers(self, headers: Any) -> None:
        pass

    def call_completed(self, exception: Any) -> None:
        pass


class Bearer(flight.ClientMiddlewareFactory):
    """The trainer's side: ``authorization: Bearer <token>`` on every call of a client."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._header = f"Bearer {token}"

    def start_call(self, info: Any) -> _Sends:
        return _Sends(self._header)


def connect(location: str, token: str | None) -> Any:
    """A Flight client of ``location`` that sends ``token`` (if any) with every call."""
    return flight.connect(location, middleware=[Bearer(token)] if token else None)
