"""The Spark Connect server that ships in the pyspark wheel, run as a warm, shared Spark.

`compaction-assets spark-server start|stop|status` wraps pyspark's own sbin scripts. The server
listens on the host and port of `spark.remote` (which must be this machine), its Python workers
run this interpreter, and its pid and logs live in `spark.server_dir`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyspark

from compaction_assets.config import SparkConfig
from compaction_assets.errors import CompactionError
from compaction_assets.execution.spark import LOCAL_DEFAULTS, SESSION_ID_FILE, ensure_worker_python

SBIN = Path(pyspark.__file__).parent / "sbin"
# Runs share one session (see spark.shared_remote); Spark closes idle sessions after 60 min by
# default and never reopens a closed session id, so the shared one must not idle out.
SESSION_IDLE_TIMEOUT = "3650d"
LOCAL_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class ServerStatus:
    remote: str
    pid: int | None  # the server JVM, if its pid file names a live process
    listening: bool
    log_dir: Path

    @property
    def running(self) -> bool:
        return self.pid is not None and self.listening

    def describe(self) -> str:
        if self.running:
            return f"Spark Connect server running at {self.remote} (pid {self.pid}); logs in {self.log_dir}"
        if self.pid is not None:
            return f"Spark Connect server starting (pid {self.pid}), not yet listening at {self.remote}"
        if self.listening:
            return f"something else is listening at {self.remote} (no server started from {self.log_dir.parent})"
        return f"Spark Connect server not running ({self.remote})"


def host_port(cfg: SparkConfig) -> tuple[str, int]:
    """Host and port of `spark.remote`; the server is only ever bound to this machine."""
    url = urlparse(cfg.remote)
    if url.scheme != "sc" or url.hostname not in LOCAL_HOSTS:
        raise CompactionError(
            f"spark.remote is {cfg.remote!r}: spark-server runs a local server, so it must be "
            "sc://127.0.0.1:PORT or sc://localhost:PORT"
        )
    return "127.0.0.1", url.port or 15002


def status(cfg: SparkConfig) -> ServerStatus:
    host, port = host_port(cfg)
    root = Path(cfg.server_dir)
    return ServerStatus(cfg.remote, _live_pid(root / "pids"), _listening(host, port), root / "logs")


def start(cfg: SparkConfig, wait_seconds: float = 180) -> ServerStatus:
    """Start the server (no-op if it runs) and wait until it accepts connections."""
    current = status(cfg)
    if current.running:
        return current
    if current.listening:
        raise CompactionError(current.describe())
    host, port = host_port(cfg)
    conf = {
        **LOCAL_DEFAULTS,
        "spark.connect.session.manager.defaultSessionTimeout": SESSION_IDLE_TIMEOUT,
        **cfg.conf,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
    }
    args = [a for key, value in conf.items() for a in ("--conf", f"{key}={value}")]
    script = SBIN / "start-connect-server.sh"
    if not script.exists():
        raise CompactionError(f"this pyspark wheel ships no Spark Connect server ({script} is missing)")
    Path(cfg.server_dir).mkdir(parents=True, exist_ok=True)
    (Path(cfg.server_dir) / SESSION_ID_FILE).write_text(f"{uuid.uuid4()}\n")
    done = subprocess.run(
        [str(script), "--master", cfg.master, *args], env=_env(cfg), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise CompactionError(f"start-connect-server.sh failed: {done.stderr.strip() or done.stdout.strip()}")
    began = time.monotonic()
    while time.monotonic() - began < wait_seconds:
        current = status(cfg)
        if current.running:
            return current
        if current.pid is None and time.monotonic() - began > 5:
            break  # the JVM exited
        time.sleep(0.5)
    raise CompactionError(f"Spark Connect server did not start at {cfg.remote}:\n{_log_tail(current.log_dir)}")


def stop(cfg: SparkConfig, wait_seconds: float = 60) -> ServerStatus:
    """Stop the server started from `spark.server_dir` and wait until it is gone."""
    if status(cfg).pid is not None:
        subprocess.run([str(SBIN / "stop-connect-server.sh")], env=_env(cfg), capture_output=True, check=False)
    deadline = time.monotonic() + wait_seconds
    while (current := status(cfg)).pid is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    return current


def _env(cfg: SparkConfig) -> dict[str, str]:
    ensure_worker_python()
    root = Path(cfg.server_dir)
    return {
        **os.environ,
        "SPARK_HOME": str(SBIN.parent),
        "SPARK_LOG_DIR": str(root / "logs"),
        "SPARK_PID_DIR": str(root / "pids"),
        "SPARK_IDENT_STRING": "compaction-assets",
    }


def _live_pid(pid_dir: Path) -> int | None:
    for pid_file in pid_dir.glob("*.pid"):
        try:
            pid = int(pid_file.read_text().strip())
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError, PermissionError):
            continue
        return pid
    return None


def _listening(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def _log_tail(log_dir: Path) -> str:
    text = "".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("*.out")))
    return text[-3000:] or f"(no log in {log_dir})"
