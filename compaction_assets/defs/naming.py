"""Names in Dagster for the tables of the lake (the asset-key and tag contracts)."""

import re
import zlib
from collections.abc import Iterable

from dagster import AssetKey

QUEUE_TAG = "compaction/queue"
TABLE_TAG = "compaction/table"
PRIORITY_TAG = "dagster/priority"
PARTITION_TAG = "dagster/partition"
RANGE_START_TAG = "dagster/asset_partition_range_start"  # a run over a range of partitions
RANGE_END_TAG = "dagster/asset_partition_range_end"
MAINTENANCE_TAG = "compaction/maintenance"  # what a maintenance run does: recovery, rewrite-manifests, ...
CHECK_NAME = "precommit_commit_consistency"
LOCATION_NAME = "compaction_assets"  # the code location, in workspace.yaml and the demo's workspace
WEBSERVER_ENV = "COMPACTION_DAGSTER_URL"  # the webserver the sensor asks to reload the code location
# A JSON list of tables: the code location defines only these (a run worker that knows its run's)
TABLES_ENV = "COMPACTION_DEFS_TABLES"
MAINTENANCE_KEY = AssetKey("maintenance")  # GC and manifest rewrites: a partition per table (gc_assets)


def table_key(table_name: str) -> AssetKey:
    """`ns.tbl` -> `lake/ns/tbl` (namespace levels become key parts)."""
    return AssetKey(["lake", *table_name.split(".")])


def partitions_name(table_name: str) -> str:
    return "lake__" + table_name.replace(".", "__")


def run_tables(asset_keys: Iterable[AssetKey] | None) -> list[str] | None:
    """The table assets a run of these assets (tables' or the maintenance asset, which needs
    none) needs defined; None if it needs others too."""
    keys = [k for k in asset_keys or [] if k != MAINTENANCE_KEY]
    if not keys and asset_keys:
        return []
    if not keys or any(len(k.path) < 3 or k.path[0] != "lake" for k in keys):
        return None
    return sorted({".".join(k.path[1:]) for k in keys})


OP_BUCKETS = 64


def op_name(queue: str, table_name: str) -> str:
    """The op whose asset the table is. Dagster validates a multi-asset's checks in time quadratic
    in its assets (1.13), so a queue's tables are spread over OP_BUCKETS ops by a hash of the name:
    the same op in every process (a run worker defining only its table names the code server's)."""
    bucket = zlib.crc32(table_name.encode()) % OP_BUCKETS
    return f"compact_{re.sub(r'[^A-Za-z0-9_]', '_', queue)}_{bucket:02d}"


def pool_name(queue: str) -> str:
    return f"compaction-{queue}"
