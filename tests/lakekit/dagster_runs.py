"""A table partition materialised in process (the asset and its blocking check), and its metadata."""

from __future__ import annotations

from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions, table_job
from compaction_assets.defs.naming import op_name


def run_partition(lake, instance, partition: str):
    defs = build_definitions(load_config(lake.config_path))
    instance.add_dynamic_partitions("lake__ns__t", [partition])
    job = table_job(defs, "ns.t")
    result = job.execute_in_process(instance=instance, partition_key=partition, raise_on_error=False)
    [check] = result.get_asset_check_evaluations() or [None]
    return result, check


def materialization_metadata(result) -> dict:
    [event] = result.asset_materializations_for_node(op_name("default", "ns.t"))
    return {k: v.value for k, v in event.metadata.items()}
