"""Sensor ticks at scale: N managed tables x 20 partitions; a tick after 10 tables changed must
cost time in proportion to the 10, not the N."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from dagster import DagsterInstance, build_sensor_context
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import IntegerType, LongType, NestedField

from compaction_assets.config import load_config
from compaction_assets.defs.sensors import evaluate_fragmentation
from compaction_assets.lake.catalog import open_catalog
from compaction_tools.demo import append_fragments

PARTITIONS = 20
SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "p", IntegerType(), required=False))
SPEC = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="p"))


def _batch(first: int, partition: int) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + 5), pa.int64()), "p": pa.array([partition] * 5, pa.int32())})


def measure(config_path: Path, tables: int, changed: int = 10, log: Callable[[str], None] = print) -> dict:
    catalog = open_catalog(load_config(config_path).catalog)
    catalog.create_namespace_if_not_exists("scale")
    names = [f"scale.t{i:04d}" for i in range(tables)]
    started = time.perf_counter()
    for i, name in enumerate(names):
        table = catalog.create_table(name, schema=SCHEMA, partition_spec=SPEC)
        append_fragments(table, [_batch(p * 5, p) for p in range(PARTITIONS)])
        if (i + 1) % 200 == 0:
            log(f"[planning] created {i + 1}/{tables} tables x {PARTITIONS} partitions")
    log(f"[planning] {tables} tables created in {time.perf_counter() - started:.0f}s")
    managed = dict.fromkeys(names, True)
    with DagsterInstance.ephemeral() as instance:

        def tick(cursor: str | None) -> tuple[float, str | None]:
            context = build_sensor_context(instance=instance, cursor=cursor)
            began = time.perf_counter()
            result = evaluate_fragmentation(context, load_config(config_path), managed)
            return time.perf_counter() - began, result.cursor

        full_s, cursor = tick(None)
        quiet_s, cursor = tick(cursor)
        for name in names[:changed]:
            catalog.load_table(name).append(_batch(10_000, 0))
        changed_s, _ = tick(cursor)
    log(
        f"[planning] sensor tick over {tables} tables: all new {full_s:.2f}s, none changed {quiet_s:.2f}s, "
        f"{changed} changed {changed_s:.2f}s"
    )
    return {
        "tables": tables,
        "partitions_per_table": PARTITIONS,
        "tick_all_tables_s": full_s,
        "tick_nothing_changed_s": quiet_s,
        "tick_changed_s": changed_s,
        "changed_tables": changed,
    }
