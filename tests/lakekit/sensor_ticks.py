"""A fragmentation sensor tick on a real Dagster instance, and what it requested: shared by the
sensor, scheduling and Dagster-facing tests."""

from __future__ import annotations

import logging

import yaml
from dagster import (
    AddDynamicPartitionsRequest,
    RunRequest,
    build_sensor_context,
)

from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions
from compaction_assets.defs.resources import CompactionResource


def tick(lake, instance, cursor=None):
    defs = build_definitions(load_config(lake.config_path))
    sensor = defs.get_sensor_def("fragmentation_sensor")
    context = build_sensor_context(
        instance=instance,
        cursor=cursor,
        definitions=defs,
        resources={"compaction": CompactionResource(config_path=str(lake.config_path))},
    )
    return sensor(context)


def requested(result, instance=None) -> dict[tuple[str, str], RunRequest]:
    """(table, partition) -> the request of the run covering it (a range run: every key of its range,
    in the partition order once the tick's partition requests apply)."""
    added = {
        r.partitions_def_name: list(r.partition_keys)
        for r in result.dynamic_partitions_requests
        if isinstance(r, AddDynamicPartitionsRequest)
    }
    covered = {}
    for r in result.run_requests:
        table = r.tags["compaction/table"]
        if (start := r.tags.get("dagster/asset_partition_range_start")) is None:
            covered[(table, r.partition_key or "")] = r
            continue
        name = "lake__" + table.replace(".", "__")
        order = [*(instance.get_dynamic_partitions(name) if instance else []), *added.get(name, [])]
        end = r.tags["dagster/asset_partition_range_end"]
        covered.update(((table, k), r) for k in order[order.index(start) : order.index(end) + 1])
    return covered


def set_scheduling(lake, **values) -> None:
    doc = yaml.safe_load(lake.config_path.read_text())
    doc["scheduling"] = {**doc.get("scheduling", {}), **values}
    lake.config_path.write_text(yaml.safe_dump(doc))


class Collect(logging.Handler):
    """The tick's log lines (the sensor context's logger, as the UI's tick log gets them)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
