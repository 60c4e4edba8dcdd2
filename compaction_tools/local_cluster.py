"""A real Spark standalone cluster on 127.0.0.1, from what the pyspark wheel ships.

The wheel has no `sbin/start-master.sh`, so the master and the workers are started the way those
scripts start them underneath: `pyspark/bin/spark-class org.apache.spark.deploy.master.Master`
and `... org.apache.spark.deploy.worker.Worker spark://HOST:PORT`. Every process binds
127.0.0.1 (`--host`, and SPARK_LOCAL_IP for the web UIs and the executors the workers launch),
gets free ports (web UIs included) and runs in a process group of its own, so `stop` (and
`kill_worker`) can end it together with its executors and their Python workers, by PID.

Used by the tests (tests/test_cluster.py) and usable for a local drill:

    with local_cluster(workers=2) as cluster:
        print(cluster.master_url)   # spark.master: spark://127.0.0.1:PORT in compaction.yaml
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from compaction_assets.errors import CompactionError
from compaction_assets.process_groups import descendants

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Daemon:
    """One master or worker JVM, the leader of its own process group."""

    name: str
    process: subprocess.Popen
    webui_port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class LocalCluster:
    root: Path  # work dirs and logs
    master: Daemon
    port: int
    env: dict[str, str]
    worker_cores: int
    worker_memory: str
    workers: list[Daemon] = field(default_factory=list)
    _serial: int = 0

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{HOST}:{self.master.webui_port}"

    def state(self) -> dict:
        """The master's own JSON view: workers, active and completed applications."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=5) as response:
            return json.load(response)

    def worker_state(self, worker: Daemon) -> dict:
        """A worker's JSON view: its executors (running and finished) and their applications."""
        with urllib.request.urlopen(f"http://{HOST}:{worker.webui_port}/json/", timeout=5) as response:
            return json.load(response)

    def alive_workers(self) -> list[dict]:
        return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]

    def add_workers(self, count: int = 1, wait_seconds: float = 120) -> list[Daemon]:
        """Start `count` more workers and wait until the master lists each of them ALIVE."""
        started = []
        for _ in range(count):
            self._serial += 1
            name = f"worker-{self._serial}"
            webui = free_port()
            work_dir = self.root / name
            work_dir.mkdir(parents=True, exist_ok=True)
            args = [
                "--host", HOST,
                "--webui-port", str(webui),
                "--cores", str(self.worker_cores),
                "--memory", self.worker_memory,
                "--work-dir", str(work_dir),
                self.master_url,
            ]  # fmt: skip
            started.append(_spawn(name, WORKER_CLASS, args, webui, self.root, self.env))
        self.workers.extend(started)
        self.wait_for_workers(started, wait_seconds)
        return started

    def work_dir(self, worker: Daemon) -> Path:
        """Where the worker keeps its executors' folders: <app id>/<executor id>/{stdout,stderr}."""
        return self.root / worker.name

    def wait_for_workers(self, workers: list[Daemon], wait_seconds: float = 120) -> None:
        """Wait until the master answers and lists every one of `workers` ALIVE."""
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            for daemon in [self.master, *workers]:
                if not daemon.alive():
                    raise CompactionError(f"Spark {daemon.name} exited:\n{_tail(daemon.log)}")
            with suppress(OSError, ValueError):
                ports = {w["webuiaddress"].rsplit(":", 1)[-1] for w in self.alive_workers()}
                if all(str(w.webui_port) in ports for w in workers):
                    return
            time.sleep(0.5)
        names = ", ".join(w.name for w in workers) or "the master"
        raise CompactionError(f"{names} did not come up at {self.master_url} in {wait_seconds}s")

    def kill_worker(self, worker: Daemon, sig: int = signal.SIGKILL) -> None:
        """Kill a worker as a lost machine dies: its JVM, its executors and their Python workers."""
        _kill_tree(worker.process, sig)
        with suppress(subprocess.TimeoutExpired):
            worker.process.wait(timeout=30)

    def pids_of(self, daemon: Daemon) -> list[int]:
        """The live processes of one daemon: its JVM and descendants (executors, Python workers)."""
        return _tree(daemon.pid) if daemon.alive() else []

    def pids(self) -> list[int]:
        """Every live process of the cluster (daemons and their descendants)."""
        return sorted({p for d in [self.master, *self.workers] for p in _tree(d.pid)})

    def stop(self) -> None:
        """SIGTERM every daemon's tree, then SIGKILL whatever is left after a grace period."""
        daemons = [*self.workers, self.master]
        for daemon in daemons:
            _kill_tree(daemon.process, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for daemon in daemons:
            with suppress(subprocess.TimeoutExpired):
                daemon.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        for daemon in daemons:
            _kill_tree(daemon.process, signal.SIGKILL)
            with suppress(subprocess.TimeoutExpired):
                daemon.process.wait(timeout=10)


def running(pids: list[int], wait_seconds: float = 10) -> list[int]:
    """Those of `pids` still running (not zombies) after up to `wait_seconds` of grace."""
    deadline = time.monotonic() + wait_seconds
    while True:
        left = [p for p in pids if _state(p) not in (None, "Z", "X")]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@contextmanager
def local_cluster(
    root: Path,
    workers: int = 2,
    worker_cores: int = 1,
    worker_memory: str = "1g",
    daemon_memory: str = "256m",
    python: str | None = None,
) -> Iterator[LocalCluster]:
    """A master and `workers` workers on 127.0.0.1, all registered; stopped (by PID) on exit.

    `python` is the interpreter the executors' Python workers run (PYSPARK_PYTHON of the daemons;
    a driver's own PYSPARK_PYTHON wins for its jobs). Logs and work dirs go under `root`.
    """
    if not SPARK_CLASS.exists():
        raise CompactionError(f"this pyspark wheel ships no {SPARK_CLASS}")
    root.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": HOST,  # web UIs and executors bind here too
        "SPARK_DAEMON_MEMORY": daemon_memory,
        # no REST submission server: it would take the fixed port 6066
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "SPARK_LOG_DIR": str(root / "logs"),
        "PYSPARK_PYTHON": python or os.environ.get("PYSPARK_PYTHON", sys.executable),
    }
    port, webui = free_port(), free_port()
    args = ["--host", HOST, "--port", str(port), "--webui-port", str(webui)]
    master = _spawn("master", MASTER_CLASS, args, webui, root, env)
    cluster = LocalCluster(root, master, port, env, worker_cores, worker_memory)
    try:
        cluster.add_workers(workers)
        yield cluster
    finally:
        cluster.stop()


def _spawn(name: str, main_class: str, args: list[str], webui: int, root: Path, env: dict[str, str]) -> Daemon:
    log = root / f"{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(SPARK_CLASS), main_class, *args],
            env=env,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: executors and Python workers join it
        )
    return Daemon(name, process, webui, log)


def _tree(pid: int) -> list[int]:
    """`pid` and its live descendants (pyspark's daemon moves itself into a group of its own, so
    a process group alone does not reach every Python worker)."""
    return descendants(pid)


def _kill_tree(process: subprocess.Popen, sig: int) -> None:
    pids = _tree(process.pid) if process.poll() is None else []
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)  # the group: the JVM, the executors it launched
    for pid in pids:  # and descendants that left the group
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _tail(log: Path, chars: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return f"(no log at {log})"


def main(argv: list[str] | None = None) -> None:
    """`python -m compaction_tools.local_cluster`: run a local cluster until Ctrl-C or SIGTERM."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m compaction_tools.local_cluster", description=main.__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="1g", help="memory per worker (what its executors may use)")
    parser.add_argument("--root", type=Path, default=None, help="logs and work dirs (default: a temporary folder)")
    args = parser.parse_args(argv)
    root = args.root or Path(tempfile.mkdtemp(prefix="spark-cluster-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the cluster on the way out
    with local_cluster(root, workers=args.workers, worker_cores=args.cores, worker_memory=args.memory) as cluster:
        print(f"spark.master: {cluster.master_url}  (master UI {cluster.webui_url}, logs in {root})", flush=True)
        try:
            while cluster.master.alive():
                time.sleep(1)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
