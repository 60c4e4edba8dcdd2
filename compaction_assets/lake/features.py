"""Table features compaction refuses, each with the reason people see (plan, compact, sensor log)."""

from __future__ import annotations

from pyiceberg.table import Table

MAX_FORMAT_VERSION = 2
FORMAT_V3_REASON = (
    "format-version {version} tables are not compacted: row lineage (_row_id, "
    "_last_updated_sequence_number) would not be preserved, and pyiceberg 0.12 cannot write "
    "format-version 3 metadata"
)


def refusal(table: Table) -> str:
    """Why the table is not compacted at all, or "" when it may be."""
    if table.format_version > MAX_FORMAT_VERSION:
        return FORMAT_V3_REASON.format(version=table.format_version)
    return ""
