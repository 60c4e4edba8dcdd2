"""Reading a manifest's live entries, and restating them without encoding them again.

A compaction restates the entries of the manifests it touches: DELETED for the files it replaces,
EXISTING for the files kept beside them in a manifest it has to rewrite. pyiceberg encodes
entries with a pure-Python Avro encoder, one block per entry: 5,000 entries take ~0.3 s, most of
a small-file compaction's commit. Yet a restated entry differs from the one read only in its four
leading fields (status, snapshot id, sequence numbers); its data_file record, nearly all of its
bytes, is unchanged. So reading keeps each live entry's data_file bytes as they are in the file,
and restating encodes the four fields and copies those bytes behind them, into a file that
carries the source manifest's own header (Avro schema, Iceberg metadata, codec): the copied bytes
decode under the schema that wrote them, whichever engine wrote it.

Only manifests whose entries have the format-version-2 layout, data or delete manifests, are
restated this way (`ManifestContents.header` is None otherwise); the others go through a writer.

Format version 3 (row lineage, deletion vectors) lives here too, below: pyiceberg 0.12 reads
manifests and manifest lists with the format-version-2 schemas (dropping `first_row_id`,
`referenced_data_file`, `content_offset`, `content_size_in_bytes`), has no v3 manifest or
manifest-list writer, and refuses to serialise v3 table metadata; no public API of it does any of
this, so the project's readers and writers for v3 are here.
"""

from __future__ import annotations

import functools
import io
import json
import os
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.avro.codecs import AVRO_CODEC_KEY, AvroCompressionCodec
from pyiceberg.avro.codecs.deflate import DeflateCodec
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.encoder import BinaryEncoder
from pyiceberg.avro.file import MAGIC, META_SCHEMA, SYNC_SIZE, AvroFile, AvroFileHeader, AvroOutputFile
from pyiceberg.avro.resolver import construct_writer
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import (
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    PartitionFieldSummary,
    construct_partition_summaries,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, TableMetadataV3
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import IcebergBaseModel, TableVersion
from pyiceberg.types import IntegerType, ListType, NestedField, StructType

from compaction_assets.iceberg_compat.manifest_writers import ManifestListWriterHooks, ManifestWriterHooks
from compaction_assets.iceberg_compat.metadata import inherit_from_manifest, record_values, schema_field_ids

# The manifest_entry fields before data_file, as format version 2 writes them
_V2_LEADING_FIELDS = [
    ("status", "int"),
    ("snapshot_id", ["null", "long"]),
    ("sequence_number", ["null", "long"]),
    ("file_sequence_number", ["null", "long"]),
]
_INFORMATIONAL_KEYS = ("schema", "schema-id")  # header keys that do not change how entries decode
BLOCK_BYTES = 1024 * 1024  # uncompressed bytes per Avro block written


@dataclass(frozen=True)
class ManifestContents:
    """A manifest's live (not DELETED) entries, sequence numbers inherited as pyiceberg does.

    `header` is the file's Avro metadata and `data_file_bytes[i]` the encoded data_file record of
    `entries[i]`, when the file has the format-version-2 entry layout; else None and ().
    """

    entries: tuple[ManifestEntry, ...]
    header: dict[str, str] | None
    data_file_bytes: tuple[bytes, ...]
    # what readers derive from the entries, kept with them (lake.files: LiveFiles per context)
    derived: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def restatable(self) -> bool:
        return self.header is not None


def _entries_file(manifest: ManifestFile, file_io: FileIO) -> AvroFile[ManifestEntry]:
    """The manifest opened with the format-version-3 entry schema (a superset: older manifests read
    its new fields as null)."""
    return AvroFile[ManifestEntry](
        file_io.new_input(manifest.manifest_path),
        MANIFEST_ENTRY_SCHEMAS[3],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    )


def read_manifest(manifest: ManifestFile, file_io: FileIO) -> ManifestContents:
    """Decode every entry with pyiceberg's reader, keeping the bytes of each live data_file.
    Read with the format-version-3 entry schema (a superset: older manifests read its new fields as
    null), so deletion vectors keep the data file they reference and their blob's offset and size,
    and data files their first_row_id (see `v3_field`)."""
    with _entries_file(manifest, file_io) as avro:
        restatable = _has_v2_layout(avro.header.meta)
        entries: list[ManifestEntry] = []
        tails: list[bytes] = []
        for count, block in _blocks(avro):
            decoder = new_decoder(block)
            for _ in range(count):
                start = decoder.tell()
                entry: ManifestEntry = avro.reader.read(decoder)
                if entry.status == ManifestEntryStatus.DELETED:
                    continue
                if restatable:
                    tails.append(block[start + _leading_length(entry) : decoder.tell()])
                entries.append(inherit_from_manifest(entry, manifest))
    if not restatable:
        return ManifestContents(tuple(entries), None, ())
    return ManifestContents(tuple(entries), dict(avro.header.meta), tuple(tails))


def write_restated(
    output: OutputFile,
    parts: Sequence[tuple[ManifestContents, Sequence[int]]],
    status: ManifestEntryStatus,
    snapshot_id: int,
    spec: PartitionSpec,
    schema: Schema,
) -> ManifestFile:
    """Write the entries at the given positions of each part's manifest with a new status, into
    one manifest of snapshot `snapshot_id`. The parts' headers may differ only in the table schema
    they record (informational: the entries' Avro schema is the same); the newest one is written.

    DELETED entries get `snapshot_id`, EXISTING ones keep their own; sequence numbers are kept,
    written out.
    Returns its manifest-list entry (content as the header says), counted as pyiceberg's
    ManifestWriter counts.
    """
    headers = [contents.header for contents, _ in parts]
    if any(h is None for h in headers) or len({layout_key(h) for h in headers if h is not None}) != 1:
        raise ValueError("restated entries must come from restatable manifests with one entry layout")
    first = newest_header([h for h in headers if h is not None])
    deleted = status == ManifestEntryStatus.DELETED
    sync = os.urandom(SYNC_SIZE)
    out = io.BytesIO()
    encoder = BinaryEncoder(out)
    header = AvroFileHeader(MAGIC, dict(first), sync)
    construct_writer(META_SCHEMA).write(encoder, header)
    codec = header.compression_codec()
    block = io.BytesIO()
    in_block = files = rows = 0
    sequence_numbers: list[int] = []  # of EXISTING entries, as pyiceberg's writer takes the minimum
    partitions = []

    def flush() -> None:
        nonlocal in_block
        content = block.getvalue()
        if codec is DeflateCodec:
            content = _deflate_fast(content)
        elif codec:
            content, _ = codec.compress(content)
        encoder.write_int(in_block)
        encoder.write_bytes(content)
        encoder.write(sync)
        block.seek(0)
        block.truncate()
        in_block = 0

    for contents, positions in parts:
        for i in positions:
            entry = contents.entries[i]
            owner = snapshot_id if deleted else entry.snapshot_id
            block.write(_leading_bytes(status.value, owner, entry.sequence_number, entry.file_sequence_number))
            block.write(contents.data_file_bytes[i])
            in_block += 1
            files += 1
            rows += entry.data_file.record_count
            partitions.append(entry.data_file.partition)
            if not deleted and entry.sequence_number is not None:
                sequence_numbers.append(entry.sequence_number)
            if block.tell() >= BLOCK_BYTES:
                flush()
    if in_block:
        flush()
    data = out.getvalue()
    with output.create(overwrite=True) as stream:
        stream.write(data)
    return ManifestFile.from_args(
        manifest_path=output.location,
        manifest_length=len(data),
        partition_spec_id=spec.spec_id,
        content=ManifestContent.DELETES if first.get("content") == "deletes" else ManifestContent.DATA,
        sequence_number=UNASSIGNED_SEQ,
        min_sequence_number=min(sequence_numbers, default=UNASSIGNED_SEQ),
        added_snapshot_id=snapshot_id,
        added_files_count=0,
        existing_files_count=0 if deleted else files,
        deleted_files_count=files if deleted else 0,
        added_rows_count=0,
        existing_rows_count=0 if deleted else rows,
        deleted_rows_count=rows if deleted else 0,
        partitions=construct_partition_summaries(spec, schema, partitions),
        key_metadata=None,
    )


def _deflate_fast(data: bytes) -> bytes:
    """A raw deflate stream (the Avro `deflate` codec) at level 1: pyiceberg's codec compresses at
    zlib's default level 6, which took 0.024 s of CPU for a 5,000-entry manifest (1.55 MB) against
    0.009 s at level 1, for a file 11 % larger (430 KB vs 388 KB); readers decompress both alike."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


def partition_schema(metadata: TableMetadata, spec_id: int) -> Schema:
    """The schema to type spec `spec_id`'s partition with: the current one, unless another engine
    dropped a source column of this (older) spec; then the newest schema that has them all.
    pyiceberg 0.12 types such a partition field `unknown`, which no predicate binds to and no
    manifest writer can write. (Each call reads the metadata's schemas: ask once per spec.)"""
    sources = {f.source_id for f in metadata.specs()[spec_id].fields}
    for schema in [metadata.schema(), *sorted(metadata.schemas, key=lambda s: -s.schema_id)]:
        if sources <= schema_field_ids(schema):
            return schema
    return metadata.schema()


def layout_key(header: dict[str, str]) -> str:
    """A manifest header without the table schema it records (`schema`, `schema-id`: informational,
    as Java writes a rewritten manifest with the current schema): headers with one key hold entries
    of one Avro schema, content and partition spec, so their entries' bytes can share a file."""
    return json.dumps({k: v for k, v in header.items() if k not in _INFORMATIONAL_KEYS}, sort_keys=True)


def newest_header(headers: Sequence[dict[str, str]]) -> dict[str, str]:
    """Of headers with one layout_key, the one recording the newest table schema."""
    return max(headers, key=lambda h: int(h["schema-id"]) if h.get("schema-id", "").isdigit() else -1)


def _has_v2_layout(meta: dict[str, str]) -> bool:
    if meta.get("format-version") != "2" or meta.get("content", "data") not in ("data", "deletes"):
        return False
    try:
        fields = json.loads(meta["avro.schema"])["fields"]
    except (KeyError, TypeError, ValueError):
        return False
    leading = [(f.get("name"), f.get("type")) for f in fields[: len(_V2_LEADING_FIELDS)]]
    return leading == _V2_LEADING_FIELDS and len(fields) == 5 and fields[4].get("name") == "data_file"


def _blocks(avro: AvroFile) -> Iterator[tuple[int, bytes]]:
    """(record count, decompressed bytes) of each block after the header (pyiceberg's framing)."""
    decoder, codec = avro.decoder, avro.header.compression_codec()
    first = True
    while True:
        if not first and decoder.read(SYNC_SIZE) != avro.header.sync:
            raise ValueError("manifest is corrupt: a block does not end with the file's sync marker")
        first = False
        try:
            count = decoder.read_int()
        except EOFError:
            return
        data = decoder.read_bytes()
        yield count, codec.decompress(data) if codec else data


def _leading_length(entry: ManifestEntry) -> int:
    """Bytes of the four leading fields as read (before any inheritance fills the nulls in)."""
    return len(_leading_bytes(int(entry.status), entry.snapshot_id, entry.sequence_number, entry.file_sequence_number))


@functools.lru_cache(maxsize=4096)
def _leading_bytes(status: int, snapshot_id: int | None, sequence: int | None, file_sequence: int | None) -> bytes:
    """The four leading fields encoded. A manifest's entries share a few such tuples (a restatement's
    DELETED entries all carry one snapshot id): encoding them once each, not once per entry, took
    restating 5,000 entries from 0.027 s to 0.017 s (the rest: deflate, 0.009 s)."""
    out = io.BytesIO()
    encoder = BinaryEncoder(out)
    encoder.write_int(status)
    for value in (snapshot_id, sequence, file_sequence):
        if value is None:
            encoder.write_int(0)
        else:
            encoder.write_int(1)
            encoder.write_int(value)
    return out.getvalue()


# Format version 3: row lineage and deletion vectors.
#
# pyiceberg 0.12 has no public API for any of this: it reads manifests and manifest lists with the
# format-version-2 schemas (the v3 fields are dropped on read), `write_manifest` / `write_manifest_list`
# refuse format version 3, its snapshot producer leaves `added-rows` unset (the table's next-row-id
# then becomes null), and TableMetadataV3.model_dump_json raises "Writing V3 is not yet supported"
# (iceberg-python #1551). What the project needs of it is here, following the spec and what Iceberg
# Java 1.10 writes (its ManifestListWriter.V3Writer, ManifestReader's first-row-id inheritance).

MIN_LINEAGE_VERSION = 3
ROW_ID_FIELD_ID = 2147483540  # the row-lineage metadata columns' reserved field ids
LAST_UPDATED_FIELD_ID = 2147483539
# positions of the format-version-3 fields in a DataFile record (pyiceberg's DATA_FILE_TYPE[3])
FIRST_ROW_ID, REFERENCED_DATA_FILE, CONTENT_OFFSET, CONTENT_SIZE_IN_BYTES = 16, 17, 18, 19
_V3_DATA_FILE_LENGTH = 20
_V3_FIELD_POSITIONS = {
    "first_row_id": FIRST_ROW_ID,
    "referenced_data_file": REFERENCED_DATA_FILE,
    "content_offset": CONTENT_OFFSET,
    "content_size_in_bytes": CONTENT_SIZE_IN_BYTES,
}
MANIFEST_FIRST_ROW_ID = 15  # position of first_row_id (field 520) in a v3 manifest-list record
_V3_MANIFEST_FILE_LENGTH = 16
MANIFEST_LISTS_CACHED = 64


def v3_field(record: DataFile | ManifestFile, position: int) -> Any:
    """A format-version-3 field of a record (None when the record has the older layout: one built
    by pyiceberg's from_args, or read with a v2 schema). Reads the Record's list itself: its
    __len__ and __getitem__ are Python calls, which cost planning 0.2 s at 200,000 files."""
    values = record_values(record)
    return values[position] if len(values) > position else None


def holds_row_lineage(data_file: DataFile) -> bool:
    """Whether a data file holds the row-lineage columns (_row_id and _last_updated_sequence_number):
    their column sizes are recorded whatever the metrics mode (pyiceberg records every column's)."""
    sizes = data_file.column_sizes or {}
    return ROW_ID_FIELD_ID in sizes and LAST_UPDATED_FIELD_ID in sizes


def with_v3_fields(data_file: DataFile, **fields: Any) -> DataFile:
    """A copy of `data_file` in the v3 layout, with any of first_row_id, referenced_data_file,
    content_offset, content_size_in_bytes set (cached entries are never mutated)."""
    values = [data_file[i] for i in range(len(data_file))]
    values += [None] * (_V3_DATA_FILE_LENGTH - len(values))
    for name, value in fields.items():
        values[_V3_FIELD_POSITIONS[name]] = value
    copy = DataFile(*values)
    copy.spec_id = data_file.spec_id
    return copy


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
    with _entries_file(manifest, file_io) as avro:
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
        if len(entry.data_file) >= _V3_DATA_FILE_LENGTH:
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
        values += [None] * (_V3_MANIFEST_FILE_LENGTH - len(values))
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


def _dump_v3_metadata_json(
    self: TableMetadataV3,
    exclude_none: bool = True,
    exclude: Any | None = None,
    by_alias: bool = True,
    **kwargs: Any,
) -> str:
    """TableMetadataV3 as JSON (IcebergBaseModel's serialisation, which round-trips what Java 1.10
    writes); refuses metadata that lost its next-row-id (a snapshot committed without added-rows)."""
    if self.next_row_id is None:
        raise ValueError("format-version 3 table metadata without next-row-id: refusing to write it")
    return IcebergBaseModel.model_dump_json(
        self, exclude_none=exclude_none, exclude=exclude, by_alias=by_alias, **kwargs
    )


# pyiceberg 0.12 raises NotImplementedError here for every v3 table (iceberg-python #1551), so no
# commit could land on one: not a compaction, nor setting a property (pause, resume), nor expiring
# snapshots (gc). The project writes what a v3 snapshot needs itself (above, and commit.two_phase).
TableMetadataV3.model_dump_json = _dump_v3_metadata_json  # type: ignore[method-assign]
