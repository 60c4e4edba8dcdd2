"""What a compaction run reports: an outcome per partition (what the CLI prints and the Dagster
asset reports), the text of its reason, and where the run's seconds went (`describe_phases`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from compaction_assets.commit.ledger import Attempt, StaleAttempt
from compaction_assets.commit.two_phase import CommitResult
from compaction_assets.errors import BackOff
from compaction_assets.planning.model import Kind, PartitionPlan


@dataclass
class PartitionOutcome:
    """What happened to one partition; what the CLI prints and the Dagster asset reports."""

    table_name: str
    partition_key: str
    status: str  # committed | skipped | failed | backed_off (prepared only while committing)
    reason: str
    kind: str | None = None
    task_id: str | None = None
    attempt_id: str | None = None
    snapshot_id: int | None = None
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    files_rewritten: int = 0
    bytes_rewritten: int = 0
    files_written: int = 0
    rows: int = 0  # rows of the rewritten files (deleted ones included)
    deletes_applied: int = 0  # distinct delete files the rewrite applied
    rows_deleted: int = 0  # rows the applied deletes removed (rows written = rows - rows_deleted - rows_expired)
    rows_expired: int = 0  # rows a data expiration dropped on purpose (dropped files' records included)
    files_dropped: int = 0  # data files a data expiration removed by metadata, unread
    delete_files_removed: int = 0  # delete files the commit removed (none apply any more)
    groups: int = 0
    seconds: float = 0.0
    peak_worker_rss: int = 0  # bytes, the largest of its groups' Spark Python workers
    engine: str = ""  # how its groups were rewritten: polars, arrow or polars+arrow
    spill_files: int = 0  # runs its sorted groups spilled to local disk (execution/external_sort.py)
    # a sorted / z-ordered rewrite: {"before": x, "after": y, "columns": [...], "order": "sort"|"zorder"}
    # with the partition's bounds_overlap (planning/overlap.py) before and after it
    bounds_overlap: dict | None = None
    # seconds of the compaction run it was part of, per phase (see describe_phases); shared by its outcomes
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in ("committed", "skipped", "backed_off")

    @property
    def mb_per_s(self) -> float:
        """Rewrite throughput: source bytes read per second."""
        return self.bytes_rewritten / 1e6 / self.seconds if self.seconds else 0.0


def describe_phases(phases: dict[str, float]) -> str:
    """Where a compaction's seconds went: planning (table, manifests, planner), beginning the
    attempts and building the job (ledger rows, Polars checks), the Spark job, and the two-phase
    commit (precommit, validation, manifests, catalog commit, sweep). Of the Spark job: the seconds
    its tasks spent inside group rewrites, the busiest task's and all tasks' (run by as many at once
    as there are task slots); with one task, the rest of the job is Spark's share (dispatch, worker
    hand-off, results)."""
    rewrite, busiest, tasks = phases.get("rewrite", 0.0), phases.get("workers", 0.0), int(phases.get("tasks", 0))
    if tasks == 1:
        inside = f"groups {busiest:.2f}s, spark {rewrite - busiest:.2f}s"
    else:
        inside = f"{tasks} tasks, groups {busiest:.2f}s in the busiest, {phases.get('workers_total', 0.0):.2f}s in all"
    return (
        f"plan {phases.get('plan', 0.0):.2f}s, begin {phases.get('begin', 0.0):.2f}s, rewrite {rewrite:.2f}s "
        f"({inside}), commit {phases.get('commit', 0.0):.2f}s"
    )


def begun_outcome(attempt: Attempt, plan: PartitionPlan, **figures: Any) -> PartitionOutcome:
    """A begun attempt's outcome, "failed" until it is prepared, with its plan's figures."""
    return PartitionOutcome(
        table_name=attempt.table_name,
        partition_key=plan.partition_key,
        status="failed",
        reason="",
        kind=str(plan.kind),
        task_id=attempt.task_id,
        attempt_id=attempt.attempt_id,
        files_before=plan.stats.data_files,
        bytes_before=plan.stats.data_bytes,
        **figures,
    )


def skipped(table_name: str, plan: PartitionPlan, reason: str = "") -> PartitionOutcome:
    """A partition not compacted: its figures unchanged, with `reason` (default: its plan's)."""
    stats = plan.stats
    return PartitionOutcome(
        table_name=table_name,
        partition_key=plan.partition_key,
        status="skipped",
        reason=reason or plan.reason,
        kind=str(plan.kind) if plan.kind else None,
        files_before=stats.data_files,
        files_after=stats.data_files,
        bytes_before=stats.data_bytes,
        bytes_after=stats.data_bytes,
        rows=stats.records,
    )


def settle(
    outcome: PartitionOutcome, plan: PartitionPlan, attempt: Attempt, result: CommitResult | None, unknown: str | None
) -> None:
    """Settle a prepared partition's outcome with its commit's `result` (None: unknown, `unknown`
    saying why if the commit raised)."""
    if result is None:
        outcome.status, outcome.reason = "failed", unknown or "commit outcome unknown"
    elif isinstance(result, BackOff):
        outcome.status, outcome.reason = "backed_off", result.reason  # the line names table and partition
    elif isinstance(result, StaleAttempt):
        outcome.status, outcome.reason = "failed", str(result)
    else:
        outcome.delete_files_removed = len(result.removed_deletes)
        outcome.status = "committed"
        outcome.reason = committed_reason(outcome, plan, attempt, result.rows_out)
        outcome.snapshot_id = result.committed_snapshot_id


def committed_reason(outcome: PartitionOutcome, plan: PartitionPlan, attempt: Attempt, rows_out: int | None) -> str:
    """What a committed partition's rewrite did, in a line (`attempt`: the prepared one)."""
    if plan.is_tier:
        reason = (
            f"{len(plan.delete_paths)} delete file(s) -> {outcome.files_written} "
            f"position-delete file(s) ({rows_out} row(s))"
        )
    elif plan.kind == Kind.EXPIRE:
        reason = (
            f"{outcome.rows_expired} row(s) past retention expired: {outcome.files_dropped} file(s) "
            f"dropped unread, {plan.input_files} file(s) -> {outcome.files_written} file(s)"
        )
    elif plan.kind == Kind.OLD_SPEC:
        written = attempt.result_files
        partitions = len({json.dumps(d["partition"]) for d in written})
        reason = (
            f"{plan.input_files} file(s) of spec {', '.join(map(str, plan.stats.spec_ids))} -> "
            f"{outcome.files_written} file(s) in {partitions} partition(s) of spec "
            f"{', '.join(sorted({str(d['spec_id']) for d in written}))}"
        )
    else:
        reason = f"{plan.input_files} file(s) -> {outcome.files_written} file(s)"
    if outcome.deletes_applied:
        reason += f", {outcome.deletes_applied} delete file(s) applied ({outcome.rows_deleted} row(s) deleted)"
    return reason


def first_line(exc: BaseException) -> str:
    """An exception's message for a reason: its first line, at most 500 characters."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]
