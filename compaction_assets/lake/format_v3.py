"""Format-version-3 manifests and manifest lists: read with first_row_id inherited, written by
writers pyiceberg 0.12 lacks.

pyiceberg 0.12 has no public API for any of this: it reads manifests and manifest lists with the
format-version-2 schemas (the v3 fields are dropped on read), `write_manifest` / `write_manifest_list`
refuse format version 3, its snapshot producer leaves `added-rows` unset (the table's next-row-id
then becomes null), and TableMetadataV3.model_dump_json raises "Writing V3 is not yet supported"
(iceberg-python #1551). What the project needs of it is here, following the spec and what Iceberg
Java 1.10 writes (its ManifestListWriter.V3Writer, ManifestReader's first-row-id inheritance).
"""

from __future__ import annotations

import threading

from pyiceberg.avro.codecs import AVRO_CODEC_KEY, AvroCompressionCodec
from pyiceberg.avro.file import AvroFile, AvroOutputFile
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import (
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    PartitionFieldSummary,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import TableVersion
from pyiceberg.types import IntegerType, ListType, NestedField, StructType

from compaction_assets.iceberg_compat.manifest_writers import ManifestListWriterHooks, ManifestWriterHooks
from compaction_assets.iceberg_compat.metadata import inherit_from_manifest
from compaction_assets.lake.manifest_io import ManifestContents, entries_file
from compaction_assets.lake.v3_fields import (
    FIRST_ROW_ID,
    MANIFEST_FIRST_ROW_ID,
    MIN_LINEAGE_VERSION,
    V3_DATA_FILE_LENGTH,
    V3_MANIFEST_FILE_LENGTH,
    v3_field,
    with_v3_fields,
)

MANIFEST_LISTS_CACHED = 64


def with_first_row_ids(contents: ManifestContents, first_row_id: int | None) -> ManifestContents:
    """The manifest's live entries with each data file's first_row_id as readers see it: written in
    the entry, else inherited from the manifest's `first_row_id` (its manifest-list entry) plus the
    records of the live data files before it that inherit too (the spec's first-row-id inheritance,
    Java's ManifestReader). Files of a manifest with no first_row_id (written before the table was
    format version 3, not yet assigned one) keep null. The result is never restated from bytes
    (header None): an EXISTING or DELETED entry written again must carry its first_row_id, or it would
    be assigned new row ids."""
    if first_row_id is None:
        return contents
    key = ("first_row_ids", first_row_id)
    if (made := contents.derived.get(key)) is not None:
        return made
    entries = []
    next_row_id = first_row_id
    for entry in contents.entries:
        data_file = entry.data_file
        if data_file.content == DataFileContent.DATA and v3_field(data_file, FIRST_ROW_ID) is None:
            data_file = with_v3_fields(data_file, first_row_id=next_row_id)
            next_row_id += data_file.record_count
            entry = ManifestEntry.from_args(
                status=entry.status,
                snapshot_id=entry.snapshot_id,
                sequence_number=entry.sequence_number,
                file_sequence_number=entry.file_sequence_number,
                data_file=data_file,
            )
        entries.append(entry)
    made = contents.derived[key] = ManifestContents(tuple(entries), None, ())
    return made


def read_entries(manifest: ManifestFile, file_io: FileIO, discard_deleted: bool = True) -> list[ManifestEntry]:
    """pyiceberg's ManifestFile.fetch_manifest_entry with the format-version-3 entry schema, the
    live data files' first_row_id inherited from the manifest's (with_first_row_ids): what a merge
    of v3 manifests writes again (DELETED entries keep what they hold)."""
    with entries_file(manifest, file_io) as avro:
        entries = [
            inherit_from_manifest(e, manifest)
            for e in avro
            if not discard_deleted or e.status != ManifestEntryStatus.DELETED
        ]
    next_row_id = v3_field(manifest, MANIFEST_FIRST_ROW_ID)
    if next_row_id is None:
        return entries
    for entry in entries:  # read here, not cached: set in place
        data_file = entry.data_file
        live = entry.status != ManifestEntryStatus.DELETED
        if live and data_file.content == DataFileContent.DATA and v3_field(data_file, FIRST_ROW_ID) is None:
            entry.data_file = with_v3_fields(data_file, first_row_id=next_row_id)
            next_row_id += data_file.record_count
    return entries


_manifest_lists: dict[str, tuple[ManifestFile, ...]] = {}
_manifest_lists_lock = threading.Lock()


def read_manifest_list(io: FileIO, location: str) -> tuple[ManifestFile, ...]:
    """A manifest list's manifests read with the format-version-3 schema (first_row_id kept, at
    MANIFEST_FIRST_ROW_ID; older lists read it as null). Manifest lists are immutable: a few
    are kept per process."""
    with _manifest_lists_lock:
        if (cached := _manifest_lists.get(location)) is not None:
            return cached
    with AvroFile[ManifestFile](
        io.new_input(location),
        MANIFEST_LIST_FILE_SCHEMAS[3],
        read_types={-1: ManifestFile, 508: PartitionFieldSummary},
        read_enums={517: ManifestContent},
    ) as reader:
        manifests = tuple(reader)
    with _manifest_lists_lock:
        while len(_manifest_lists) >= MANIFEST_LISTS_CACHED:
            _manifest_lists.pop(next(iter(_manifest_lists)))
        _manifest_lists[location] = manifests
    return manifests


def snapshot_manifests(snapshot: Snapshot, io: FileIO, format_version: int) -> list[ManifestFile]:
    """The snapshot's manifests: pyiceberg's reading for format versions 1 and 2, with first_row_id
    (read_manifest_list) for a format-version-3 table."""
    if format_version < MIN_LINEAGE_VERSION:
        return snapshot.manifests(io)
    return list(read_manifest_list(io, snapshot.manifest_list))


class ManifestWriterV3(ManifestWriterHooks):
    """A format-version-3 manifest of data files or of delete files (deletion vectors keep the data
    file they reference and their blob's offset and size; data files their first_row_id, null for
    new files, which then inherit from the manifest-list entry). `equality_ids` is list<int> as the
    spec (and Java) has it: pyiceberg 0.12 declares list<long> (see delete_files)."""

    def __init__(
        self,
        spec: PartitionSpec,
        schema: Schema,
        output_file: OutputFile,
        snapshot_id: int,
        avro_compression: AvroCompressionCodec,
        content: ManifestContent = ManifestContent.DATA,
    ) -> None:
        super().__init__(spec, schema, output_file, snapshot_id, avro_compression)
        self._content = content

    def content(self) -> ManifestContent:
        return self._content

    @property
    def version(self) -> TableVersion:
        return 3

    @property
    def file_metadata(self) -> dict[str, str]:
        return {**super().file_metadata, "content": "deletes" if self._content == ManifestContent.DELETES else "data"}

    def entry_schema(self, format_version: TableVersion) -> Schema:
        schema = super().entry_schema(format_version)
        return Schema(*[int_equality_ids(f) if f.field_id == 2 else f for f in schema.fields])

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        schema = self.entry_schema(3)
        return AvroOutputFile[ManifestEntry](
            output_file=self.output_file,
            file_schema=schema,
            record_schema=schema,
            schema_name="manifest_entry",
            metadata=self.file_metadata,
        )

    def prepare_entry(self, entry: ManifestEntry) -> ManifestEntry:
        entry = super().prepare_entry(entry)
        if len(entry.data_file) >= V3_DATA_FILE_LENGTH:
            return entry
        return ManifestEntry.from_args(
            status=entry.status,
            snapshot_id=entry.snapshot_id,
            sequence_number=entry.sequence_number,
            file_sequence_number=entry.file_sequence_number,
            data_file=with_v3_fields(entry.data_file),
        )


class ManifestListWriterV3(ManifestListWriterHooks):
    """A format-version-3 manifest list. As the spec (and Java's V3Writer) has it, each data
    manifest without a first_row_id (one this snapshot wrote) is assigned the running next row id,
    which then advances by its added and existing rows; `assigned_rows` is the snapshot's
    `added-rows`, and the table's next-row-id advances by it."""

    def __init__(
        self,
        output_file: OutputFile,
        snapshot_id: int,
        parent_snapshot_id: int | None,
        sequence_number: int,
        first_row_id: int,
        compression: AvroCompressionCodec,
    ) -> None:
        super().__init__(
            format_version=3,
            output_file=output_file,
            meta={
                "snapshot-id": str(snapshot_id),
                "parent-snapshot-id": str(parent_snapshot_id) if parent_snapshot_id is not None else "null",
                "sequence-number": str(sequence_number),
                "first-row-id": str(first_row_id),
                "format-version": "3",
                AVRO_CODEC_KEY: compression,
            },
        )
        self._snapshot_id = snapshot_id
        self._sequence_number = sequence_number
        self._first_row_id = first_row_id
        self._next_row_id = first_row_id

    @property
    def assigned_rows(self) -> int:
        return self._next_row_id - self._first_row_id

    def avro_writer(self, output_file: OutputFile, metadata: dict[str, str]) -> AvroOutputFile[ManifestFile]:
        """Records in the v3 layout too: first_row_id is written, not only declared."""
        return AvroOutputFile[ManifestFile](
            output_file=output_file,
            record_schema=MANIFEST_LIST_FILE_SCHEMAS[3],
            file_schema=MANIFEST_LIST_FILE_SCHEMAS[3],
            schema_name="manifest_file",
            metadata=metadata,
        )

    def prepare_manifest(self, manifest_file: ManifestFile) -> ManifestFile:
        values = [manifest_file[i] for i in range(len(manifest_file))]
        values += [None] * (V3_MANIFEST_FILE_LENGTH - len(values))
        manifest = ManifestFile(*values)
        for unassigned in (manifest.sequence_number, manifest.min_sequence_number):
            if unassigned == UNASSIGNED_SEQ and manifest.added_snapshot_id != self._snapshot_id:
                raise ValueError(
                    f"Found unassigned sequence number for a manifest from snapshot: {manifest.added_snapshot_id}"
                )
        if manifest.sequence_number == UNASSIGNED_SEQ:
            manifest.sequence_number = self._sequence_number
        if manifest.min_sequence_number == UNASSIGNED_SEQ:
            manifest.min_sequence_number = self._sequence_number
        if manifest.content == ManifestContent.DATA and values[MANIFEST_FIRST_ROW_ID] is None:
            manifest[MANIFEST_FIRST_ROW_ID] = self._next_row_id
            self._next_row_id += (manifest.added_rows_count or 0) + (manifest.existing_rows_count or 0)
        return manifest


def int_equality_ids(data_file: NestedField) -> NestedField:
    """The manifest entry's data_file field with `equality_ids` as list<int> (field 136), as the spec
    says: pyiceberg 0.12 declares list<long>, which readers following the spec cannot narrow."""
    assert isinstance(data_file.field_type, StructType)
    fields = [
        NestedField(135, f.name, ListType(136, IntegerType(), element_required=True), required=False, doc=f.doc)
        if f.field_id == 135
        else f
        for f in data_file.field_type.fields
    ]
    return NestedField(data_file.field_id, data_file.name, StructType(*fields), required=data_file.required)
