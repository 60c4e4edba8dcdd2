"""Table maintenance apart from compaction: one asset, `maintenance`, partitioned by table name.

Materialising a table's partition collects the table's garbage (the daily `gc_all_tables`
schedule runs every managed table's partition in one run), or, in a run tagged
`compaction/maintenance=rewrite-manifests` (the fragmentation sensor requests those), rewrites
the table's small manifests (commit/manifest_rewrite.py). Maintenance is table-wide, not per
Iceberg partition, so it is not the table asset's; its metadata `kind` says which maintenance ran
(`gc` or `rewrite-manifests`). One asset rather than one per table: Dagster snapshots every
asset at each code-location load, and a second asset per table doubled that cost.
"""

from collections.abc import Collection, Iterator

from dagster import (
    AddDynamicPartitionsRequest,
    AssetExecutionContext,
    AssetMaterialization,
    DefaultScheduleStatus,
    DynamicPartitionsDefinition,
    Failure,
    MetadataValue,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    asset,
    define_asset_job,
    schedule,
)

from compaction_assets.commit.manifest_rewrite import ManifestRewriteReport
from compaction_assets.defs.naming import MAINTENANCE_KEY, MAINTENANCE_TAG, RANGE_END_TAG, RANGE_START_TAG
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.engine.facade import Engine
from compaction_assets.maintenance.gc import GcReport
from compaction_assets.planning.planner import Kind
from compaction_assets.redact import redact

GC_JOB = "gc_all_tables"
MAINTENANCE_PARTITIONS_NAME = "maintenance_tables"  # a str for Dagster calls (the definition's `.name` is Optional)
MAINTENANCE_PARTITIONS = DynamicPartitionsDefinition(name=MAINTENANCE_PARTITIONS_NAME)


def maintenance_partition_request(instance_partitions: Collection[str], table_name: str) -> list:
    """What makes the table a partition of the maintenance asset, if it is not yet one."""
    if table_name in instance_partitions:
        return []
    return [AddDynamicPartitionsRequest(partitions_def_name=MAINTENANCE_PARTITIONS_NAME, partition_keys=[table_name])]


@asset(
    key=MAINTENANCE_KEY,
    partitions_def=MAINTENANCE_PARTITIONS,
    group_name="maintenance",
    kinds={"iceberg"},
    output_required=False,  # a materialisation per table (partition) of the run is reported instead
    description="Maintenance of the managed tables, a partition per table (`namespace.table`): garbage "
    "collection (expires old snapshots and deletes files that no retained snapshot or in-flight task "
    "references, orphans only after a grace period), and manifest rewrites (small manifests merged, clustered "
    "by partition) when the sensor asks for one.",
)
def maintenance(context: AssetExecutionContext, compaction: CompactionResource) -> Iterator[AssetMaterialization]:
    """A run maintains the tables of its partitions one after the other; one failing does not
    stop the rest."""
    engine = compaction.engine()
    failed: list[str] = []
    rewrite = context.run.tags.get(MAINTENANCE_TAG) == str(Kind.REWRITE_MANIFESTS)
    for table_name in context.partition_keys:
        try:
            done = _rewrite_manifests(context, engine, table_name) if rewrite else _gc(context, engine, table_name)
        except Exception as exc:  # noqa: BLE001 - reported below, after the other tables
            what = "manifest rewrite" if rewrite else "GC"
            context.log.error(redact(f"{table_name}: {what} failed: {exc}"))
            failed.append(table_name)
            continue
        yield done
    if failed:
        what = "manifest rewrite" if rewrite else "GC"
        raise Failure(description=f"{what} failed for {len(failed)} table(s): {', '.join(failed[:20])}")


def _gc(context: AssetExecutionContext, engine: Engine, table_name: str) -> AssetMaterialization:
    report = engine.gc(table_name)
    context.log.info(
        f"{table_name}: expired {len(report.snapshots_expired)} snapshot(s), deleted {report.files_deleted} "
        f"file(s) ({len(report.orphan_files)} orphans), {report.bytes_reclaimed} bytes"
        + (" (paused: skipped)" if report.paused else "")
    )
    return AssetMaterialization(asset_key=MAINTENANCE_KEY, partition=table_name, metadata=gc_metadata(report))


def gc_metadata(report: GcReport) -> dict:
    """A GC's materialisation metadata (a run's, or the CLI's `gc` reported to Dagster)."""
    return {
        "kind": "gc",
        "table": report.table_name,
        "paused": report.paused,
        "snapshots_expired": len(report.snapshots_expired),
        "files_deleted": report.files_deleted,
        "orphan_files_deleted": len(report.orphan_files),
        "bytes_reclaimed": report.bytes_reclaimed,
    }


def _rewrite_manifests(context: AssetExecutionContext, engine: Engine, table_name: str) -> AssetMaterialization:
    report = engine.rewrite_manifests(table_name, task_id=context.run.run_id)
    context.log.info(redact(f"{table_name}: {report.status}: {report.reason}"))
    return AssetMaterialization(asset_key=MAINTENANCE_KEY, partition=table_name, metadata=manifests_metadata(report))


def manifests_metadata(report: ManifestRewriteReport) -> dict:
    """A manifest rewrite's materialisation metadata (a run's, or the CLI's reported to Dagster)."""
    return {
        "kind": str(Kind.REWRITE_MANIFESTS),
        "table": report.table_name,
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
    }


def gc_schedule(table_names: Collection[str] | None) -> ScheduleDefinition:
    """Daily: one run over every managed table's maintenance partition. The partitions follow the
    managed tables (`table_names`; None in a run worker, which has not loaded them): a table's
    is added here or by the sensor, a dropped table's removed here."""
    job = define_asset_job(GC_JOB, selection=[MAINTENANCE_KEY])

    @schedule(job=job, cron_schedule="0 3 * * *", default_status=DefaultScheduleStatus.RUNNING, name="gc_daily")
    def _gc_daily(context: ScheduleEvaluationContext) -> RunRequest | SkipReason:
        name = MAINTENANCE_PARTITIONS_NAME
        existing = list(context.instance.get_dynamic_partitions(name))
        if table_names is not None:
            wanted = set(table_names)
            for gone in sorted(set(existing) - wanted):
                context.instance.delete_dynamic_partition(name, gone)
            if added := sorted(wanted - set(existing)):
                context.instance.add_dynamic_partitions(name, added)
            existing = list(context.instance.get_dynamic_partitions(name))
        if not existing:
            return SkipReason("no managed tables")
        return RunRequest(tags={RANGE_START_TAG: existing[0], RANGE_END_TAG: existing[-1]})

    return _gc_daily
