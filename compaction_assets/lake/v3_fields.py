"""Format version 3's fields of data files and manifest-list entries: row lineage (first_row_id,
the _row_id and _last_updated_sequence_number columns) and deletion vectors (referenced data
file, blob offset and size), read and set by position in pyiceberg's records.

pyiceberg 0.12 reads manifests and manifest lists with the format-version-2 schemas, so these
fields exist only in records read with the v3 schemas (lake/format_v3.py); a record built by
`DataFile.from_args` has the shorter layout, where `v3_field` reads None.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.manifest import (
    DataFile,
    ManifestFile,
)

from compaction_assets.iceberg_compat.metadata import record_values

MIN_LINEAGE_VERSION = 3
ROW_ID_FIELD_ID = 2147483540  # the row-lineage metadata columns' reserved field ids
LAST_UPDATED_FIELD_ID = 2147483539
# positions of the format-version-3 fields in a DataFile record (pyiceberg's DATA_FILE_TYPE[3])
FIRST_ROW_ID, REFERENCED_DATA_FILE, CONTENT_OFFSET, CONTENT_SIZE_IN_BYTES = 16, 17, 18, 19
V3_DATA_FILE_LENGTH = 20
_V3_FIELD_POSITIONS = {
    "first_row_id": FIRST_ROW_ID,
    "referenced_data_file": REFERENCED_DATA_FILE,
    "content_offset": CONTENT_OFFSET,
    "content_size_in_bytes": CONTENT_SIZE_IN_BYTES,
}
MANIFEST_FIRST_ROW_ID = 15  # position of first_row_id (field 520) in a v3 manifest-list record
V3_MANIFEST_FILE_LENGTH = 16


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
    values += [None] * (V3_DATA_FILE_LENGTH - len(values))
    for name, value in fields.items():
        values[_V3_FIELD_POSITIONS[name]] = value
    copy = DataFile(*values)
    copy.spec_id = data_file.spec_id
    return copy
