"""Row lineage (format version 3) carried through a rewrite.

Every row of a v3 table has a row id and the sequence number of the commit that last updated it,
readable as the metadata columns `_row_id` (field id 2147483540) and
`_last_updated_sequence_number` (2147483539). A data file may hold them as columns; where it does
not, or a value is null, readers inherit them: `_row_id` = the file's first_row_id + the row's
position in the file, `_last_updated_sequence_number` = the file's sequence number (its manifest
entry's file_sequence_number, as Java's PartitionUtil.constantsMap has it). A rewrite moves rows to
new files at new positions, so it writes both columns into the new files with each row's value as
read (Java's rewrite_data_files does the same): unchanged rows keep their ids and sequence numbers.

The reader (execution/source_reader) adds both columns to each batch, from the file's columns if it
has them and by inheritance otherwise, before deletes drop rows (positions count every row of the file).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from compaction_assets.lake.v3_fields import LAST_UPDATED_FIELD_ID, ROW_ID_FIELD_ID

LINEAGE_FIELDS = (
    NestedField(ROW_ID_FIELD_ID, "_row_id", LongType(), required=False),
    NestedField(LAST_UPDATED_FIELD_ID, "_last_updated_sequence_number", LongType(), required=False),
)
LINEAGE_IDS = tuple(f.field_id for f in LINEAGE_FIELDS)
FIELD_ID = b"PARQUET:field_id"
ARROW_FIELDS = tuple(
    pa.field(f.name, pa.int64(), nullable=True, metadata={FIELD_ID: str(f.field_id).encode()}) for f in LINEAGE_FIELDS
)


def with_lineage_fields(schema: Schema) -> Schema:
    """`schema` and the two lineage columns after its own (what a v3 rewrite writes and reads)."""
    return Schema(*schema.fields, *LINEAGE_FIELDS, schema_id=schema.schema_id)


def lineage_positions(physical: pa.Schema) -> dict[int, int]:
    """Field id -> column index of the lineage columns a file holds (by field id)."""
    found = {}
    for index, column in enumerate(physical):
        field_id = (column.metadata or {}).get(FIELD_ID)
        if field_id is not None and int(field_id) in LINEAGE_IDS:
            found[int(field_id)] = index
    return found


def add_lineage(
    batch: pa.RecordBatch,
    source,  # noqa: ANN001 - SourceFile: first_row_id, file_sequence_number
    start: int,
    row_ids: pa.Array | None = None,
    updated: pa.Array | None = None,
) -> pa.RecordBatch:
    """`batch` (rows `start`.. of `source`, before deletes) with `_row_id` and
    `_last_updated_sequence_number` appended: the file's own values (`row_ids`, `updated`) where
    not null, else inherited (see the module doc; null when the file has no first_row_id)."""
    rows = batch.num_rows
    if source.first_row_id is None:
        inherited_ids = pa.nulls(rows, pa.int64())
    else:
        inherited_ids = pa.array(np.arange(start, start + rows, dtype=np.int64) + source.first_row_id)
    if source.file_sequence_number is None:
        inherited_seq = pa.nulls(rows, pa.int64())
    else:
        inherited_seq = pa.array(np.full(rows, source.file_sequence_number, dtype=np.int64))
    ids = inherited_ids if row_ids is None else pc.coalesce(row_ids.cast(pa.int64()), inherited_ids)
    seqs = inherited_seq if updated is None else pc.coalesce(updated.cast(pa.int64()), inherited_seq)
    return pa.RecordBatch.from_arrays(
        [*batch.columns, ids, seqs], schema=pa.schema([*batch.schema, *ARROW_FIELDS], metadata=batch.schema.metadata)
    )
