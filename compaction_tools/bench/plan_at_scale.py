"""Planning one huge table: 200,000 live files in 5,000 partitions (issue 19).

The table is made fast, not through 200,000 appends: pyiceberg writes one real tiny Parquet file
per partition (its own values, field ids, statistics), each is hard-linked into the partition's
folder `files/partitions` times, and the DataFiles (the file's own, with the link's path) are
committed in `commits` fast appends of `manifests/commits` manifests each, the shape a streaming
writer leaves: every manifest holds one file of each of `files/manifests` partitions. It is built
once into a cache folder (reused while its marker file is there) with its generation time.

Measured in child processes, each starting cold:
- the plan (`Engine.plan`, what `compaction-assets plan` prints): the first (cold) and the
  median of the next ones (warm: caches filled, as in a long-lived sensor or code server);
- the fragmentation sensor's tick (`evaluate_fragmentation` on an ephemeral DagsterInstance, as
  bench/planning_scale.py drives it): the first plans the table; the median of the next ones,
  on the unchanged table, is `tick_s`; and the process's peak RSS (VmHWM).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import yaml
from pyiceberg.manifest import DataFile, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestampType

from compaction_assets.iceberg_compat.arrow import dataframe_to_data_files
from compaction_assets.iceberg_compat.metadata import record_values
from compaction_assets.iceberg_compat.producers import AppendProducer
from compaction_assets.lake.catalog import open_catalog

TABLE = "scale.events"
FILES_PER_PARTITION = 40
REGIONS = 10
ROWS_PER_FILE = 10
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "ts", TimestampType(), required=False),
    NestedField(3, "region", StringType(), required=False),
    NestedField(4, "amount", DoubleType(), required=False),
)
SPEC = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=DayTransform(), name="ts_day"),
    PartitionField(source_id=3, field_id=1001, transform=IdentityTransform(), name="region"),
)
MARKER = "ready.json"
_EPOCH_DAY = dt.datetime(2024, 1, 1)


def default_root(files: int, partitions: int, manifests: int) -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"compaction-plan-scale-{files}-{partitions}-{manifests}"


def config_doc(root: Path) -> dict:
    return {
        "catalog": {
            "name": "scale",
            "properties": {
                "type": "sql",
                "uri": f"sqlite:///{root}/catalog.db",
                "warehouse": f"file://{root}/warehouse",
            },
        },
        "state": {"uri": f"sqlite:///{root}/state.db"},
        "spark": {"mode": "local", "master": "local[1]"},
        "tables": [{"match": "*"}],
    }


def ensure_table(
    root: Path, files: int, partitions: int, manifests: int, commits: int, log: Callable[[str], None] = print
) -> dict:
    """The cached table under `root` (built when its marker is missing); returns the marker."""
    marker = root / MARKER
    if marker.exists():
        built = json.loads(marker.read_text())
        log(f"[plan-scale] reusing the table in {root} (built in {built['generation_s']:.0f}s)")
        return built
    if files % partitions or files % manifests or manifests % commits or partitions % (files // manifests):
        raise ValueError(
            f"plan-scale: {files} files must split evenly over {partitions} partitions, {manifests} manifests"
        )
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "compaction.yaml").write_text(yaml.safe_dump(config_doc(root), sort_keys=False))
    started = time.perf_counter()
    catalog = open_catalog(_catalog_config(root))
    catalog.create_namespace_if_not_exists(TABLE.split(".")[0])
    table = catalog.create_table(TABLE, schema=SCHEMA, partition_spec=SPEC)
    originals = sorted(
        dataframe_to_data_files(table.metadata, _rows(partitions), table.io), key=lambda f: f.file_path
    )  # one file per partition: pyiceberg splits the rows by partition
    if len(originals) != partitions:
        raise RuntimeError(f"plan-scale: expected {partitions} partition files, pyiceberg wrote {len(originals)}")
    log(f"[plan-scale] wrote {partitions} partition files in {time.perf_counter() - started:.1f}s; linking copies")
    copies = files // partitions
    per_manifest = files // manifests
    batches = _manifest_batches(originals, copies, per_manifest)
    per_commit = manifests // commits
    for c in range(commits):
        chunk = batches[c * per_commit : (c + 1) * per_commit]
        with table.transaction() as txn:
            append = _ManifestPerBatch(Operation.APPEND, txn, table.io)
            append.batches = chunk
            for batch in chunk:
                for data_file in batch:
                    append.append_data_file(data_file)
            append.commit()
        table = catalog.load_table(TABLE)
        if (c + 1) % 10 == 0 or c + 1 == commits:
            log(f"[plan-scale] committed {(c + 1) * per_commit}/{manifests} manifests")
    built = {
        "files": files,
        "partitions": partitions,
        "manifests": manifests,
        "commits": commits,
        "generation_s": time.perf_counter() - started,
    }
    marker.write_text(json.dumps(built))
    return built


class _ManifestPerBatch(AppendProducer):
    """A fast append writing one manifest per batch of files (as many micro-batch commits would)."""

    batches: list[list[DataFile]]

    def manifests(self) -> list[ManifestFile]:
        """One ADDED manifest per batch, then the parent's manifests."""
        written = []
        for batch in self.batches:
            with self.new_manifest_writer(self.table_metadata.spec()) as writer:
                for data_file in batch:
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self.snapshot_id,
                            sequence_number=None,
                            file_sequence_number=None,
                            data_file=data_file,
                        )
                    )
            written.append(writer.to_manifest_file())
        return written + self.existing_manifests()


def _rows(partitions: int) -> pa.Table:
    """ROWS_PER_FILE rows in each partition: day d (from 2024-01-01) x region r."""
    ids, stamps, regions = [], [], []
    for p in range(partitions):
        day, region = divmod(p, REGIONS)
        for i in range(ROWS_PER_FILE):
            ids.append(p * ROWS_PER_FILE + i)
            stamps.append(_EPOCH_DAY + dt.timedelta(days=day, minutes=7 * i))
            regions.append(f"region-{region:02d}")
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "ts": pa.array(stamps, pa.timestamp("us")),
            "region": pa.array(regions, pa.string()),
            "amount": pa.array([i * 0.25 for i in ids], pa.float64()),
        }
    )


def _manifest_batches(originals: list[DataFile], copies: int, per_manifest: int) -> list[list[DataFile]]:
    """Copy k of every partition's file as a hard link beside it; manifest m holds copy
    m // (partitions / per_manifest) of a run of per_manifest consecutive partitions."""
    runs = len(originals) // per_manifest
    batches = []
    for m in range(runs * copies):
        copy, run = divmod(m, runs)
        batches.append([_linked(f, copy) for f in originals[run * per_manifest : (run + 1) * per_manifest]])
    return batches


def _linked(original: DataFile, copy: int) -> DataFile:
    if copy == 0:
        return original
    source = original.file_path.removeprefix("file://")
    target = source.removesuffix(".parquet") + f"-c{copy:03d}.parquet"
    os.link(source, target)
    data_file = DataFile(*record_values(original))
    data_file[1] = f"file://{target}" if original.file_path.startswith("file://") else target
    return data_file


def _catalog_config(root: Path):  # noqa: ANN202
    from compaction_assets.config import load_config

    return load_config(root / "compaction.yaml").catalog


# ---------------------------------------------------------------- children: plan and sensor


def _plan_child(root: Path, repeats: int) -> dict:
    from compaction_assets.config import load_config
    from compaction_assets.engine.facade import Engine

    engine = Engine(load_config(root / "compaction.yaml"))
    seconds, cpu, plans = [], [], None
    for _ in range(1 + repeats):
        began, began_cpu = time.perf_counter(), time.process_time()
        plans = engine.plan(TABLE)
        seconds.append(time.perf_counter() - began)
        cpu.append(time.process_time() - began_cpu)
    assert plans is not None  # the loop above runs at least once
    return {
        "cold_plan_s": seconds[0],
        "warm_plan_s": statistics.median(seconds[1:]),
        "warm_plan_runs": seconds[1:],
        "cold_plan_cpu_s": cpu[0],
        "warm_plan_cpu_s": statistics.median(cpu[1:]),
        "partitions_to_compact": len(plans.to_compact),
        "partitions": len(plans.partitions),
        "files": sum(p.stats.data_files for p in plans.partitions),
        "plan_peak_rss_bytes": _peak_rss(),
    }


def _sensor_child(root: Path, repeats: int) -> dict:
    from dagster import DagsterInstance, build_sensor_context

    from compaction_assets.config import load_config
    from compaction_assets.defs.sensors import evaluate_fragmentation

    config_path = root / "compaction.yaml"
    seconds, cpu, cursor = [], [], None
    with DagsterInstance.ephemeral() as instance:
        for _ in range(1 + repeats):
            context = build_sensor_context(instance=instance, cursor=cursor)
            began, began_cpu = time.perf_counter(), time.process_time()
            result = evaluate_fragmentation(context, load_config(config_path), {TABLE: True})
            seconds.append(time.perf_counter() - began)
            cpu.append(time.process_time() - began_cpu)
            cursor = result.cursor
    return {
        "first_tick_s": seconds[0],
        "tick_s": statistics.median(seconds[1:]),
        "tick_runs": seconds[1:],
        "tick_cpu_s": statistics.median(cpu[1:]),
        "sensor_peak_rss_bytes": _peak_rss(),
    }


def _peak_rss() -> int:
    from compaction_assets.execution.worker import peak_rss

    return peak_rss()


def _in_child(kind: str, root: Path, repeats: int) -> dict:
    command = [sys.executable, "-m", "compaction_tools.bench.plan_at_scale", "--child", kind, str(root), str(repeats)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench: the {kind} child failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(
    files: int = 200_000, root: Path | None = None, repeats: int = 5, log: Callable[[str], None] = print
) -> dict:
    """Build (or reuse) a table of `files` files (a multiple of 40): 40 per partition, in manifests
    of up to 200 files (1,000 manifests in 50 commits at 200,000 files); plan it and tick the
    sensor over it, each in a fresh process."""
    partitions = files // FILES_PER_PARTITION
    per_manifest = math.gcd(partitions, 200)
    manifests = files // per_manifest
    commits = math.gcd(manifests, 50)
    root = root or default_root(files, partitions, manifests)
    built = ensure_table(root, files, partitions, manifests, commits, log)
    figures = {**built, **_in_child("plan", root, repeats), **_in_child("sensor", root, repeats)}
    MiB = 1024 * 1024
    log(
        f"planning_{_short(files)}_s={figures['warm_plan_s']:.2f} (warm, median of {repeats}: "
        f"{', '.join(f'{s:.2f}' for s in figures['warm_plan_runs'])}; CPU {figures['warm_plan_cpu_s']:.2f}s; "
        f"cold {figures['cold_plan_s']:.2f}s, CPU {figures['cold_plan_cpu_s']:.2f}s; "
        f"{figures['files']} files, {figures['partitions']} partitions, {manifests} manifests, "
        f"{figures['partitions_to_compact']} to compact; plan process peak RSS "
        f"{figures['plan_peak_rss_bytes'] / MiB:.0f} MiB)"
    )
    log(
        f"sensor_tick_{_short(files)}_s={figures['tick_s']:.3f} (unchanged table, median of {repeats}: "
        f"{', '.join(f'{s:.3f}' for s in figures['tick_runs'])}; CPU {figures['tick_cpu_s']:.3f}s; first tick "
        f"{figures['first_tick_s']:.2f}s) sensor_peak_rss_mb={figures['sensor_peak_rss_bytes'] / MiB:.0f} "
        f"table_generation_s={built['generation_s']:.0f}"
    )
    return figures


def _short(files: int) -> str:
    return f"{files // 1000}k" if files % 1000 == 0 else str(files)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        kind, folder, times = sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
        print(json.dumps((_plan_child if kind == "plan" else _sensor_child)(folder, times)))
    else:
        measure(files=int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
