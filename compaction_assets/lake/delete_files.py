"""Write real position- and equality-delete files, and commit them the way another engine (Spark,
Flink) would. The cheaper merge-on-read tiers (execution/delete_tiers.py) write their position
deletes with `PositionDeleteWriter` (any number of data files, rolling at a target size, from a
Spark worker's FileIO); the demo's CDC table and the tests use the table-level helpers as
"another engine".

pyiceberg 0.12 reads position deletes but cannot write delete files, and has no public API to
commit them: a fast-append producer (iceberg_compat.producers.AppendProducer) is taught to write
its added files into a DELETES manifest. The delete files are real Parquet files with the field ids
the spec reserves (file_path 2147483546, pos 2147483545) or the equality columns' own ids, and the
DataFile carries `equality_ids`, so any reader (DuckDB, Spark) can apply them. The snapshot has
operation `delete` and pyiceberg's summary counts (added-position-deletes, added-delete-files, ...).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO, OutputStream
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.typedef import EMPTY_DICT, Record, TableVersion
from pyiceberg.types import LongType, NestedField, StringType

from compaction_assets.iceberg_compat.manifest_writers import ManifestWriterHooks
from compaction_assets.iceberg_compat.producers import AppendProducer
from compaction_assets.lake.format_v3 import int_equality_ids

FILE_PATH_ID = 2147483546  # reserved field ids of a position-delete file (Iceberg spec)
POS_ID = 2147483545


class _DeleteManifestWriter(ManifestWriterHooks):
    """A v2 manifest writer whose manifest holds delete files (content=deletes).

    pyiceberg 0.12 declares `equality_ids` as list<long>; the spec says list<int> (field 136), and
    readers that follow it (DuckDB 1.4.4: "Expected vector of type INT32, but found INT64"; Java
    cannot narrow long to int either) fail on such a manifest: the file schema says int here.
    """

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def file_metadata(self) -> dict[str, str]:
        return {**super().file_metadata, "content": "deletes"}

    def entry_schema(self, format_version: TableVersion) -> Schema:
        schema = super().entry_schema(format_version)
        return Schema(*[int_equality_ids(f) if f.field_id == 2 else f for f in schema.fields])


class _AddDeleteFiles(AppendProducer):
    """A fast append whose added files are delete files: one DELETES manifest per spec."""

    def snapshot_summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        """pyiceberg's summary, with each file's partition rendered by its own spec (pyiceberg 0.12
        renders added files by the default spec: IndexError for a file of an older, wider spec)."""
        metadata = self.table_metadata
        collector = SnapshotSummaryCollector()
        for delete_file in self.added_files:
            collector.add_file(delete_file, metadata.schema(), metadata.specs()[delete_file.spec_id])
        parent_id = self.parent_snapshot_id
        parent = metadata.snapshot_by_id(parent_id) if parent_id is not None else None
        return update_snapshot_summaries(
            summary=Summary(operation=self.operation, **collector.build(), **snapshot_properties),
            previous_summary=parent.summary if parent is not None else None,
        )

    def manifests(self) -> list[ManifestFile]:
        metadata = self.table_metadata
        by_spec: dict[int, list[DataFile]] = {}
        for delete_file in self.added_files:
            by_spec.setdefault(delete_file.spec_id, []).append(delete_file)
        manifests = []
        for spec_id, files in by_spec.items():
            writer = _DeleteManifestWriter(
                metadata.specs()[spec_id],
                metadata.schema(),
                self.new_manifest_output(),
                self.snapshot_id,
                self.compression,
            )
            with writer:
                for delete_file in files:
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED, snapshot_id=self.snapshot_id, data_file=delete_file
                        )
                    )
            manifests.append(writer.to_manifest_file())
        return self.existing_manifests() + manifests


def commit_delete_files(table: Table, delete_files: Sequence[DataFile]) -> int:
    """Commit the delete files in one `delete` snapshot; returns its snapshot id."""
    txn = table.transaction()
    producer = _AddDeleteFiles(operation=Operation.DELETE, transaction=txn, io=table.io)
    for delete_file in delete_files:
        producer.append_data_file(delete_file)
    with producer:
        pass
    txn.commit_transaction()
    table.refresh()
    if (snapshot := table.current_snapshot()) is None:  # the commit above made one
        raise RuntimeError(f"{table.name()}: no current snapshot after committing delete files")
    return snapshot.snapshot_id


def _write_parquet(table: Table, rows: pa.Table, kind: str) -> tuple[str, int, pq.FileMetaData]:
    path = f"{table.location().rstrip('/')}/data/{kind}-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(path).create() as stream:
        writer = pq.ParquetWriter(stream, rows.schema)
        writer.write_table(rows)
        writer.close()
        metadata = writer.writer.metadata
    return path, len(table.io.new_input(path)), metadata


POSITION_DELETE_SCHEMA = Schema(
    NestedField(FILE_PATH_ID, "file_path", StringType(), required=True),
    NestedField(POS_ID, "pos", LongType(), required=True),
)
_POSITION_ARROW = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID)}),
    ]
)
# Java's MetricsConfig.forPositionDelete: file_path bounds in full (never truncated), so equal
# bounds name the one data file a delete file references (lake.deletes.referenced_data_file).
_POSITION_STATS = compute_statistics_plan(POSITION_DELETE_SCHEMA, {"write.metadata.metrics.default": "full"})
_POSITION_IDS = parquet_path_to_id_mapping(POSITION_DELETE_SCHEMA)
WRITE_ROWS = 1 << 17  # rows written at once: files roll at the target size between such slices


@dataclass(frozen=True)
class _OpenFile:
    """The position-delete file being written: its path, stream and Parquet writer."""

    path: str
    stream: OutputStream
    writer: pq.ParquetWriter


class PositionDeleteWriter:
    """Writes (file_path, pos) rows of one partition into position-delete files named
    `{name}-NNNNN.parquet`, starting a new file once one reaches `target_bytes`.

    Callers write rows sorted by file_path, then pos (the spec's order for position deletes).
    Every file records exact file_path bounds, so a file holding one data file's rows references it.
    """

    def __init__(self, io: FileIO, name: str, spec_id: int, partition: Record, target_bytes: int | None = None) -> None:
        self._io = io
        self._name = name
        self._spec_id = spec_id
        self._partition = partition
        self._target = target_bytes
        self._open: _OpenFile | None = None
        self._opened: list[str] = []
        self._written: list[DataFile] = []

    def write(self, paths: pa.Array | pa.ChunkedArray, positions: pa.Array | pa.ChunkedArray) -> None:
        """Append rows (already sorted after every row written before)."""
        for start in range(0, len(paths), WRITE_ROWS):
            self._write(paths.slice(start, WRITE_ROWS), positions.slice(start, WRITE_ROWS))

    def _write(self, paths: pa.Array | pa.ChunkedArray, positions: pa.Array | pa.ChunkedArray) -> None:
        if (open_file := self._open) is None:
            path = f"{self._name}-{len(self._opened):05d}.parquet"
            self._opened.append(path)
            stream = self._io.new_output(path).create(overwrite=True)
            writer = pq.ParquetWriter(stream, _POSITION_ARROW, compression="zstd")
            open_file = self._open = _OpenFile(path, stream, writer)
        rows = pa.table([paths.cast(pa.string()), positions.cast(pa.int64())], schema=_POSITION_ARROW)
        open_file.writer.write_table(rows)
        if self._target is not None and open_file.stream.tell() >= self._target:
            self._finish_file()

    def close(self) -> list[DataFile]:
        """Finish the open file; the DataFiles (content position deletes) of every file written."""
        self._finish_file()
        return self._written

    def abort(self) -> None:
        """Delete every file this writer opened (best effort: recovery also sweeps by prefix)."""
        if (open_file := self._open) is not None:
            with contextlib.suppress(Exception):
                open_file.writer.close()
                open_file.stream.close()
        for path in self._opened:
            with contextlib.suppress(OSError):
                self._io.delete(path)

    def _finish_file(self) -> None:
        if (open_file := self._open) is None:
            return
        open_file.writer.close()
        open_file.stream.close()
        stats = data_file_statistics_from_parquet_metadata(
            open_file.writer.writer.metadata, _POSITION_STATS, _POSITION_IDS
        )
        delete_file = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path=open_file.path,
            file_format=FileFormat.PARQUET,
            partition=self._partition,
            file_size_in_bytes=len(self._io.new_input(open_file.path)),
            **stats.to_serialized_dict(),
        )
        delete_file.spec_id = self._spec_id
        self._written.append(delete_file)
        self._open = None


def position_delete_rows(
    table: Table, spec_id: int, partition: Record, paths: Sequence[str], positions: Sequence[int]
) -> DataFile:
    """Write one position-delete file removing rows `positions[i]` (0-based) of data files `paths[i]`,
    of one partition of a spec; rows are sorted as the spec requires."""
    rows = pa.table({"file_path": pa.array(paths, pa.string()), "pos": pa.array(positions, pa.int64())})
    rows = rows.sort_by([("file_path", "ascending"), ("pos", "ascending")])
    name = f"{table.location().rstrip('/')}/data/pos-delete-{uuid.uuid4().hex}"
    writer = PositionDeleteWriter(table.io, name, spec_id, partition)
    writer.write(rows.column("file_path"), rows.column("pos"))
    [delete_file] = writer.close()
    return delete_file


def position_delete_file(table: Table, data_file: DataFile, positions: Sequence[int]) -> DataFile:
    """Write a position-delete file removing rows `positions` (0-based) of the live `data_file`."""
    paths = [data_file.file_path] * len(positions)
    return position_delete_rows(table, data_file.spec_id, data_file.partition, paths, positions)


def equality_delete_file(
    table: Table, spec_id: int, partition: Record, columns: Sequence[str], values: Sequence[Mapping[str, Any]]
) -> DataFile:
    """Write an equality-delete file on `columns` (current schema names) in one partition of a spec:
    it removes every row of that partition, committed before it, equal on all columns to a value."""
    current = table.schema()
    ids = [current.find_field(name).field_id for name in columns]
    delete_schema = Schema(*[current.find_field(i) for i in ids], schema_id=current.schema_id)
    rows = pa.Table.from_pylist([dict(v) for v in values], schema=schema_to_pyarrow(delete_schema))
    path, size, metadata = _write_parquet(table, rows, "eq-delete")
    stats = data_file_statistics_from_parquet_metadata(
        metadata, compute_statistics_plan(delete_schema, table.properties), parquet_path_to_id_mapping(delete_schema)
    )
    delete_file = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        file_size_in_bytes=size,
        equality_ids=ids,
        **stats.to_serialized_dict(),
    )
    delete_file.spec_id = spec_id
    return delete_file


def read_column(table: Table, data_file: DataFile, field_id: int, name: str) -> list[Any]:
    """One column of a data file, in row order: by Iceberg field id, else by name (files added
    with add_files carry no field ids)."""
    with table.io.new_input(data_file.file_path).open() as stream:
        parquet = pq.read_table(stream)
    for index, field in enumerate(parquet.schema):
        if field.metadata and field.metadata.get(b"PARQUET:field_id") == str(field_id).encode():
            return parquet.column(index).to_pylist()
    return parquet.column(name).to_pylist()
