"""pyiceberg 0.12's private Arrow functions and record internals, under public names.

- `to_requested_schema`: a batch projected onto a schema by field id (renames, added columns as
  nulls, promotions), the projection pyiceberg's own scan applies; also the write-side conversion
  to a file schema with field ids. pyiceberg exposes it only inside ArrowScan and its writer.
- `dataframe_to_data_files`: Arrow rows written as data files of a table, without a commit (a test
  lake's and the bench's many small files in one append). Public: only `Table.append`, one commit a call.
- `scan_batches_with_deletes`: ArrowScan's generator over scan tasks with their deletes applied,
  without `to_record_batches`' materialisation of each whole file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.io.fileformat import FileFormatModel
from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files, _to_requested_schema
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask
from pyiceberg.table.metadata import TableMetadata


def to_requested_schema(
    requested_schema: Schema,
    file_schema: Schema,
    batch: pa.RecordBatch,
    *,
    downcast_ns_timestamp_to_us: bool = False,
    include_field_ids: bool = False,
    allow_timestamp_tz_mismatch: bool = False,
    format_model: FileFormatModel | None = None,
) -> pa.RecordBatch:
    """`batch`, read with `file_schema`, as `requested_schema` (pyiceberg's `_to_requested_schema`)."""
    return _to_requested_schema(
        requested_schema,
        file_schema,
        batch,
        downcast_ns_timestamp_to_us=downcast_ns_timestamp_to_us,
        include_field_ids=include_field_ids,
        allow_timestamp_tz_mismatch=allow_timestamp_tz_mismatch,
        format_model=format_model,
    )


def dataframe_to_data_files(metadata: TableMetadata, rows: pa.Table, io: FileIO) -> Iterable[DataFile]:
    """`rows` written as data files of the table `metadata` describes (pyiceberg's `_dataframe_to_data_files`)."""
    return _dataframe_to_data_files(metadata, rows, io)


def scan_batches_with_deletes(scan: ArrowScan, tasks: Iterable[FileScanTask]) -> Iterator[pa.RecordBatch]:
    """The tasks' batches as `scan` projects them, each file's own deletes applied, streamed
    (ArrowScan's `_record_batches_from_scan_tasks_and_deletes`, with no positional deletes given)."""
    return scan._record_batches_from_scan_tasks_and_deletes(tasks, {})
