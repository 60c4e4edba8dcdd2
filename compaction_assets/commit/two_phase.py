"""Two-phase commit of a rewrite.

Precommit (engine): every result file is durable and the ledger row is PREPARED with the exact
DataFile list. Commit (here): one Iceberg snapshot that deletes the sources and adds the results,
tagged with the task and attempt ids, made only if every source is still live; then COMMITTED.
A commit that gives way deletes the attempt's own files and ends ROLLED_BACK.
"""

from __future__ import annotations

import time

from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.expressions import AlwaysFalse
from pyiceberg.manifest import ManifestContent, ManifestFile
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.snapshots import Operation, Snapshot
from pyiceberg.table.update.snapshot import _ManifestMergeManager, _OverwriteFiles
from pyiceberg.table.update.validate import _validate_data_files_exist, _validate_no_new_deletes_for_data_files
from pyiceberg.utils.properties import property_as_bool, property_as_int

from compaction_assets.commit.ledger import Attempt, Ledger, StaleAttempt, Status
from compaction_assets.errors import BackOff
from compaction_assets.faults import crash_point
from compaction_assets.lake.datafile_codec import datafile_from_json
from compaction_assets.lake.files import live_files
from compaction_assets.lake.storage import delete_files, files_with_prefix

TASK_ID_PROPERTY = "compaction.task-id"
ATTEMPT_ID_PROPERTY = "compaction.attempt-id"


def commit_snapshot(table: Table, attempt: Attempt) -> Snapshot | None:
    """The snapshot this attempt committed, if any (found by its summary properties)."""
    for snapshot in table.metadata.snapshots:
        summary = snapshot.summary
        if (
            summary is not None
            and summary[TASK_ID_PROPERTY] == attempt.task_id
            and summary[ATTEMPT_ID_PROPERTY] == attempt.attempt_id
        ):
            return snapshot
    return None


MAX_COMMIT_TRIES = 8


def commit_prepared(table: Table, ledger: Ledger, attempt: Attempt) -> Attempt:
    """Swap sources for results in one snapshot; raises BackOff (after rolling back) if it cannot.

    Each try starts from the catalog's current state: if a snapshot already carries the attempt
    (a concurrent recovery committed it), confirm it; if a source is no longer live, or a delete
    file appeared in the partition (rewriting would resurrect deleted rows), roll back. pyiceberg
    validates, at commit and on its own retries, that the replaced files still exist and gained
    no delete files (RewriteFiles semantics, see _RewriteFiles); appends do not conflict.
    """
    last_error: Exception | None = None
    for attempt_no in range(MAX_COMMIT_TRIES):
        table.refresh()
        if commit_snapshot(table, attempt) is not None:
            return confirm_committed(table, ledger, attempt)
        files = live_files(table)
        live = {f.path: f.data_file for f in files if not f.is_delete}
        missing = [p for p in attempt.source_files if p not in live]
        if missing:
            raise roll_back(
                table,
                ledger,
                attempt,
                f"{len(missing)} of {len(attempt.source_files)} source file(s) are no longer live "
                f"(e.g. {missing[0]}): a concurrent change replaced them",
            )
        if deletes := [f.path for f in files if f.is_delete and f.partition_key == attempt.partition_key]:
            raise roll_back(table, ledger, attempt, f"delete file(s) appeared in the partition, e.g. {deletes[0]}")
        try:
            _commit_once(table, attempt, live)
        except (CommitFailedException, ValidationException) as exc:  # guaranteed not to have landed
            last_error = exc
            time.sleep(min(0.05 * 2**attempt_no, 1.0))
            continue
        crash_point("after_iceberg_commit")
        return confirm_committed(table, ledger, attempt)
    table.refresh()
    if commit_snapshot(table, attempt) is not None:
        return confirm_committed(table, ledger, attempt)
    raise roll_back(table, ledger, attempt, f"commit gave way {MAX_COMMIT_TRIES} times; last: {last_error}")


class _RewriteFiles(_OverwriteFiles):
    """An overwrite with Iceberg RewriteFiles semantics.

    Validation: rows appended concurrently are no conflict for a rewrite (pyiceberg's
    serializable check says they are); replaced files that vanished, or gained delete files,
    are. pyiceberg re-runs this on every commit retry.

    Manifests: merged as Java Iceberg's rewrite does (`commit.manifest-merge.enabled`, default
    true there, and here), so the one-manifest-per-append trail of a streaming writer is folded
    up by every compaction instead of making each later read of the table slower.
    """

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        props = self._transaction.table_metadata.properties
        if not property_as_bool(props, TableProperties.MANIFEST_MERGE_ENABLED, True):
            return manifests
        merger = _ManifestMergeManager(
            target_size_bytes=property_as_int(
                props, TableProperties.MANIFEST_TARGET_SIZE_BYTES, TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT
            ),
            min_count_to_merge=property_as_int(
                props, TableProperties.MANIFEST_MIN_MERGE_COUNT, TableProperties.MANIFEST_MIN_MERGE_COUNT_DEFAULT
            ),
            merge_enabled=True,
            snapshot_producer=self,
        )
        data = [m for m in manifests if m.content == ManifestContent.DATA]
        deletes = [m for m in manifests if m.content == ManifestContent.DELETES]
        return merger.merge_manifests(data) + deletes

    def _validate_concurrency(self) -> None:
        window = self._commit_window
        if window is None or window.is_empty() or window.head is None:
            return
        table = self._transaction._table
        predicate = self._predicate if self._predicate != AlwaysFalse() else None
        _validate_data_files_exist(table, window.head, self._deleted_data_files, window.base)
        _validate_no_new_deletes_for_data_files(table, window.head, predicate, self._deleted_data_files, window.base)


def _commit_once(table: Table, attempt: Attempt, live: dict) -> None:
    properties = {TASK_ID_PROPERTY: attempt.task_id, ATTEMPT_ID_PROPERTY: attempt.attempt_id}
    txn = table.transaction()
    rewrite = _RewriteFiles(operation=Operation.OVERWRITE, transaction=txn, io=table.io, snapshot_properties=properties)
    with rewrite as overwrite:
        for path in attempt.source_files:
            overwrite.delete_data_file(live[path])
        for doc in attempt.result_files:
            overwrite.append_data_file(datafile_from_json(doc))
    txn.commit_transaction()


def confirm_committed(table: Table, ledger: Ledger, attempt: Attempt) -> Attempt:
    """Mark COMMITTED from the snapshot that carries the attempt, and sweep its stray files."""
    snapshot = commit_snapshot(table, attempt)
    if snapshot is None:
        raise RuntimeError(f"attempt {attempt.attempt_id}: no snapshot of table {attempt.table_name} carries it")
    try:
        committed = ledger.mark_committed(attempt.attempt_id, snapshot.snapshot_id)
    except StaleAttempt:
        committed = ledger.get(attempt.attempt_id)
        if committed is None or committed.status != Status.COMMITTED:
            raise
    sweep_untracked(table, attempt, keep={d["file_path"] for d in attempt.result_files})
    return committed


def roll_back(table: Table, ledger: Ledger, attempt: Attempt, reason: str) -> BackOff:
    """Mark ROLLED_BACK, then delete everything the attempt wrote; returns the BackOff to raise.

    The ledger goes first: if another process already ended the attempt (e.g. committed it),
    the transition is refused and nothing is deleted.
    """
    ledger.mark_rolled_back(attempt.attempt_id, reason)
    sweep_untracked(table, attempt, keep=set())
    return BackOff(f"{attempt.table_name} [{attempt.partition_key or 'unpartitioned'}]: backed off: {reason}")


def abandon(table: Table, ledger: Ledger, attempt: Attempt, reason: str) -> Attempt:
    """An EXECUTING attempt that will never finish: mark it FAILED, then delete what it wrote."""
    failed = ledger.mark_failed(attempt.attempt_id, reason)
    sweep_untracked(table, attempt, keep=set())
    return failed


def sweep_untracked(table: Table, attempt: Attempt, keep: set[str]) -> int:
    """Delete files named after this attempt in its output folders, except those in `keep`."""
    written = [p for d in attempt.output_dirs for p in files_with_prefix(d, attempt.attempt_id)]
    return delete_files(table.io, table.location(), [p for p in written if p not in keep])
