"""When an attempt cannot commit on the table's head: the commit's conflict rules, pure functions
of the table's metadata (what Java's MergingSnapshotProducer validates for a RewriteFiles).

Every attempt commits only on a head that descends from its base snapshot (base_history). A data
rewrite also gives way when a source is no longer live, when a position delete added since its
base can apply to a source, or when rows move between partitions under an equality delete added
since (delete_conflict); a replaced equality delete must apply to no live data file the attempt did
not cover (uncovered); results must suit the table's format version (format_conflict). The
producer (rewrite_producer) runs the same rules on every commit try, and decides which deletes the
swap leaves dangling (dangling); the orchestrator (two_phase) runs them before each try.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.exceptions import ValidationException
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntryStatus,
)
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import (
    ADDED_DELETE_FILES,
    Operation,
    Snapshot,
)

from compaction_assets.commit.ledger import Attempt
from compaction_assets.lake.datafile_codec import datafile_from_json
from compaction_assets.lake.deletes import (
    ApplyingDeletes,
    DeleteIndex,
    SequencedFile,
    file_key,
)
from compaction_assets.lake.files import LiveFile
from compaction_assets.lake.manifest_cache import live_entries
from compaction_assets.lake.manifest_io import ManifestContents
from compaction_assets.lake.partition_key import partition_id
from compaction_assets.lake.v3_fields import MIN_LINEAGE_VERSION, holds_row_lineage


def conflict(
    attempt: Attempt,
    live: dict[str, LiveFile],
    history: Mapping[int | None, list[Snapshot]],
    added_since: Mapping[int | None, list[DataFile]],
    global_specs: frozenset[int],
    format_version: int = 2,
) -> str | None:
    """Why the attempt cannot commit on the current head (of a table of `format_version`), or None."""
    written = [datafile_from_json(d) for d in attempt.result_files]
    if reason := format_conflict(written, format_version):
        return reason
    results = [f for f in written if f.content == DataFileContent.DATA]
    if reason := _sources_gone(attempt, live):
        return reason
    try:
        history[attempt.base_snapshot_id]  # every kind: the head must descend from the base (base_history)
    except ValidationException as exc:
        return str(exc)
    replaced = [live[p] for p in attempt.source_files]
    if reason := _deletes_since_base(attempt, replaced, added_since, global_specs, results):
        return reason
    data_files = [f for f in live.values() if not f.is_delete]
    return uncovered(replaced, data_files, attempt.covered_files, global_specs)


def _sources_gone(attempt: Attempt, live: dict[str, LiveFile]) -> str | None:
    """Whether some of the attempt's source files are no longer live, described; else None."""
    missing = [p for p in attempt.source_files if p not in live]
    if missing:
        return (
            f"{len(missing)} of {len(attempt.source_files)} source file(s) are no longer live "
            f"(e.g. {missing[0]}): a concurrent change replaced them"
        )
    return None


def _deletes_since_base(
    attempt: Attempt,
    replaced: Sequence[LiveFile],
    added_since: Mapping[int | None, list[DataFile]],
    global_specs: frozenset[int],
    results: Sequence[DataFile],
) -> str | None:
    """Whether a delete added since the base conflicts with replacing the data files (delete_conflict); else None."""
    if data := [f.data_file for f in replaced if not f.is_delete]:
        try:
            added = added_since[attempt.base_snapshot_id]
        except ValidationException as exc:
            return str(exc)
        if reason := delete_conflict(data, added, global_specs, results):
            return reason
    return None


def format_conflict(results: Sequence[DataFile], format_version: int) -> str | None:
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


def deletes_added_since(
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


def delete_conflict(
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
    if reason := _position_delete_conflict(replaced, added_deletes, global_specs):
        return reason
    if not results:
        return None
    if _results_stay_in_partitions(replaced, results):
        return None
    return _equality_delete_conflict(replaced, added_deletes, global_specs, results)


def _position_delete_conflict(
    replaced: Sequence[DataFile], added_deletes: Sequence[DataFile], global_specs: frozenset[int]
) -> str | None:
    """Whether an added position delete can apply to a replaced file, described; else None."""
    index = DeleteIndex((d for d in added_deletes if d.content == DataFileContent.POSITION_DELETES), global_specs)
    for data_file in replaced if index else ():
        if applying := index.for_data_file(data_file):
            return (
                f"position delete file {applying[0].file_path}, added after the base snapshot, can apply to "
                f"source {data_file.file_path}: rewriting it would bring deleted rows back"
            )
    return None


def _results_stay_in_partitions(replaced: Sequence[DataFile], results: Sequence[DataFile]) -> bool:
    """Whether every result's partition is one a source is in (no rows move between partitions)."""
    outside = {partition_id(f.spec_id, f.partition) for f in results}  # results' partitions no source is in
    for data_file in replaced:  # a group's sources share a partition: this stops at the first
        outside.discard(partition_id(data_file.spec_id, data_file.partition))
        if not outside:
            return True
    return False


def _equality_delete_conflict(
    replaced: Sequence[DataFile],
    added_deletes: Sequence[DataFile],
    global_specs: frozenset[int],
    results: Sequence[DataFile],
) -> str | None:
    """Whether an added partition-scoped equality delete applies to a source or result of a rewrite
    that moves rows between partitions, described; else None."""
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


def uncovered(
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
class Sequenced:
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


def sequenced(contents: ManifestContents) -> list[Sequenced]:
    return [Sequenced(e.data_file, e.sequence_number or 0) for e in contents.entries]


def dangling(
    candidates: Sequence[Sequenced],
    remaining: Iterable[Sequenced],
    results: Iterable[Sequenced],
    global_specs: frozenset[int],
) -> list[Sequenced]:
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


@dataclass(frozen=True)
class Rewrite:
    """One attempt's part of a commit: files replaced, files added (data or delete files), the base
    it was planned on, and the data files it covered (see uncovered)."""

    base_snapshot_id: int | None
    data_sequence_number: int | None  # the base's; None in a format-version-1 table (no sequence numbers)
    replaced: list[DataFile]
    added: list[DataFile]
    covered: list[str] | None = None

    @property
    def replaced_data(self) -> list[DataFile]:
        return [f for f in self.replaced if f.content == DataFileContent.DATA]
