"""The live files of a table's current snapshot, read from its manifests (never from data files)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table

from compaction_assets.lake.manifest_cache import live_entries
from compaction_assets.lake.partition_key import PartitionId, partition_id, render_partition


@dataclass(frozen=True)
class LiveFile:
    """One data or delete file referenced by the current snapshot, with its partition id and key."""

    data_file: DataFile
    partition_id: PartitionId  # what files are grouped by: (spec id, typed values)
    partition_key: str  # its injective rendering (lake.partition_key)
    added_at_ms: int
    data_sequence_number: int = 0  # its entry's (inherited); 0 in a format-version-1 table

    @property
    def path(self) -> str:
        return self.data_file.file_path

    @property
    def size(self) -> int:
        return self.data_file.file_size_in_bytes

    @cached_property  # the planner sorts and packs by it: summed once, not per comparison
    def data_bytes(self) -> int:
        """Compressed column data (manifest column sizes), or the file size when unrecorded."""
        column_sizes = self.data_file.column_sizes
        return sum(column_sizes.values()) if column_sizes else self.size

    @property
    def record_count(self) -> int:
        return self.data_file.record_count

    @property
    def spec_id(self) -> int:
        return self.data_file.spec_id

    @property
    def is_delete(self) -> bool:
        return self.data_file.content != DataFileContent.DATA


def partition_key(table: Table, data_file: DataFile) -> str:
    """The injective partition key of a file under its own spec ("" for the current spec unpartitioned)."""
    spec = table.specs()[data_file.spec_id]
    return render_partition(spec, table.schema(), data_file.partition, table.spec().spec_id)


def live_files(table: Table) -> list[LiveFile]:
    """All files of the current snapshot, each with the time of the snapshot that added it."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    added_at = {s.snapshot_id: s.timestamp_ms for s in table.metadata.snapshots}
    keys: dict[PartitionId, str] = {}  # partition keys, rendered once per partition
    files = []
    for manifest in snapshot.manifests(table.io):
        for entry in live_entries(manifest, table.io):
            data_file = entry.data_file
            pid = partition_id(data_file.spec_id, data_file.partition)
            key = keys.get(pid)
            if key is None:
                key = keys[pid] = partition_key(table, data_file)
            added_ms = added_at.get(entry.snapshot_id, snapshot.timestamp_ms)
            files.append(LiveFile(data_file, pid, key, added_ms, entry.sequence_number or 0))
    return files


def live_data_files_by_path(table: Table) -> dict[str, DataFile]:
    """Path -> DataFile for every live data file (not delete files) of the current snapshot."""
    return {f.path: f.data_file for f in live_files(table) if not f.is_delete}
