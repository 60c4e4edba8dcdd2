"""One asset per managed table: materialising a partition compacts it; a blocking check follows."""

import time

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    DagsterEventType,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
    asset_check,
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


def table_asset(table_name: str, rule: TableRule, partitioned: bool, location: str, policy: Policy) -> AssetsDefinition:
    namespace = table_name.rsplit(".", 1)[0]
    partitions = DynamicPartitionsDefinition(name=partitions_name(table_name)) if partitioned else None

    @asset(
        key=table_key(table_name),
        partitions_def=partitions,
        group_name=namespace.replace(".", "_"),
        kinds={"iceberg", "spark"},
        deps=[AssetKey.from_user_string(u) for u in rule.upstream],
        pool=pool_name(rule.queue),
        description=(
            f"Iceberg table `{table_name}` at `{location}`, compacted on queue `{rule.queue}` "
            f"(priority {rule.priority}). Policy: target {policy.target_file_size_bytes} B, fragment <= "
            f"{policy.fragment_max_bytes} B, undersized < {policy.undersized_below_bytes} B, "
            f"min input files {policy.min_input_files}. Materialising a partition compacts it."
        ),
        metadata={"table": table_name, "location": MetadataValue.path(location), "queue": rule.queue},
    )
    def _compact(
        context: AssetExecutionContext, compaction: CompactionResource, pyspark: LazyPySparkResource
    ) -> MaterializeResult:
        partition = context.partition_key if partitioned else None
        engine = compaction.engine(spark=pyspark)
        outcomes = engine.compact(table_name, partition=partition, task_id=context.run.run_id)
        for o in outcomes:
            context.log.info(redact(f"{table_name} [{o.partition_key or 'unpartitioned'}]: {o.status}: {o.reason}"))
        failed = [o for o in outcomes if not o.ok]
        if failed:
            description = redact(f"{table_name}: {failed[0].reason}")
            raise Failure(description=description, metadata=_metadata(failed[0], rule.queue))
        outcome = _single(outcomes)
        fixed = run_fixed_cost(context, outcome.seconds)
        context.log.info(
            f"dagster_run_fixed_cost_s={fixed:.2f} (run launch to result, less {outcome.seconds:.2f}s of compaction; "
            f"spark {'connect' if engine.config.spark.mode == 'connect' else 'local: a JVM of its own'})"
        )
        return MaterializeResult(
            metadata={**_metadata(outcome, rule.queue), "dagster_run_fixed_cost_s": round(fixed, 2)}
        )

    return _compact


def consistency_check(table_name: str, executing_timeout_seconds: int):  # noqa: ANN201 - AssetChecksDefinition
    @asset_check(
        asset=table_key(table_name),
        name=CHECK_NAME,
        blocking=True,
        description="The run's ledger rows are COMMITTED with their snapshot, result files live, replaced "
        "files gone, rows in = rows out, nothing left PREPARED or untracked for the partition.",
    )
    def _check(context: AssetCheckExecutionContext, compaction: CompactionResource) -> AssetCheckResult:
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
        return AssetCheckResult(passed=report.passed, severity=AssetCheckSeverity.ERROR, metadata=metadata)

    return _check


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
