"""Managed tables as assets: materialising partitions compacts them; a blocking check of each follows."""

import time
import warnings
from collections import Counter
from collections.abc import Generator, Iterator

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    AssetSpec,
    DagsterEventType,
    DynamicPartitionsDefinition,
    Failure,
    MetadataValue,
    Output,
    PreviewWarning,
    multi_asset,
)
from dagster_pyspark import LazyPySparkResource

from compaction_assets.commit.consistency import RECOVER_HINT, ConsistencyReport, check_partitions
from compaction_assets.config import TableRule
from compaction_assets.defs.naming import CHECK_NAME, partitions_name, pool_name, table_key
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.engine.facade import Engine
from compaction_assets.engine.outcomes import PartitionOutcome
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
        # no definition metadata: the description says it all, and Dagster snapshots (and a
        # webserver deserialises) every asset's at each load: 10% of the location's load at 10,000 tables
    )


def check_spec(spec: AssetSpec) -> AssetCheckSpec:
    """The table's blocking consistency check, evaluated per partition (as its asset is)."""
    with warnings.catch_warnings():  # a check per partition is a preview in Dagster 1.13: said once, in the README
        warnings.simplefilter("ignore", PreviewWarning)
        return AssetCheckSpec(
            CHECK_NAME,
            asset=spec.key,
            blocking=True,
            partitions_def=spec.partitions_def,
            description="The run's ledger rows are COMMITTED with their snapshot, result files live, replaced "
            "files gone, rows in = rows out (+ rows a data expiration dropped, never in a `replace` snapshot), "
            "nothing left PREPARED or untracked for the partition.",
        )


def queue_assets(name: str, queue: str, specs: dict[str, AssetSpec]) -> AssetsDefinition:
    """Tables of `queue` (see naming.op_name), each with its blocking check, as the assets of one
    op: Dagster builds and snapshots an op for many tables at a fraction of an op per table's cost
    (seconds per thousand tables at every code location load). Each table has partitions of its
    own: a run selects one table and one partition or a range of its partitions (Dagster takes
    the run's partitions from the selected table's; the op can subset, so its tables may differ).
    The op's pool is the queue's."""
    tables = {spec.key: (table, spec.partitions_def is not None) for table, spec in specs.items()}

    @multi_asset(
        name=name,
        specs=list(specs.values()),
        check_specs=[check_spec(spec) for spec in specs.values()],
        can_subset=True,  # also makes every output optional: materialisations are reported per partition
        pool=pool_name(queue),
    )
    def _compact(
        context: AssetExecutionContext, compaction: CompactionResource, pyspark: LazyPySparkResource
    ) -> Iterator[AssetMaterialization | AssetCheckEvaluation | Output]:
        failures = []
        for key in sorted(context.selected_asset_keys):
            table_name, partitioned = tables[key]
            failures += yield from compact_table(context, table_name, queue, partitioned, compaction, pyspark)
        if failures:  # several only when a run selects several unpartitioned tables (by hand)
            raise failures[0] if len(failures) == 1 else Failure("\n".join(f.description or "" for f in failures))

    return _compact


def compact_table(
    context: AssetExecutionContext,
    table_name: str,
    queue: str,
    partitioned: bool,
    compaction: CompactionResource,
    pyspark: LazyPySparkResource,
) -> Generator[AssetMaterialization | AssetCheckEvaluation | Output, None, list[Failure]]:
    """Compacts the run's partitions of the table (one, or a range: the sensor's batches) in one
    Spark job and one commit; reports a materialisation per partition compacted or left alone and
    the blocking consistency check per partition of the run. Returns (as a generator's value) the
    Failure naming each partition whose compaction failed (the others stay committed), if any."""
    key = table_key(table_name)
    keys = list(context.partition_keys) if partitioned else [""]
    engine = compaction.engine(spark=pyspark)
    outcomes = _compact_partitions(engine, table_name, keys, context.run.run_id)
    _log_outcomes(context, table_name, outcomes)
    fixed = _log_fixed_cost(context, engine, keys, outcomes)
    run_figures = {"dagster_run_fixed_cost_s": round(fixed, 2), "partitions_in_run": len(keys)}
    for o in outcomes:
        if o.ok:
            yield outcome_materialization(o, queue, partitioned, run_figures)
    for name, spec in context.assets_def.check_specs_by_output_name.items():
        if spec.asset_key == key and spec.key in context.selected_asset_check_keys:
            yield from _consistency(engine, table_name, key, keys, outcomes, partitioned)
            # the check's evaluations are the events above; its output only says they were all reported
            yield Output(None, output_name=name)
    return _failures(table_name, keys, outcomes, queue)


def _compact_partitions(engine: Engine, table_name: str, keys: list[str], run_id: str) -> list[PartitionOutcome]:
    """Compacts the run's partitions: one (which must exist) by itself, several as a range."""
    if len(keys) == 1:  # one partition: it must exist
        return engine.compact(table_name, partition=keys[0] or None, task_id=run_id)
    return engine.compact(table_name, task_id=run_id, partitions=keys)


def _log_outcomes(context: AssetExecutionContext, table_name: str, outcomes: list[PartitionOutcome]) -> None:
    """Logs a single outcome, or each failed one and the counts per status of several."""
    # a log line is an event Dagster stores: one per failed partition, the others counted
    for o in outcomes if len(outcomes) == 1 else [o for o in outcomes if not o.ok]:
        context.log.info(redact(f"{table_name} [{o.partition_key or 'unpartitioned'}]: {o.status}: {o.reason}"))
    if len(outcomes) > 1:
        counts = Counter(o.status for o in outcomes)
        context.log.info(f"{table_name}: {', '.join(f'{n} {status}' for status, n in sorted(counts.items()))}")


def _log_fixed_cost(
    context: AssetExecutionContext, engine: Engine, keys: list[str], outcomes: list[PartitionOutcome]
) -> float:
    """Logs and returns the run's fixed cost: launch to result, less the longest compaction."""
    seconds = max((o.seconds for o in outcomes), default=0.0)
    fixed = run_fixed_cost(context, seconds)
    context.log.info(
        f"dagster_run_fixed_cost_s={fixed:.2f} (run launch to result, less {seconds:.2f}s of compaction "
        f"of {len(keys)} partition(s); spark "
        f"{'connect' if engine.config.spark.mode == 'connect' else 'local: a JVM of its own'})"
    )
    return fixed


def _failures(table_name: str, keys: list[str], outcomes: list[PartitionOutcome], queue: str) -> list[Failure]:
    """Decides the run's Failure naming each failed partition, or none if all succeeded."""
    failed = [o for o in outcomes if not o.ok]
    if not failed:
        return []
    description = redact(f"{table_name}: {len(failed)} of {len(keys)} partition(s) failed: {failed[0].reason}")
    listed = "\n".join(f"- `{o.partition_key or 'unpartitioned'}`: {redact(o.reason)}" for o in failed)
    metadata = {**_metadata(failed[0], queue), "failed_partitions": MetadataValue.md(listed)}
    return [Failure(description=description, metadata=metadata)]


def _consistency(
    engine: Engine,
    table_name: str,
    key: AssetKey,
    keys: list[str],
    outcomes: list[PartitionOutcome],
    partitioned: bool = True,
) -> Iterator[AssetCheckEvaluation]:
    """The blocking check of every partition of the run: its attempts (if it was compacted) and
    what other runs left in it; a failed evaluation fails the run once all are reported. An
    unpartitioned asset gets one evaluation for all the table partitions its run compacted."""
    table = load_table(engine.catalog, table_name)
    tasks: dict[str, str | None] = dict.fromkeys(keys)
    tasks |= {o.partition_key: o.task_id for o in outcomes if o.task_id}
    timeout = engine.config.state.executing_timeout_seconds
    reports = check_partitions(table, engine.ledger, tasks, timeout)
    if not partitioned:
        merged = ConsistencyReport(sum(r.attempts_checked for r in reports.values()))
        merged.problems = [p for r in reports.values() for p in r.problems]
        reports = {"": merged}
    for partition, report in reports.items():
        metadata: dict[str, int | str | MetadataValue] = {
            "attempts_checked": report.attempts_checked,
            "partition": partition or "(unpartitioned)",
        }
        if not report.passed:
            metadata |= {
                "problems": MetadataValue.md("\n".join(f"- {p}" for p in report.problems)),
                "fix": RECOVER_HINT,
            }
        yield AssetCheckEvaluation(
            asset_key=key,
            check_name=CHECK_NAME,
            passed=report.passed,
            metadata=metadata,
            severity=AssetCheckSeverity.ERROR,
            blocking=True,
            partition=partition or None,
        )


def outcome_materialization(o: PartitionOutcome, queue: str, partitioned: bool, figures: dict) -> AssetMaterialization:
    """The materialisation of the table's asset partition `o` compacted or left alone (in a run, or
    by the CLI: defs/cli_events.py). An unpartitioned asset's run also compacts files of an older,
    partitioned spec (old-spec): those are its materialisations too, their partition in the metadata."""
    spec_part = {"partition": o.partition_key} if o.partition_key and not partitioned else {}
    return AssetMaterialization(
        asset_key=table_key(o.table_name),
        partition=(o.partition_key or None) if partitioned else None,
        metadata={**_metadata(o, queue), **figures, **spec_part},
    )


def run_fixed_cost(context: AssetExecutionContext, compaction_seconds: float) -> float:
    """Seconds of this run so far not spent compacting: launch (from the run's STARTING event, or
    its start when executed in process), imports, code loading, the Spark session, the plan."""
    starting = context.instance.all_logs(context.run.run_id, of_type=DagsterEventType.RUN_STARTING)
    record = context.instance.get_run_record_by_id(context.run.run_id)
    begin = starting[0].timestamp if starting else (record.start_time if record and record.start_time else time.time())
    return max(0.0, time.time() - begin - compaction_seconds)


def _metadata(o: PartitionOutcome, queue: str) -> dict:
    """Numeric values are plotted by the UI across materialisations; credentials are masked."""
    clustering = {"bounds_overlap": MetadataValue.json(o.bounds_overlap)} if o.bounds_overlap else {}
    return {
        **clustering,
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
        "rows_expired": o.rows_expired,
        "files_dropped": o.files_dropped,
        "delete_files_removed": o.delete_files_removed,
        "groups": o.groups,
        "duration_s": round(o.seconds, 3),
        "mb_per_s": round(o.mb_per_s, 3),
        "peak_worker_rss_mb": round(o.peak_worker_rss / 2**20, 1),
        "rewrite_engine": o.engine,
        "sort_spill_files": o.spill_files,
        "snapshot_id": MetadataValue.text(str(o.snapshot_id or "")),
        "task_id": o.task_id or "",
        "queue": queue,
    }
