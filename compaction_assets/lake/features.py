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


def manifest_refusal(table: Table) -> str:
    """Why the table's manifests are not rewritten, or "": besides `refusal`, a format-version-1
    table's (the rewrite writes manifests in the v2 layout; upgraded to v2, its v1 manifests are)."""
    if table.format_version == 1:
        return (
            "manifests not due: a format-version-1 table's manifests are not rewritten (the rewrite writes "
            "the format-version-2 entry layout; upgrade the table to format version 2)"
        )
    return refusal(table)
