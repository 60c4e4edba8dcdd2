"""Two-phase commit of a rewrite.

Precommit (engine): every result file is durable and the ledger row is PREPARED with the exact
DataFile list. Commit (here): one Iceberg `replace` snapshot that deletes the sources and adds the
results of one or more attempts of a table, tagged with their task and attempt ids, made only if
the head descends from every attempt's base snapshot (base_history: a rollback of main since the
plan makes any attempt back off, delete-file tiers and manifest rewrites too), every source is still
live and no position delete that can apply to one was added since the attempt's base snapshot
(Java's RewriteFiles); then COMMITTED.
A commit that gives way deletes the attempt's own files and ends ROLLED_BACK.

A data expiration (kind `expire`) changes the table's content, so its snapshot is no `replace`
(readers and changelog scans skip those): it is a `delete` when it only removes files (whole files
past retention, dropped by metadata) and an `overwrite` when it also adds the rewritten ones, as
Java's engines do; same summary properties, same validation, same protocol. Expirations commit
in snapshots of their own, never with compactions; recovery recommits one with the operation its
files call for (snapshot_operation).

Sources and results are data files (a rewrite) or delete files (the cheaper merge-on-read tiers:
equality deletes converted to position deletes, position deletes combined). The snapshot also
removes every delete file that the swap leaves applying to no live data file (dangling deletes),
decided on the head each try lands on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntryStatus,
)
from pyiceberg.table import Table
from pyiceberg.table.snapshots import (
    REMOVED_DELETE_FILES,
    Operation,
    Snapshot,
)
from pyiceberg.typedef import KeyDefaultDict

from compaction_assets.commit.conflicts import Rewrite, base_history, conflict, deletes_added_since
from compaction_assets.commit.ledger import Attempt, Ledger, StaleAttempt, Status
from compaction_assets.commit.rewrite_producer import RewriteFiles
from compaction_assets.errors import BackOff
from compaction_assets.faults import crash_point
from compaction_assets.gc_pause import gc_paused
from compaction_assets.lake.datafile_codec import datafile_from_json
from compaction_assets.lake.deletes import (
    global_spec_ids,
    referenced_data_file,
)
from compaction_assets.lake.features import refusal
from compaction_assets.lake.files import LiveFile, live_files, partition_key
from compaction_assets.lake.format_v3 import read_entries
from compaction_assets.lake.manifest_cache import forget
from compaction_assets.lake.storage import PathSet, delete_unreferenced, files_with_prefix
from compaction_assets.planning.planner import Kind

log = logging.getLogger("compaction_assets")

TASK_ID_PROPERTY = "compaction.task-id"

ATTEMPT_ID_PROPERTY = "compaction.attempt-id"


def commit_snapshot(table: Table, attempt: Attempt) -> Snapshot | None:
    """The snapshot this attempt committed, if the table still has it: the one whose
    `compaction.attempt-id` lists the attempt's id (a snapshot that commits several attempts of one
    table lists their ids comma-separated; attempt ids are hex, task ids may not hold a comma).
    Once any engine has expired that snapshot, recovery decides from the table's files instead."""
    for snapshot in table.metadata.snapshots:
        summary = snapshot.summary
        if summary is not None and attempt.attempt_id in (summary[ATTEMPT_ID_PROPERTY] or "").split(","):
            return snapshot
    return None


MAX_COMMIT_TRIES = 8

EXPIRE_KIND = "expire"  # planning.planner.Kind.EXPIRE (commit/ does not import the planner)


def snapshot_operation(attempts: Sequence[Attempt]) -> Operation:
    """The operation of the snapshot committing `attempts`: `replace` for compactions (same rows);
    for data expirations `delete` when nothing is added, else `overwrite`.

    Raises:
        ValueError: expirations and compactions mixed (they need snapshots of their own).
    """
    expiring = {a.kind == EXPIRE_KIND for a in attempts}
    if len(expiring) > 1:
        raise ValueError("data expirations and compactions commit in separate snapshots")
    if expiring != {True}:
        return Operation.REPLACE
    return Operation.OVERWRITE if any(a.result_files for a in attempts) else Operation.DELETE


CommitResult = Attempt | BackOff | StaleAttempt


def commit_prepared(table: Table, ledger: Ledger, attempt: Attempt) -> Attempt:
    """Commit one PREPARED attempt; raises BackOff (after rolling back) if it cannot."""
    results: dict[str, CommitResult] = {}
    commit_together(table, ledger, [attempt], results)
    result = results[attempt.attempt_id]
    if isinstance(result, Exception):
        raise result
    return result


@gc_paused()  # thousands of manifest entries read, restated and written (recovery commits here too)
def commit_together(
    table: Table, ledger: Ledger, attempts: Sequence[Attempt], results: dict[str, CommitResult]
) -> None:
    """Swap sources for results of every PREPARED attempt of one table in one `replace` snapshot
    (data expirations: `delete` or `overwrite`, see snapshot_operation; they may not be mixed with
    compactions), so partitions that finish together cost the table one commit, not one each.

    `results` gets, per attempt id, the COMMITTED attempt, or the BackOff of an attempt that had
    to roll back, or the StaleAttempt of one another process ended. It is filled as attempts are
    settled, so it is meaningful even when this raises (catalog unreachable: the outcome of the
    unsettled attempts is unknown and they stay PREPARED for recovery).

    Each try starts from the catalog's current state: an attempt a snapshot already carries (a
    concurrent recovery committed it) is confirmed; one whose sources are no longer live, or whose
    base snapshot is no ancestor of the head (base_history: main rolled back or set to another
    snapshot since the plan), or that a position delete added after its base snapshot can apply
    to, or that replaces an equality delete still applying to a live data file it did not cover,
    rolls back alone. The same checks
    run again inside every commit try, pyiceberg's own retries included (RewriteFiles); appends
    and equality deletes do not conflict (results take their base's data sequence number).

    A COMMITTED attempt's `removed_deletes` lists the delete files its snapshot removed on its
    account: the delete files it replaced, and the dangling ones its swap left (see RewriteFiles).
    """
    snapshot_operation(attempts)  # refuses a mix of expirations and compactions before anything is done
    pending = list(attempts)
    peers = {a.attempt_id: a for a in attempts}

    def settle(attempt: Attempt, outcome: Callable[[], CommitResult]) -> None:
        pending.remove(attempt)
        try:
            results[attempt.attempt_id] = outcome()
        except StaleAttempt as exc:
            results[attempt.attempt_id] = exc

    last_error: Exception | None = None
    for attempt_no in range(MAX_COMMIT_TRIES):
        table.refresh()
        for attempt in [a for a in pending if commit_snapshot(table, a) is not None]:
            settle(attempt, partial(confirm_committed, table, ledger, attempt, peers=peers))
        if refused := refusal(table):  # another engine changed the table into one we do not commit to
            for attempt in list(pending):
                settle(attempt, partial(roll_back, table, ledger, attempt, refused))
            return
        live = {f.path: f for f in live_files(table)}
        _roll_back_conflicting(table, ledger, pending, live, settle)
        if not pending:
            return
        try:
            _commit_once(table, pending, {path: f.data_file for path, f in live.items()})
        except (CommitFailedException, ValidationException) as exc:  # guaranteed not to have landed
            last_error = exc
            time.sleep(min(0.05 * 2**attempt_no, 1.0))
            continue
        crash_point("after_iceberg_commit")
        for attempt in list(pending):
            settle(attempt, partial(confirm_committed, table, ledger, attempt, peers=peers))
        return
    table.refresh()
    _settle_after_tries(table, ledger, pending, peers, settle, last_error)


def _roll_back_conflicting(
    table: Table,
    ledger: Ledger,
    pending: list[Attempt],
    live: dict[str, LiveFile],
    settle: Callable[[Attempt, Callable[[], CommitResult]], None],
) -> None:
    """Which pending attempts conflict with the table as it is now (conflict); each of those rolls back alone."""
    history, added_since = _conflict_lookups(table)
    global_specs = global_spec_ids(table.metadata.specs().values())
    for attempt in list(pending):
        if reason := conflict(attempt, live, history, added_since, global_specs, table.format_version):
            settle(attempt, partial(roll_back, table, ledger, attempt, reason))


def _conflict_lookups(
    table: Table,
) -> tuple[KeyDefaultDict[int | None, list[Snapshot]], KeyDefaultDict[int | None, list[DataFile]]]:
    """Which snapshots lead from a base to the head, and which deletes were added since (both lazy, per base)."""
    head = table.current_snapshot()
    head_id = head.snapshot_id if head else None

    def history_of(base: int | None, head_id: int | None = head_id) -> list[Snapshot]:
        return base_history(table.metadata, base, head_id)

    history: KeyDefaultDict[int | None, list[Snapshot]] = KeyDefaultDict(history_of)

    def added_since_base(base: int | None, history: Mapping[int | None, list[Snapshot]] = history) -> list[DataFile]:
        return deletes_added_since(table.metadata, table.io, base, history[base])

    added_since: KeyDefaultDict[int | None, list[DataFile]] = KeyDefaultDict(added_since_base)
    return history, added_since


def _settle_after_tries(
    table: Table,
    ledger: Ledger,
    pending: list[Attempt],
    peers: Mapping[str, Attempt],
    settle: Callable[[Attempt, Callable[[], CommitResult]], None],
    last_error: Exception | None,
) -> None:
    """Whether each attempt still pending after the last try landed after all: confirmed if so, else rolled back."""
    for attempt in list(pending):
        if commit_snapshot(table, attempt) is not None:
            settle(attempt, partial(confirm_committed, table, ledger, attempt, peers=peers))
        else:
            reason = f"commit gave way {MAX_COMMIT_TRIES} times; last: {last_error}"
            settle(attempt, partial(roll_back, table, ledger, attempt, reason))


def _commit_once(table: Table, attempts: Sequence[Attempt], live: dict[str, DataFile]) -> None:
    """One commit of every attempt (pyiceberg retries it on a concurrent commit, see RewriteFiles),
    as the snapshot operation they call for (snapshot_operation).

    The manifests the new snapshot restated leave the manifest cache: no plan reads them again,
    and a 5,000-file rewrite's entries left there only had Python's collector sweep them once it
    came back on (0.03-0.2 s of such a compaction, after the commit, measured on the bench)."""
    properties = {
        TASK_ID_PROPERTY: ",".join(a.task_id for a in attempts),
        ATTEMPT_ID_PROPERTY: ",".join(a.attempt_id for a in attempts),
    }
    metadata = table.metadata
    rewrites = []
    for attempt in attempts:
        replaced = [live[p] for p in attempt.source_files]
        added = [datafile_from_json(doc) for doc in attempt.result_files]
        base = metadata.snapshot_by_id(attempt.base_snapshot_id) if attempt.base_snapshot_id is not None else None
        if base is None and any(f.content == DataFileContent.DATA for f in [*replaced, *added]):
            # conflict rolled such attempts back; the base expired in between
            raise ValidationException(f"base snapshot {attempt.base_snapshot_id} of {attempt.attempt_id} is gone")
        rewrites.append(
            Rewrite(
                base_snapshot_id=attempt.base_snapshot_id,
                data_sequence_number=None if base is None or metadata.format_version < 2 else base.sequence_number,
                replaced=replaced,
                added=added,
                covered=attempt.covered_files,
            )
        )
    txn = table.transaction()
    rewrite = RewriteFiles(txn, table.io, rewrites, properties, snapshot_operation(attempts))
    try:
        with rewrite:
            pass
        txn.commit_transaction()
        forget(rewrite.replaced_manifests)
    finally:
        rewrite.untie()


def confirm_committed(
    table: Table,
    ledger: Ledger,
    attempt: Attempt,
    snapshot_id: int | None = None,
    peers: Mapping[str, Attempt] | None = None,
) -> Attempt:
    """Mark COMMITTED, with the snapshot that carries the attempt (or `snapshot_id`, when recovery
    found its result files committed by a snapshot since expired) and the delete files that
    snapshot removed on its account (removed_deletes; `peers`: attempts it may share the snapshot
    with, else read from the ledger), and sweep its stray files."""
    if snapshot_id is None:
        snapshot = commit_snapshot(table, attempt)
        if snapshot is None:
            raise RuntimeError(f"attempt {attempt.attempt_id}: no snapshot of table {attempt.table_name} carries it")
        snapshot_id = snapshot.snapshot_id
    else:
        snapshot = table.metadata.snapshot_by_id(snapshot_id)
    try:
        removed = [] if snapshot is None else removed_deletes(table, ledger, snapshot, attempt, peers or {})
    except Exception as exc:  # a figure for the report must not make a landed commit's outcome unknown
        log.warning("attempt %s: cannot tell which delete files its commit removed: %s", attempt.attempt_id, exc)
        removed = []
    try:
        committed = ledger.mark_committed(attempt.attempt_id, snapshot_id, removed)
    except StaleAttempt:
        current = ledger.get(attempt.attempt_id)
        if current is None or current.status != Status.COMMITTED:
            raise
        committed = current
    sweep_untracked(table, ledger, attempt, keep={d["file_path"] for d in attempt.result_files})
    return committed


def removed_deletes(
    table: Table, ledger: Ledger, snapshot: Snapshot, attempt: Attempt, peers: Mapping[str, Attempt]
) -> list[str]:
    """Paths of the delete files `snapshot` removed (DELETED entries it wrote into delete manifests)
    on `attempt`'s account. Each goes to one of the attempts the snapshot commits, the first (in its
    `compaction.attempt-id` order) that replaced it, else that replaced the data file it references,
    else of its partition key, else the first: a delete that several partitions shared (a global
    one) is counted once."""
    summary = snapshot.summary
    ids = ((summary[ATTEMPT_ID_PROPERTY] or "") if summary is not None else "").split(",")
    if summary is None or not summary[REMOVED_DELETE_FILES] or attempt.attempt_id not in ids:
        return []
    removed = _deletes_removed_by(table, snapshot)
    attempts = [a for i in ids if (a := attempt if i == attempt.attempt_id else peers.get(i) or ledger.get(i))]
    return [d.file_path for d in removed if _delete_owner(table, attempts, d).attempt_id == attempt.attempt_id]


def _deletes_removed_by(table: Table, snapshot: Snapshot) -> list[DataFile]:
    """Which delete files the snapshot removed: DELETED entries it wrote into its own delete manifests."""
    return [
        e.data_file
        for m in snapshot.manifests(table.io)
        if m.content == ManifestContent.DELETES and m.added_snapshot_id == snapshot.snapshot_id
        for e in read_entries(m, table.io, discard_deleted=False)  # v3 schema: a DV keeps its data file
        if e.status == ManifestEntryStatus.DELETED and e.snapshot_id == snapshot.snapshot_id
    ]


def _delete_owner(table: Table, attempts: Sequence[Attempt], delete_file: DataFile) -> Attempt:
    """Which attempt a removed delete file is counted for (see removed_deletes)."""
    referenced = referenced_data_file(delete_file)
    key = partition_key(table, delete_file) if delete_file.spec_id in table.specs() else None
    for rule in (
        lambda a: delete_file.file_path in a.source_files,
        lambda a: referenced is not None and referenced in a.source_files,
        lambda a: a.partition_key == key,
    ):
        if matched := next((a for a in attempts if rule(a)), None):
            return matched
    return attempts[0]


def roll_back(table: Table, ledger: Ledger, attempt: Attempt, reason: str) -> BackOff:
    """Mark ROLLED_BACK, then delete what the attempt wrote that nothing references; returns the
    BackOff to raise.

    The ledger goes first: if another process already ended the attempt (e.g. committed it),
    the transition is refused and nothing is deleted. A file a snapshot references (the commit
    landed after all) is never deleted: see sweep_untracked.
    """
    ledger.mark_rolled_back(attempt.attempt_id, reason)
    sweep_untracked(table, ledger, attempt, keep=set())
    why = f"{reason} (rolled back; the next run plans it again)"
    return BackOff(f"{attempt.table_name} [{attempt.partition_key or 'unpartitioned'}]: backed off: {why}", why)


def abandon(table: Table, ledger: Ledger, attempt: Attempt, reason: str) -> Attempt:
    """An EXECUTING attempt that will never finish: mark it FAILED, then delete what it wrote."""
    failed = ledger.mark_failed(attempt.attempt_id, reason)
    sweep_untracked(table, ledger, attempt, keep=set())
    return failed


def sweep_untracked(table: Table, ledger: Ledger, attempt: Attempt, keep: set[str]) -> int:
    """Delete files named after this attempt in its output folders, except those in `keep`, any a
    snapshot of the table references and any an open attempt claims (storage.delete_unreferenced)."""
    written = written_files(table.io, attempt)
    kept = PathSet(keep)
    doomed = [p for p in written if p not in kept]
    if not doomed:
        return 0
    return delete_unreferenced(table, doomed, ledger.open_claims(attempt.table_name))


def written_files(io: FileIO, attempt: Attempt) -> list[str]:
    """The files named after the attempt in its output folders; an old-spec attempt writes into a
    folder per partition of the current spec below its one, which is listed recursively."""
    recursive = attempt.kind == Kind.OLD_SPEC
    return [p for d in attempt.output_dirs for p in files_with_prefix(d, attempt.attempt_id, io, recursive)]
