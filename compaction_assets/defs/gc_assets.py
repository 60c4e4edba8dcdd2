"""GC as a separate process from compaction: one asset per table, downstream of the table asset."""

from collections.abc import Iterator

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    DefaultScheduleStatus,
    Failure,
    MaterializeResult,
    ScheduleDefinition,
    define_asset_job,
    multi_asset,
)

from compaction_assets.defs.naming import table_key
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.redact import redact

GC_JOB = "gc_all_tables"


def gc_key(table_name: str) -> AssetKey:
    return AssetKey(["gc", *table_name.split(".")])


def gc_spec(table_name: str) -> AssetSpec:
    return AssetSpec(
        key=gc_key(table_name),
        deps=[table_key(table_name)],
        group_name="maintenance",
        kinds={"iceberg"},
        skippable=True,  # a table whose GC failed reports none; the others still do
        description=f"Garbage collection of `{table_name}`: expires old snapshots and deletes files that no "
        "retained snapshot or in-flight task references (orphans only after a grace period).",
    )


def gc_assets(table_names: list[str]) -> AssetsDefinition:
    """Every table's GC asset in one op (as the tables' own assets, see queue_assets): a run
    collects the selected tables one after the other; one failing does not stop the rest."""
    tables = {gc_key(t): t for t in table_names}

    @multi_asset(name="gc_tables", specs=[gc_spec(t) for t in table_names], can_subset=True)
    def _gc(context: AssetExecutionContext, compaction: CompactionResource) -> Iterator[MaterializeResult]:
        engine = compaction.engine()
        failed: list[str] = []
        for key in sorted(context.selected_asset_keys):
            table_name = tables[key]
            try:
                report = engine.gc(table_name)
            except Exception as exc:  # noqa: BLE001 - reported below, after the other tables
                context.log.error(redact(f"{table_name}: GC failed: {exc}"))
                failed.append(table_name)
                continue
            context.log.info(
                f"{table_name}: expired {len(report.snapshots_expired)} snapshot(s), deleted {report.files_deleted} "
                f"file(s) ({len(report.orphan_files)} orphans), {report.bytes_reclaimed} bytes"
                + (" (paused: skipped)" if report.paused else "")
            )
            yield MaterializeResult(
                asset_key=key,
                metadata={
                    "paused": report.paused,
                    "snapshots_expired": len(report.snapshots_expired),
                    "files_deleted": report.files_deleted,
                    "orphan_files_deleted": len(report.orphan_files),
                    "bytes_reclaimed": report.bytes_reclaimed,
                },
            )
        if failed:
            raise Failure(description=f"GC failed for {len(failed)} table(s): {', '.join(failed[:20])}")

    return _gc


def gc_schedule() -> ScheduleDefinition:
    job = define_asset_job(GC_JOB, selection=AssetSelection.key_prefixes("gc"))
    return ScheduleDefinition(
        name="gc_daily", job=job, cron_schedule="0 3 * * *", default_status=DefaultScheduleStatus.RUNNING
    )
