"""Draining many fragmented partitions: a table with 2,000 of them, from the first fragmentation
sensor tick to every partition committed.

Each tick of the real sensor (real Dagster instance on SQLite, real catalog) is followed by the
runs it requested, executed in sequence with `execute_in_process` of the table's job on this
process's warm local Spark session: the run worker's code path (asset, engine, one Spark job,
one commit, a materialisation and a check result per partition) without the launch of a run
process, which `bench.fixed_cost` measures (`dagster_run_fixed_cost_s`, paid once per run: runs
x that is the rest of a deployment's drain time). The same loop with `max_partitions_per_run: 1`
(the run-per-partition behaviour before batches) over a few partitions gives the anchor.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import yaml
from dagster import AddDynamicPartitionsRequest, DagsterInstance, SensorResult, build_sensor_context
from pyspark.sql import SparkSession

from compaction_assets.commit.ledger import Status
from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions, table_job
from compaction_assets.defs.naming import TABLE_TAG
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.engine.facade import Engine
from compaction_assets.execution.spark import spark_session
from compaction_assets.lake.appends import append_fragments
from compaction_assets.lake.digest import rows_digest

FILES_PER_PARTITION = 5  # the default policy's min_input_files: every partition is worth compacting
ROWS_PER_FILE = 4
APPEND_PARTITIONS = 250  # partitions per append (one commit each) while building the table
CONFIG = {  # a scratch lake beside the file: SQLite catalog and ledger, local Spark
    "catalog": {
        "name": "drain",
        "properties": {"type": "sql", "uri": "sqlite:///catalog.db", "warehouse": "file://wh"},
    },
    "state": {"uri": "sqlite:///state.db"},
    "spark": {"mode": "local", "master": "local[2]", "conf": {"spark.ui.showConsoleProgress": "false"}},
}


def build_table(engine: Engine, name: str, partitions: int) -> None:
    """`partitions` identity partitions of FILES_PER_PARTITION small files each, in a few appends."""
    first = pa.table({"id": pa.array([0], pa.int64()), "part": pa.array([0], pa.int32())})
    table = engine.catalog.create_table(name, schema=first.schema)
    with table.update_spec() as spec:
        spec.add_identity("part")
    table = engine.catalog.load_table(name)
    for start in range(0, partitions, APPEND_PARTITIONS):
        batches = []
        for p in range(start, min(start + APPEND_PARTITIONS, partitions)):
            for f in range(FILES_PER_PARTITION):
                ids = range(
                    (p * FILES_PER_PARTITION + f) * ROWS_PER_FILE, (p * FILES_PER_PARTITION + f + 1) * ROWS_PER_FILE
                )
                batches.append(
                    pa.table({"id": pa.array(ids, pa.int64()), "part": pa.array([p] * ROWS_PER_FILE, pa.int32())})
                )
        append_fragments(table, batches)
        table.refresh()


def drain(config_path: Path, instance: DagsterInstance, log: Callable[[str], None]) -> tuple[float, int, int]:
    """Tick the sensor, run what it requested, until a tick requests nothing. Returns seconds,
    runs and ticks."""
    config = load_config(config_path)
    defs = build_definitions(config)
    sensor = defs.get_sensor_def("fragmentation_sensor")
    resources = {"compaction": CompactionResource(config_path=str(config_path))}
    cursor, runs, ticks = None, 0, 0
    started = time.perf_counter()
    while True:
        result = sensor(build_sensor_context(instance=instance, cursor=cursor, definitions=defs, resources=resources))
        if not isinstance(result, SensorResult):  # evaluate_fragmentation returns one
            raise TypeError(f"fragmentation_sensor returned {type(result).__name__}, not a SensorResult")
        ticks += 1
        for change in result.dynamic_partitions_requests or ():  # as the daemon does before launching
            if isinstance(change, AddDynamicPartitionsRequest):
                instance.add_dynamic_partitions(change.partitions_def_name, change.partition_keys)
        cursor = result.cursor
        if not result.run_requests:
            return time.perf_counter() - started, runs, ticks
        for request in result.run_requests:
            job = table_job(defs, request.tags[TABLE_TAG])
            began = time.perf_counter()
            run = job.execute_in_process(
                instance=instance, partition_key=request.partition_key, tags=request.tags, raise_on_error=False
            )
            runs += 1
            if not run.success:
                raise RuntimeError(f"run {run.run_id} ({request.run_key}) failed")
            log(f"[drain] run {runs} ({request.run_key}) in {time.perf_counter() - began:.1f}s")


def measure(
    root: Path, partitions: int = 2000, anchor_partitions: int = 10, log: Callable[[str], None] = print
) -> dict:
    """Build the table, drain it with the product's batches, then drain `anchor_partitions` with a
    run per partition (0: skip the anchor)."""
    figures: dict = {"partitions": partitions}
    for label, count, per_run in (("batched", partitions, None), ("per_partition", anchor_partitions, 1)):
        if not count:
            continue
        home = root / f"drain-{label}"
        home.mkdir(parents=True)
        config_path = home / "compaction.yaml"
        config_path.write_text(yaml.safe_dump({**CONFIG, "scheduling": {"max_partitions_per_run": per_run or 500}}))
        config = load_config(config_path)
        spark = spark_session(config.spark)  # the warm session every run of this process joins

        def warm(spark: SparkSession = spark) -> SparkSession:
            return spark

        engine = Engine(config, spark=warm)
        engine.catalog.create_namespace_if_not_exists("drain")
        began = time.perf_counter()
        build_table(engine, "drain.t", count)
        before = rows_digest(engine.catalog.load_table("drain.t"))
        built = time.perf_counter() - began
        log(f"[drain] {label}: table of {count} partitions x {FILES_PER_PARTITION} files built in {built:.0f}s")
        (home / "dagster_home").mkdir()
        with DagsterInstance.local_temp(str(home / "dagster_home")) as instance:
            seconds, runs, ticks = drain(config_path, instance, log)
        table = engine.catalog.load_table("drain.t")
        committed = [a for a in engine.ledger.attempts(table_name="drain.t") if a.status == Status.COMMITTED]
        if rows_digest(table) != before or len(committed) != count or engine.plan("drain.t").to_compact:
            raise RuntimeError(f"drain of {count} partitions incomplete or rows changed: {len(committed)} committed")
        figures[label] = {"seconds": seconds, "runs": runs, "ticks": ticks, "per_partition_s": seconds / count}
        log(
            f"[drain] {label}: {count} partitions committed in {seconds:.1f}s: {runs} run(s), {ticks} tick(s), "
            f"{seconds / count:.3f}s per partition"
        )
        engine.ledger.dispose()
    return figures


def report(figures: dict, log: Callable[[str], None] = print) -> None:
    batched = figures["batched"]
    line = (
        f"drain_2000_partitions_s={batched['seconds']:.1f} per_partition_s={batched['per_partition_s']:.3f} "
        f"(partitions={figures['partitions']} runs={batched['runs']} ticks={batched['ticks']}"
    )
    if anchor := figures.get("per_partition"):
        line += f"; a run per partition: {anchor['per_partition_s']:.2f}s per partition"
    log(line + "; launch of a run process not included: + runs x dagster_run_fixed_cost_s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=2000)
    parser.add_argument("--anchor-partitions", type=int, default=10)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="drain-bench-"))
    report(measure(root, args.partitions, args.anchor_partitions))


if __name__ == "__main__":
    main()
