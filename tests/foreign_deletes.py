"""Delete files as another engine (Spark, Flink) commits them: real Parquet delete files in real
delete manifests. pyiceberg 0.12 cannot write delete files, so this goes through its private
_FastAppendFiles (test code only; the project's own pyiceberg internals live in commit/two_phase.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.typedef import Record, TableVersion
from pyiceberg.types import IntegerType, ListType, NestedField, StructType

FILE_PATH_FIELD_ID = 2147483546  # the file_path column of a position delete file (Iceberg spec)

_POS_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_FIELD_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"2147483545"}),
    ]
)


class _DeleteManifestWriter(ManifestWriterV2):
    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}

    def _with_partition(self, format_version: TableVersion) -> Schema:
        """pyiceberg 0.12 writes equality_ids as list<long>; the spec says list<int> (and DuckDB
        1.4.4 fails with "Expected vector of type INT32" on the long)."""
        schema = super()._with_partition(format_version)
        return Schema(*(_int_equality_ids(f) if f.name == "data_file" else f for f in schema.fields))


def _int_equality_ids(data_file: NestedField) -> NestedField:
    struct = data_file.field_type
    assert isinstance(struct, StructType)
    fields = [
        NestedField(f.field_id, f.name, ListType(136, IntegerType(), element_required=True), required=False, doc=f.doc)
        if f.field_id == 135
        else f
        for f in struct.fields
    ]
    return NestedField(data_file.field_id, data_file.name, StructType(*fields), required=data_file.required)


class _AddDeletes(_FastAppendFiles):
    def _manifests(self) -> list[ManifestFile]:
        metadata = self._transaction.table_metadata
        manifests = []
        for spec_id in sorted({f.spec_id for f in self._added_data_files}):
            output = self.new_manifest_output()
            writer = _DeleteManifestWriter(
                metadata.specs()[spec_id], metadata.schema(), output, self._snapshot_id, self._compression
            )
            with writer:
                for f in self._added_data_files:
                    if f.spec_id == spec_id:
                        writer.add(
                            ManifestEntry.from_args(
                                status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id, data_file=f
                            )
                        )
            manifests.append(writer.to_manifest_file())
        return self._existing_manifests() + manifests


def commit_deletes(table: Table, delete_files: Sequence[DataFile]) -> None:
    """One `delete` snapshot adding the delete files (a manifest per spec)."""
    txn = table.transaction()
    producer = _AddDeletes(operation=Operation.DELETE, transaction=txn, io=table.io)
    for f in delete_files:
        producer.append_data_file(f)  # the summary counts them as added delete files
    with producer:
        pass
    txn.commit_transaction()


def _write(table: Table, data: pa.Table) -> tuple[str, int]:
    path = f"{table.location()}/data/delete-{uuid.uuid4().hex}.parquet"
    local = path.removeprefix("file://")
    pq.write_table(data, local)
    return path, Path(local).stat().st_size


def position_delete(
    table: Table,
    data_file: DataFile,
    positions: list[int],
    *,
    referenced: bool = False,
    spec_id: int | None = None,
    partition: Record | None = None,
) -> DataFile:
    """A position delete file for rows `positions` of `data_file`. `referenced`: file_path bounds
    equal to the path (a file-scoped delete); else partition-scoped, in `spec_id`/`partition`
    (default: the data file's; an unpartitioned spec makes it global)."""
    data = pa.table({"file_path": [data_file.file_path] * len(positions), "pos": positions}, schema=_POS_SCHEMA)
    path, size = _write(table, data)
    bounds = {FILE_PATH_FIELD_ID: data_file.file_path.encode()} if referenced else None
    f = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=data_file.partition if partition is None else partition,
        record_count=len(positions),
        file_size_in_bytes=size,
        lower_bounds=bounds,
        upper_bounds=bounds,
    )
    f.spec_id = data_file.spec_id if spec_id is None else spec_id
    return f


def equality_delete(table: Table, ids: list[int], spec_id: int, partition: Record) -> DataFile:
    """An equality delete file on column `id` (field id 1) in the given spec and partition."""
    data = pa.table(
        {"id": pa.array(ids, pa.int64())},
        schema=pa.schema([pa.field("id", pa.int64(), metadata={b"PARQUET:field_id": b"1"})]),
    )
    path, size = _write(table, data)
    f = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=len(ids),
        file_size_in_bytes=size,
        equality_ids=[1],
    )
    f.spec_id = spec_id
    return f
