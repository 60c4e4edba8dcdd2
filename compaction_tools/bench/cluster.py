"""One compaction on a Spark standalone cluster, measured the way a user runs it.

    python -m compaction_tools.bench.cluster [--dataset small|tiny] [--workers 2] [--master spark://H:P]

Starts a local standalone cluster (compaction_tools.local_cluster: a master and `--workers`
workers of one core and 1 GiB each on 127.0.0.1) unless `--master` names one, writes the bench
dataset as one unpartitioned Iceberg table in a scratch lake, and runs `compaction-assets compact`
in its own process with `spark.master` pointing at the cluster. Prints the files and bytes before
and after, the command's wall seconds, the engine's own split, and which rewrite path ran.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import yaml

from compaction_assets.config import load_config
from compaction_assets.lake.catalog import open_catalog
from compaction_assets.lake.digest import rows_digest
from compaction_tools.bench import datasets
from compaction_tools.local_cluster import local_cluster

DATASETS = {"small": datasets.SMALL, "tiny": datasets.TINY}
TABLE = "bench.t"


def cluster_config(root: Path, master: str) -> Path:
    doc = {
        "catalog": {
            "name": "lake",
            "properties": {"type": "sql", "uri": "sqlite:///catalog.db", "warehouse": "file://warehouse"},
        },
        "state": {"uri": "sqlite:///state.db"},
        "spark": {
            "mode": "local",
            "master": master,
            "conf": {
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.memory": "512m",
            },
        },
        "queues": [{"name": "default", "max_concurrent_runs": 1, "capacity": 10}],
        "tables": [{"match": "*", "queue": "default"}],
    }
    path = root / "compaction.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def files_and_bytes(table) -> tuple[int, int]:  # noqa: ANN001 - a pyiceberg Table
    files = table.inspect.files().to_pylist()
    return len(files), sum(f["file_size_in_bytes"] for f in files)


def measure(root: Path, master: str, dataset: datasets.Dataset) -> dict:
    lake = root / "lake"
    lake.mkdir(parents=True)
    config = cluster_config(lake, master)
    catalog = open_catalog(load_config(config).catalog)
    catalog.create_namespace("bench")
    sources = datasets.write_files(root / "source", dataset)
    table = datasets.iceberg_table(catalog, TABLE, sources, {})
    before = rows_digest(table)
    files_before, bytes_before = files_and_bytes(table)
    env = {**os.environ, "COMPACTION_CONFIG": str(config)}
    command = [str(Path(sys.executable).parent / "compaction-assets"), "compact", TABLE]
    started = time.monotonic()
    run = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if run.returncode != 0:
        raise SystemExit(f"compact failed ({run.returncode}):\n{run.stdout}\n{run.stderr[-3000:]}")
    table = catalog.load_table(TABLE)
    files_after, bytes_after = files_and_bytes(table)
    paths = re.findall(r"committed snapshot \d+: .* \(([a-z+]+)\)", run.stderr)
    split = re.search(r"planned in ([\d.]+)s, rewritten in ([\d.]+)s, committed in ([\d.]+)s", run.stderr)
    return {
        "dataset": dataset.name,
        "rows": dataset.rows,
        "files_before": files_before,
        "files_after": files_after,
        "bytes_before": bytes_before,
        "bytes_after": bytes_after,
        "command_s": round(seconds, 1),
        "planned_s": float(split.group(1)) if split else None,
        "rewritten_s": float(split.group(2)) if split else None,
        "committed_s": float(split.group(3)) if split else None,
        "rewrite_path": "+".join(sorted(set(paths))) or "?",
        "identical_rows": rows_digest(table) == before,
        "stdout": run.stdout.strip(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m compaction_tools.bench.cluster", description=__doc__)
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="small")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--master", default=None, help="an existing cluster (default: start a local one)")
    parser.add_argument("--root", type=Path, default=None, help="scratch folder (default: a new temporary one)")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        root = args.root or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cluster-bench-")))
        master = args.master
        if master is None:
            cluster = stack.enter_context(local_cluster(root / "cluster", workers=args.workers))
            master = cluster.master_url
        result = measure(root, master, DATASETS[args.dataset])
    print(result.pop("stdout"))
    print(" ".join(f"{k}={v}" for k, v in result.items()))
    if not result["identical_rows"]:
        raise SystemExit("rows differ after the compaction")


if __name__ == "__main__":
    main()
