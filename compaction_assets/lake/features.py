"""Table features compaction refuses, each with the reason people see (plan, compact, sensor log).

Format version 3 tables are compacted: data rewrites apply deletion vectors and keep row lineage
(execution/lineage), and commit v3 manifests and manifest lists (lake/manifest_io). What does not
handle v3 yet is refused there with its reason: the delete-file tiers and manifest rewrites."""

from __future__ import annotations

from pyiceberg.table import Table

MAX_FORMAT_VERSION = 3
FORMAT_REASON = "format-version {version} tables are not compacted: this project knows format versions 1 to 3"
LINEAGE_COLUMNS = frozenset({"_row_id", "_last_updated_sequence_number"})
LINEAGE_NAME_REASON = (
    "format-version 3 tables with a column named {columns} are not compacted: a rewrite writes row lineage "
    "under those reserved names (the spec's metadata columns); rename the column"
)
V3_TIER_REASON = (
    "format-version 3 tables get no delete-file tier (rewrite-position-deletes, convert-equality-deletes): "
    "position-delete files may not be added to a v3 table, deletion vectors would have to be written; "
    "a data rewrite applies the deletes instead"
)
V3_MANIFEST_REASON = (
    "manifests not due: a format-version-3 table's manifests are not rewritten (the manifest rewrite does "
    "not carry row lineage, first_row_id, yet); compactions fold its data manifests as they commit"
)


def refusal(table: Table) -> str:
    """Why the table is not compacted at all, or "" when it may be."""
    if table.format_version > MAX_FORMAT_VERSION:
        return FORMAT_REASON.format(version=table.format_version)
    if table.format_version >= 3 and (taken := sorted(LINEAGE_COLUMNS & {f.name for f in table.schema().fields})):
        return LINEAGE_NAME_REASON.format(columns=", ".join(taken))
    return ""


def tier_refusal(table: Table) -> str:
    """Why the delete-file tiers are not run on the table, or "" when they may be."""
    return V3_TIER_REASON if table.format_version >= 3 else ""


def manifest_refusal(table: Table) -> str:
    """Why the table's manifests are not rewritten, or "": `manifest_version_refusal`, else `refusal`."""
    return manifest_version_refusal(table.format_version) or refusal(table)


def manifest_version_refusal(format_version: int) -> str:
    """Why manifests of a table at this format version are not rewritten, or "": a format-version-1
    table's (the rewrite writes manifests in the v2 layout; upgraded to v2, its v1 manifests are)
    and a format-version-3 table's (see V3_MANIFEST_REASON). Checked at plan and on each commit try
    (a table may be upgraded in between)."""
    if format_version == 1:
        return (
            "manifests not due: a format-version-1 table's manifests are not rewritten (the rewrite writes "
            "the format-version-2 entry layout; upgrade the table to format version 2)"
        )
    if format_version == 3:
        return V3_MANIFEST_REASON
    return ""
