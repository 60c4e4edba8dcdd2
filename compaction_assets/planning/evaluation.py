"""Evaluating a partition (Amoro's evaluator): what its files and the delete files applying to
them amount to (`PartitionStats`), measured once and read by every strategy and the sensor."""

from __future__ import annotations

from collections.abc import Sequence

from compaction_assets.lake.clustering import Clustering
from compaction_assets.lake.deletes import is_deletion_vector
from compaction_assets.planning.model import DeleteMap, FileStat, PartitionStats, is_position, read_amplification
from compaction_assets.planning.overlap import bounds_overlap
from compaction_assets.planning.policy import Policy


def partition_stats(
    partition_key: str,
    files: Sequence[FileStat],
    policy: Policy,
    deletes: DeleteMap | None = None,
    clustering: Clustering | None = None,
) -> PartitionStats:
    """`clustering`: the table's clustering columns, whose bounds_overlap is measured (None: not)."""
    deletes = deletes or DeleteMap()
    data = [f for f in files if not f.is_delete]
    sizes = [f.size for f in data]
    fragment_max, undersized_below = policy.fragment_max_bytes, policy.undersized_below_bytes
    return PartitionStats(
        partition_key=partition_key,
        data_files=len(data),
        data_bytes=sum(sizes),
        records=sum(f.record_count for f in data),
        fragments=sum(size <= fragment_max for size in sizes),
        undersized=sum(size < undersized_below for size in sizes),
        delete_files=len(files) - len(data),
        last_write_ms=max((f.added_at_ms for f in files), default=0),
        spec_ids=tuple(sorted({f.spec_id for f in data})),
        bounds_overlap=bounds_overlap([f.data_file for f in data], clustering) if clustering else None,
        **_delete_load(data, deletes),
    )


def _delete_load(data: Sequence[FileStat], deletes: DeleteMap) -> dict:
    """The PartitionStats fields of the delete load on the data files `data`."""
    records = sum(f.record_count for f in data)
    applying = deletes.distinct(f.path for f in data)
    deleted = sum(d.record_count for d in applying)
    with_deletes = deletes.by_data
    return {
        "position_delete_files": sum(is_position(d) for d in applying),
        "equality_delete_files": sum(not is_position(d) for d in applying),
        "data_files_with_deletes": sum(f.path in with_deletes for f in data) if with_deletes else 0,
        "deleted_rows": deleted,
        "delete_ratio": min(1.0, deleted / records) if records else 0.0,
        "read_amplification": read_amplification(records, deleted),
        "deletion_vectors": sum(is_deletion_vector(d.data_file) for d in applying),
    }
