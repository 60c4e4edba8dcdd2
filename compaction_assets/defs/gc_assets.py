"""GC as a separate process from compaction: one asset per table, downstream of the table asset."""

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    DefaultScheduleStatus,
    MaterializeResult,
    ScheduleDefinition,
    asset,
    define_asset_job,
)

from compaction_assets.defs.naming import table_key
from compaction_assets.defs.resources import CompactionResource


def gc_key(table_name: str) -> AssetKey:
    return AssetKey(["gc", *table_name.split(".")])


def gc_asset(table_name: str) -> AssetsDefinition:
    @asset(
        key=gc_key(table_name),
        deps=[table_key(table_name)],
        group_name="maintenance",
        kinds={"iceberg"},
        description=f"Garbage collection of `{table_name}`: expires old snapshots and deletes files that no "
        "retained snapshot or in-flight task references (orphans only after a grace period).",
    )
    def _gc(context: AssetExecutionContext, compaction: CompactionResource) -> MaterializeResult:
        report = compaction.engine().gc(table_name)
        context.log.info(
            f"{table_name}: expired {len(report.snapshots_expired)} snapshot(s), deleted {report.files_deleted} "
            f"file(s) ({len(report.orphan_files)} orphans), {report.bytes_reclaimed} bytes"
            + (" (paused: skipped)" if report.paused else "")
        )
        return MaterializeResult(
            metadata={
                "paused": report.paused,
                "snapshots_expired": len(report.snapshots_expired),
                "files_deleted": report.files_deleted,
                "orphan_files_deleted": len(report.orphan_files),
                "bytes_reclaimed": report.bytes_reclaimed,
            }
        )

    return _gc


def gc_schedule(table_names: list[str]) -> ScheduleDefinition:
    job = define_asset_job("gc_all_tables", selection=AssetSelection.assets(*[gc_key(t) for t in table_names]))
    return ScheduleDefinition(
        name="gc_daily", job=job, cron_schedule="0 3 * * *", default_status=DefaultScheduleStatus.RUNNING
    )
