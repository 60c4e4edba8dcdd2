"""Delete files shaped for the commit tests (scoped to a chosen spec and partition, or naming one
data file); committed as another engine would by tests.lakekit.deletes (pyiceberg 0.12 cannot).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from tests.lakekit.deletes import commit_delete_files as commit_deletes  # noqa: F401 (re-exported)

FILE_PATH_FIELD_ID = 2147483546  # the file_path column of a position delete file (Iceberg spec)

_POS_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_FIELD_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"2147483545"}),
    ]
)


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
