"""The snapshot summary of a rewrite, as Java's SnapshotSummary writes it.

pyiceberg 0.12's update_snapshot_summaries refuses `replace`, and its collector knows no deletion
vectors and skips the unpartitioned spec's one partition: what each file added and removed counts,
in its own spec's partition, deletion vectors as `removed-dvs`, and the parent's totals carried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyiceberg.manifest import (
    DataFile,
)
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import (
    ADDED_DATA_FILES,
    ADDED_DELETE_FILES,
    ADDED_EQUALITY_DELETES,
    ADDED_FILE_SIZE,
    ADDED_POSITION_DELETES,
    ADDED_RECORDS,
    CHANGED_PARTITION_COUNT_PROP,
    DELETED_DATA_FILES,
    DELETED_RECORDS,
    REMOVED_DELETE_FILES,
    REMOVED_EQUALITY_DELETES,
    REMOVED_FILE_SIZE,
    REMOVED_POSITION_DELETE_FILES,
    REMOVED_POSITION_DELETES,
    TOTAL_DATA_FILES,
    TOTAL_DELETE_FILES,
    TOTAL_EQUALITY_DELETES,
    TOTAL_FILE_SIZE,
    TOTAL_POSITION_DELETES,
    TOTAL_RECORDS,
    Operation,
    SnapshotSummaryCollector,
    Summary,
)
from pyiceberg.typedef import KeyDefaultDict
from pyiceberg.utils.properties import property_as_int

from compaction_assets.lake.deletes import (
    is_deletion_vector,
)
from compaction_assets.lake.v3_fields import CONTENT_SIZE_IN_BYTES, v3_field

REMOVED_DVS = "removed-dvs"  # Java's snapshot summary (format version 3); pyiceberg 0.12 has no such key


def rewrite_summary(
    metadata: TableMetadata,
    added: Sequence[DataFile],
    removed: Sequence[DataFile],
    parent_id: int | None,
    operation: Operation,
    spec_schema: Callable[[int], Schema],
    properties: Mapping[str, str],
) -> Summary:
    """Java's snapshot summary for a rewrite: what was added and removed (each file counted in its
    own spec's partition, typed by `spec_schema`), the parent's totals carried forward, and `properties`."""
    specs = metadata.specs()
    limit = property_as_int(
        metadata.properties,
        TableProperties.WRITE_PARTITION_SUMMARY_LIMIT,
        TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT,
    )
    collector = SnapshotSummaryCollector(partition_summary_limit=limit or 0)
    schemas = KeyDefaultDict(spec_schema)  # once per spec, not per file
    for data_file in added:
        collector.add_file(data_file, schemas[data_file.spec_id], specs[data_file.spec_id])
    for data_file in removed:
        collector.remove_file(data_file, schemas[data_file.spec_id], specs[data_file.spec_id])
    changes = collector.build()
    if dvs := [f for f in removed if is_deletion_vector(f)]:
        _count_deletion_vectors(changes, dvs)
    # Java counts the unpartitioned spec's one partition (path ""); pyiceberg's collector skips it
    files = [*added, *removed]
    if changed := len(collector.partition_metrics) + any(len(f.partition) == 0 for f in files):
        changes[CHANGED_PARTITION_COUNT_PROP] = str(changed)
    parent = metadata.snapshot_by_id(parent_id) if parent_id is not None else None
    # a parent without a summary (format version 1 allows it) states no totals to carry
    previous = None if parent is None else parent.summary if parent.summary is not None else {}
    totals = _carried_totals(previous, changes)
    return Summary(operation=operation, **changes, **totals, **properties)


def _count_deletion_vectors(changes: dict[str, str], dvs: Sequence[DataFile]) -> None:
    """Removed deletion vectors as Java's SnapshotSummary counts them (pyiceberg 0.12's collector
    knows none): `removed-dvs`, not `removed-position-delete-files`, each of its blob's size (not
    its whole Puffin file's) in `removed-files-size`."""
    files = int(changes.get(REMOVED_POSITION_DELETE_FILES, 0)) - len(dvs)
    if files > 0:
        changes[REMOVED_POSITION_DELETE_FILES] = str(files)
    else:
        changes.pop(REMOVED_POSITION_DELETE_FILES, None)
    changes[REMOVED_DVS] = str(len(dvs))
    overcounted = sum(f.file_size_in_bytes - (v3_field(f, CONTENT_SIZE_IN_BYTES) or 0) for f in dvs)
    changes[REMOVED_FILE_SIZE] = str(max(0, int(changes.get(REMOVED_FILE_SIZE, 0)) - overcounted))


# total property, its added property, its removed property (as pyiceberg's update_snapshot_summaries)
_TOTALS = (
    (TOTAL_DATA_FILES, ADDED_DATA_FILES, DELETED_DATA_FILES),
    (TOTAL_DELETE_FILES, ADDED_DELETE_FILES, REMOVED_DELETE_FILES),
    (TOTAL_RECORDS, ADDED_RECORDS, DELETED_RECORDS),
    (TOTAL_FILE_SIZE, ADDED_FILE_SIZE, REMOVED_FILE_SIZE),
    (TOTAL_POSITION_DELETES, ADDED_POSITION_DELETES, REMOVED_POSITION_DELETES),
    (TOTAL_EQUALITY_DELETES, ADDED_EQUALITY_DELETES, REMOVED_EQUALITY_DELETES),
)


def _carried_totals(previous: Mapping[str, Any] | None, changes: Mapping[str, str]) -> dict[str, str]:
    """The parent's totals plus what was added, minus what was removed (`previous` None: there is
    no parent, totals start at 0). A total the parent does not state (another engine left it out,
    or the whole summary), or cannot be parsed, is left out too, as Java does."""
    totals = {}
    for total, added, removed in _TOTALS:
        before = "0" if previous is None else previous.get(total)
        try:
            value = int(before) + int(changes.get(added, 0)) - int(changes.get(removed, 0))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if value >= 0:
            totals[total] = str(value)
    return totals
