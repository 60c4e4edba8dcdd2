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

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import PrivateAttr
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo, IsNaN, IsNull, Or, Reference
from pyiceberg.expressions.visitors import manifest_evaluator
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    write_manifest,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import (
    ADDED_DATA_FILES,
    ADDED_DELETE_FILES,
    ADDED_EQUALITY_DELETES,
    ADDED_FILE_SIZE,
    ADDED_POSITION_DELETES,
    ADDED_RECORDS,
    CHANGED_PARTITION_COUNT_PROP,
    DELETED_DATA_FILES,
    DELETED_RECORDS,
    REMOVED_DELETE_FILES,
    REMOVED_EQUALITY_DELETES,
    REMOVED_FILE_SIZE,
    REMOVED_POSITION_DELETE_FILES,
    REMOVED_POSITION_DELETES,
    TOTAL_DATA_FILES,
    TOTAL_DELETE_FILES,
    TOTAL_EQUALITY_DELETES,
    TOTAL_FILE_SIZE,
    TOTAL_POSITION_DELETES,
    TOTAL_RECORDS,
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
)
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetSnapshotRefUpdate,
    TableRequirement,
    UpdatesAndRequirements,
)
from pyiceberg.typedef import EMPTY_DICT, KeyDefaultDict, Record
from pyiceberg.utils.concurrent import ExecutorFactory
from pyiceberg.utils.properties import property_as_bool, property_as_int

from compaction_assets.commit.ledger import Attempt, Ledger, StaleAttempt, Status
from compaction_assets.errors import BackOff
from compaction_assets.faults import crash_point
from compaction_assets.gc_pause import gc_paused
from compaction_assets.iceberg_compat.producers import OverwriteProducer
from compaction_assets.lake.datafile_codec import datafile_from_json
from compaction_assets.lake.delete_files import _DeleteManifestWriter
from compaction_assets.lake.deletes import (
    ApplyingDeletes,
    DeleteIndex,
    SequencedFile,
    file_key,
    global_spec_ids,
    is_deletion_vector,
    referenced_data_file,
)
from compaction_assets.lake.features import refusal
from compaction_assets.lake.files import LiveFile, live_files, partition_key
from compaction_assets.lake.manifest_cache import forget, live_entries, manifest_contents
from compaction_assets.lake.manifest_io import (
    CONTENT_SIZE_IN_BYTES,
    MANIFEST_FIRST_ROW_ID,
    MIN_LINEAGE_VERSION,
    ManifestContents,
    ManifestListWriterV3,
    ManifestWriterV3,
    holds_row_lineage,
    partition_schema,
    read_entries,
    snapshot_manifests,
    v3_field,
    with_first_row_ids,
    write_restated,
)
from compaction_assets.lake.partition_key import partition_id
from compaction_assets.lake.storage import PathSet, delete_unreferenced, files_with_prefix
from compaction_assets.planning.planner import Kind

log = logging.getLogger("compaction_assets")
_UNREAD = ManifestContents((), None, ())
REMOVED_DVS = "removed-dvs"  # Java's snapshot summary (format version 3); pyiceberg 0.12 has no such key
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
    run again inside every commit try, pyiceberg's own retries included (_RewriteFiles); appends
    and equality deletes do not conflict (results take their base's data sequence number).

    A COMMITTED attempt's `removed_deletes` lists the delete files its snapshot removed on its
    account: the delete files it replaced, and the dangling ones its swap left (see _RewriteFiles).
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
            settle(attempt, lambda a=attempt: confirm_committed(table, ledger, a, peers=peers))
        if refused := refusal(table):  # another engine changed the table into one we do not commit to
            for attempt in list(pending):
                settle(attempt, lambda a=attempt, r=refused: roll_back(table, ledger, a, r))
            return
        live = {f.path: f for f in live_files(table)}
        head = table.current_snapshot()
        head_id = head.snapshot_id if head else None
        history = KeyDefaultDict(lambda base, head_id=head_id: base_history(table.metadata, base, head_id))
        added_since = KeyDefaultDict(
            lambda base, history=history: _deletes_added_since(table.metadata, table.io, base, history[base])
        )
        global_specs = global_spec_ids(table.metadata.specs().values())
        for attempt in list(pending):
            if reason := _conflict(attempt, live, history, added_since, global_specs, table.format_version):
                settle(attempt, lambda a=attempt, r=reason: roll_back(table, ledger, a, r))
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
            settle(attempt, lambda a=attempt: confirm_committed(table, ledger, a, peers=peers))
        return
    table.refresh()
    for attempt in list(pending):
        if commit_snapshot(table, attempt) is not None:
            settle(attempt, lambda a=attempt: confirm_committed(table, ledger, a, peers=peers))
        else:
            reason = f"commit gave way {MAX_COMMIT_TRIES} times; last: {last_error}"
            settle(attempt, lambda a=attempt, r=reason: roll_back(table, ledger, a, r))


def _conflict(
    attempt: Attempt,
    live: dict[str, LiveFile],
    history: Mapping[int | None, list[Snapshot]],
    added_since: Mapping[int | None, list[DataFile]],
    global_specs: frozenset[int],
    format_version: int = 2,
) -> str | None:
    """Why the attempt cannot commit on the current head (of a table of `format_version`), or None."""
    written = [datafile_from_json(d) for d in attempt.result_files]
    if reason := _format_conflict(written, format_version):
        return reason
    results = [f for f in written if f.content == DataFileContent.DATA]
    missing = [p for p in attempt.source_files if p not in live]
    if missing:
        return (
            f"{len(missing)} of {len(attempt.source_files)} source file(s) are no longer live "
            f"(e.g. {missing[0]}): a concurrent change replaced them"
        )
    try:
        history[attempt.base_snapshot_id]  # every kind: the head must descend from the base (base_history)
    except ValidationException as exc:
        return str(exc)
    replaced = [live[p] for p in attempt.source_files]
    if data := [f.data_file for f in replaced if not f.is_delete]:
        try:
            added = added_since[attempt.base_snapshot_id]
        except ValidationException as exc:
            return str(exc)
        if reason := _delete_conflict(data, added, global_specs, results):
            return reason
    data_files = [f for f in live.values() if not f.is_delete]
    return _uncovered(replaced, data_files, attempt.covered_files, global_specs)


def _format_conflict(results: Sequence[DataFile], format_version: int) -> str | None:
    """Why an attempt's results cannot be added to a table of `format_version`, or None: in a
    format-version-3 table (upgraded after the plan), data files written without row lineage (the
    rows would get new row ids and sequence numbers) and position-delete files (v3 takes deletion
    vectors only)."""
    if format_version < MIN_LINEAGE_VERSION:
        return None
    if positional := [f for f in results if f.content == DataFileContent.POSITION_DELETES]:
        return (
            f"the table is format version {format_version}, which takes no position-delete file such as "
            f"{positional[0].file_path}: the table was upgraded after the plan"
        )
    if bare := [f for f in results if f.content == DataFileContent.DATA and not holds_row_lineage(f)]:
        return (
            f"the table is format version {format_version} but result file {bare[0].file_path} holds no row "
            "lineage (_row_id, _last_updated_sequence_number): the table was upgraded after the plan, and "
            "committing would give its rows new row ids"
        )
    return None


def base_history(metadata: TableMetadata, base_snapshot_id: int | None, head_snapshot_id: int | None) -> list[Snapshot]:
    """The snapshots committed after the base on the head's line of history, newest first: the head
    and its ancestors down to the base's child (Java's SnapshotUtil.ancestorsBetween). Every attempt,
    whatever it replaces (data files, delete files, manifests), commits only on a head this can be
    read for: its plan, result files and checks hold for the base's state and what came after it,
    never for another line of history.

    Raises ValidationException when no base is recorded, when the base is no ancestor of the head
    (main rolled back, or set to another snapshot, since the plan: the head may hold files the base
    did not, whose deletes the attempt dropped), or when that cannot be told (a snapshot between them
    expired: pyiceberg's expiry clears the parent id of its child, Java's leaves it dangling). The
    base itself may be expired as long as its child still names it as parent (Java's
    MergingSnapshotProducer.validationHistory).
    """
    if base_snapshot_id is None:
        raise ValidationException("no base snapshot recorded: cannot tell what changed since the plan")
    by_id = {s.snapshot_id: s for s in metadata.snapshots}
    history: list[Snapshot] = []
    snapshot_id = head_snapshot_id
    while snapshot_id != base_snapshot_id:
        if snapshot_id is None:
            raise ValidationException(
                f"base snapshot {base_snapshot_id} is no ancestor of the head {head_snapshot_id} in the table's "
                "history: main was rolled back or set to another snapshot since the plan (or the snapshots "
                "between them expired), so the plan does not hold for the head"
            )
        snapshot = by_id.get(snapshot_id)
        if snapshot is None:
            raise ValidationException(
                f"cannot read the history from base snapshot {base_snapshot_id} to head {head_snapshot_id}: "
                f"snapshot {snapshot_id} is missing (history expired): cannot tell the base is an ancestor of the head"
            )
        history.append(snapshot)
        snapshot_id = snapshot.parent_snapshot_id
    return history


def _deletes_added_since(
    metadata: TableMetadata, io: FileIO, base_snapshot_id: int | None, history: Sequence[Snapshot]
) -> list[DataFile]:
    """The delete files the snapshots of `history` (base_history: after the base, up to and
    including the head) added: the ADDED entries of the delete manifests each of them wrote (as
    Java's MergingSnapshotProducer validationHistory reads them).

    Raises ValidationException when the base is not in the table's metadata (a data rewrite's
    results take its data sequence number).
    """
    if base_snapshot_id is None or metadata.snapshot_by_id(base_snapshot_id) is None:
        raise ValidationException(
            f"base snapshot {base_snapshot_id} is not in the table's metadata (expired?): "
            "cannot tell which delete files were added since"
        )
    added: list[DataFile] = []
    for snapshot in history:
        for manifest in [] if _only_appends_data(snapshot) else snapshot.manifests(io):
            if manifest.content == ManifestContent.DELETES and manifest.added_snapshot_id == snapshot.snapshot_id:
                added.extend(
                    e.data_file
                    for e in live_entries(manifest, io)
                    if e.status == ManifestEntryStatus.ADDED and e.snapshot_id == snapshot.snapshot_id
                )
    return added


def _only_appends_data(snapshot: Snapshot) -> bool:
    """An `append` that says it added no delete file (the spec's append adds data files only):
    its manifest list need not be read, which keeps a long window of streaming appends cheap."""
    summary = snapshot.summary
    return summary is not None and summary.operation == Operation.APPEND and not summary[ADDED_DELETE_FILES]


def _delete_conflict(
    replaced: Sequence[DataFile],
    added_deletes: Sequence[DataFile],
    global_specs: frozenset[int],
    results: Sequence[DataFile] = (),
) -> str | None:
    """A delete added after the base that the rewrite would make apply to other rows, described;
    else None.

    A position delete that can apply to a replaced file always is (its rows get new positions).
    Equality deletes are not while the results stay in the sources' partitions: the results carry
    the base's data sequence number, so those deletes apply to the rewritten rows as they did to
    the replaced ones (Java's RewriteFiles ignores them once `dataSequenceNumber` is set). When
    rows move to other partitions (an old-spec rewrite), a partition-scoped one that can apply to a
    replaced file would no longer apply to its rows, and one that can apply to a result would
    newly apply to them: both are conflicts (global ones apply on either side alike)."""
    index = DeleteIndex((d for d in added_deletes if d.content == DataFileContent.POSITION_DELETES), global_specs)
    for data_file in replaced if index else ():
        if applying := index.for_data_file(data_file):
            return (
                f"position delete file {applying[0].file_path}, added after the base snapshot, can apply to "
                f"source {data_file.file_path}: rewriting it would bring deleted rows back"
            )
    if not results:
        return None
    outside = {partition_id(f.spec_id, f.partition) for f in results}  # results' partitions no source is in
    for data_file in replaced:  # a group's sources share a partition: this stops at the first
        outside.discard(partition_id(data_file.spec_id, data_file.partition))
        if not outside:
            return None
    scoped = [
        d for d in added_deletes if d.content == DataFileContent.EQUALITY_DELETES and d.spec_id not in global_specs
    ]
    index = DeleteIndex(scoped, global_specs)
    for data_file in [*replaced, *results] if index else ():
        if applying := index.for_data_file(data_file):
            return (
                f"equality delete file {applying[0].file_path}, added after the base snapshot, can apply to "
                f"{data_file.file_path}, and the rewrite moves rows between partitions: it would apply to "
                "other rows than before"
            )
    return None


def _uncovered(
    replaced: Sequence[SequencedFile],
    data_files: Iterable[SequencedFile],
    covered: Sequence[str] | None,
    global_specs: frozenset[int],
) -> str | None:
    """Why replacing these files would bring deleted rows back, or None: an equality delete among
    them applies (lake.deletes.ApplyingDeletes) to a live data file outside `covered`, the data files
    the attempt accounted for (converting equality deletes into position deletes computes positions
    for those files only; a file another engine rewrote keeping an older data sequence number, or
    a result of another rewrite in the same snapshot, would lose its deletes)."""
    equality = [f for f in replaced if f.data_file.content == DataFileContent.EQUALITY_DELETES]
    if not equality:
        return None
    index, accounted = ApplyingDeletes(equality, global_specs), set(covered or ())
    for data in data_files:
        if data.data_file.file_path not in accounted and (applying := index.for_data_file(data)):
            return (
                f"equality delete file {applying[0].data_file.file_path} still applies to live data file "
                f"{data.data_file.file_path}, which the attempt did not cover: replacing it would bring "
                "deleted rows back"
            )
    return None


@dataclass(frozen=True)
class _Sequenced:
    """A file with its data sequence number, as lake.deletes.ApplyingDeletes takes it."""

    data_file: DataFile
    data_sequence_number: int

    @property
    def path(self) -> str:
        """What tells it from other live files (lake.deletes.file_key: a deletion vector is a blob)."""
        return file_key(self.data_file)

    @property
    def is_delete(self) -> bool:
        return self.data_file.content != DataFileContent.DATA


@dataclass(frozen=True)
class _Rewrite:
    """One attempt's part of a commit: files replaced, files added (data or delete files), the base
    it was planned on, and the data files it covered (see _uncovered)."""

    base_snapshot_id: int | None
    data_sequence_number: int | None  # the base's; None in a format-version-1 table (no sequence numbers)
    replaced: list[DataFile]
    added: list[DataFile]
    covered: list[str] | None = None

    @property
    def replaced_data(self) -> list[DataFile]:
        return [f for f in self.replaced if f.content == DataFileContent.DATA]


class _AssertNumbering(AssertRefSnapshotId):
    """assert-ref-snapshot-id that also requires the format version, last-sequence-number and
    next-row-id the snapshot was numbered from (`numbered`), where pyiceberg checks requirements
    itself (SQL and other metastore catalogs). pyiceberg 0.12 checks a snapshot's sequence number
    only on format version 2 and a stale first-row-id, or a v3 upgrade, only as it applies the
    update, by ValueError (to the caller: outcome unknown); nor does asserting main's head help,
    since a commit to another branch moves the table's numbering without moving main. Failing here
    is a CommitFailedException, so pyiceberg's retry numbers the snapshot again from the refreshed
    table. A REST catalog receives a plain assert-ref-snapshot-id (private attributes are not
    serialised); its server checks the numbering itself (Java's TableMetadata.Builder)."""

    _expected: tuple[int, int, int | None] = PrivateAttr(default=(0, 0, None))

    def validate(self, base_metadata: TableMetadata | None) -> None:
        super().validate(base_metadata)
        assert base_metadata is not None  # super() raised otherwise
        found = _numbering(base_metadata)
        if found != self._expected:
            raise CommitFailedException(
                "Requirement failed: table numbering changed (format version, last-sequence-number, "
                f"next-row-id): expected {self._expected}, found {found}"
            )


def _numbering(metadata: TableMetadata) -> tuple[int, int, int | None]:
    """Format version, last-sequence-number (none before v2) and next-row-id (none before v3)."""
    return metadata.format_version, getattr(metadata, "last_sequence_number", 0), getattr(metadata, "next_row_id", None)


def numbered(commit: UpdatesAndRequirements, metadata: TableMetadata) -> UpdatesAndRequirements:
    """A producer's `snapshot_updates` result with its assert-ref-snapshot-id requiring, besides the branch
    head, the numbering `metadata` gave the snapshot (_AssertNumbering)."""
    updates, requirements = commit

    def checked(requirement: TableRequirement) -> TableRequirement:
        if not isinstance(requirement, AssertRefSnapshotId):
            return requirement
        strict = _AssertNumbering(ref=requirement.ref, snapshot_id=requirement.snapshot_id)
        strict._expected = _numbering(metadata)
        return strict

    return updates, tuple(checked(r) for r in requirements)


class _RewriteFiles(OverwriteProducer):
    """A `replace` snapshot (a data expiration's: `delete` or `overwrite`) with Iceberg RewriteFiles
    semantics (Java's BaseRewriteFiles and MergingSnapshotProducer), built on pyiceberg 0.12's
    overwrite producer (iceberg_compat.producers): pyiceberg 0.12 has no public producer for it (the upstream proposal,
    iceberg-python #3130 / PR #3131, adds `UpdateSnapshot.replace()`; drop this class for it once
    released).

    Validation, on every commit try (pyiceberg calls `manifests` again on each of its retries,
    with the refreshed head as parent): the parent descends from every attempt's base (base_history);
    every replaced file, data or delete, is live in the parent;
    no position delete file that can apply to a replaced data file (lake.deletes) was added after
    its attempt's base snapshot; no replaced equality delete applies to a data file its attempt
    did not cover (_uncovered). Rows appended concurrently are no conflict (pyiceberg's own
    serializable check says they are: `validate_concurrency` is replaced, since its window starts
    at the head this producer was created on, not at the attempts' bases).

    Dangling deletes, decided on the parent each try: a live delete file that applied to a replaced
    data file (lake.deletes.ApplyingDeletes, the spec's rule) and, after the swap, applies to no
    live data file is removed too (DELETED in its delete manifest, counted in the summary). After
    the swap means: the parent's other data files with their own data sequence numbers, and the
    added data files with their base's (an equality delete committed after the base applies to
    them); a position delete never applies to an added file (its path is new). Only deletes that
    applied to a replaced file are considered, so an unrelated delete is never touched, and a
    delete another engine removed or made apply again (a file rewritten keeping its old data
    sequence number) is seen on the next try: recomputed, never resurrected.

    Added files: per partition spec, one data manifest whose entries carry their attempt's base
    snapshot's data sequence number (Java's `dataSequenceNumber(startingSnapshot.sequenceNumber())`),
    so an equality delete committed after the base still applies to the rewritten rows, and one
    delete manifest whose entries inherit this snapshot's; file sequence numbers are inherited.

    Manifests: data manifests merged as Java Iceberg's rewrite does (`commit.manifest-merge.enabled`,
    default true there, and here), so the one-manifest-per-append trail of a streaming writer is
    folded up by every compaction instead of making each later read of the table slower.

    Manifest entries: read through the process's manifest cache, where the conflict check has
    just put them, and restated from the bytes read where the manifest allows (lake.manifest_io:
    no per-entry Avro encoding in Python). For a 5,000-file rewrite, decoding the parent's
    manifests again was 0.9 s and encoding the DELETED entries 0.3 s of a 1.2 s commit.

    Summary: computed here, since pyiceberg 0.12's update_snapshot_summaries refuses `replace`.

    Format version 3 (pyiceberg 0.12 writes no v3 manifest, manifest list or snapshot: no public API
    does): manifests are written by manifest_io.ManifestWriterV3, entries written again (restated,
    merged) carry their data files' first_row_id as readers inherit it, so rows keep their ids; the
    manifest list (manifest_io.ManifestListWriterV3) assigns new row ids to the data manifests this
    snapshot wrote, and the snapshot records first-row-id and added-rows (snapshot_updates). A deletion vector
    is one blob of a Puffin file many share: removed by its key (lake.deletes.file_key), dangling once
    its data file is replaced, counted as Java does (`removed-dvs`). Results must hold row lineage
    (_format_conflict: a table upgraded after the plan makes the attempt back off).
    """

    def __init__(
        self,
        transaction: Transaction,
        io: FileIO,
        rewrites: Sequence[_Rewrite],
        snapshot_properties: dict[str, str],
        operation: Operation = Operation.REPLACE,
    ) -> None:
        super().__init__(operation=operation, transaction=transaction, io=io, snapshot_properties=snapshot_properties)
        self._rewrites = list(rewrites)
        self._data_sequence_numbers: dict[str, int | None] = {}
        self._dangling: list[DataFile] = []  # this try's
        self._global_specs = global_spec_ids(transaction.table_metadata.specs().values())
        self._scanned: list[tuple[ManifestFile, ManifestContents, list[int]]] = []  # this try's
        # format version 3 (this try's metadata, see snapshot_updates): row lineage kept (first_row_id), v3
        # manifests and manifest list written
        self._lineage = transaction.table_metadata.format_version >= MIN_LINEAGE_VERSION
        for rewrite in rewrites:
            for data_file in rewrite.replaced:
                self.delete_data_file(data_file)
            for data_file in rewrite.added:
                self.append_data_file(data_file)
                self._data_sequence_numbers[data_file.file_path] = rewrite.data_sequence_number

    def manifests(self) -> list[ManifestFile]:
        self._validate_no_new_deletes()
        self.build_partition_filters()
        self._scanned = self._scan(self.parent_snapshot_id)
        removed = [(c, p) for _, c, p in self._scanned if p]
        executor = ExecutorFactory.get_or_create()
        added = executor.submit(self._added_manifests)
        deleted = executor.submit(self._restated_manifests, removed, ManifestEntryStatus.DELETED)
        existing = executor.submit(self.existing_manifests)
        return self.process_manifests(added.result() + deleted.result() + existing.result())

    @property
    def replaced_manifests(self) -> list[str]:
        """The last try's manifests that held removed files (the snapshot restates their entries)."""
        return [manifest.manifest_path for manifest, _, positions in self._scanned if positions]

    def untie(self) -> None:
        """Break the reference cycle pyiceberg 0.12's cached `partition_filters` (a KeyDefaultDict of
        a bound method) makes of the producer, so that it and all it holds (the replaced files, the
        scanned manifests' entries) are freed when dropped, not by Python's cyclic collector later
        (a sweep of thousands of entries, in whatever runs next)."""
        self.drop_partition_filters()

    def validate_concurrency(self) -> None:
        """Nothing here: `manifests` validates every try against the attempts' own bases."""

    def _spec_schema(self, spec_id: int) -> Schema:
        """lake.manifest_io.partition_schema of the transaction's metadata. (Each call rebuilds the
        transaction's metadata: ask once per spec.)"""
        return partition_schema(self.table_metadata, spec_id)

    def manifest_evaluator(self, spec_id: int) -> Callable[[ManifestFile], bool]:
        return manifest_evaluator(
            self.spec(spec_id), self._spec_schema(spec_id), self.partition_filters[spec_id], self.case_sensitive
        )

    def new_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        """pyiceberg's, with the partition typed by _spec_schema (its merge writes through this too);
        format version 3: manifest_io.ManifestWriterV3 (pyiceberg 0.12 writes no v3 manifest)."""
        if self._lineage:
            schema, output = self._spec_schema(spec.spec_id), self.new_manifest_output()
            return ManifestWriterV3(spec, schema, output, self.snapshot_id, self.compression)
        return write_manifest(
            format_version=self.table_metadata.format_version,
            spec=spec,
            schema=self._spec_schema(spec.spec_id),
            output_file=self.new_manifest_output(),
            snapshot_id=self.snapshot_id,
            avro_compression=self.compression,
        )

    def _new_writer(self, content: ManifestContent, spec: PartitionSpec) -> ManifestWriter:
        """A manifest writer for data files or for delete files (format version 2: a table with
        delete files has at least that)."""
        if content == ManifestContent.DATA:
            return self.new_manifest_writer(spec)
        schema, output = self._spec_schema(spec.spec_id), self.new_manifest_output()
        if self._lineage:
            return ManifestWriterV3(spec, schema, output, self.snapshot_id, self.compression, content)
        return _DeleteManifestWriter(spec, schema, output, self.snapshot_id, self.compression)

    def fetch_manifest_entry(self, manifest: ManifestFile, discard_deleted: bool = True) -> list[ManifestEntry]:
        """What pyiceberg's manifest merge writes again; format version 3: read with the v3 entry
        schema and first_row_id inherited (manifest_io.read_entries), else the merged entries would
        lose their rows' ids (pyiceberg 0.12 reads the v2 schema)."""
        if self._lineage:
            return read_entries(manifest, self.file_io, discard_deleted)
        return super().fetch_manifest_entry(manifest, discard_deleted)

    def snapshot_updates(self) -> UpdatesAndRequirements:
        """pyiceberg 0.12's snapshot producer's, but for format version 3 (which it cannot
        write: no v3 manifest list, and the snapshot's `added-rows` left unset): the manifest list
        assigns first_row_id to the data manifests this snapshot wrote (manifest_io.ManifestListWriterV3),
        the snapshot's first-row-id is the table's next-row-id and its added-rows what was assigned."""
        metadata = self.table_metadata
        self._lineage = metadata.format_version >= MIN_LINEAGE_VERSION  # each try: another engine may upgrade
        if not self._lineage:
            return numbered(super().snapshot_updates(), metadata)
        if metadata.next_row_id is None:
            raise ValidationException("format-version 3 table without next-row-id: cannot assign row ids")
        manifests = self.manifests()
        sequence_number = metadata.next_sequence_number()
        summary = self.snapshot_summary(self.snapshot_properties)
        location, output = self.new_manifest_list_output()
        parent_id = self.parent_snapshot_id
        with ManifestListWriterV3(
            output,
            self.snapshot_id,
            parent_id,
            sequence_number,
            metadata.next_row_id,
            self.compression,
        ) as writer:
            writer.add_manifests(manifests)
        snapshot = Snapshot(
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=parent_id,
            manifest_list=location,
            sequence_number=sequence_number,
            summary=summary,
            schema_id=metadata.current_schema_id,
            first_row_id=metadata.next_row_id,
            added_rows=writer.assigned_rows,
        )
        branch = self.target_branch
        if branch is None:
            return (AddSnapshotUpdate(snapshot=snapshot),), ()
        ref = SetSnapshotRefUpdate(
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=parent_id,
            ref_name=branch,
            type=SnapshotRefType.BRANCH,
        )
        head = metadata.refs[branch].snapshot_id if branch in metadata.refs else None
        return numbered(
            ((AddSnapshotUpdate(snapshot=snapshot), ref), (AssertRefSnapshotId(snapshot_id=head, ref=branch),)),
            metadata,
        )

    def build_partition_filters(self) -> None:
        """The replaced files' partitions, per spec, to skip manifests that cannot hold one: pyiceberg's
        own, except for NaN (its EqualTo(NaN) raises) and infinities (see _value_predicate)."""
        by_spec: dict[int, list[Record]] = {}
        for data_file in self.deleted_files:
            by_spec.setdefault(data_file.spec_id, []).append(data_file.partition)
        for spec_id, records in by_spec.items():
            names = [f.name for f in self.spec(spec_id).fields]
            if not names:
                self.partition_filters[spec_id] = AlwaysTrue()
                continue
            matches = [And(AlwaysTrue(), *(_value_predicate(n, r[i]) for i, n in enumerate(names))) for r in records]
            self.partition_filters[spec_id] = Or(self.partition_filters[spec_id], *matches)

    def _validate_no_new_deletes(self) -> None:
        """Raise ValidationException if the parent (the head this try commits on) does not descend
        from an attempt's base (base_history: every attempt, delete-file tiers too), or a position
        delete added after the base can apply to one of the data files it replaces."""
        metadata, parent_id = self.table_metadata, self.parent_snapshot_id
        for rewrite in self._rewrites:
            history = base_history(metadata, rewrite.base_snapshot_id, parent_id)
            if reason := _format_conflict(rewrite.added, metadata.format_version):
                raise ValidationException(reason)
            results = [f for f in rewrite.added if f.content == DataFileContent.DATA]
            if not (replaced := rewrite.replaced_data):
                continue
            added = _deletes_added_since(metadata, self.file_io, rewrite.base_snapshot_id, history)
            if reason := _delete_conflict(replaced, added, self._global_specs, results):
                raise ValidationException(reason)

    def _scan(self, snapshot_id: int | None) -> list[tuple[ManifestFile, ManifestContents, list[int]]]:
        """The snapshot's manifests, each with its cached contents and the positions of the files
        this try removes from it: the replaced files and the dangling deletes (see the class doc).
        Raises ValidationException if a replaced file is not live, or one replaced equality delete
        applies to a data file its attempt did not cover.

        Read: the manifests pyiceberg's partition evaluator admits (they may hold a replaced file,
        or a delete in its partition), the delete manifests of unpartitioned specs (global deletes),
        and, when a global delete is in question, the data manifests it can apply to (by their
        minimum sequence number)."""
        metadata = self.table_metadata
        snapshot = metadata.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
        manifests = snapshot_manifests(snapshot, self.file_io, metadata.format_version) if snapshot is not None else []
        evaluators = KeyDefaultDict(self.manifest_evaluator)
        read: dict[int, ManifestContents] = {}
        for i, manifest in enumerate(manifests):
            global_deletes = (
                manifest.content == ManifestContent.DELETES and manifest.partition_spec_id in self._global_specs
            )
            if global_deletes or evaluators[manifest.partition_spec_id](manifest):
                read[i] = self._contents(manifest)
        files = {f.path: f for contents in read.values() for f in _sequenced(contents)}
        replaced = {f.file_path for f in self.deleted_files}
        if missing := sorted(replaced - files.keys()):
            raise ValidationException(f"Missing required files to delete: {', '.join(missing)}")
        deletes = ApplyingDeletes(
            (f for f in files.values() if f.is_delete and f.path not in replaced), self._global_specs
        )
        replaced_data = [files[p] for p in replaced if not files[p].is_delete]
        candidates = {d.path: d for data in replaced_data for d in deletes.for_data_file(data)}
        # a global delete (candidate, or replaced equality delete) can apply to data files of any partition
        in_question = [
            *candidates.values(),
            *(files[p] for p in replaced if files[p].data_file.content == DataFileContent.EQUALITY_DELETES),
        ]
        upto = max(
            (
                f.data_sequence_number
                for f in in_question
                if len(f.data_file.partition) == 0 or f.data_file.spec_id in self._global_specs
            ),
            default=-1,
        )
        for i, manifest in enumerate(manifests):
            if i in read or manifest.content != ManifestContent.DATA or (manifest.min_sequence_number or 0) > upto:
                continue
            read[i] = self._contents(manifest)
            files.update((f.path, f) for f in _sequenced(read[i]))
        remaining = [f for f in files.values() if not f.is_delete and f.path not in replaced]
        results = [
            _Sequenced(f, self._data_sequence_numbers[f.file_path] or 0)
            for f in self.added_files
            if f.content == DataFileContent.DATA
        ]
        for rewrite in self._rewrites:
            sources = [files[f.file_path] for f in rewrite.replaced]
            if reason := _uncovered(sources, [*remaining, *results], rewrite.covered, self._global_specs):
                raise ValidationException(reason)
        dangling = _dangling(list(candidates.values()), remaining, results, self._global_specs)
        self._dangling = [d.data_file for d in dangling]
        removed = replaced | {d.path for d in dangling}
        return [
            (
                manifest,
                read.get(i, _UNREAD),
                [j for j, e in enumerate(read[i].entries) if file_key(e.data_file) in removed] if i in read else [],
            )
            for i, manifest in enumerate(manifests)
        ]

    def _contents(self, manifest: ManifestFile) -> ManifestContents:
        """A manifest's cached live entries; in a format-version-3 table with their data files'
        first_row_id as readers see it (manifest_io.with_first_row_ids), so that an entry written
        again keeps its rows' ids."""
        contents = manifest_contents(manifest, self.file_io)
        if not self._lineage:
            return contents
        return with_first_row_ids(contents, v3_field(manifest, MANIFEST_FIRST_ROW_ID))

    def _added_manifests(self) -> list[ManifestFile]:
        """The added files, one manifest per content and partition spec: data files with their data
        sequence numbers, delete files inheriting this snapshot's."""
        groups: dict[tuple[ManifestContent, int], list[DataFile]] = {}
        for data_file in self.added_files:
            content = ManifestContent.DATA if data_file.content == DataFileContent.DATA else ManifestContent.DELETES
            groups.setdefault((content, data_file.spec_id), []).append(data_file)
        manifests = []
        for (content, spec_id), data_files in groups.items():
            with self._new_writer(content, self.spec(spec_id)) as writer:
                for data_file in data_files:
                    writer.add_entry(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self.snapshot_id,
                            sequence_number=self._data_sequence_numbers[data_file.file_path]
                            if content == ManifestContent.DATA
                            else None,
                            file_sequence_number=None,
                            data_file=data_file,
                        )
                    )
            manifests.append(writer.to_manifest_file())
        return manifests

    def _restated_manifests(
        self, parts: list[tuple[ManifestContents, list[int]]], status: ManifestEntryStatus
    ) -> list[ManifestFile]:
        """The entries at the given positions restated with `status` (DELETED: this snapshot's id;
        EXISTING: their own), one manifest per source header (restatable) or per content and spec
        (the rest)."""
        deleted = status == ManifestEntryStatus.DELETED
        by_header: dict[str, list[tuple[ManifestContents, list[int]]]] = {}
        by_spec: dict[tuple[ManifestContent, int], list[ManifestEntry]] = {}
        for contents, positions in parts:
            if contents.restatable and not self._lineage:  # v3: entries carry first_row_id (_contents)
                by_header.setdefault(json.dumps(contents.header, sort_keys=True), []).append((contents, positions))
            else:
                for i in positions:
                    entry = contents.entries[i]
                    content = (
                        ManifestContent.DATA
                        if entry.data_file.content == DataFileContent.DATA
                        else ManifestContent.DELETES
                    )
                    by_spec.setdefault((content, entry.data_file.spec_id), []).append(entry)
        manifests = []
        for group in by_header.values():
            first, positions = group[0]
            spec = self.spec(first.entries[positions[0]].data_file.spec_id)
            output = self.new_manifest_output()
            schema = self._spec_schema(spec.spec_id)
            manifests.append(write_restated(output, group, status, self.snapshot_id, spec, schema))
        for (content, spec_id), entries in by_spec.items():
            with self._new_writer(content, self.spec(spec_id)) as writer:
                for entry in entries:
                    writer.add_entry(_restated(entry, status, self.snapshot_id if deleted else entry.snapshot_id))
            manifests.append(writer.to_manifest_file())
        return manifests

    def existing_manifests(self) -> list[ManifestFile]:
        """pyiceberg's logic on this try's scan: untouched manifests are kept as they are; one that
        held removed files is written again with the rest of its entries, EXISTING."""
        kept = []
        for manifest, contents, positions in self._scanned:
            if not positions:
                kept.append(manifest)
            elif remaining := sorted(set(range(len(contents.entries))) - set(positions)):
                kept.extend(self._restated_manifests([(contents, remaining)], ManifestEntryStatus.EXISTING))
        return kept

    def process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        props = self.table_metadata.properties
        if not property_as_bool(props, TableProperties.MANIFEST_MERGE_ENABLED, True):
            return manifests
        data = [m for m in manifests if m.content == ManifestContent.DATA]
        deletes = [m for m in manifests if m.content == ManifestContent.DELETES]
        merged = self.merge_manifests(
            data,
            target_size_bytes=property_as_int(
                props, TableProperties.MANIFEST_TARGET_SIZE_BYTES, TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT
            ),
            min_count_to_merge=property_as_int(
                props, TableProperties.MANIFEST_MIN_MERGE_COUNT, TableProperties.MANIFEST_MIN_MERGE_COUNT_DEFAULT
            ),
        )
        return merged + deletes

    def snapshot_summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        """Java's snapshot summary for a rewrite: what was added and removed (each file counted in
        its own spec's partition; dangling deletes among the removed), and the parent's totals
        carried forward."""
        metadata = self.table_metadata
        specs = metadata.specs()
        limit = property_as_int(
            metadata.properties,
            TableProperties.WRITE_PARTITION_SUMMARY_LIMIT,
            TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT,
        )
        collector = SnapshotSummaryCollector(partition_summary_limit=limit or 0)
        removed = [*self.deleted_files, *self._dangling]
        schemas = KeyDefaultDict(self._spec_schema)  # once per spec, not per file
        for data_file in self.added_files:
            collector.add_file(data_file, schemas[data_file.spec_id], specs[data_file.spec_id])
        for data_file in removed:
            collector.remove_file(data_file, schemas[data_file.spec_id], specs[data_file.spec_id])
        changes = collector.build()
        if dvs := [f for f in removed if is_deletion_vector(f)]:
            _count_deletion_vectors(changes, dvs)
        # Java counts the unpartitioned spec's one partition (path ""); pyiceberg's collector skips it
        files = [*self.added_files, *removed]
        if changed := len(collector.partition_metrics) + any(len(f.partition) == 0 for f in files):
            changes[CHANGED_PARTITION_COUNT_PROP] = str(changed)
        parent_id = self.parent_snapshot_id
        parent = metadata.snapshot_by_id(parent_id) if parent_id is not None else None
        # a parent without a summary (format version 1 allows it) states no totals to carry
        previous = None if parent is None else parent.summary if parent.summary is not None else {}
        totals = _carried_totals(previous, changes)
        return Summary(operation=self.operation, **changes, **totals, **snapshot_properties)


def _count_deletion_vectors(changes: dict[str, str], dvs: Sequence[DataFile]) -> None:
    """Removed deletion vectors as Java's SnapshotSummary counts them (pyiceberg 0.12's collector
    knows none): `removed-dvs`, not `removed-position-delete-files`, each of its blob's size (not
    its whole Puffin file's) in `removed-files-size`."""
    files = int(changes.get(REMOVED_POSITION_DELETE_FILES, 0)) - len(dvs)
    if files > 0:
        changes[REMOVED_POSITION_DELETE_FILES] = str(files)
    else:
        changes.pop(REMOVED_POSITION_DELETE_FILES, None)
    changes[REMOVED_DVS] = str(len(dvs))
    overcounted = sum(f.file_size_in_bytes - (v3_field(f, CONTENT_SIZE_IN_BYTES) or 0) for f in dvs)
    changes[REMOVED_FILE_SIZE] = str(max(0, int(changes.get(REMOVED_FILE_SIZE, 0)) - overcounted))


def _sequenced(contents: ManifestContents) -> list[_Sequenced]:
    return [_Sequenced(e.data_file, e.sequence_number or 0) for e in contents.entries]


def _dangling(
    candidates: Sequence[_Sequenced],
    remaining: Iterable[_Sequenced],
    results: Iterable[_Sequenced],
    global_specs: frozenset[int],
) -> list[_Sequenced]:
    """The candidate delete files that apply (ApplyingDeletes) to none of the remaining data files
    nor, for equality deletes, to the added ones (a position delete names paths the results lack)."""
    if not candidates:
        return []
    index = ApplyingDeletes(candidates, global_specs)
    applying: set[str] = set()
    for data in remaining:
        applying.update(d.data_file.file_path for d in index.for_data_file(data))
    for data in results:
        applying.update(
            d.data_file.file_path
            for d in index.for_data_file(data)
            if d.data_file.content == DataFileContent.EQUALITY_DELETES
        )
    return [d for d in candidates if d.path not in applying]


def _value_predicate(name: str, value: Any) -> BooleanExpression:
    """A predicate a manifest holding this partition value passes (it may pass others: it only prunes)."""
    if value is None:
        return IsNull(Reference(name))
    if isinstance(value, float) and math.isnan(value):
        return IsNaN(Reference(name))
    if isinstance(value, float) and math.isinf(value):
        # pyiceberg binds EqualTo(±inf) on a float (32-bit) field as beyond the type's range: AlwaysFalse
        return AlwaysTrue()
    return EqualTo(Reference(name), value)


def _restated(entry: ManifestEntry, status: ManifestEntryStatus, snapshot_id: int | None) -> ManifestEntry:
    """A new entry for `entry`'s file with another status (cached entries are never mutated)."""
    return ManifestEntry.from_args(
        status=status,
        snapshot_id=snapshot_id,
        sequence_number=entry.sequence_number,
        file_sequence_number=entry.file_sequence_number,
        data_file=entry.data_file,
    )


# total property, its added property, its removed property (as pyiceberg's update_snapshot_summaries)
_TOTALS = (
    (TOTAL_DATA_FILES, ADDED_DATA_FILES, DELETED_DATA_FILES),
    (TOTAL_DELETE_FILES, ADDED_DELETE_FILES, REMOVED_DELETE_FILES),
    (TOTAL_RECORDS, ADDED_RECORDS, DELETED_RECORDS),
    (TOTAL_FILE_SIZE, ADDED_FILE_SIZE, REMOVED_FILE_SIZE),
    (TOTAL_POSITION_DELETES, ADDED_POSITION_DELETES, REMOVED_POSITION_DELETES),
    (TOTAL_EQUALITY_DELETES, ADDED_EQUALITY_DELETES, REMOVED_EQUALITY_DELETES),
)


def _carried_totals(previous: Mapping[str, Any] | None, changes: Mapping[str, str]) -> dict[str, str]:
    """The parent's totals plus what was added, minus what was removed (`previous` None: there is
    no parent, totals start at 0). A total the parent does not state (another engine left it out,
    or the whole summary), or cannot be parsed, is left out too, as Java does."""
    totals = {}
    for total, added, removed in _TOTALS:
        before = "0" if previous is None else previous.get(total)
        try:
            value = int(before) + int(changes.get(added, 0)) - int(changes.get(removed, 0))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if value >= 0:
            totals[total] = str(value)
    return totals


def _commit_once(table: Table, attempts: Sequence[Attempt], live: dict[str, DataFile]) -> None:
    """One commit of every attempt (pyiceberg retries it on a concurrent commit, see _RewriteFiles),
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
            # _conflict rolled such attempts back; the base expired in between
            raise ValidationException(f"base snapshot {attempt.base_snapshot_id} of {attempt.attempt_id} is gone")
        rewrites.append(
            _Rewrite(
                base_snapshot_id=attempt.base_snapshot_id,
                data_sequence_number=None if base is None or metadata.format_version < 2 else base.sequence_number,
                replaced=replaced,
                added=added,
                covered=attempt.covered_files,
            )
        )
    txn = table.transaction()
    rewrite = _RewriteFiles(txn, table.io, rewrites, properties, snapshot_operation(attempts))
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
        committed = ledger.get(attempt.attempt_id)
        if committed is None or committed.status != Status.COMMITTED:
            raise
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
    removed = [
        e.data_file
        for m in snapshot.manifests(table.io)
        if m.content == ManifestContent.DELETES and m.added_snapshot_id == snapshot.snapshot_id
        for e in read_entries(m, table.io, discard_deleted=False)  # v3 schema: a DV keeps its data file
        if e.status == ManifestEntryStatus.DELETED and e.snapshot_id == snapshot.snapshot_id
    ]
    attempts = [a for i in ids if (a := attempt if i == attempt.attempt_id else peers.get(i) or ledger.get(i))]

    def owner(delete_file: DataFile) -> Attempt:
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

    return [d.file_path for d in removed if owner(d).attempt_id == attempt.attempt_id]


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
