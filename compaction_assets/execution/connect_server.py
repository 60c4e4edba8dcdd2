"""The Spark Connect server that ships in the pyspark wheel, run as a warm, shared Spark.

`compaction-assets spark-server start|stop|status` wraps pyspark's own sbin scripts. The server
listens on the host and port of `spark.remote` (which must be this machine), its Python workers
run this interpreter, and its pid and logs live in `spark.server_dir`.

Health (`health`, used by `status` and the recovery sensor) is more than an open port: the server
must answer a trivial request (its Spark version, asked in the runs' shared session) within a
timeout. A pid file whose process is gone means the server died: `stop` removes the pid file, so
only a server that was not stopped on purpose leaves one behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyspark

from compaction_assets.config import SparkConfig
from compaction_assets.errors import CompactionError
from compaction_assets.execution.spark import (
    LOCAL_DEFAULTS,
    SESSION_ID_FILE,
    ensure_worker_python,
    worker_conf,
)
from compaction_assets.redact import redact

SBIN = Path(pyspark.__file__).parent / "sbin"
# Runs share one session (see spark.shared_remote); Spark closes idle sessions after 60 min by
# default and never reopens a closed session id, so the shared one must not idle out.
SESSION_IDLE_TIMEOUT = "3650d"
LOCAL_HOSTS = ("127.0.0.1", "localhost")
PROBE_TIMEOUT_S = 5.0
START_COMMAND = "compaction-assets spark-server start"
# The probe's session when no server started from spark.server_dir names a shared one: one fixed
# id, so probing never piles up sessions on a server (they idle out only after SESSION_IDLE_TIMEOUT).
PROBE_SESSION = str(uuid.uuid5(uuid.NAMESPACE_URL, "compaction-assets:spark-server-probe"))


@dataclass(frozen=True)
class ServerStatus:
    remote: str
    pid: int | None  # the server JVM, if its pid file names a live process
    listening: bool
    log_dir: Path
    dead_pid: int | None = None  # a pid file is left whose process is gone: the server died
    answering: bool | None = None  # answered a trivial request in time; None: not asked
    detail: str | None = None  # the Spark version it answered with, or why it did not answer

    @property
    def running(self) -> bool:
        return self.pid is not None and self.listening and self.answering is not False

    @property
    def state(self) -> str:
        """running | not-answering | starting | died | foreign | stopped"""
        if self.pid is not None:
            if self.listening:
                return "running" if self.answering is not False else "not-answering"
            return "starting"
        if self.listening:
            return "foreign"
        return "died" if self.dead_pid is not None else "stopped"

    def describe(self) -> str:
        remote = safe_remote(self.remote)
        state = self.state
        if state == "running":
            version = f", Spark {self.detail}" if self.answering and self.detail else ""
            return f"Spark Connect server running at {remote} (pid {self.pid}{version}); logs in {self.log_dir}"
        if state == "not-answering":
            return (
                f"Spark Connect server (pid {self.pid}) listens at {remote} but does not answer: {self.detail}; "
                f"logs in {self.log_dir}"
            )
        if state == "starting":
            return f"Spark Connect server starting (pid {self.pid}), not yet listening at {remote}"
        if state == "foreign":
            return f"something else is listening at {remote} (no server started from {self.log_dir.parent})"
        if state == "died":
            return (
                f"Spark Connect server died (pid {self.dead_pid} is gone, it was not stopped) at {remote}: "
                f"`{START_COMMAND}` starts it again; logs in {self.log_dir}"
            )
        return f"Spark Connect server not running ({remote}): `{START_COMMAND}` starts it"

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(remote=safe_remote(self.remote), log_dir=str(self.log_dir), state=self.state, running=self.running)
        return out


def safe_remote(remote: str) -> str:
    """`spark.remote` for messages: a `token=` parameter masked."""
    return re.sub(r"(?i)(token=)[^;]*", r"\1***", remote)


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
    """Pid file and port only: cheap, no request to the server."""
    host, port = host_port(cfg)
    root = Path(cfg.server_dir)
    live, dead = _pids(root / "pids")
    return ServerStatus(cfg.remote, live, _listening(host, port), root / "logs", dead_pid=dead)


def health(cfg: SparkConfig, timeout_s: float = PROBE_TIMEOUT_S) -> ServerStatus:
    """`status`, and whether a listening server answers a trivial request within `timeout_s`."""
    current = status(cfg)
    if not current.listening:
        return current
    host, port = host_port(cfg)
    answering, detail = _probe(host, port, _probe_session(cfg), timeout_s)
    return ServerStatus(**{**current.__dict__, "answering": answering, "detail": detail})


def start(cfg: SparkConfig, wait_seconds: float = 180) -> ServerStatus:
    """Start the server (no-op if it runs) and wait until it accepts connections. Starts from
    this machine take turns (a lock file in `spark.server_dir`): an operator's `spark-server start`
    and a supervised restart never launch two JVMs that fight over the port and the pid file."""
    Path(cfg.server_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(cfg.server_dir) / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return _start(cfg, wait_seconds)


def _start(cfg: SparkConfig, wait_seconds: float) -> ServerStatus:
    current = status(cfg)
    if current.running:
        return current
    if current.listening:
        raise CompactionError(current.describe())
    # A pid file naming a dead JVM is stale; Spark's script would refuse to start while that pid is
    # still a zombie not yet reaped ("running as process N. Stop it first."), as after a kill.
    for pid_file in (Path(cfg.server_dir) / "pids").glob("*.pid"):
        pid_file.unlink(missing_ok=True)
    host, port = host_port(cfg)
    conf = {
        **LOCAL_DEFAULTS,
        **worker_conf(cfg.master),
        "spark.connect.session.manager.defaultSessionTimeout": SESSION_IDLE_TIMEOUT,
        **cfg.conf,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
    }
    args = [a for key, value in conf.items() for a in ("--conf", f"{key}={value}")]
    script = SBIN / "start-connect-server.sh"
    if not script.exists():
        raise CompactionError(f"this pyspark wheel ships no Spark Connect server ({script} is missing)")
    (Path(cfg.server_dir) / SESSION_ID_FILE).write_text(f"{uuid.uuid4()}\n")  # clients join the new session
    done = subprocess.run(
        [str(script), "--master", cfg.master, *args],
        env=_env(cfg),
        capture_output=True,
        text=True,
        check=False,
        start_new_session=True,  # the JVM outlives whatever started it (a Dagster run, the CLI)
    )
    if done.returncode != 0:
        raise CompactionError(f"start-connect-server.sh failed: {done.stderr.strip() or done.stdout.strip()}")
    began = time.monotonic()
    while time.monotonic() - began < wait_seconds:
        current = status(cfg)
        if current.running:
            return health(cfg)
        if current.pid is None and time.monotonic() - began > 5:
            break  # the JVM exited
        time.sleep(0.5)
    where = safe_remote(cfg.remote)
    raise CompactionError(f"Spark Connect server did not start at {where}:\n{_log_tail(current.log_dir)}")


def stop(cfg: SparkConfig, wait_seconds: float = 60) -> ServerStatus:
    """Stop the server started from `spark.server_dir` and wait until it is gone (killed if it
    outlives `wait_seconds`)."""
    if status(cfg).pid is not None:
        subprocess.run([str(SBIN / "stop-connect-server.sh")], env=_env(cfg), capture_output=True, check=False)
    deadline = time.monotonic() + wait_seconds
    while (current := status(cfg)).pid is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    if current.pid is not None:  # the JVM outlived its shutdown hooks' time (a loaded machine): kill it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(current.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (current := status(cfg)).pid is not None and time.monotonic() < deadline:
            time.sleep(0.2)
    if current.pid is None and current.dead_pid is not None:  # stopped on purpose: not "died" any more
        for pid_file in (Path(cfg.server_dir) / "pids").glob("*.pid"):
            pid_file.unlink(missing_ok=True)
        current = status(cfg)
    return current


def stop_message(before: ServerStatus, after: ServerStatus) -> str:
    """What `stop` did, from the status before and after it: stopped which server, or why nothing."""
    remote, root = safe_remote(before.remote), before.log_dir.parent
    if after.pid is not None:
        return f"Spark Connect server (pid {after.pid}) at {remote} is still running after SIGKILL: kill {after.pid}"
    if before.pid is not None:
        return f"stopped the Spark Connect server at {remote} (pid {before.pid})"
    if before.dead_pid is not None:
        return f"nothing to stop: the server started from {root} had died (pid {before.dead_pid}); pid file removed"
    if before.listening:
        return (
            f"nothing to stop: no server was started from {root}; something else listens at {remote} "
            "(left alone: stop it yourself)"
        )
    return f"nothing to stop: no Spark Connect server runs at {remote} (none was started from {root})"


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


def _pids(pid_dir: Path) -> tuple[int | None, int | None]:
    """(live, dead): the server JVM a pid file names, alive or gone (a reused pid is not ours)."""
    live = dead = None
    for pid_file in pid_dir.glob("*.pid"):
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if _is_server(pid):
            live = pid
        else:
            dead = pid
    return live, dead


def _is_server(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path(f"/proc/{pid}/cmdline")
    if not Path("/proc/self").exists():  # no /proc (macOS): trust the live pid
        return True
    try:
        return b"org.apache.spark" in proc.read_bytes()  # a reused pid is some other program
    except FileNotFoundError:
        return False
    except OSError:
        return True


def _probe_session(cfg: SparkConfig) -> str:
    try:
        session = (Path(cfg.server_dir) / SESSION_ID_FILE).read_text().strip()
    except OSError:
        session = ""
    return session or PROBE_SESSION


def _probe(host: str, port: int, session_id: str, timeout_s: float) -> tuple[bool, str]:
    """Ask the server its Spark version, in the session runs join (so a closed shared session
    shows), as the runs' user; one request, no retries."""
    import grpc
    from pyspark.sql.connect.proto import base_pb2, base_pb2_grpc

    user = os.getenv("SPARK_USER", os.getenv("USER", ""))
    request = base_pb2.AnalyzePlanRequest(
        session_id=session_id,
        user_context=base_pb2.UserContext(user_id=user),
        spark_version=base_pb2.AnalyzePlanRequest.SparkVersion(),
    )
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            answer = base_pb2_grpc.SparkConnectServiceStub(channel).AnalyzePlan(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            why = f"no answer within {timeout_s:g} s" if code == grpc.StatusCode.DEADLINE_EXCEEDED else None
            return False, why or redact(f"{code.name if code else 'error'}: {(exc.details() or '')[:300]}")
    return True, answer.spark_version.version


def _listening(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def _log_tail(log_dir: Path) -> str:
    text = "".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("*.out")))
    return text[-3000:] or f"(no log in {log_dir})"
