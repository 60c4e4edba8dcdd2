"""Table maintenance apart from compaction: one asset per table, downstream of the table asset.

Materialising it collects the table's garbage (the daily `gc_all_tables` schedule), or, in a run
tagged `compaction/maintenance=rewrite-manifests` (the fragmentation sensor requests those),
rewrites the table's small manifests (commit/manifest_rewrite.py). A manifest rewrite is
table-wide, not per partition, so it materialises this unpartitioned asset rather than the
table's partitioned one; its metadata `kind` says which maintenance ran (`gc` or
`rewrite-manifests`).
"""

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
    MetadataValue,
    ScheduleDefinition,
    define_asset_job,
    multi_asset,
)

from compaction_assets.defs.naming import MAINTENANCE_TAG, table_key
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.engine import Engine
from compaction_assets.planning.planner import Kind
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
        description=f"Maintenance of `{table_name}`: garbage collection (expires old snapshots and deletes files "
        "that no retained snapshot or in-flight task references, orphans only after a grace period), and "
        "manifest rewrites (small manifests merged, clustered by partition) when the sensor asks for one.",
    )


def gc_assets(table_names: list[str]) -> AssetsDefinition:
    """Every table's GC asset in one op (as the tables' own assets, see queue_assets): a run
    collects the selected tables one after the other; one failing does not stop the rest."""
    tables = {gc_key(t): t for t in table_names}

    @multi_asset(name="gc_tables", specs=[gc_spec(t) for t in table_names], can_subset=True)
    def _gc(context: AssetExecutionContext, compaction: CompactionResource) -> Iterator[MaterializeResult]:
        engine = compaction.engine()
        failed: list[str] = []
        rewrite = context.run.tags.get(MAINTENANCE_TAG) == str(Kind.REWRITE_MANIFESTS)
        for key in sorted(context.selected_asset_keys):
            table_name = tables[key]
            if rewrite:
                try:
                    yield _rewrite_manifests(context, engine, key, table_name)
                except Exception as exc:  # noqa: BLE001 - reported below, after the other tables
                    context.log.error(redact(f"{table_name}: manifest rewrite failed: {exc}"))
                    failed.append(table_name)
                continue
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
                    "kind": "gc",
                    "paused": report.paused,
                    "snapshots_expired": len(report.snapshots_expired),
                    "files_deleted": report.files_deleted,
                    "orphan_files_deleted": len(report.orphan_files),
                    "bytes_reclaimed": report.bytes_reclaimed,
                },
            )
        if failed:
            what = "manifest rewrite" if rewrite else "GC"
            raise Failure(description=f"{what} failed for {len(failed)} table(s): {', '.join(failed[:20])}")

    return _gc


def _rewrite_manifests(
    context: AssetExecutionContext, engine: Engine, key: AssetKey, table_name: str
) -> MaterializeResult:
    report = engine.rewrite_manifests(table_name, task_id=context.run.run_id)
    context.log.info(redact(f"{table_name}: {report.status}: {report.reason}"))
    return MaterializeResult(
        asset_key=key,
        metadata={
            "kind": str(Kind.REWRITE_MANIFESTS),
            "status": report.status,
            "reason": redact(report.reason),
            "manifests_before": report.manifests_before,
            "manifests_after": report.manifests_after,
            "manifests_replaced": report.manifests_replaced,
            "manifests_written": report.manifests_written,
            "entries": report.entries,
            "bytes_replaced": report.bytes_replaced,
            "bytes_written": report.bytes_written,
            "duration_s": round(report.seconds, 3),
            "snapshot_id": MetadataValue.text(str(report.snapshot_id or "")),
            "task_id": report.task_id,
        },
    )


def gc_schedule() -> ScheduleDefinition:
    job = define_asset_job(GC_JOB, selection=AssetSelection.key_prefixes("gc"))
    return ScheduleDefinition(
        name="gc_daily", job=job, cron_schedule="0 3 * * *", default_status=DefaultScheduleStatus.RUNNING
    )
