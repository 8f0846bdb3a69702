"""Is there a Ray cluster at an address, and will it let this process in? (a throwaway child)

``RayRuntime`` runs this module as ``python -m stallbench.ray_probe KIND HOST:PORT TIMEOUT``
before it calls ``ray.init`` in the trainer's process, because ``ray.init`` is a poor probe:
every failure becomes "Failed to connect to Ray cluster" after 20 s of retries (a missing
token included), "nothing listening" takes minutes, and Ray's C++ side *aborts the process*
on some misconfigurations (``RAY_AUTH_MODE=token`` with no token, an unreadable
``RAY_AUTH_TOKEN_PATH``). Here, in a child that the parent kills on time-out:

- ``gcs`` (``"host:port"``, ``"auto"`` resolved): ``GcsClient`` answers at once, or raises
  ``AuthenticationError`` at once when the cluster wants a token this process does not send
  (missing) or sends wrong; then the cluster's recorded Ray and Python versions, compared with
  ours the way ``ray.init`` compares them (``check_version_info``);
- ``client`` (``"ray://host:port"``): a PING to the Ray Client server over a gRPC channel built
  the way Ray Client builds it (with the token when token auth is on); UNAUTHENTICATED is the
  token, UNIMPLEMENTED a gRPC service that is not Ray Client.

It prints one JSON object: ``{"ok": true, ...}`` or ``{"ok": false, "cause": ..., "detail":
...}`` with cause one of ``auth_missing``, ``auth_rejected``, ``auth_no_token``, ``version``,
``not_ray``, ``error``, ``auth_unexpected`` (this process would use token auth against a
cluster without it: its workers could not hand results back to this driver). ``auth`` describes what this process would send (mode, token source),
so the parent's message can say which of the two it is and where the token came from.

Like ``ray_setup`` it imports nothing of stallbench (importing ``stallbench.executors`` would
import every executor and torch: seconds of start-up for a probe).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def token_source(env: dict[str, str] | None = None) -> str | None:
    """Where Ray would read the token from, in its documented order (``RAY_AUTH_TOKEN``, the
    file at ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``); None: no token anywhere."""
    env = os.environ if env is None else env
    if env.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return f"RAY_AUTH_TOKEN_PATH ({path})"
    home = Path(env.get("HOME") or Path.home()) / ".ray" / "auth_token"
    try:
        if home.read_text().strip():
            return str(home)
    except OSError:
        pass
    return None


def auth_problem(env: dict[str, str] | None = None) -> str | None:
    """A local misconfiguration on which Ray's C++ side aborts the whole process (so it must
    be caught before any Ray call in the trainer): token mode with no token, or a token path
    that cannot be read."""
    env = os.environ if env is None else env
    if (env.get("RAY_AUTH_MODE") or "").lower() != "token" or env.get("RAY_AUTH_TOKEN"):
        return None
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if path:
        try:
            if Path(path).read_text().strip():
                return None
        except OSError as exc:
            return (f"RAY_AUTH_MODE=token but the token file RAY_AUTH_TOKEN_PATH={path} cannot "
                    f"be read ({exc.strerror or exc})")
        return f"RAY_AUTH_MODE=token but the token file RAY_AUTH_TOKEN_PATH={path} is empty"
    if token_source(env) is None:
        return ("RAY_AUTH_MODE=token but no token was found (RAY_AUTH_TOKEN, "
                "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)")
    return None


def auth_state(auto: bool, env: dict[str, str] | None = None) -> dict[str, Any]:
    """What ``ray.init`` would send: token mode is on when ``RAY_AUTH_MODE=token``, or, for an
    address found by ``"auto"`` (not through ``RAY_ADDRESS``), when the variable is unset and a
    token exists (Ray's auto-enable); an explicit address never auto-enables."""
    env = os.environ if env is None else env
    mode = env.get("RAY_AUTH_MODE")
    source = token_source(env)
    token = (mode or "").lower() == "token"
    auto_enabled = False
    if mode is None and auto and not env.get("RAY_ADDRESS") and source:
        token = auto_enabled = True
    return {"mode": mode, "token": token, "source": source if token else None,
            "available": source, "auto_enabled": auto_enabled}


def _result(ok: bool, **kw: Any) -> dict[str, Any]:
    return {"ok": ok, **kw}


def probe_gcs(hostport: str, timeout: float) -> dict[str, Any]:
    import ray
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        client = GcsClient(address=hostport)
        raw = client.internal_kv_get(b"CLUSTER_METADATA", namespace=b"cluster",
                                     timeout=max(1.0, timeout))
    except AuthenticationError as exc:
        return _result(False, cause="auth", detail=str(exc).split(". ")[0])
    except Exception as exc:  # noqa: BLE001 - anything else: say what it was
        text = str(exc).replace("\n", " ")
        if "Method not found" in text or "UNIMPLEMENTED" in text.upper():
            return _result(False, cause="not_ray", detail="speaks gRPC but is not a Ray GCS")
        return _result(False, cause="error", detail=f"{type(exc).__name__}: {text[:300]}")
    meta: dict[str, Any] = json.loads(raw.decode()) if raw else {}
    if meta:
        from ray._private.utils import check_version_info

        try:
            check_version_info(meta, "stallbench", raise_on_mismatch=True)
        except RuntimeError:
            here = ".".join(map(str, sys.version_info[:3]))
            return _result(False, cause="version", cluster_ray=meta.get("ray_version"),
                           cluster_python=meta.get("python_version"), ray=ray.__version__,
                           python=here)
    return _result(True, cluster_ray=meta.get("ray_version"),
                   cluster_python=meta.get("python_version"),
                   cluster_auth=_gcs_auth(hostport, timeout))


def _gcs_auth(hostport: str, timeout: float) -> str | None:
    """Does the GCS require a token? Asked with a bare gRPC call that carries none (Ray's own
    clients add the token whenever this process is in token mode, so they cannot tell):
    "token", "disabled", or None when it could not be told. It matters because a driver in
    token mode serves its tasks' results behind the token too: the workers of a cluster
    without token auth cannot hand their results back, and the run waits forever."""
    try:
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return None
    channel = grpc.insecure_channel(hostport)
    try:
        stub = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel)
        stub.InternalKVGet(gcs_service_pb2.InternalKVGetRequest(key=b"CLUSTER_METADATA",
                                                                namespace=b"cluster"),
                           timeout=max(1.0, timeout))
        return "disabled"
    except grpc.RpcError as exc:
        return "token" if exc.code() == grpc.StatusCode.UNAUTHENTICATED else None
    finally:
        channel.close()


def probe_client(hostport: str, timeout: float) -> dict[str, Any]:
    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

    channel = init_grpc_channel(hostport)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        return _result(False, cause="silent", timeout=timeout)
    stub = ray_client_pb2_grpc.RayletDriverStub(channel)
    req = ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING)
    try:
        stub.ClusterInfo(req, timeout=timeout, metadata=[("client_id", "stallbench-probe")])
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return _result(False, cause="auth", detail=(exc.details() or "").split(". ")[0])
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return _result(False, cause="not_ray", detail="speaks gRPC but is not a Ray Client "
                                                          "server")
        return _result(False, cause="error", detail=f"{code.name}: {(exc.details() or '')[:300]}")
    finally:
        channel.close()
    return _result(True)


def main(argv: list[str]) -> int:
    kind, hostport, timeout = argv[0], argv[1], float(argv[2])
    auto = len(argv) > 3 and argv[3] == "auto"
    state = auth_state(auto)
    problem = auth_problem({**os.environ, "RAY_AUTH_MODE": "token"} if state["token"]
                           else dict(os.environ))
    if problem:
        out = _result(False, cause="auth_no_token", detail=problem)
    else:
        if state["auto_enabled"]:
            os.environ["RAY_AUTH_MODE"] = "token"      # what ray.init("auto") does
        try:
            out = probe_client(hostport, timeout) if kind == "client" else \
                probe_gcs(hostport, timeout)
        except ImportError as exc:
            out = _result(False, cause="error", detail=f"cannot import {exc.name or exc}")
        if out.get("cause") == "auth":
            out["cause"] = "auth_rejected" if state["token"] else "auth_missing"
        elif out.get("ok") and state["token"] and out.get("cluster_auth") == "disabled":
            out = _result(False, cause="auth_unexpected", detail="the cluster has no token "
                          "authentication", cluster_auth="disabled")
    out["auth"] = state
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child process
    sys.exit(main(sys.argv[1:]))
