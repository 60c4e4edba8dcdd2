"""`compaction-assets demo`: run `dagster dev` on the demo lake, optionally with a streaming writer."""

from __future__ import annotations

import os
import random
import shutil
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from compaction_assets.config import SPARK_REMOTE_ENV, CompactionConfig
from compaction_assets.defs.naming import WEBSERVER_ENV
from compaction_assets.execution import connect_server
from compaction_assets.lake.catalog import load_table, open_catalog
from compaction_assets.process_groups import Stop, session_members, signals_raise
from compaction_assets.stack import PROJECT_DAGSTER_YAML, Stack, require_ui, write_workspace
from compaction_tools.demo import append_order_batches

__all__ = ["run_dagster_dev", "session_members", "warm_spark"]

STREAM_INTERVAL_S = 20
DEV_SUPERSEDED = "Function `dev_command` is superseded"  # the start of the warning's text


def run_dagster_dev(config: CompactionConfig, port: int, stream: bool) -> int:
    """Start the webserver (127.0.0.1 only) and daemon on a warm Spark; returns dagster dev's exit code.

    SIGINT and SIGTERM (Ctrl-C, `kill PID`) stop the whole demo: dagster dev (in a session of its
    own with the webserver, daemon, code server), the warm run host (with its runs) and the Spark
    Connect server the demo started are signalled at once, and what outlives the grace is killed
    (stack.Stack.stop).
    """
    require_ui(Path(sys.executable).parent)
    home = Path(config.source).parent / ".dagster_home"
    home.mkdir(exist_ok=True)
    shutil.copy(PROJECT_DAGSTER_YAML, home / "dagster.yaml")
    workspace = write_workspace(home, config, "workspace.yaml")
    url = f"http://127.0.0.1:{port}"
    # the sensor reloads the code location through the webserver when tables come or go
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "COMPACTION_CONFIG": config.source,
        WEBSERVER_ENV: url,
        SPARK_REMOTE_ENV: config.spark.remote,
    }
    # `dagster dev` warns once that it is superseded by `dg dev` (dagster-dg-cli, not installed);
    # -W drops that one warning in that one process, not the rest, and not in its children.
    quiet = f"ignore:{DEV_SUPERSEDED}:FutureWarning"  # Dagster's SupersessionWarning is a FutureWarning
    command = [sys.executable, "-W", quiet, "-m", "dagster", "dev", "-h", "127.0.0.1", "-p", str(port)]
    stack = Stack(config)
    stop = threading.Event()
    with signals_raise():
        try:
            stack.start_spark()
            stack.start_run_host(home, env)
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
            if stream:
                threading.Thread(target=_stream_orders, args=(config, stop), daemon=True).start()
            # cwd is DAGSTER_HOME: Dagster warns about a dagster.yaml in any other working folder
            return stack.spawn("dagster dev", [*command, "-w", str(workspace)], env, home).wait()
        except Stop:
            return 0
        finally:
            stop.set()
            stack.stop()


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


def _stream_orders(config: CompactionConfig, stop: threading.Event) -> None:
    """Append a few small files to sales.orders every STREAM_INTERVAL_S, like a streaming sink."""
    table = load_table(open_catalog(config.catalog), "sales.orders")
    rng = random.Random()
    while not stop.wait(STREAM_INTERVAL_S):
        table.refresh()
        files = append_order_batches(table, batches=6, rng=rng)
        print(f"[stream] appended {files} small files to sales.orders", flush=True)
