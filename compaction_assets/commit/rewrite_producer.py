"""The snapshot a commit makes: Iceberg RewriteFiles semantics on pyiceberg's overwrite producer.

`RewriteFiles` (see its docstring) builds the `replace` snapshot of one or more attempts (a data
expiration's `delete` or `overwrite`), validating the conflict rules (commit/conflicts.py) against
the head of every commit try, removing the deletes the swap leaves dangling, writing manifests
with the attempts' data sequence numbers and format-version-3 row lineage, and the snapshot
summary Java writes. pyiceberg's private hooks are reached through iceberg_compat.producers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from pyiceberg.exceptions import ValidationException
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
from pyiceberg.table import TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadataV3
from pyiceberg.table.snapshots import (
    Operation,
    Summary,
)
from pyiceberg.table.update import (
    UpdatesAndRequirements,
)
from pyiceberg.typedef import EMPTY_DICT, KeyDefaultDict, Record
from pyiceberg.utils.concurrent import ExecutorFactory
from pyiceberg.utils.properties import property_as_bool

from compaction_assets.commit.conflicts import (
    Rewrite,
    Sequenced,
    base_history,
    dangling,
    delete_conflict,
    deletes_added_since,
    format_conflict,
    sequenced,
    uncovered,
)
from compaction_assets.commit.numbering import numbered
from compaction_assets.commit.rewrite_summary import rewrite_summary
from compaction_assets.commit.snapshot_v3 import v3_snapshot_updates
from compaction_assets.iceberg_compat.producers import OverwriteProducer
from compaction_assets.lake.delete_files import _DeleteManifestWriter
from compaction_assets.lake.deletes import (
    ApplyingDeletes,
    file_key,
    global_spec_ids,
)
from compaction_assets.lake.format_v3 import (
    ManifestWriterV3,
    read_entries,
    snapshot_manifests,
    with_first_row_ids,
)
from compaction_assets.lake.manifest_cache import manifest_contents
from compaction_assets.lake.manifest_io import ManifestContents, partition_schema, restated, write_restated
from compaction_assets.lake.properties import int_property
from compaction_assets.lake.v3_fields import MANIFEST_FIRST_ROW_ID, MIN_LINEAGE_VERSION, v3_field

_UNREAD = ManifestContents((), None, ())


class RewriteFiles(OverwriteProducer):
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
    did not cover (uncovered). Rows appended concurrently are no conflict (pyiceberg's own
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
    does): manifests are written by format_v3.ManifestWriterV3, entries written again (restated,
    merged) carry their data files' first_row_id as readers inherit it, so rows keep their ids; the
    manifest list (format_v3.ManifestListWriterV3) assigns new row ids to the data manifests this
    snapshot wrote, and the snapshot records first-row-id and added-rows (snapshot_updates). A deletion vector
    is one blob of a Puffin file many share: removed by its key (lake.deletes.file_key), dangling once
    its data file is replaced, counted as Java does (`removed-dvs`). Results must hold row lineage
    (format_conflict: a table upgraded after the plan makes the attempt back off).
    """

    def __init__(
        self,
        transaction: Transaction,
        io: FileIO,
        rewrites: Sequence[Rewrite],
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
        format version 3: format_v3.ManifestWriterV3 (pyiceberg 0.12 writes no v3 manifest)."""
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
        schema and first_row_id inherited (format_v3.read_entries), else the merged entries would
        lose their rows' ids (pyiceberg 0.12 reads the v2 schema)."""
        if self._lineage:
            return read_entries(manifest, self.file_io, discard_deleted)
        return super().fetch_manifest_entry(manifest, discard_deleted)

    def snapshot_updates(self) -> UpdatesAndRequirements:
        """pyiceberg 0.12's snapshot producer's, but for format version 3 (which it cannot
        write: no v3 manifest list, and the snapshot's `added-rows` left unset): the manifest list
        assigns first_row_id to the data manifests this snapshot wrote (format_v3.ManifestListWriterV3),
        the snapshot's first-row-id is the table's next-row-id and its added-rows what was assigned."""
        metadata = self.table_metadata
        self._lineage = metadata.format_version >= MIN_LINEAGE_VERSION  # each try: another engine may upgrade
        if not self._lineage:
            return numbered(super().snapshot_updates(), metadata)
        if not isinstance(metadata, TableMetadataV3):  # what pyiceberg parses format version 3 into
            raise ValidationException(
                f"format-version {metadata.format_version} table metadata read as {type(metadata).__name__}: "
                "cannot assign row ids"
            )
        if metadata.next_row_id is None:
            raise ValidationException("format-version 3 table without next-row-id: cannot assign row ids")
        return v3_snapshot_updates(self, metadata, self.manifests(), self.snapshot_summary(self.snapshot_properties))

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
            if reason := format_conflict(rewrite.added, metadata.format_version):
                raise ValidationException(reason)
            results = [f for f in rewrite.added if f.content == DataFileContent.DATA]
            if not (replaced := rewrite.replaced_data):
                continue
            added = deletes_added_since(metadata, self.file_io, rewrite.base_snapshot_id, history)
            if reason := delete_conflict(replaced, added, self._global_specs, results):
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
        manifests = self._snapshot_manifests(snapshot_id)
        read = self._read_admitted(manifests)
        files = {f.path: f for contents in read.values() for f in sequenced(contents)}
        replaced = {f.file_path for f in self.deleted_files}
        if missing := sorted(replaced - files.keys()):
            raise ValidationException(f"Missing required files to delete: {', '.join(missing)}")
        candidates = self._dangling_candidates(files, replaced)
        upto = self._global_upto(list(candidates.values()), files, replaced)
        self._read_data_upto(manifests, read, files, upto)
        remaining = [f for f in files.values() if not f.is_delete and f.path not in replaced]
        results = self._added_results()
        self._validate_covered(files, [*remaining, *results])
        left = dangling(list(candidates.values()), remaining, results, self._global_specs)
        self._dangling = [d.data_file for d in left]
        removed = replaced | {d.path for d in left}
        return [
            (manifest, read.get(i, _UNREAD), _removed_positions(read, i, removed))
            for i, manifest in enumerate(manifests)
        ]

    def _snapshot_manifests(self, snapshot_id: int | None) -> list[ManifestFile]:
        """Which manifests the snapshot has (none when there is no snapshot)."""
        metadata = self.table_metadata
        snapshot = metadata.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
        return snapshot_manifests(snapshot, self.file_io, metadata.format_version) if snapshot is not None else []

    def _dangling_candidates(self, files: dict[str, Sequenced], replaced: set[str]) -> dict[str, Sequenced]:
        """Which live deletes (not replaced themselves) apply to a replaced data file, by path."""
        deletes = ApplyingDeletes(
            (f for f in files.values() if f.is_delete and f.path not in replaced), self._global_specs
        )
        replaced_data = [files[p] for p in replaced if not files[p].is_delete]
        return {d.path: d for data in replaced_data for d in deletes.for_data_file(data)}

    def _read_admitted(self, manifests: list[ManifestFile]) -> dict[int, ManifestContents]:
        """Which manifests to read first: the global delete manifests and those the partition evaluator admits."""
        evaluators = KeyDefaultDict(self.manifest_evaluator)
        read: dict[int, ManifestContents] = {}
        for i, manifest in enumerate(manifests):
            global_deletes = (
                manifest.content == ManifestContent.DELETES and manifest.partition_spec_id in self._global_specs
            )
            if global_deletes or evaluators[manifest.partition_spec_id](manifest):
                read[i] = self._contents(manifest)
        return read

    def _global_upto(self, candidates: list[Sequenced], files: dict[str, Sequenced], replaced: set[str]) -> int:
        """The highest data sequence number of a global delete in question (-1 when there is none)."""
        # a global delete (candidate, or replaced equality delete) can apply to data files of any partition
        in_question = [
            *candidates,
            *(files[p] for p in replaced if files[p].data_file.content == DataFileContent.EQUALITY_DELETES),
        ]
        return max(
            (
                f.data_sequence_number
                for f in in_question
                if len(f.data_file.partition) == 0 or f.data_file.spec_id in self._global_specs
            ),
            default=-1,
        )

    def _read_data_upto(
        self, manifests: list[ManifestFile], read: dict[int, ManifestContents], files: dict[str, Sequenced], upto: int
    ) -> None:
        """Which unread data manifests a global delete up to `upto` can apply to; reads them into `read` and `files`."""
        for i, manifest in enumerate(manifests):
            if i in read or manifest.content != ManifestContent.DATA or (manifest.min_sequence_number or 0) > upto:
                continue
            read[i] = self._contents(manifest)
            files.update((f.path, f) for f in sequenced(read[i]))

    def _added_results(self) -> list[Sequenced]:
        """The added data files, with the data sequence numbers they are committed with."""
        return [
            Sequenced(f, self._data_sequence_numbers[f.file_path] or 0)
            for f in self.added_files
            if f.content == DataFileContent.DATA
        ]

    def _validate_covered(self, files: dict[str, Sequenced], kept: list[Sequenced]) -> None:
        """Whether every attempt covered the data files its replaced equality deletes apply to; raises if not."""
        for rewrite in self._rewrites:
            sources = [files[f.file_path] for f in rewrite.replaced]
            if reason := uncovered(sources, kept, rewrite.covered, self._global_specs):
                raise ValidationException(reason)

    def _contents(self, manifest: ManifestFile) -> ManifestContents:
        """A manifest's cached live entries; in a format-version-3 table with their data files'
        first_row_id as readers see it (format_v3.with_first_row_ids), so that an entry written
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
                    writer.add_entry(restated(entry, status, self.snapshot_id if deleted else entry.snapshot_id))
            manifests.append(writer.to_manifest_file())
        return manifests

    def snapshot_summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        """Java's snapshot summary for a rewrite (rewrite_summary.rewrite_summary); dangling deletes
        among the removed files."""
        removed = [*self.deleted_files, *self._dangling]
        return rewrite_summary(
            self.table_metadata,
            self.added_files,
            removed,
            self.parent_snapshot_id,
            self.operation,
            self._spec_schema,
            snapshot_properties,
        )

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
            target_size_bytes=int_property(
                props, TableProperties.MANIFEST_TARGET_SIZE_BYTES, TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT
            ),
            min_count_to_merge=int_property(
                props, TableProperties.MANIFEST_MIN_MERGE_COUNT, TableProperties.MANIFEST_MIN_MERGE_COUNT_DEFAULT
            ),
        )
        return merged + deletes


def _removed_positions(read: dict[int, ManifestContents], i: int, removed: set[str]) -> list[int]:
    """Which entries of manifest `i` this try removes (none when it was not read)."""
    if i not in read:
        return []
    return [j for j, e in enumerate(read[i].entries) if file_key(e.data_file) in removed]


def _value_predicate(name: str, value: Any) -> BooleanExpression:
    """A predicate a manifest holding this partition value passes (it may pass others: it only prunes)."""
    if value is None:
        return IsNull(term=Reference(name))
    if isinstance(value, float) and math.isnan(value):
        return IsNaN(term=Reference(name))
    if isinstance(value, float) and math.isinf(value):
        # pyiceberg binds EqualTo(±inf) on a float (32-bit) field as beyond the type's range: AlwaysFalse
        return AlwaysTrue()
    return EqualTo(term=Reference(name), value=value)
