"""One compaction run of a table's planned partitions, after planning: begin an attempt each
(engine/begin.py), rewrite them all in one Spark job, precommit each (its result files durable,
its attempt PREPARED), commit them in two phases (data expirations in a commit of their own), and
report how the run went. Every crash point of a compaction (faults.py) is reached here."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pyiceberg.table import Table
from pyspark.sql import SparkSession

from compaction_assets.commit.heartbeat import Heartbeat
from compaction_assets.commit.ledger import Ledger, StaleAttempt
from compaction_assets.commit.two_phase import CommitResult, commit_together
from compaction_assets.config import CompactionConfig
from compaction_assets.engine.begin import Task, Work, abandon_attempt, begin
from compaction_assets.engine.outcomes import PartitionOutcome, begun_outcome, describe_phases, first_line, settle
from compaction_assets.engine.table_plan import TablePlan
from compaction_assets.errors import CompactionError
from compaction_assets.execution.delete_tiers import TierOutcome, TierRun
from compaction_assets.execution.job import SORTED_KINDS, task_seconds
from compaction_assets.execution.rewrite import run_rewrite
from compaction_assets.execution.tier_tasks import run_tiers
from compaction_assets.execution.worker import GroupOutcome, RewriteJob
from compaction_assets.faults import crash_point
from compaction_assets.lake.clustering import Clustering
from compaction_assets.lake.datafile_codec import datafile_to_json
from compaction_assets.lake.files import LiveFile
from compaction_assets.planning.model import Kind, PartitionPlan
from compaction_assets.planning.overlap import bounds_overlap

log = logging.getLogger("compaction_assets")


def run_compaction(
    ledger: Ledger,
    config: CompactionConfig,
    spark_factory: Callable[[], SparkSession],
    table: Table,
    tplan: TablePlan,
    files: dict[str, LiveFile],
    todo: list[PartitionPlan],
    task: Task,
    started: tuple[float, float],
) -> list[PartitionOutcome]:
    """Compact the partitions of `todo` (planned in `tplan`, on `files`); one outcome each: those
    another open attempt holds first (skipped), then the others. `started`: when the compaction
    started and when its planning ended (time.monotonic())."""
    table_name = tplan.table_name
    crash_point("after_plan")
    with Heartbeat(ledger, config.state.heartbeat_seconds) as heartbeat:
        work, job, tiers, tier_run, held = begin(ledger, config, table, table_name, tplan, files, todo, task)
        for item in [*work, *tiers]:
            heartbeat.track(item.attempt.attempt_id)
        planned = time.monotonic()
        results, tier_results = _rewrite(ledger, spark_factory, table, table_name, job, tier_run, [*work, *tiers])
        crash_point("after_rewrite")
        rewritten = time.monotonic()
        phases = _phases(started, planned, rewritten, job, results)
        finished = [prepare(table, ledger, item, [results[i] for i in item.groups]) for item in work]
        finished += [prepare_tier(table, ledger, item, tier_results[i]) for i, item in enumerate(tiers)]
        crash_point("before_commit")
        commit(table, ledger, list(zip([*work, *tiers], finished, strict=True)))
        if tplan.clustering is not None:
            report_overlap(tplan.clustering, files, list(zip(work, finished[: len(work)], strict=True)))
        seconds = time.monotonic() - started[0]
        phases["commit"] = time.monotonic() - rewritten
        _report(table_name, finished, seconds, phases)
        log.info(
            "%s: %d group(s), %d tier job(s): %s",
            table_name,
            len(job.groups),
            len(tier_run.jobs),
            describe_phases(phases),
        )
        return [*held, *finished]


def _rewrite(
    ledger: Ledger,
    spark_factory: Callable[[], SparkSession],
    table: Table,
    table_name: str,
    job: RewriteJob,
    tier_run: TierRun,
    begun: list[Work],
) -> tuple[list[GroupOutcome], list[TierOutcome]]:
    """Run the job and the tier run on Spark; if that fails, every begun attempt is abandoned and
    CompactionError raised."""
    results: list[GroupOutcome] = []
    tier_results: list[TierOutcome] = []
    try:
        # a Spark session only when there is data to read (an expiration may only drop files)
        if job.groups or tier_run.jobs:
            spark = spark_factory()
            if job.groups:
                results = run_rewrite(spark, job)
            if tier_run.jobs:
                tier_results = run_tiers(spark, tier_run)
    except Exception as exc:
        message = first_line(exc)
        for item in begun:
            abandon_attempt(table, ledger, item.attempt, f"rewrite job failed: {message}")
        raise CompactionError(f"{table_name}: rewrite job failed: {message}") from exc
    return results, tier_results


def _phases(
    started: tuple[float, float], planned: float, rewritten: float, job: RewriteJob, results: list[GroupOutcome]
) -> dict[str, float]:
    """The run's seconds so far, per phase, and its Spark tasks' (see describe_phases)."""
    start, plan_done = started
    phases = {
        "plan": plan_done - start,
        "begin": planned - plan_done,
        "rewrite": rewritten - planned,
    }
    seconds = task_seconds(job.tasks, results)
    phases.update(tasks=len(seconds), workers=max(seconds, default=0.0), workers_total=sum(seconds))
    return phases


def _report(table_name: str, finished: list[PartitionOutcome], seconds: float, phases: dict[str, float]) -> None:
    """Give each outcome the run's seconds and phases; log each committed one."""
    for outcome in finished:
        outcome.seconds = seconds
        outcome.phases = phases
        if outcome.status == "committed":
            log.info(
                "%s [%s]: committed snapshot %s: %s in %.1fs (%s)",
                outcome.table_name,
                outcome.partition_key or "-",
                outcome.snapshot_id,
                outcome.reason,
                outcome.seconds,
                outcome.engine,
            )


def prepare(table: Table, ledger: Ledger, item: Work, results: list[GroupOutcome]) -> PartitionOutcome:
    """Precommit one partition: its result files are durable; PREPARED with their exact list.
    Returns its outcome: "prepared", or "failed" with the reason (the attempt then cleaned up)."""
    plan, attempt = item.plan, item.attempt
    expiring = plan.kind == Kind.EXPIRE
    outcome = _rewrite_outcome(item, results)
    written = [f for r in results for f in r.data_files]
    rows_out = sum(f.record_count for f in written)
    if reason := _rows_wrong(item, results, outcome, rows_out):
        outcome.reason = abandon_attempt(table, ledger, attempt, reason)
        return outcome
    bytes_out = sum(f.file_size_in_bytes for f in written)
    try:
        item.attempt = ledger.prepare(
            attempt.attempt_id,
            [datafile_to_json(f) for f in written],
            rows_out,
            bytes_out,
            rows_expired=outcome.rows_expired if expiring else None,
        )
    except StaleAttempt as exc:
        outcome.reason = abandon_attempt(table, ledger, attempt, f"stale: {exc}")
        return outcome
    crash_point("after_prepare")
    item.written = written
    outcome.status = "prepared"
    outcome.files_written = len(written)
    # an old-spec rewrite moves its rows out of the partition, into the current spec's partitions
    moved = plan.kind == Kind.OLD_SPEC
    outcome.files_after = plan.stats.data_files - len(plan.source_paths) + (0 if moved else len(written))
    outcome.bytes_after = plan.stats.data_bytes - attempt.bytes_in + (0 if moved else bytes_out)
    return outcome


def _rewrite_outcome(item: Work, results: list[GroupOutcome]) -> PartitionOutcome:
    """A data rewrite's outcome, "failed" until it is prepared, with its plan's and its groups' figures."""
    plan, attempt = item.plan, item.attempt
    dropped_rows = attempt.rows_in - sum(g.records for g in plan.groups)  # an expiration's unread files
    expired_read = sum(r.rows_expired for r in results)
    return begun_outcome(
        attempt,
        plan,
        files_rewritten=plan.input_files,
        bytes_rewritten=plan.input_bytes,
        rows=attempt.rows_in,
        deletes_applied=len(item.deletes),
        rows_deleted=sum(r.rows_deleted for r in results),
        rows_expired=dropped_rows + expired_read,
        files_dropped=len(plan.drop_paths),
        groups=len(plan.groups),
        peak_worker_rss=max((r.peak_rss for r in results), default=0),
        engine="+".join(sorted({r.engine for r in results}, reverse=True)),
        spill_files=sum(r.spill_files for r in results),
    )


def _rows_wrong(item: Work, results: list[GroupOutcome], outcome: PartitionOutcome, rows_out: int) -> str:
    """Why a partition's group results cannot be precommitted (a group's error, rows read or
    written that do not add up), or ""."""
    plan, attempt = item.plan, item.attempt
    dropped_rows = attempt.rows_in - sum(g.records for g in plan.groups)
    expired_read = sum(r.rows_expired for r in results)
    rows_read = sum(r.rows_read for r in results)
    if errors := [r.error for r in results if r.error]:
        return errors[0]
    if rows_read != attempt.rows_in - dropped_rows:
        return f"row count mismatch: the sources hold {attempt.rows_in - dropped_rows} rows to read, read {rows_read}"
    if expired_read and plan.kind != Kind.EXPIRE:
        return f"a {plan.kind} rewrite dropped {expired_read} row(s) as expired"
    if rows_out != rows_read - outcome.rows_deleted - expired_read:
        return (
            f"row count mismatch: read {rows_read} rows, deletes removed {outcome.rows_deleted}, "
            f"expiration dropped {expired_read}, wrote {rows_out}"
        )
    return ""


def prepare_tier(table: Table, ledger: Ledger, item: Work, result: TierOutcome) -> PartitionOutcome:
    """Precommit one tier attempt: its position-delete files are durable; PREPARED with them
    (and, for a conversion, the data files it covered)."""
    plan, attempt = item.plan, item.attempt
    outcome = begun_outcome(
        attempt,
        plan,
        files_after=plan.stats.data_files,
        bytes_after=plan.stats.data_bytes,
        bytes_rewritten=result.bytes_read,
        rows=plan.stats.records,
        peak_worker_rss=result.peak_rss,
        engine="arrow",
    )
    if result.error:
        outcome.reason = abandon_attempt(table, ledger, attempt, result.error)
        return outcome
    written = result.delete_files
    covered = result.covered_data_files if plan.kind == Kind.CONVERT_EQUALITY_DELETES else None
    try:
        item.attempt = ledger.prepare(
            attempt.attempt_id,
            [datafile_to_json(f) for f in written],
            result.rows_written,
            sum(f.file_size_in_bytes for f in written),
            covered_files=covered,
        )
    except StaleAttempt as exc:
        outcome.reason = abandon_attempt(table, ledger, attempt, f"stale: {exc}")
        return outcome
    crash_point("after_prepare")
    outcome.status = "prepared"
    outcome.files_written = len(written)
    return outcome


def commit(table: Table, ledger: Ledger, prepared: list[tuple[Work, PartitionOutcome]]) -> None:
    """Commit every prepared partition of the table: the data expirations in one snapshot
    (`delete` or `overwrite`), the compactions in another (`replace`); settle each outcome."""
    prepared = [(item, outcome) for item, outcome in prepared if outcome.status == "prepared"]
    expirations = [(item, outcome) for item, outcome in prepared if item.plan.kind == Kind.EXPIRE]
    compactions = [(item, outcome) for item, outcome in prepared if item.plan.kind != Kind.EXPIRE]
    for together in (expirations, compactions):
        if together:
            _commit_together(table, ledger, together)


def _commit_together(table: Table, ledger: Ledger, prepared: list[tuple[Work, PartitionOutcome]]) -> None:
    results: dict[str, CommitResult] = {}
    unknown = None
    try:
        commit_together(table, ledger, [item.attempt for item, _ in prepared], results)
    except Exception as exc:  # catalog unreachable or locked, table dropped: outcome unknown
        log.warning("%s: commit failed: %s", prepared[0][1].table_name, exc)
        unknown = (
            f"commit outcome unknown ({type(exc).__name__}: {first_line(exc)}); the attempt stays "
            "PREPARED and recovery finishes it once this process has exited"
        )
    for item, outcome in prepared:
        settle(outcome, item.plan, item.attempt, results.get(item.attempt.attempt_id), unknown)


def report_overlap(
    clustering: Clustering, files: dict[str, LiveFile], done: list[tuple[Work, PartitionOutcome]]
) -> None:
    """Each committed sorted rewrite's bounds_overlap before (its plan's) and after (the files the
    plan saw, less those it replaced, plus those it wrote) on the clustering columns."""
    done = [(i, o) for i, o in done if o.status == "committed" and i.plan.kind in SORTED_KINDS]
    wanted = {i.plan.partition_key for i, _ in done}
    by_partition: dict[str, list[LiveFile]] = {}
    for f in files.values() if done else ():
        if not f.is_delete and f.partition_key in wanted:
            by_partition.setdefault(f.partition_key, []).append(f)
    for item, outcome in done:
        replaced = set(item.plan.source_paths)
        kept = [f.data_file for f in by_partition.get(item.plan.partition_key, ()) if f.path not in replaced]
        outcome.bounds_overlap = {
            "before": round(item.plan.stats.bounds_overlap or 0.0, 3),
            "after": round(bounds_overlap([*kept, *item.written], clustering), 3),
            "columns": list(clustering.columns),
            "order": "zorder" if clustering.zorder else "sort",
        }
