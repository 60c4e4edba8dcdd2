"""Precommit/commit consistency of a compaction run, checked against the ledger and the table.

For the run's attempts (per partition, for a run over several): each ended (no PREPARED or
EXECUTING left); a COMMITTED one has its snapshot, its result files (data or delete files) live
and its replaced files gone, no file written by the attempt left untracked, and, if it rewrote
data files, rows in = rows out (rows out <= rows in when the table had delete files the rewrite
may have applied). A data expiration drops rows on purpose, counted apart: rows in = rows out +
rows expired (<= as above), its snapshot is no `replace` (readers would skip the change), and no
other kind may have expired a row. For the partition: no PREPARED row, and no EXECUTING row whose process is gone
or which has timed out, remains from any run.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table
from pyiceberg.table.snapshots import TOTAL_DELETE_FILES, Operation, Snapshot

from compaction_assets.commit.ledger import Attempt, Ledger, Status
from compaction_assets.commit.recovery import orphaned_because
from compaction_assets.commit.two_phase import EXPIRE_KIND, commit_snapshot, written_files
from compaction_assets.lake.files import live_files

RECOVER_HINT = "run `compaction-assets recover` (the recovery sensor also does this every minute)"


@dataclass
class ConsistencyReport:
    attempts_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


def check_consistency(
    table: Table, ledger: Ledger, partition_key: str, task_id: str | None, executing_timeout_seconds: int
) -> ConsistencyReport:
    return check_partitions(table, ledger, {partition_key: task_id}, executing_timeout_seconds)[partition_key]


def check_partitions(
    table: Table, ledger: Ledger, tasks: Mapping[str, str | None], executing_timeout_seconds: int
) -> dict[str, ConsistencyReport]:
    """A report per partition key of `tasks`, whose value is the task id its run's attempts have
    (None: no task to check, only what other runs left in the partition). The table's files and
    the ledger are read once for all partitions."""
    table_name = ".".join(table.name())
    reports = {key: ConsistencyReport() for key in tasks}
    live = {f.path: f.data_file for f in live_files(table)}
    owner = {task_id: key for key, task_id in tasks.items() if task_id is not None}
    for attempt in ledger.attempts(table_name=table_name, task_ids=owner) if owner else []:
        report = reports[owner[attempt.task_id]]
        report.attempts_checked += 1
        report.problems.extend(_attempt_problems(table, attempt, live))
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=executing_timeout_seconds)
    for attempt in ledger.attempts(table_name=table_name, statuses=[Status.PREPARED, Status.EXECUTING]):
        found = reports.get(attempt.partition_key)
        if found is None or attempt.task_id == tasks[attempt.partition_key]:
            continue
        if attempt.status == Status.PREPARED:
            found.problems.append(f"attempt {attempt.attempt_id} of task {attempt.task_id} is left PREPARED")
        elif why := orphaned_because(attempt, cutoff):
            found.problems.append(f"attempt {attempt.attempt_id} is left EXECUTING: {why}")
    return reports


def _attempt_problems(table: Table, attempt: Attempt, live: dict) -> list[str]:
    name = f"attempt {attempt.attempt_id}"
    if attempt.status in (Status.PREPARED, Status.EXECUTING):
        return [f"{name} is left {attempt.status}"]
    results = {d["file_path"] for d in attempt.result_files}
    written = set(written_files(table.io, attempt))
    problems = []
    if attempt.status == Status.COMMITTED:
        if (snapshot := commit_snapshot(table, attempt)) is None:
            problems.append(f"{name} is COMMITTED but no snapshot carries its task id")
        if missing := sorted(results - live.keys()):
            problems.append(f"{name}: {len(missing)} result file(s) not live, e.g. {missing[0]}")
        if still := sorted(set(attempt.source_files) & live.keys()):
            problems.append(f"{name}: {len(still)} replaced file(s) still live, e.g. {still[0]}")
        if problem := _rows_problem(table, attempt, snapshot):
            problems.append(f"{name}: {problem}")
        results_live = results & live.keys()
        if untracked := sorted(written - results_live):
            problems.append(f"{name}: {len(untracked)} untracked file(s) written, e.g. {untracked[0]}")
    elif written:
        problems.append(f"{name} ended {attempt.status} but left {len(written)} file(s), e.g. {sorted(written)[0]}")
    return problems


def _no_deletes_before(table: Table, snapshot: Snapshot | None) -> bool:
    """Whether the snapshot's parent says the table had no delete files (False when that cannot be told)."""
    parent = None
    if snapshot is not None and snapshot.parent_snapshot_id is not None:
        parent = table.metadata.snapshot_by_id(snapshot.parent_snapshot_id)
    before = parent.summary if parent is not None else None
    return before is not None and before.get(TOTAL_DELETE_FILES) == "0"


def _rows_problem(table: Table, attempt: Attempt, snapshot: Snapshot | None) -> str | None:
    """Rows in against rows out (+ rows expired, for a data expiration) of a data rewrite: equal,
    unless the table had delete files before the commit (the rewrite may have applied some: fewer
    rows out). Delete-file rewrites count delete records, which a conversion may change: not checked."""
    expired = attempt.rows_expired or 0
    expiring = attempt.kind == EXPIRE_KIND
    if expired and not expiring:
        return f"a {attempt.kind} attempt dropped {expired} row(s) as expired"
    summary = snapshot.summary if snapshot is not None else None
    if expiring and summary is not None and summary.operation == Operation.REPLACE:
        return f"a data expiration committed as operation {summary.operation}: readers skip it"
    if any(d["content"] != DataFileContent.DATA for d in attempt.result_files):
        return None
    rows_in, rows_out = attempt.rows_in, (attempt.rows_out or 0) + expired
    no_deletes = _no_deletes_before(table, snapshot)
    return _count_problem(attempt, rows_in, rows_out, expired, no_deletes)


def _count_problem(attempt: Attempt, rows_in: int, rows_out: int, expired: int, no_deletes: bool) -> str | None:
    """Whether rows out (+ expired) exceed rows in, or differ from them with no delete files before, described."""
    expiring = attempt.kind == EXPIRE_KIND
    if rows_out > rows_in or (no_deletes and rows_out != rows_in):
        out = f"rows out {attempt.rows_out or 0} + rows expired {expired}" if expiring else f"rows out {rows_out}"
        return f"rows in {rows_in} != {out}"
    return None
