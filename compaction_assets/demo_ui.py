"""`compaction-assets demo`: run `dagster dev` on the demo lake, optionally with a streaming writer."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from compaction_assets.config import CompactionConfig
from compaction_assets.dagster_host import process as run_host
from compaction_assets.defs.naming import LOCATION_NAME, WEBSERVER_ENV
from compaction_assets.demo import append_order_batches
from compaction_assets.execution import connect_server
from compaction_assets.lake.catalog import load_table, open_catalog

STREAM_INTERVAL_S = 20


def run_dagster_dev(config: CompactionConfig, port: int, stream: bool) -> int:
    """Start the webserver (127.0.0.1 only) and daemon on a warm Spark; returns dagster dev's exit code.

    SIGINT and SIGTERM (Ctrl-C, `kill PID`) stop the whole demo: dagster dev runs in a process
    group of its own, which gets the signal and is waited for (and killed if it lingers), then
    the warm run host (its session too) and the Spark Connect server the demo started are stopped.
    """
    base = Path(config.source).parent
    home = base / ".dagster_home"
    home.mkdir(exist_ok=True)
    shutil.copy(Path(__file__).resolve().parent.parent / "dagster.yaml", home / "dagster.yaml")
    workspace = home / "workspace.yaml"
    workspace.write_text(
        yaml.safe_dump(
            {
                "load_from": [
                    {
                        "python_module": {
                            "module_name": "compaction_assets.definitions",
                            "location_name": LOCATION_NAME,
                            "working_directory": str(base),
                        }
                    }
                ]
            }
        )
    )
    url = f"http://127.0.0.1:{port}"
    # the sensor reloads the code location through the webserver when tables come or go
    env = {**os.environ, "DAGSTER_HOME": str(home), "COMPACTION_CONFIG": config.source, WEBSERVER_ENV: url}
    command = [str(Path(sys.executable).parent / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port)]
    with _signals_raise() as received:
        try:
            with warm_spark(config), warm_run_host(home, env):
                print(
                    f"\nDagster UI: {url}\n"
                    f"  asset graph (lineage, one asset per table): {url}/asset-groups\n"
                    f"  a table, its partitions, materialisations and checks: {url}/assets/lake/sales/orders\n"
                    f"  sensors (fragmentation_sensor, recovery_sensor) and their ticks: {url}/automation\n"
                    f"  runs, with compaction/queue and dagster/priority tags: {url}/runs\n"
                    f"  queue limits (pools compaction-<queue>): {url}/deployment/concurrency\n"
                    f"`compaction-assets status` shows queues and tables; DAGSTER_HOME={home}\n"
                    "The fragmentation sensor is running: compaction runs start within a minute. "
                    f"Ctrl-C (or kill -INT/-TERM {os.getpid()}) stops everything.\n",
                    flush=True,
                )
                # cwd is DAGSTER_HOME: Dagster warns about a dagster.yaml in any other working folder
                return _serve([*command, "-w", str(workspace)], env, home, received, config if stream else None)
        except _Stop:
            return 0


def _serve(
    command: list[str], env: dict[str, str], cwd: Path, received: list[int], stream: CompactionConfig | None
) -> int:
    """Run dagster dev in a process group of its own until it exits or a signal arrives."""
    stop = threading.Event()
    if stream:
        threading.Thread(target=_stream_orders, args=(stream, stop), daemon=True).start()
    server = subprocess.Popen(command, env=env, cwd=cwd, start_new_session=True)
    try:
        return server.wait()
    except _Stop:
        _stop_group(server, received[0])
        return 0
    finally:
        stop.set()
        if server.poll() is None or session_members(server.pid):
            _stop_group(server, signal.SIGTERM)


class _Stop(BaseException):  # noqa: N818 - a signal, not an error
    """SIGINT or SIGTERM reached the demo."""


@contextmanager
def _signals_raise() -> Iterator[list[int]]:
    """Turn SIGINT and SIGTERM into _Stop in the main thread; yields the list that gets the signal."""
    received: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        if not received:
            received.append(signum)
            raise _Stop

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _stop_group(server: subprocess.Popen, signum: int, grace_s: float = 40) -> None:
    """Signal dagster dev's session (webserver, daemon, code server, runs: it leads a session of
    its own) and wait for it; SIGKILL whatever is left after `grace_s`."""
    for sig, wait_s in ((signum, grace_s), (signal.SIGKILL, 10)):
        for pid in session_members(server.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if server.poll() is not None and not session_members(server.pid):
                return
            time.sleep(0.2)


def session_members(sid: int) -> list[int]:
    """Live processes of session `sid` (Linux /proc), leader first."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields: state ppid pgrp session ...
            members.append(int(stat.parent.name))
    return sorted(members, key=lambda pid: pid != sid)


@contextmanager
def warm_spark(config: CompactionConfig) -> Iterator[None]:
    """In connect mode, a Spark Connect server for the demo's runs: started here unless one runs,
    and then stopped again on the way out. Local mode: nothing (every run starts its own JVM)."""
    if config.spark.mode != "connect":
        yield
        return
    started = not connect_server.status(config.spark).running
    try:
        if started:
            print(
                f"starting the warm Spark (Spark Connect at {config.spark.remote}) for the demo's runs ...", flush=True
            )
            connect_server.start(config.spark)
        yield
    finally:
        if started:
            connect_server.stop(config.spark)


@contextmanager
def warm_run_host(home: Path, env: dict[str, str]) -> Iterator[None]:
    """The run host WarmRunLauncher hands runs to (a fork per run instead of a new Python), in a
    session of its own with its runs; signalled and waited for on the way out."""
    print("starting the warm run host (dagster and the compaction code imported once) ...", flush=True)
    host = run_host.start(home, env)
    try:
        yield
    finally:
        _stop_group(host, signal.SIGTERM, grace_s=20)


def _stream_orders(config: CompactionConfig, stop: threading.Event) -> None:
    """Append a few small files to sales.orders every STREAM_INTERVAL_S, like a streaming sink."""
    table = load_table(open_catalog(config.catalog), "sales.orders")
    rng = random.Random()
    while not stop.wait(STREAM_INTERVAL_S):
        table.refresh()
        files = append_order_batches(table, batches=6, rng=rng)
        print(f"[stream] appended {files} small files to sales.orders", flush=True)
