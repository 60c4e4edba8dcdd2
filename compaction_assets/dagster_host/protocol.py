"""The run host's wire format: one JSON object per line each way over a Unix socket in DAGSTER_HOME."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

SOCKET_NAME = "run-host.sock"


def default_socket(dagster_home: str | None = None) -> Path:
    """$DAGSTER_HOME/run-host.sock (AF_UNIX paths are limited to ~107 bytes)."""
    home = dagster_home or os.environ.get("DAGSTER_HOME") or "."
    return Path(home).resolve() / SOCKET_NAME


def request(path: Path, message: dict, timeout_s: float = 30.0) -> dict:
    """Send one request to the host at `path` and return its reply; OSError if it is not listening."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        conn.connect(str(path))
        conn.sendall(json.dumps(message).encode() + b"\n")
        reply = _read_line(conn)
    if not reply:
        raise ConnectionError(f"run host at {path} closed the connection without a reply")
    answer = json.loads(reply)
    if "error" in answer:
        raise RuntimeError(f"run host at {path}: {answer['error']}")
    return answer


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.strip()


def read_request(conn: socket.socket) -> dict:
    return json.loads(_read_line(conn) or b"{}")


def reply(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")
