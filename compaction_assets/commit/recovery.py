"""Recovery: finish or undo every attempt a crash left open, so nothing is lost or duplicated.

Only attempts whose process is gone (same host, pid not alive) or that have not moved for longer
than the timeout are touched: a live process finishes its own attempt. Each attempt is recovered
on its own: one that raises is reported (table and attempt id) and the others still recovered.

PREPARED, decided from the table's state (any engine may have expired our snapshot meanwhile);
result files are data files, or delete files (the merge-on-read tiers), both read from the
manifests of every snapshot the table has:
- committed, if a snapshot names the attempt, or any snapshot the table has references one of its
  result files: mark COMMITTED;
- else, if its result files are gone, roll back (nothing was committed; the sources are as they were);
- else recommit, which rolls back if its sources (data or delete files) are no longer live.
An attempt without result files (a rewrite whose rows were all deleted) whose snapshot was expired
cannot be told from one never committed: it is recommitted, and so rolled back once its sources
are gone; the table's rows are right either way.
A PREPARED attempt whose recovery raised PARK_AFTER times is parked: FAILED with the reason, and
nothing deleted (its result files are either referenced by the table, or uncommitted and left to
GC's orphan collection after the grace period).
A manifest rewrite (kind rewrite-manifests) is never recommitted: committed if a snapshot carries it
or lists one of its manifests, else rolled back with its manifests left in place (its process, if
only stalled, may still commit them; GC's orphan cleanup deletes them once no snapshot references them).
EXECUTING: mark FAILED, delete the files it wrote that nothing references.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from compaction_assets.commit import manifest_rewrite
from compaction_assets.commit.ledger import Attempt, Ledger, StaleAttempt, Status
from compaction_assets.commit.two_phase import abandon, commit_prepared, commit_snapshot, confirm_committed
from compaction_assets.errors import BackOff, CompactionError
from compaction_assets.lake.catalog import TableNotFound, load_table
from compaction_assets.lake.manifest_cache import live_entries
from compaction_assets.lake.storage import PathSet

PARK_AFTER = 3  # recoveries of one attempt that raised before it is parked


@dataclass
class RecoveryReport:
    confirmed: list[str] = field(default_factory=list)  # committed before the crash, now marked
    recommitted: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)  # FAILED after PARK_AFTER failed recoveries
    errors: list[str] = field(default_factory=list)  # "<table> attempt <id>: <error>": left open, tried next run

    @property
    def handled(self) -> int:
        return (
            len(self.confirmed) + len(self.recommitted) + len(self.rolled_back) + len(self.abandoned) + len(self.parked)
        )


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
    """Recover every orphaned open attempt, each on its own (see the module docstring)."""
    report = RecoveryReport()
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=executing_timeout_seconds)
    for attempt in ledger.attempts(statuses=[Status.PREPARED]):
        if orphaned_because(attempt, cutoff):
            _isolated(ledger, attempt, report, lambda a=attempt: _recover_prepared(catalog, ledger, a, report))
    for attempt in ledger.attempts(statuses=[Status.EXECUTING]):
        if why := orphaned_because(attempt, cutoff):
            _isolated(ledger, attempt, report, lambda a=attempt, w=why: _abandon(catalog, ledger, a, w, report))
    return report


def _isolated(ledger: Ledger, attempt: Attempt, report: RecoveryReport, recover_one: Callable[[], None]) -> None:
    """Run one attempt's recovery. An error is counted on the attempt and reported; at the
    PARK_AFTER-th (the table was readable each time) the attempt is parked instead. An unreadable
    table (catalog unreachable) is reported, never counted: nothing about the attempt is known."""
    try:
        recover_one()
    except StaleAttempt:
        return  # another recovery or the attempt's own process ended it first
    except Exception as exc:  # one attempt must not stop the others' recovery
        error = f"{type(exc).__name__}: {exc}"
        name = f"{attempt.table_name} attempt {attempt.attempt_id}"
        try:
            if (
                not isinstance(exc, _Unreachable)
                and ledger.note_recovery_failure(attempt.attempt_id, error) >= PARK_AFTER
            ):
                ledger.park(attempt.attempt_id, f"recovery failed {PARK_AFTER} times, last: {error}")
                report.parked.append(attempt.attempt_id)
                return
        except Exception as ledger_exc:  # the ledger itself may be what fails
            error += f" (and recording it failed: {ledger_exc})"
        report.errors.append(f"{name}: {error}")


class _Unreachable(CompactionError):
    """The attempt's table could not be loaded (catalog unreachable, bad metadata)."""


def _load(catalog: Catalog, attempt: Attempt) -> Table | None:
    """The attempt's table, or None if it was dropped."""
    try:
        return load_table(catalog, attempt.table_name)
    except TableNotFound:
        return None
    except CompactionError as exc:
        raise _Unreachable(str(exc)) from exc


def _abandon(catalog: Catalog, ledger: Ledger, attempt: Attempt, why: str, report: RecoveryReport) -> None:
    table = _load(catalog, attempt)
    if table is None:
        ledger.mark_failed(attempt.attempt_id, f"abandoned: {why}; table dropped")
    else:
        abandon(table, ledger, attempt, f"abandoned: {why}")
    report.abandoned.append(attempt.attempt_id)


def _recover_prepared(catalog: Catalog, ledger: Ledger, attempt: Attempt, report: RecoveryReport) -> None:
    table = _load(catalog, attempt)
    if table is None:
        ledger.mark_rolled_back(attempt.attempt_id, "table dropped before commit")
        report.rolled_back.append(attempt.attempt_id)
        return
    if attempt.kind == manifest_rewrite.KIND:  # never recommitted: see commit/manifest_rewrite.py
        if (committed := manifest_rewrite.committed_by_manifests(table, attempt)) is not None:
            confirm_committed(table, ledger, attempt, committed)
            report.confirmed.append(attempt.attempt_id)
        else:
            # Its manifests stay: a process taken for dead may still commit them. GC's orphan
            # cleanup deletes them once past its grace period and referenced by no snapshot.
            ledger.mark_rolled_back(
                attempt.attempt_id,
                "a manifest rewrite is not recommitted: the next plan redoes it; its manifests are left to GC",
            )
            report.rolled_back.append(attempt.attempt_id)
        return
    if (snapshot := commit_snapshot(table, attempt)) is not None:
        confirm_committed(table, ledger, attempt, snapshot.snapshot_id)
        report.confirmed.append(attempt.attempt_id)
        return
    if (committed := committed_by_state(table, attempt)) is not None:
        confirm_committed(table, ledger, attempt, committed)
        report.confirmed.append(attempt.attempt_id)
        return
    if missing := _missing_results(table, attempt):
        # Not committed (no snapshot references them) and not recommittable: nothing changed in the table.
        ledger.mark_rolled_back(
            attempt.attempt_id, f"{len(missing)} result file(s) gone before recovery could recommit, e.g. {missing[0]}"
        )
        report.rolled_back.append(attempt.attempt_id)
        return
    try:
        commit_prepared(table, ledger, attempt)
        report.recommitted.append(attempt.attempt_id)
    except BackOff:
        report.rolled_back.append(attempt.attempt_id)


def committed_by_state(table: Table, attempt: Attempt) -> int | None:
    """The id of the snapshot that added the attempt's result files (data or delete files: data and
    delete manifests alike are read), if any snapshot the table still has references one of them
    (that snapshot itself may have been expired by any engine since)."""
    if not attempt.result_files:
        return None
    results = PathSet(d["file_path"] for d in attempt.result_files)
    seen: set[str] = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            for entry in live_entries(manifest, table.io):
                if entry.data_file.file_path in results:
                    return entry.snapshot_id
    return None


def _missing_results(table: Table, attempt: Attempt) -> list[str]:
    return [d["file_path"] for d in attempt.result_files if not table.io.new_input(d["file_path"]).exists()]
