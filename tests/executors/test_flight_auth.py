"""Who may call a Flight server (issue 38, class 12: ``serve`` streamed a whole dataset to
anyone). One real ``stallbench serve`` with a token, started once for the module on its
default address: calls without the token or with a wrong one are refused before any handler
(ping, do_get, every action: nothing learnt, not the variant key); the right token streams
every row and may prepare caches, but not ``release`` them nor size the pools beyond the
server's cores; the default address is loopback; a non-loopback ``--host`` without a token
does not start. The trainer: a missing, unset or wrong token is one line naming the file and
``executor.flight_token_env``, exit 2; the right one streams. Local servers take their
trainer's owner token only.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("pyarrow.flight")
import pyarrow.flight as flight  # noqa: E402

from stallbench import scenario, threads  # noqa: E402
from stallbench.errors import ScenarioError, UserError  # noqa: E402
from stallbench.executors import EXECUTORS  # noqa: E402
from stallbench.executors.flight import auth, protocol  # noqa: E402
from stallbench.pipeline import FULL, Plan, dataset_for  # noqa: E402

TOKEN = "sb-test-" + "x7Q" * 8          # 32 printable characters
VAR = "SB_TEST_FLIGHT_TOKEN"
SCENARIO = """
name = "authtest"
[dataset]
rows = 1200
row_group_rows = 300
files = 1
dense_features = 2
sparse_features = 1
sequence_features = 1
sequence_max_len = 4
[model]
kind = "emulated"
[loader]
batch_size = 100
[analysis]
differential = false
[executor]
kind = "flight"
connect_timeout_s = 10
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``stallbench serve s.toml --port 0 --token-env VAR``: no ``--host`` (its default)."""
    d = tmp_path_factory.mktemp("serve-auth")
    (d / "s.toml").write_text(SCENARIO)
    env = {**os.environ, VAR: TOKEN, "STALLBENCH_CACHE": str(d / "cache"),
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "stallbench", "serve", "s.toml", "--port", "0",
                             "--token-env", VAR], cwd=d, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving 1 variant(s)" in line and f"token from ${VAR}" in line, \
            line + proc.stderr.read()
        assert TOKEN not in line
        port = int(line.split("grpc://127.0.0.1:")[1].split()[0])
        yield d, port, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _config(d: Path, port: int, extra: str = "") -> scenario.Config:
    text = SCENARIO + f'flight_servers = ["grpc://127.0.0.1:{port}"]\n' + extra
    return scenario.parse(text, str(d / "t.toml")).base


def _key(d: Path, port: int) -> str:
    return protocol.config_key(_config(d, port))


def _ticket(key: str, shards: int = 4, threads_: int | None = None) -> flight.Ticket:
    return flight.Ticket(protocol.Ticket(key, FULL, tuple(range(shards)), tuple(range(shards)),
                                         threads_).encode())


def _ping(client: Any) -> dict[str, Any]:
    return json.loads(list(client.do_action(flight.Action("ping", b"")))[0].body.to_pybytes())


def test_calls_without_the_right_token_are_refused(served: Any) -> None:
    """No token, a wrong one (also one that only starts like the right one, and the right one
    without ``Bearer``): every call refused as unauthenticated, saying nothing served."""
    d, port, proc = served
    key = _key(d, port)
    calls = {
        "ping": lambda c: list(c.do_action(flight.Action("ping", b""))),
        "do_get": lambda c: c.do_get(_ticket(key)).read_all(),
        "release": lambda c: list(c.do_action(flight.Action("release", json.dumps(
            {"key": key}).encode()))),
        "prepare": lambda c: list(c.do_action(flight.Action("prepare", json.dumps(
            {"key": key, "shards": [0, 1, 2, 3]}).encode()))),
        "resize": lambda c: c.do_get(_ticket(key, threads_=1024)).read_all(),
        "list_actions": lambda c: c.list_actions(),
    }
    clients = {"none": auth.connect(f"grpc://127.0.0.1:{port}", None),
               "wrong": auth.connect(f"grpc://127.0.0.1:{port}", "not-the-servers-token-1"),
               "prefix": auth.connect(f"grpc://127.0.0.1:{port}", TOKEN[:-1])}
    raw = flight.connect(f"grpc://127.0.0.1:{port}")     # the token, not as a Bearer header
    try:
        for who, client in clients.items():
            for what, call in calls.items():
                with pytest.raises(flight.FlightUnauthenticatedError) as e:
                    call(client)
                assert key not in str(e.value) and "authtest" not in str(e.value), (who, what)
        opts = flight.FlightCallOptions(
            headers=[(b"authorization", TOKEN.encode())])
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(raw.do_action(flight.Action("ping", b""), options=opts))
    finally:
        for c in [*clients.values(), raw]:
            c.close()
    assert proc.poll() is None


def test_the_token_streams_every_row_but_owns_nothing(served: Any) -> None:
    """The serve token: ping names the variant, do_get streams all rows, ``prepare`` builds
    caches; ``release`` and a thread budget above the server's cores are refused (the pools
    stay within the cores: the ping says what they are)."""
    d, port, proc = served
    key = _key(d, port)
    client = auth.connect(f"grpc://127.0.0.1:{port}", TOKEN)
    try:
        info = _ping(client)
        assert info["variants"][key] == {"shards": 4, "rows": 1200}
        table = client.do_get(_ticket(key)).read_all()
        assert table.num_rows == 1200
        list(client.do_action(flight.Action("prepare", json.dumps(
            {"key": key, "shards": [0]}).encode())))
        with pytest.raises(flight.FlightUnauthorizedError, match="server's owner"):
            list(client.do_action(flight.Action("release", json.dumps({"key": key}).encode())))
        cores = info["cores"]
        with pytest.raises(flight.FlightUnauthorizedError, match=f"bound of {cores}"):
            client.do_get(_ticket(key, threads_=1024)).read_all()
        assert _ping(client)["pyarrow_threads"] <= cores
        assert client.do_get(_ticket(key, 1, threads_=1)).read_all().num_rows == 300
    finally:
        client.close()
    assert proc.poll() is None


def test_serve_listens_on_loopback_by_default(served: Any) -> None:
    _, port, proc = served
    listening = [c.laddr for c in psutil.Process(proc.pid).net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert listening, "the server listens on nothing"
    for addr in listening:
        ip = ipaddress.ip_address(addr.ip.split("%")[0])
        ip = getattr(ip, "ipv4_mapped", None) or ip        # ::ffff:127.0.0.1
        assert ip.is_loopback, listening


def test_the_trainer_with_the_token_streams(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    d, port, _ = served
    monkeypatch.setenv(VAR, TOKEN)
    cfg = _config(d, port, f'flight_token_env = "{VAR}"\n')
    plan = Plan.create(cfg, dataset_for(cfg, d / "trainer-cache", "t.toml"), scenario_file="t.toml")
    with EXECUTORS.get("flight")(cfg, "t.toml") as ex:
        rows = sum(out.rows for out in ex.run(plan))
        assert ex.rank_options()["token"] == TOKEN       # ranks send the same
    assert rows == 1200


@pytest.mark.parametrize("extra, value, says", [
    ("", None, "refused the call without a token (it was started with one): set "
               "flight_token_env"),
    (f'flight_token_env = "{VAR}"\n', "not-the-servers-token-2", f"refused the token in ${VAR}"),
    (f'flight_token_env = "{VAR}"\n', None, f"the environment variable {VAR} is not set"),
    (f'flight_token_env = "{VAR}"\n', "short", "printable ASCII"),
])
def test_a_missing_or_wrong_token_names_the_key(served: Any, monkeypatch: pytest.MonkeyPatch,
                                                extra: str, value: str | None, says: str) -> None:
    d, port, _ = served
    monkeypatch.delenv(VAR, raising=False)
    if value is not None:
        monkeypatch.setenv(VAR, value)
    cfg = _config(d, port, extra)
    ex = EXECUTORS.get("flight")(cfg, "t.toml")
    with pytest.raises(ScenarioError) as e:
        EXECUTORS.get("flight").check(cfg, "t.toml")
        ex.start()
    ex.stop()
    assert e.value.key == "executor.flight_token_env" and says in str(e.value), str(e.value)
    assert value is None or value not in str(e.value)


def test_a_refused_token_is_one_line_exit_2_from_the_cli(served: Any) -> None:
    d, port, _ = served
    (d / "t.toml").write_text(SCENARIO + f'flight_servers = ["grpc://127.0.0.1:{port}"]\n'
                              f'flight_token_env = "{VAR}"\n')
    env = {**os.environ, VAR: "not-the-servers-token-3", "STALLBENCH_CACHE": str(d / "tcache")}
    r = subprocess.run([sys.executable, "-m", "stallbench", "run", "t.toml", "--out", "out",
                        "--no-progress"], cwd=d, env=env, capture_output=True, text=True,
                       timeout=180)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("stallbench: error: t.toml: executor.flight_token_env: the Flight "
                               f"server at grpc://127.0.0.1:{port} refused the token in ${VAR}")
    assert "not-the-servers-token-3" not in r.stderr + r.stdout


def test_the_token_variable_name_is_checked_and_never_quoted() -> None:
    """A token pasted where its variable's name belongs is refused without being echoed."""
    secret = "hf_" + "Zq9" * 10
    with pytest.raises(ScenarioError) as e:
        scenario_ = scenario.parse(SCENARIO + 'flight_servers = ["grpc://h:1"]\n'
                                   f'flight_token_env = "{secret}-x"\n', "t.toml")
        EXECUTORS.get("flight").validate(scenario_.base, "t.toml")
    assert e.value.key == "executor.flight_token_env" and secret not in str(e.value)


def test_the_token_key_leaves_the_fingerprint_unchanged() -> None:
    base = SCENARIO + 'flight_servers = ["grpc://h:1"]\n'
    a = scenario.parse(base, "t.toml").fingerprint
    assert scenario.parse(base + f'flight_token_env = "{VAR}"\n', "t.toml").fingerprint == a
    assert scenario.parse(base + "flight_streams_per_server = 2\n", "t.toml").fingerprint != a


@pytest.mark.parametrize("args, says", [
    (["--host", "0.0.0.0"], "--host 0.0.0.0: serving beyond this machine needs a token"),
    (["--host", "::"], "--host ::: serving beyond this machine needs a token"),
    (["--host", "0.0.0.0", "--token-env", "SB_TEST_UNSET_VAR"],
     "--token-env: no environment variable of the name given is set"),
    # issue 59: a token pasted where the variable's name belongs is never repeated
    (["--token-env", "Sq7hR2kP9xW4mZ1vB8nC3"],
     "--token-env: no environment variable of the name given is set"),
    (["--token-env", "SB_TEST_SHORT_TOKEN"], "--token-env SB_TEST_SHORT_TOKEN: the token must be"),
    (["--token-env", TOKEN + "="], "--token-env: expected the name of an environment variable"),
    (["--token-file", "no-such-file"], "--token-file no-such-file: cannot read it"),
    (["--token-file", "short.txt"], "--token-file short.txt: the file must hold one token"),
])
def test_serve_refuses_to_start_unsafely(tmp_path: Path, capsys: Any,
                                         monkeypatch: pytest.MonkeyPatch, args: list[str],
                                         says: str) -> None:
    """Before the dataset is opened: one line, exit 2, the token never quoted."""
    from stallbench.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SB_TEST_SHORT_TOKEN", "short")
    monkeypatch.delenv("SB_TEST_UNSET_VAR", raising=False)
    (tmp_path / "short.txt").write_text("short\n")
    (tmp_path / "s.toml").write_text(SCENARIO)
    t0 = time.monotonic()
    assert main(["serve", "s.toml", "--port", "0", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"stallbench: error: {says}"), err
    assert TOKEN not in err and "short\n" not in err.split(":", 2)[-1]
    assert not any(a in err for a in args if a.startswith("Sq"))
    assert not (tmp_path / ".cache").exists()          # refused before the dataset


def test_local_servers_take_their_trainers_token_only(tmp_path: Path) -> None:
    """A local server refuses every other caller of this machine; its owner may release."""
    from stallbench.executors.flight.local import LocalServers

    servers = LocalServers(1, None, "t.toml")
    servers.start()
    try:
        loc = servers.locations[0]
        for token in (None, auth.new_token()):
            c = auth.connect(loc, token)
            with pytest.raises(flight.FlightUnauthenticatedError):
                list(c.do_action(flight.Action("ping", b"")))
            c.close()
        owner = auth.connect(loc, servers.token)
        assert _ping(owner)["scenario"] == "<trainer>"
        with pytest.raises(flight.FlightServerError, match="does not serve variant k"):
            list(owner.do_action(flight.Action("release", b'{"key": "k"}')))  # past the role
        owner.close()
    finally:
        pids = servers.pids()
        servers.stop()
    assert not [p for p in pids if psutil.pid_exists(p) and
                psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_tokens_and_loopback_rules() -> None:
    assert auth.valid_token(auth.new_token()) and not auth.valid_token("a b" * 10)
    assert not auth.valid_token("x" * 15) and auth.valid_token("x" * 16)
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.3.4.5"):
        assert auth.is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.0.2.1", "example.invalid"):
        assert not auth.is_loopback(host), host
    assert threads.machine_cores() == auth.reader_threads_max()
    with pytest.raises(UserError):
        auth.serve_token("1BAD", None)
