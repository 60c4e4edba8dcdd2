"""The live files of a table's current snapshot, read from its manifests (never from data files)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table

from compaction_assets.lake.manifest_cache import live_entries


@dataclass(frozen=True)
class LiveFile:
    """One data or delete file referenced by the current snapshot, with its partition key."""

    data_file: DataFile
    partition_key: str
    added_at_ms: int

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
    """The Iceberg partition path of a file under its own spec ("" for unpartitioned)."""
    spec = table.specs()[data_file.spec_id]
    if spec.is_unpartitioned():
        return ""
    return spec.partition_to_path(data_file.partition, table.schema())


def live_files(table: Table) -> list[LiveFile]:
    """All files of the current snapshot, each with the time of the snapshot that added it."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    added_at = {s.snapshot_id: s.timestamp_ms for s in table.metadata.snapshots}
    keys: dict[tuple, str] = {}  # partition paths, computed once per partition
    files = []
    for manifest in snapshot.manifests(table.io):
        for entry in live_entries(manifest, table.io):
            data_file = entry.data_file
            slot = (data_file.spec_id, data_file.partition)
            key = keys.get(slot)
            if key is None:
                key = keys[slot] = partition_key(table, data_file)
            files.append(LiveFile(data_file, key, added_at.get(entry.snapshot_id, snapshot.timestamp_ms)))
    return files


def live_data_files_by_path(table: Table) -> dict[str, DataFile]:
    """Path -> DataFile for every live data file (not delete files) of the current snapshot."""
    return {f.path: f.data_file for f in live_files(table) if not f.is_delete}
