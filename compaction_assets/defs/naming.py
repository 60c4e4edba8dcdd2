"""Names in Dagster for the tables of the lake (the asset-key and tag contracts)."""

from dagster import AssetKey

QUEUE_TAG = "compaction/queue"
TABLE_TAG = "compaction/table"
PRIORITY_TAG = "dagster/priority"
PARTITION_TAG = "dagster/partition"
RANGE_START_TAG = "dagster/asset_partition_range_start"  # a run over a range of partitions
RANGE_END_TAG = "dagster/asset_partition_range_end"
CHECK_NAME = "precommit_commit_consistency"
LOCATION_NAME = "compaction_assets"  # the code location, in workspace.yaml and the demo's workspace
WEBSERVER_ENV = "COMPACTION_DAGSTER_URL"  # the webserver the sensor asks to reload the code location


def table_key(table_name: str) -> AssetKey:
    """`ns.tbl` -> `lake/ns/tbl` (namespace levels become key parts)."""
    return AssetKey(["lake", *table_name.split(".")])


def partitions_name(table_name: str) -> str:
    return "lake__" + table_name.replace(".", "__")


def job_name(table_name: str) -> str:
    return "compact__" + table_name.replace(".", "__")


def pool_name(queue: str) -> str:
    return f"compaction-{queue}"
