"""`compaction-assets demo`: run `dagster dev` on the demo lake, optionally with a streaming writer."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from compaction_assets.config import CompactionConfig
from compaction_assets.demo import append_order_batches
from compaction_assets.lake.catalog import load_table, open_catalog

STREAM_INTERVAL_S = 20


def run_dagster_dev(config: CompactionConfig, port: int, stream: bool) -> int:
    """Start the webserver (127.0.0.1 only) and daemon; returns dagster dev's exit code."""
    base = Path(config.source).parent
    home = base / ".dagster_home"
    home.mkdir(exist_ok=True)
    shutil.copy(Path(__file__).resolve().parent.parent / "dagster.yaml", home / "dagster.yaml")
    workspace = home / "workspace.yaml"
    workspace.write_text(
        yaml.safe_dump(
            {
                "load_from": [
                    {"python_module": {"module_name": "compaction_assets.definitions", "working_directory": str(base)}}
                ]
            }
        )
    )
    env = {**os.environ, "DAGSTER_HOME": str(home), "COMPACTION_CONFIG": config.source}
    url = f"http://127.0.0.1:{port}"
    print(
        f"\nDagster UI: {url}\n"
        f"  asset graph (lineage, one asset per table): {url}/asset-groups\n"
        f"  a table, its partitions, materialisations and checks: {url}/assets/lake/sales/orders\n"
        f"  sensors (fragmentation_sensor, recovery_sensor) and their ticks: {url}/automation\n"
        f"  runs, with compaction/queue and dagster/priority tags: {url}/runs\n"
        f"  queue limits (pools compaction-<queue>): {url}/deployment/concurrency\n"
        "The fragmentation sensor is running: compaction runs start within a minute. Ctrl-C stops.\n",
        flush=True,
    )
    stop = threading.Event()
    if stream:
        threading.Thread(target=_stream_orders, args=(config, stop), daemon=True).start()
    command = [
        str(Path(sys.executable).parent / "dagster"),
        "dev",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-w",
        str(workspace),
    ]
    try:
        return subprocess.call(command, env=env, cwd=base)
    except KeyboardInterrupt:
        return 0
    finally:
        stop.set()


def _stream_orders(config: CompactionConfig, stop: threading.Event) -> None:
    """Append a few small files to sales.orders every STREAM_INTERVAL_S, like a streaming sink."""
    table = load_table(open_catalog(config.catalog), "sales.orders")
    rng = random.Random()
    while not stop.wait(STREAM_INTERVAL_S):
        table.refresh()
        files = append_order_batches(table, batches=6, rng=rng)
        print(f"[stream] appended {files} small files to sales.orders", flush=True)
