"""Class 10 of issue 13: every error names the scenario file and key, and is one line.

The rules: data errors carry their origin (``Dataset.origin`` = "s.toml: dataset.path"), so a
zero-row file or a row group that cannot be read, in whichever process, names the scenario
file and key; Ray's own chatter never reaches the terminal (its default token-auth notice is
filtered where stallbench starts Ray itself, Ray Data's ERROR logs of a failed run are
silenced because stallbench reports the failure); ``ray://`` without Ray Client says exactly
what to install; Ray dying under a run (its Parquet footer reader killed in stock mode: a
231-line traceback before) is one line, or survived. Issue 26: ``serve`` that cannot listen
(a port taken, an address not of this machine) is one line with gRPC's reason, and none of
gRPC's own log lines.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from reliability_helpers import TINY, Watched, no_files, one_error_line, sb, write

EXISTING = ('name = "e"\n[dataset]\npath = "data.parquet"\n[model]\nkind = "emulated"\n'
            '[loader]\nbatch_size = 64\n{loader}[analysis]\ndifferential = false\n')


def _table(rows: int) -> pa.Table:
    return pa.table({"label": pa.array([float(i % 2) for i in range(rows)], pa.float32()),
                     "x": pa.array([float(i) for i in range(rows)], pa.float32()),
                     "ids": pa.array([[i, i + 1] for i in range(rows)], pa.list_(pa.int64()))})


def test_zero_row_parquet_names_file_and_key(tmp_path: Path, env: dict) -> None:
    pq.write_table(_table(0), tmp_path / "data.parquet")
    write(tmp_path, EXISTING.format(loader=""))
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path)
    one_error_line(r, "s.toml: dataset.path: ", "has no rows")
    assert no_files(tmp_path / "out")


@pytest.mark.parametrize("workers", [0, 2])
def test_unreadable_row_group_names_file_and_key(tmp_path: Path, env: dict,
                                                 workers: int) -> None:
    """The footer is intact, a data page is not: found while reading, in the trainer or in a
    loader worker, and reported with the scenario file and key either way."""
    path = tmp_path / "data.parquet"
    pq.write_table(_table(20_000), path, compression="snappy", row_group_size=5_000)
    raw = bytearray(path.read_bytes())
    meta = pq.ParquetFile(path).metadata
    col = meta.row_group(2).column(1)
    start = col.data_page_offset + 40
    raw[start:start + 400] = b"\xff" * 400
    path.write_bytes(bytes(raw))
    write(tmp_path, EXISTING.format(loader=f"num_workers = {workers}\n"))
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path)
    one_error_line(r, "s.toml: dataset.path: ", "data.parquet")
    assert "Traceback" not in r.stderr and "DataLoader" not in r.stderr
    assert no_files(tmp_path / "out")


def test_oversized_sequence_len_on_existing_data_names_its_key(tmp_path: Path,
                                                               env: dict) -> None:
    pq.write_table(_table(50_000), tmp_path / "data.parquet")
    text = EXISTING.format(loader="").replace("batch_size = 64", "batch_size = 50000").replace(
        'path = "data.parquet"', 'path = "data.parquet"\nsequence_max_len = 100000')
    write(tmp_path, text)
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path)
    one_error_line(r, "s.toml: dataset.sequence_max_len: ", "padded sequences")


# A successful local Ray run prints nothing on stderr (Ray 2.5x printed a token-authentication
# notice at every start: every one-line error of stallbench became two lines): checked on the
# Ray run of test_user_modules.py::test_ray_workers_get_no_driver_directory (TINY, one CPU, a
# user transform), which starts a runtime anyway; a second start only for this cost ~12 s of CI.


def test_ray_client_address_says_what_to_install(tmp_path: Path, env: dict) -> None:
    pytest.importorskip("ray")
    try:
        import grpc  # noqa: F401
        pytest.skip("Ray Client's dependency (grpc) is installed here")
    except ImportError:
        pass
    write(tmp_path, TINY + '[executor]\nkind = "ray"\nray_address = "ray://127.0.0.1:10001"\n')
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path)
    one_error_line(r, "s.toml: executor.ray_address: ", "Ray Client is not installed",
                   'pip install "ray[client]==')


@pytest.mark.ray
def test_killing_rays_parquet_footer_reader_in_stock_mode(tmp_path: Path, env: dict) -> None:
    """Every ``FooterReader`` actor Ray Data starts is killed as soon as it appears: the run
    is survived (Ray restarted it) or ends in one line, never in Ray's traceback, and
    nothing is left running."""
    pytest.importorskip("ray")
    write(tmp_path, TINY.replace("rows = 4096", "rows = 40000") +
          '[executor]\nkind = "ray"\ncpus = 1\nray_mode = "stock"\n')
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path)
    killed: list[str] = []

    def killer() -> None:
        deadline = time.monotonic() + 240
        while w.proc.poll() is None and time.monotonic() < deadline:
            for k in w.children():
                try:
                    if "FooterRead" in k.name():
                        k.kill()
                        killed.append(k.name())
                except Exception:  # noqa: BLE001 - gone already
                    pass
            time.sleep(0.02)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    rc, out, err = w.finish(timeout=300)
    t.join(timeout=5)
    assert killed, "no footer reader appeared: " + err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    if rc == 0:
        assert list((tmp_path / "out").glob("*.json"))
    else:
        assert rc == 2, err[-3000:]
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            "stallbench: error: s.toml: executor: Ray failed during the run"), err
        assert no_files(tmp_path / "out")
    left = w.leftovers()
    assert not left, f"processes left behind: {left}"


@pytest.mark.parametrize("bind, host, says", [
    ("0.0.0.0", None, "another process listens on port"),
    ("127.0.0.1", "127.0.0.1", "another process listens on port"),
    (None, "192.0.2.1", "192.0.2.1 is not an address of this machine"),   # TEST-NET-1
])
def test_serve_that_cannot_listen_is_one_line(tmp_path: Path, env: dict, bind: str | None,
                                              host: str | None, says: str) -> None:
    """gRPC logs a failed bind itself, to fd 2, around an exception that only says "Server
    did not start properly": the command prints one line with the reason and the port."""
    import socket

    pytest.importorskip("pyarrow.flight")
    write(tmp_path, TINY)
    with socket.socket() as taken:
        port = 0
        if bind is not None:
            taken.bind((bind, 0))
            taken.listen()
            port = taken.getsockname()[1]
        args = ["serve", "s.toml", "--port", str(port or 8815)] + (["--host", host] if host else [])
        if host not in (None, "127.0.0.1"):      # beyond loopback a token is needed first
            args += ["--token-env", "SB_SERVE_TOKEN"]
        r = sb(args, {**env, "SB_SERVE_TOKEN": "t" * 32}, tmp_path, timeout=120)
    line = one_error_line(r, f"--port {port or 8815}: cannot listen on", says)
    assert "add_port.cc" not in r.stderr and "absl" not in r.stderr, r.stderr
    assert "did not start properly" not in line, line
