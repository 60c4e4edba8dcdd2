"""Recovery: finish or undo every attempt a crash left open, so nothing is lost or duplicated.

Only attempts whose process is gone (same host, pid not alive) or that have not moved for longer
than the timeout are touched: a live process finishes its own attempt. PREPARED: if a snapshot
carries the attempt, mark COMMITTED; elif all sources are still live, recommit; else roll back.
EXECUTING: mark FAILED, delete its files.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog

from compaction_assets.commit.ledger import Attempt, Ledger, StaleAttempt, Status
from compaction_assets.commit.two_phase import abandon, commit_prepared, commit_snapshot, confirm_committed
from compaction_assets.errors import BackOff, CompactionError
from compaction_assets.lake.catalog import TableNotFound, load_table


@dataclass
class RecoveryReport:
    confirmed: list[str] = field(default_factory=list)  # committed before the crash, now marked
    recommitted: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def handled(self) -> int:
        return len(self.confirmed) + len(self.recommitted) + len(self.rolled_back) + len(self.abandoned)


def process_gone(attempt: Attempt) -> bool:
    """True when the attempt ran on this host and its process no longer exists."""
    if attempt.host != socket.gethostname():
        return False
    try:
        os.kill(attempt.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def orphaned_because(attempt: Attempt, cutoff: dt.datetime) -> str | None:
    """Why nobody will finish this open attempt, or None if its process may still do so."""
    if process_gone(attempt):
        return f"process {attempt.pid} on {attempt.host} is gone"
    if attempt.updated_at < cutoff:
        return "no heartbeat within state.executing_timeout_seconds"
    return None


def recover(catalog: Catalog, ledger: Ledger, executing_timeout_seconds: int) -> RecoveryReport:
    report = RecoveryReport()
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=executing_timeout_seconds)
    for attempt in ledger.attempts(statuses=[Status.PREPARED]):
        if orphaned_because(attempt, cutoff):
            _recover_prepared(catalog, ledger, attempt, report)
    for attempt in ledger.attempts(statuses=[Status.EXECUTING]):
        why = orphaned_because(attempt, cutoff)
        if why is None:
            continue
        try:
            abandon(load_table(catalog, attempt.table_name), ledger, attempt, f"abandoned: {why}")
            report.abandoned.append(attempt.attempt_id)
        except StaleAttempt:
            continue  # another recovery ended it first
        except CompactionError as exc:
            report.errors.append(f"{attempt.attempt_id}: {exc}")
    return report


def _recover_prepared(catalog: Catalog, ledger: Ledger, attempt: Attempt, report: RecoveryReport) -> None:
    try:
        table = load_table(catalog, attempt.table_name)
    except TableNotFound as exc:
        ledger.mark_rolled_back(attempt.attempt_id, f"table dropped before commit: {exc}")
        report.rolled_back.append(attempt.attempt_id)
        return
    except CompactionError as exc:
        report.errors.append(f"{attempt.attempt_id}: {exc}")
        return
    try:
        if commit_snapshot(table, attempt) is not None:
            confirm_committed(table, ledger, attempt)
            report.confirmed.append(attempt.attempt_id)
            return
        commit_prepared(table, ledger, attempt)
        report.recommitted.append(attempt.attempt_id)
    except BackOff:
        report.rolled_back.append(attempt.attempt_id)
    except StaleAttempt:
        return  # another recovery ended it first
