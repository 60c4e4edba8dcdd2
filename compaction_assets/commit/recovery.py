"""Recovery: finish or undo every attempt a crash left open, so nothing is lost or duplicated.

Only attempts whose process is gone (same host, pid not alive) or that have not moved for longer
than the timeout are touched: a live process finishes its own attempt. Each attempt is decided on
its own: one that raises is reported (table and attempt id) and the others still recovered. The
attempts to recommit are committed together, one snapshot per table (commit_together, the same
checks per attempt; attempts sharing a source or covered file go to separate snapshots, data
expirations to their own); one whose batch raised is retried alone.

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
import logging
import os
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from compaction_assets.commit import manifest_rewrite
from compaction_assets.commit.ledger import OPEN, Attempt, Ledger, StaleAttempt, Status
from compaction_assets.commit.process_identity import judged_gone
from compaction_assets.commit.two_phase import (
    EXPIRE_KIND,
    CommitResult,
    abandon,
    commit_prepared,
    commit_snapshot,
    commit_together,
    confirm_committed,
)
from compaction_assets.errors import BackOff, CompactionError
from compaction_assets.lake.catalog import TableNotFound, load_table
from compaction_assets.lake.datafile_codec import datafile_from_json
from compaction_assets.lake.manifest_cache import live_entries
from compaction_assets.lake.storage import PathSet

log = logging.getLogger("compaction_assets")
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
    """True when the attempt ran on this host and its process no longer exists: its pid is free,
    or another process's now (process_identity). An owner in another PID namespace under the same
    host name (a container on the host's network) cannot be judged by pid: its heartbeat decides.
    Attempts recorded before the process identity was (None) are judged by pid alone."""
    if attempt.host != socket.gethostname():
        return False
    if attempt.process is not None:
        return bool(judged_gone(attempt.process, attempt.pid))
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


def describe_holder(attempt: Attempt, executing_timeout_seconds: int) -> str:
    """Which open attempt holds a partition's files, whether its process lives, and what to run."""
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=executing_timeout_seconds)
    held = f"attempt {attempt.attempt_id} ({attempt.status} since {attempt.created_at:%Y-%m-%d %H:%M:%S} UTC)"
    if why := orphaned_because(attempt, cutoff):
        return f"{held}: {why}; run `compaction-assets recover` (it finishes the attempt, or says why it cannot)"
    owner = f"process {attempt.pid} on {attempt.host}"
    if attempt.host != socket.gethostname():
        return (
            f"{held} of {owner}, alive by its heartbeat (taken for dead after "
            f"state.executing_timeout_seconds={executing_timeout_seconds} without one): it finishes the attempt"
        )
    return f"{held} of {owner}, which is running: it finishes the attempt, nothing to run"


def open_attempts_note(ledger: Ledger, table_name: str, executing_timeout_seconds: int) -> list[str]:
    """A line per open attempt of the table, by partition: what `plan` and `compact` say about files in flight."""
    return [
        f"{a.partition_key or '(unpartitioned)'}: {len(a.source_files)} file(s) held by "
        + describe_holder(a, executing_timeout_seconds)
        for a in ledger.attempts(statuses=OPEN, table_name=table_name)
    ]


def recover(
    catalog: Catalog,
    ledger: Ledger,
    executing_timeout_seconds: int,
    table_name: str | None = None,
    partitions: Collection[str] | None = None,
) -> RecoveryReport:
    """Recover every orphaned open attempt (only `table_name`'s, and of those only the ones on
    `partitions`, if given): see the module docstring."""
    report = RecoveryReport()
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=executing_timeout_seconds)

    def orphaned(status: Status) -> list[tuple[Attempt, str]]:
        found = ledger.attempts(statuses=[status], table_name=table_name)
        found = [a for a in found if partitions is None or a.partition_key in partitions]
        return [(a, why) for a in found if (why := orphaned_because(a, cutoff))]

    by_table: dict[str, list[Attempt]] = {}
    for attempt, _ in orphaned(Status.PREPARED):
        by_table.setdefault(attempt.table_name, []).append(attempt)
    for attempts in by_table.values():
        _recover_table(catalog, ledger, attempts, report)
    for attempt, why in orphaned(Status.EXECUTING):
        _isolated(ledger, attempt, report, partial(_abandon, catalog, ledger, attempt, why, report))
    return report


def _recover_table(catalog: Catalog, ledger: Ledger, attempts: list[Attempt], report: RecoveryReport) -> None:
    """Decide each PREPARED attempt of one table, then recommit those to recommit together."""
    loaded: list[Table | None] = []

    def table() -> Table | None:  # loaded once (a failed load is tried again for the next attempt)
        if not loaded:
            loaded.append(_load(catalog, attempts[0]))
        return loaded[0]

    recommit: list[Attempt] = []
    for attempt in attempts:
        _isolated(ledger, attempt, report, partial(_recover_prepared, table, ledger, attempt, report, recommit))
    if not recommit:
        return
    if (loaded_table := table()) is None:  # never: _recover_prepared recommits only once the table loaded
        raise RuntimeError(f"{attempts[0].table_name}: attempts to recommit but the table did not load")
    for batch in _batches(recommit):
        _recommit(loaded_table, ledger, batch, report)


def _batches(attempts: list[Attempt]) -> list[list[Attempt]]:
    """Attempts to commit together: no two share a source or covered file (a snapshot may not
    replace a file twice), data expirations apart from compactions (snapshot_operation)."""
    batches: list[tuple[bool, set[str], list[Attempt]]] = []
    for attempt in attempts:
        expiring, paths = attempt.kind == EXPIRE_KIND, {*attempt.source_files, *(attempt.covered_files or ())}
        batch = next((b for b in batches if b[0] == expiring and b[1].isdisjoint(paths)), None)
        if batch is None:
            batches.append(batch := (expiring, set(), []))
        batch[1].update(paths)
        batch[2].append(attempt)
    return [b[2] for b in batches]


def _recommit(table: Table, ledger: Ledger, batch: list[Attempt], report: RecoveryReport) -> None:
    """Commit a batch in one snapshot; attempts it left unsettled (it raised) are recovered alone."""
    results: dict[str, CommitResult] = {}
    if len(batch) > 1:
        try:
            commit_together(table, ledger, batch, results)
        except Exception as exc:  # each unsettled attempt is tried alone below
            log.warning(
                "%s: recommitting %d attempts together failed, one at a time now: %s",
                batch[0].table_name,
                len(batch),
                exc,
            )
    for attempt in batch:
        result = results.get(attempt.attempt_id)
        if result is None:
            _isolated(ledger, attempt, report, partial(_recommit_alone, table, ledger, attempt, report))
        elif isinstance(result, BackOff):
            report.rolled_back.append(attempt.attempt_id)
        elif not isinstance(result, StaleAttempt):  # stale: another recovery or its process ended it
            report.recommitted.append(attempt.attempt_id)


def _recommit_alone(table: Table, ledger: Ledger, attempt: Attempt, report: RecoveryReport) -> None:
    try:
        commit_prepared(table, ledger, attempt)
        report.recommitted.append(attempt.attempt_id)
    except BackOff:
        report.rolled_back.append(attempt.attempt_id)


def _isolated(ledger: Ledger, attempt: Attempt, report: RecoveryReport, recover_one: Callable[[], None]) -> None:
    """Run one attempt's recovery. An error is counted on the attempt and reported; at the
    PARK_AFTER-th (the table was readable each time) the attempt is parked instead. An unreadable
    table (catalog unreachable) is reported, never counted: nothing about the attempt is known."""
    try:
        recover_one()
    except StaleAttempt:
        return  # another recovery or the attempt's own process ended it first
    except _Replaced as exc:
        ledger.park(attempt.attempt_id, str(exc))
        report.parked.append(attempt.attempt_id)
        return
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


class _Replaced(CompactionError):
    """The table the attempt's name loads is not the one it ran on: parked, its files left alone."""


def _same_table(table: Table, attempt: Attempt) -> Table:
    """`table`, if it is the one the attempt began on (same table uuid; not recorded: assumed),
    else raise _Replaced: renamed, or dropped and created again under the name. Committing,
    rolling back or sweeping against that other table would judge the attempt by files it
    never had (and delete ones the renamed table still reads)."""
    if attempt.table_uuid is not None and str(table.metadata.table_uuid) != attempt.table_uuid:
        raise _Replaced(
            f"{attempt.table_name} is not the table this attempt ran on (table uuid {attempt.table_uuid}, now "
            f"{table.metadata.table_uuid}: renamed, or dropped and created again); parked, its files left as "
            "they are (if the table was renamed, its snapshots say whether the attempt committed)"
        )
    return table


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
        abandon(_same_table(table, attempt), ledger, attempt, f"abandoned: {why}")
    report.abandoned.append(attempt.attempt_id)


def _recover_prepared(
    load: Callable[[], Table | None], ledger: Ledger, attempt: Attempt, report: RecoveryReport, recommit: list[Attempt]
) -> None:
    """Decide one PREPARED attempt: settled here, or appended to `recommit` (see the module docstring)."""
    table = load()
    if table is None:
        ledger.mark_rolled_back(
            attempt.attempt_id,
            "table not found: dropped, or renamed (then the renamed table's snapshots say whether this "
            "attempt committed); its files are left as they are",
        )
        report.rolled_back.append(attempt.attempt_id)
        return
    _same_table(table, attempt)
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
    for doc in attempt.result_files:  # a record that cannot be read fails this attempt alone, not its batch
        datafile_from_json(doc)
    recommit.append(attempt)


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
