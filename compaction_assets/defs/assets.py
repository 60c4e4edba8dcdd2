"""One asset per managed table: materialising a partition compacts it; a blocking check follows."""

import time
from collections.abc import Iterator

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    DagsterEventType,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)
from dagster_pyspark import LazyPySparkResource

from compaction_assets.commit.consistency import RECOVER_HINT, check_consistency
from compaction_assets.config import TableRule
from compaction_assets.defs.naming import CHECK_NAME, PARTITION_TAG, partitions_name, pool_name, table_key
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.engine import PartitionOutcome
from compaction_assets.lake.catalog import load_table
from compaction_assets.planning.policy import Policy
from compaction_assets.redact import redact


def table_spec(table_name: str, rule: TableRule, partitioned: bool, location: str, policy: Policy) -> AssetSpec:
    """The table's asset in the UI: key, partitions (the table's Iceberg partitions), lineage."""
    namespace = table_name.rsplit(".", 1)[0]
    return AssetSpec(
        key=table_key(table_name),
        partitions_def=DynamicPartitionsDefinition(name=partitions_name(table_name)) if partitioned else None,
        group_name=namespace.replace(".", "_"),
        kinds={"iceberg", "spark"},
        deps=[AssetKey.from_user_string(u) for u in rule.upstream],
        description=(
            f"Iceberg table `{table_name}` at `{location}`, compacted on queue `{rule.queue}` "
            f"(priority {rule.priority}). Policy: target {policy.target_file_size_bytes} B, fragment <= "
            f"{policy.fragment_max_bytes} B, undersized < {policy.undersized_below_bytes} B, "
            f"min input files {policy.min_input_files}. Materialising a partition compacts it."
        ),
        metadata={"table": table_name, "location": MetadataValue.path(location), "queue": rule.queue},
    )


def check_spec(table_name: str) -> AssetCheckSpec:
    return AssetCheckSpec(
        CHECK_NAME,
        asset=table_key(table_name),
        blocking=True,
        description="The run's ledger rows are COMMITTED with their snapshot, result files live, replaced "
        "files gone, rows in = rows out, nothing left PREPARED or untracked for the partition.",
    )


def queue_assets(
    name: str, queue: str, specs: dict[str, AssetSpec], executing_timeout_seconds: int
) -> AssetsDefinition:
    """Tables of `queue` (see naming.op_name), each with its blocking check, as the assets of one
    op: Dagster builds and snapshots an op for many tables at a fraction of an op per table's cost
    (seconds per thousand tables at every code location load). A run selects one table (and
    partition); the op compacts it, then checks it. The op's pool is the queue's."""
    tables = {spec.key: (name, spec.partitions_def is not None) for name, spec in specs.items()}

    @multi_asset(
        name=name,
        specs=list(specs.values()),
        check_specs=[check_spec(table) for table, _ in tables.values()],
        can_subset=True,
        pool=pool_name(queue),
    )
    def _compact(
        context: AssetExecutionContext, compaction: CompactionResource, pyspark: LazyPySparkResource
    ) -> Iterator[MaterializeResult | AssetCheckResult]:
        for key in sorted(context.selected_asset_keys):
            table_name, partitioned = tables[key]
            yield compact_table(context, table_name, queue, partitioned, compaction, pyspark)
        for check in sorted(context.selected_asset_check_keys):
            yield consistency_check(context, tables[check.asset_key][0], compaction, executing_timeout_seconds)

    return _compact


def compact_table(
    context: AssetExecutionContext,
    table_name: str,
    queue: str,
    partitioned: bool,
    compaction: CompactionResource,
    pyspark: LazyPySparkResource,
) -> MaterializeResult:
    partition = context.partition_key if partitioned else None
    engine = compaction.engine(spark=pyspark)
    outcomes = engine.compact(table_name, partition=partition, task_id=context.run.run_id)
    for o in outcomes:
        context.log.info(redact(f"{table_name} [{o.partition_key or 'unpartitioned'}]: {o.status}: {o.reason}"))
    failed = [o for o in outcomes if not o.ok]
    if failed:
        description = redact(f"{table_name}: {failed[0].reason}")
        raise Failure(description=description, metadata=_metadata(failed[0], queue))
    outcome = _single(outcomes)
    fixed = run_fixed_cost(context, outcome.seconds)
    context.log.info(
        f"dagster_run_fixed_cost_s={fixed:.2f} (run launch to result, less {outcome.seconds:.2f}s of compaction; "
        f"spark {'connect' if engine.config.spark.mode == 'connect' else 'local: a JVM of its own'})"
    )
    return MaterializeResult(
        asset_key=table_key(table_name),
        metadata={**_metadata(outcome, queue), "dagster_run_fixed_cost_s": round(fixed, 2)},
    )


def consistency_check(
    context: AssetExecutionContext, table_name: str, compaction: CompactionResource, executing_timeout_seconds: int
) -> AssetCheckResult:
    engine = compaction.engine()
    table = load_table(engine.catalog, table_name)
    partition = context.run.tags.get(PARTITION_TAG, "")
    report = check_consistency(table, engine.ledger, partition, context.run.run_id, executing_timeout_seconds)
    metadata = {"attempts_checked": report.attempts_checked, "partition": partition or "(unpartitioned)"}
    if not report.passed:
        metadata |= {
            "problems": MetadataValue.md("\n".join(f"- {p}" for p in report.problems)),
            "fix": RECOVER_HINT,
        }
    return AssetCheckResult(
        asset_key=table_key(table_name),
        check_name=CHECK_NAME,
        passed=report.passed,
        severity=AssetCheckSeverity.ERROR,
        metadata=metadata,
    )


def run_fixed_cost(context: AssetExecutionContext, compaction_seconds: float) -> float:
    """Seconds of this run so far not spent compacting: launch (from the run's STARTING event, or
    its start when executed in process), imports, code loading, the Spark session, the plan."""
    starting = context.instance.all_logs(context.run.run_id, of_type=DagsterEventType.RUN_STARTING)
    record = context.instance.get_run_record_by_id(context.run.run_id)
    begin = starting[0].timestamp if starting else (record.start_time if record and record.start_time else time.time())
    return max(0.0, time.time() - begin - compaction_seconds)


def _single(outcomes: list[PartitionOutcome]) -> PartitionOutcome:
    """A run compacts one partition (or the whole unpartitioned table): one outcome."""
    [outcome] = outcomes
    return outcome


def _metadata(o: PartitionOutcome, queue: str) -> dict:
    """Numeric values are plotted by the UI across materialisations; credentials are masked."""
    return {
        "status": o.status,
        "reason": redact(o.reason),
        "kind": o.kind or "none",
        "data_files_before": o.files_before,
        "data_files_after": o.files_after,
        "bytes_before": o.bytes_before,
        "bytes_after": o.bytes_after,
        "rows": o.rows,
        "deletes_applied": o.deletes_applied,
        "rows_deleted": o.rows_deleted,
        "delete_files_removed": o.delete_files_removed,
        "groups": o.groups,
        "duration_s": round(o.seconds, 3),
        "mb_per_s": round(o.mb_per_s, 3),
        "peak_worker_rss_mb": round(o.peak_worker_rss / 2**20, 1),
        "rewrite_engine": o.engine,
        "snapshot_id": MetadataValue.text(str(o.snapshot_id or "")),
        "task_id": o.task_id or "",
        "queue": queue,
    }
