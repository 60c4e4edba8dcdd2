"""Beginning a table's run: one claimed attempt per planned partition in the ledger, each added
to the Spark work as it begins (execution/job.py builds the rewrite job and the tier run); a
partition another open attempt holds is skipped, naming the holder. An attempt that will not
commit is abandoned (FAILED) with its reason."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from pyiceberg.table import Table

from compaction_assets.commit.ledger import Attempt, Claimed, Ledger, StaleAttempt
from compaction_assets.commit.recovery import describe_holder
from compaction_assets.commit.two_phase import abandon
from compaction_assets.config import CompactionConfig
from compaction_assets.engine.outcomes import PartitionOutcome, first_line, skipped
from compaction_assets.engine.table_plan import TablePlan
from compaction_assets.execution.delete_tiers import TierJob, TierRun
from compaction_assets.execution.job import (
    SORTED_KINDS,
    RewriteJobBuilder,
    data_path,
    tier_job,
    tier_output_dir,
    tier_run,
)
from compaction_assets.execution.worker import RewriteJob
from compaction_assets.lake.files import LiveFile
from compaction_assets.planning.model import PartitionPlan

# the task id a run's attempts take (None: one of their own each) and how many partitions the run compacts
Task = tuple[str | None, int]


@dataclass
class Work:
    """One begun partition of a run: its plan, its attempt and its share of the Spark work."""

    plan: PartitionPlan
    attempt: Attempt
    groups: list[int] = field(default_factory=list)
    deletes: set[str] = field(default_factory=set)  # paths of the delete files its groups apply
    written: list = field(default_factory=list)  # DataFiles its groups wrote, once prepared


def begin(
    ledger: Ledger,
    config: CompactionConfig,
    table: Table,
    table_name: str,
    tplan: TablePlan,
    files: dict[str, LiveFile],
    todo: list[PartitionPlan],
    task: Task,
) -> tuple[list[Work], RewriteJob, list[Work], TierRun, list[PartitionOutcome]]:
    """Begin one attempt per partition and build the rewrite job (data rewrites) and the tier
    run (delete-file tiers); the last item: the partitions skipped because another open attempt
    holds them (Claimed). If anything raises meanwhile, the attempts already begun are
    abandoned (FAILED, with the error) before it propagates."""
    work: list[Work] = []
    tiers: list[Work] = []
    held: list[PartitionOutcome] = []
    try:
        rewrites = [p for p in todo if not p.is_tier]
        job = build_job(ledger, config, table, table_name, tplan, files, rewrites, task, work, held)
        tier_plans = [p for p in todo if p.is_tier]
        run = build_tiers(ledger, config, table, table_name, tplan, files, tier_plans, task, tiers, held)
        return work, job, tiers, run, held
    except Exception as exc:
        for item in [*work, *tiers]:
            abandon_attempt(table, ledger, item.attempt, f"could not start the rewrite: {first_line(exc)}")
        raise


def build_job(
    ledger: Ledger,
    config: CompactionConfig,
    table: Table,
    table_name: str,
    tplan: TablePlan,
    files: dict[str, LiveFile],
    todo: list[PartitionPlan],
    task: Task,
    work: list[Work],
    held: list[PartitionOutcome],
) -> RewriteJob:
    """Fill `work` with an attempt per partition as each is begun (`held`: those another open
    attempt holds, skipped), and return the job."""
    builder = RewriteJobBuilder(table, files, tplan.deletes, tplan.policy, tplan.clustering, tplan.expire)
    sorting = tplan.clustering is not None and any(p.kind in SORTED_KINDS for p in todo)
    for plan in todo:
        out_dir = builder.output_dir(plan)
        dropped = [files[p] for p in plan.drop_paths]
        try:
            attempt = begin_attempt(
                ledger,
                table_name,
                tplan,
                plan,
                task,
                out_dir,
                plan.source_paths,
                rows_in=sum(g.records for g in plan.groups) + sum(f.record_count for f in dropped),
                bytes_in=plan.input_bytes + sum(f.size for f in dropped),
            )
        except Claimed as claimed:
            held.append(held_outcome(config, table_name, plan, claimed))
            continue
        item = Work(plan, attempt)
        work.append(item)
        first = len(builder.groups)
        for offset, spec in enumerate(builder.add(plan, out_dir, attempt.attempt_id)):
            item.groups.append(first + offset)
            item.deletes.update(d.path for d in spec.deletes)
    return builder.job(sorting, config.spark.task_bytes)


def build_tiers(
    ledger: Ledger,
    config: CompactionConfig,
    table: Table,
    table_name: str,
    tplan: TablePlan,
    files: dict[str, LiveFile],
    todo: list[PartitionPlan],
    task: Task,
    tiers: list[Work],
    held: list[PartitionOutcome],
) -> TierRun:
    """Fill `tiers` with an attempt per delete-file tier plan, and return their Spark run.
    The attempt replaces the plan's delete files; a conversion also records (when it ends)
    the data files it covered, which the commit checks the replaced deletes against."""
    path = data_path(table)
    jobs: list[TierJob] = []
    for plan in todo:
        out_dir = tier_output_dir(path, plan)
        deletes = [files[p] for p in plan.delete_paths]
        try:
            attempt = begin_attempt(
                ledger,
                table_name,
                tplan,
                plan,
                task,
                out_dir,
                list(plan.delete_paths),
                rows_in=sum(d.record_count for d in deletes),
                bytes_in=sum(d.size for d in deletes),
            )
        except Claimed as claimed:
            held.append(held_outcome(config, table_name, plan, claimed))
            continue
        tiers.append(Work(plan, attempt))
        jobs.append(tier_job(plan, files, out_dir, attempt.attempt_id))
    return tier_run(table, tplan.policy, jobs)


def begin_attempt(
    ledger: Ledger,
    table_name: str,
    tplan: TablePlan,
    plan: PartitionPlan,
    task: Task,
    out_dir: str,
    source_files: list[str],
    rows_in: int,
    bytes_in: int,
) -> Attempt:
    """An EXECUTING ledger row for one partition's plan, on the plan's snapshot, claimed:
    raises Claimed if another open attempt holds the partition or one of the sources."""
    return ledger.begin(
        task_id=_task_id(*task, plan),
        table_name=table_name,
        partition_key=plan.partition_key,
        kind=str(plan.kind),
        base_snapshot_id=tplan.snapshot_id,
        source_files=source_files,
        output_dirs=[out_dir],
        rows_in=rows_in,
        bytes_in=bytes_in,
        claim=True,
        table_uuid=tplan.table_uuid,
    )


def held_outcome(config: CompactionConfig, table_name: str, plan: PartitionPlan, claimed: Claimed) -> PartitionOutcome:
    """A partition another open attempt claimed first: skipped, saying which and what to run."""
    holder = describe_holder(claimed.holder, config.state.executing_timeout_seconds)
    return skipped(table_name, plan, f"planned {plan.kind}, not run: the partition is held by {holder}")


def abandon_attempt(table: Table, ledger: Ledger, attempt: Attempt, reason: str) -> str:
    """End an attempt that will not commit; returns the reason to report. An attempt another
    process already ended (recovery took it for dead) is left as that process left it."""
    try:
        abandon(table, ledger, attempt, reason)
    except StaleAttempt as exc:
        return f"{reason}; {exc}"
    return reason


def _task_id(task_id: str | None, partitions: int, plan: PartitionPlan) -> str:
    """The caller's task id (a Dagster run's id), made per partition when the run has several."""
    if task_id is None:
        return uuid.uuid4().hex
    return task_id if partitions == 1 else f"{task_id}:{plan.partition_key}"
