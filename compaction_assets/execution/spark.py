"""Spark sessions: `local` (one SparkSession per process) or `connect` (a shared Spark Connect server).

`spark_conf` is the one description of the session, used both here (CLI) and by the Dagster
layer's LazyPySparkResource: `spark.master` for local mode, `spark.remote` for Spark Connect.
"""

from __future__ import annotations

import atexit
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TypedDict
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from compaction_assets.config import SparkConfig
from compaction_assets.errors import CompactionError

# Defaults suited to compaction jobs in local mode; anything in compaction.yaml's spark.conf wins.
LOG4J2 = Path(__file__).with_name("log4j2.properties")  # errors only: no WARN lines in the CLI's output
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.extraJavaOptions": f"-Dderby.system.home=/tmp -Dlog4j2.configurationFile=file://{LOG4J2}",
}
# A local run's JVM only schedules our tasks: rows go through the Python workers. So a small
# footprint: the serial collector (no G1 remembered sets or concurrent threads), C1 only (no C2
# compiler arenas), and a heap that starts small and gives back what it does not use. The bench's
# ours JVM on "sorted" and "mor": 332-338 -> 243-254 MiB peak RSS, no slower (bench/footprint.py).
# Not for the Connect server, whose JVM also plans every run's queries (not measured with it).
JVM_FOOTPRINT = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xms64m -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=30"


SESSION_ID_FILE = "session-id"  # in spark.server_dir: the server's shared session, see shared_remote


def spark_conf(cfg: SparkConfig) -> dict[str, str]:
    if cfg.mode == "connect":
        return {"spark.remote": shared_remote(cfg), **cfg.conf}
    defaults = {**LOCAL_DEFAULTS, **worker_conf(cfg.master)}
    defaults["spark.driver.extraJavaOptions"] += f" {JVM_FOOTPRINT}"
    return {"spark.master": cfg.master, "spark.app.name": "compaction-assets", **defaults, **cfg.conf}


OMP_THREADS_CONF = "spark.executorEnv.OMP_NUM_THREADS"


def worker_threads(master: str) -> dict[str, str]:
    """On a `local[N]` master, Python workers get OMP_NUM_THREADS=N, as a cluster's get their
    executor's cores.

    Spark sets OMP_NUM_THREADS in every Python worker's environment, to the executor's cores, or to
    1 in local mode, where no executor has cores of its own; Arrow sizes its CPU pool (Parquet
    decoding, scans) by it. A sorted group is one task: with one Arrow thread it decoded and
    sorted on one of two cores (the bench's z-order group 7.3 s, with two 6.7 s). Two tasks at once
    then run up to 2N Arrow threads on N cores, as Polars' own pool (N per worker) already does.
    """
    if (cores := _local_cores(master)) is None:
        return {}  # a cluster, local-cluster[...] included: Spark sets each executor's cores
    return {OMP_THREADS_CONF: str(os.cpu_count() or 1) if cores == "*" else cores}


def _local_cores(master: str) -> str | None:
    """The cores of a local master ("1" for `local`, N or "*" for `local[N]`); None for a cluster."""
    if master.strip() == "local":
        return "1"
    local = LOCAL_MASTER.fullmatch(master.strip())
    return local.group(1) if local is not None else None


def worker_conf(master: str) -> dict[str, str]:
    """What the Python workers of a session on `master` are started with (worker_threads, worker_daemon)."""
    return {**worker_threads(master), **worker_daemon(master)}


DAEMON_CONF = "spark.python.daemon.module"


def worker_daemon(master: str) -> dict[str, str]:
    """On a local master, pyspark's daemon whose workers leave pandas out (52 MiB each that nothing
    there uses: spark_daemon.py). Not on a cluster, whose executors may get this package only
    from spark.submit.pyFiles, after their daemon starts."""
    if _local_cores(master) is None:
        return {}
    return {DAEMON_CONF: "compaction_assets.execution.spark_daemon"}


LOCAL_MASTER = re.compile(r"local\[\s*(\*|\d+)\s*(?:,\s*\d+\s*)?\]")  # local[N], local[*], local[N,retries]


def shared_remote(cfg: SparkConfig) -> str:
    """`spark.remote`, joined to the shared session of a server `spark-server start` launched.

    Spark keeps Python workers per Connect session, so a run in a session of its own starts a
    worker and imports pyarrow, pyiceberg and Polars again (~1.5 s of a trivial run's ~3.5 s);
    runs that join the one session the server was started with find its workers warm. The id is
    new for every server start; a remote that names a session itself is left alone.
    """
    try:
        session = (Path(cfg.server_dir) / SESSION_ID_FILE).read_text().strip()
    except OSError:
        return cfg.remote
    if not session or "session_id=" in cfg.remote:
        return cfg.remote
    base = cfg.remote.rstrip("/")
    return f"{base}{';' if '/;' in base else '/;'}session_id={session}"


def require_server(cfg: SparkConfig, timeout_s: float = 3.0) -> None:
    """Connect mode: fail at once, naming `spark.remote`, when no server listens there (the
    client would otherwise retry for minutes)."""
    if cfg.mode != "connect":
        return
    url = urlparse(cfg.remote)
    port = url.port or 15002
    try:
        with socket.create_connection((url.hostname or "localhost", port), timeout=timeout_s) as sock:
            if "use_ssl=true" in cfg.remote.lower() or _speaks_grpc(sock, timeout_s):
                return
    except OSError:
        forget_connect_session()  # a client cached from before the server went would hang at exit
        raise CompactionError(
            f"spark.mode is connect but no Spark Connect server answers at {cfg.remote}: "
            "start it with `compaction-assets spark-server start` (the demo starts its own)"
        ) from None
    raise CompactionError(  # else the client retries for ~40 s and ends with a cut-off gRPC error
        f"port {port} answers but is not a Spark Connect server (no gRPC/HTTP/2 reply at {cfg.remote}): "
        "stop what listens there, or point spark.remote at the Spark Connect server's port "
        "(`compaction-assets spark-server start` runs one there)"
    )


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + empty SETTINGS


def _speaks_grpc(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the server on `sock` speaks plaintext HTTP/2 as gRPC servers do: it answers the
    client preface with a SETTINGS frame (frame type 4). HTTP/1 servers, databases and silent
    listeners do not."""
    sock.settimeout(timeout_s)
    try:
        sock.sendall(_HTTP2_PREFACE)
        header = b""
        while len(header) < 9 and (chunk := sock.recv(9 - len(header))):
            header += chunk
    except OSError:
        return False
    return len(header) == 9 and header[3] == 4


def ensure_worker_python() -> None:
    """Spark's Python workers must run an interpreter with this package installed.

    pyspark 4 reads only PYSPARK_PYTHON for that (not spark.pyspark.python) and falls back to
    `python3` on the PATH; point it at the running interpreter unless the user chose one.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def spark_session(cfg: SparkConfig) -> SparkSession:
    """Get or create the session the config describes."""
    require_server(cfg)
    ensure_worker_python()
    conf = spark_conf(cfg)
    if cfg.mode == "connect" and stale_connect_session(conf["spark.remote"]):
        forget_connect_session()
    if cfg.mode == "local":
        start_local_jvm(conf)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    return bounded_retries(session, conf["spark.remote"]) if cfg.mode == "connect" else session


# Spark's launcher always adds `--add-modules=jdk.incubator.vector` (JavaModuleOptions), and the JDK
# prints this line to stderr at boot whenever an incubator module is resolved (ModuleBootstrap.warn:
# no option turns it off). The module stays; only the line is dropped.
INCUBATOR_LINE = b"WARNING: Using incubator modules: "


def start_local_jvm(conf: Mapping[str, str]) -> None:
    """Local mode: launch this process's driver JVM (unless it runs) as pyspark would, with `conf`,
    but its stderr passed on through `_pass_stderr`, without the JDK's incubator-module line."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:  # noqa: SLF001
        return
    gateway = launch_gateway(SparkConf(loadDefaults=False).setAll(list(conf.items())), {"stderr": subprocess.PIPE})
    threading.Thread(target=_pass_stderr, args=(gateway.proc.stderr,), name="spark-stderr", daemon=True).start()
    SparkContext._ensure_initialized(gateway=gateway)  # noqa: SLF001 - the session then uses this JVM


def _pass_stderr(stream: IO[bytes]) -> None:
    for line in iter(stream.readline, b""):
        if not line.startswith(INCUBATOR_LINE):
            os.write(2, line)


# A Connect client retries an unreachable server for ~10 min by default (15 tries, backoff to 60 s),
# also at process exit (its atexit cleanup calls the server). A server that died is not back in
# seconds (the recovery sensor restarts it within a tick), so a run gives up after ~10 s instead.
class _RetrySettings(TypedDict):
    """DefaultPolicy's keyword arguments this module sets."""

    max_retries: int
    backoff_multiplier: float
    initial_backoff: int
    max_backoff: int


CLIENT_RETRY: _RetrySettings = {
    "max_retries": 6,
    "backoff_multiplier": 2.0,
    "initial_backoff": 200,
    "max_backoff": 5000,
}


def bounded_retries(session: SparkSession, remote: str) -> SparkSession:
    """Connect: give up on a dead server after ~10 s of retries, and exit without calling it (pyspark's own
    exit cleanup would retry it; ours, registered later, runs first and closes the client)."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    client = session.client
    client.set_retry_policies([DefaultPolicy(**CLIENT_RETRY)])
    if not getattr(client, "_compaction_exit_hook", False):
        # our marker on pyspark's client object (not one of its attributes)
        client._compaction_exit_hook = True  # type: ignore[attr-defined]  # noqa: SLF001
        url = urlparse(remote)
        atexit.register(_close_if_unreachable, client, url.hostname or "localhost", url.port or 15002)
    return session


def _close_if_unreachable(client: object, host: str, port: int) -> None:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return
    except OSError:
        client.close()  # type: ignore[attr-defined]


def stale_connect_session(remote: str) -> bool:
    """A Connect session this process cached (getOrCreate would return it whatever the remote)
    that is not the server's current shared session: the server was restarted since, with a new
    session id, and the old client would only fail (INVALID_HANDLE.SESSION_CHANGED)."""
    cached = _cached_connect_session()
    if cached is None:
        return False
    wanted = remote.partition("session_id=")[2].split(";")[0]
    return bool(wanted) and cached.session_id != wanted


def forget_connect_session() -> None:
    """Close this process's cached Connect client without a request to the server (its session
    on the server is left alone; the server that held it may be gone): getOrCreate then makes a
    new one, and the old client's exit cleanup does not retry a dead server."""
    if (cached := _cached_connect_session()) is not None:
        cached.client.close()


def _cached_connect_session():  # noqa: ANN202 - a pyspark.sql.connect SparkSession or None
    if "pyspark.sql.connect.session" not in sys.modules:
        return None  # never made one in this process
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return ConnectSession.getActiveSession() or ConnectSession._get_default_session()  # noqa: SLF001
