"""Bytes that crossed the network from the Flight servers, as the kernel counted them.

Arrow's IPC writer compresses inside Flight, so the producer never learns how many bytes a
compressed batch took on the wire; the kernel does. Each of the trainer's TCP sockets keeps
``tcpi_bytes_received`` (Linux ``tcp_info``, shown by iproute2's ``ss -ti``): read for the
sockets of this process whose peer is a Flight server, before and after a run, their
difference is what the servers' streams delivered (Arrow IPC, gRPC and HTTP/2 framing; not
TCP/IP headers). Where ``ss`` is missing or shows no such counter, the figure is None and
results say so; the uncompressed IPC size is always measured apart (``raw_bytes``).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

_BYTES = re.compile(r"\bbytes_received:(\d+)")
_PID = re.compile(r"\bpid=(\d+)\b")


def resolve(host: str, port: int) -> list[tuple[str, int]]:
    """The addresses a host name stands for (what ``ss`` shows as peers)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return [(host, port)]
    return sorted({(i[4][0], port) for i in infos})


def _peer(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def bytes_received(peers: list[tuple[str, int]], pid: int | None = None) -> int | None:
    """Sum of ``bytes_received`` over the established TCP sockets to ``peers`` held by
    process ``pid`` (default: this one); None where the kernel's counters cannot be read."""
    ss = shutil.which("ss")
    if not ss or not peers:
        return None
    filt: list[str] = []
    for addr, port in peers:
        filt += (["or"] if filt else []) + ["dst", _peer(addr, port)]
    try:
        out = subprocess.run([ss, "-tinpH", "state", "established", "(", *filt, ")"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return received(out, os.getpid() if pid is None else pid)


def received(out: str, pid: int) -> int:
    """``bytes_received`` summed over the sockets of ``ss -tinp`` output held by ``pid``
    (every socket, where ``ss`` shows no owners)."""
    total = 0
    for record in _records(out):
        owners = {int(p) for p in _PID.findall(record)}
        if owners and pid not in owners:
            continue
        m = _BYTES.search(record)       # ss leaves the field out while it is 0
        total += int(m.group(1)) if m else 0
    return total


def _records(out: str) -> list[str]:
    """One string per socket: ``ss`` prints a socket's details on indented lines."""
    recs: list[str] = []
    for line in out.splitlines():
        if line[:1].isspace() and recs:
            recs[-1] += " " + line
        elif line.strip():
            recs.append(line)
    return recs
