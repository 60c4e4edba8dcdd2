"""The demo's upstream writer: an asset that appends micro-batches to sales.orders, as a
streaming job would, so the asset graph shows writers -> table lineage."""

import random

from dagster import AssetExecutionContext, AssetKey, MaterializeResult, asset

from compaction_assets.defs.resources import CompactionResource
from compaction_assets.lake.appends import append_order_batches
from compaction_assets.lake.catalog import load_table

DEMO_WRITER_KEY = AssetKey(["writers", "orders_stream"])


@asset(
    key=DEMO_WRITER_KEY,
    group_name="writers",
    kinds={"python", "iceberg"},
    description="Demo writer: appends 12 small files (micro-batches) to sales.orders on each materialisation.",
)
def orders_stream(context: AssetExecutionContext, compaction: CompactionResource) -> MaterializeResult:
    engine = compaction.engine()
    table = load_table(engine.catalog, "sales.orders")
    files = append_order_batches(table, batches=12, rng=random.Random())
    context.log.info(f"appended {files} small file(s) to sales.orders")
    return MaterializeResult(metadata={"files_appended": files})
