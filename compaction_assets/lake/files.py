"""The live files of a table's current snapshot, read from its manifests (never from data files)."""

from __future__ import annotations

from collections.abc import Iterable

from pyiceberg.manifest import DataFile, DataFileContent, ManifestEntry
from pyiceberg.table import Table
from pyiceberg.utils.lazydict import LazyDict

from compaction_assets.iceberg_compat.metadata import lazy_dict_values
from compaction_assets.lake.deletes import file_key
from compaction_assets.lake.format_v3 import snapshot_manifests, with_first_row_ids
from compaction_assets.lake.manifest_cache import manifest_contents
from compaction_assets.lake.partition_key import PartitionId, partition_id, render_partition
from compaction_assets.lake.v3_fields import FIRST_ROW_ID, MANIFEST_FIRST_ROW_ID, MIN_LINEAGE_VERSION, v3_field


class LiveFile:
    """One data or delete file referenced by the current snapshot, with its partition id and key.
    `path` tells it from the other live files (lake.deletes.file_key): the file's path, but a
    deletion vector's is `<Puffin file path>#<blob offset>` (many share one Puffin file).
    `first_row_id`: a data file's in a format-version-3 table, inherited as readers see it
    (format_v3.with_first_row_ids); None otherwise.

    Slotted, its figures copied out of the DataFile once: the planner reads them a few times per
    file, and at 200,000 files each DataFile property call costs planning tenths of a second."""

    __slots__ = (
        "data_file",
        "partition_id",
        "partition_key",
        "added_at_ms",
        "data_sequence_number",
        "path",
        "size",
        "data_bytes",
        "record_count",
        "spec_id",
        "is_delete",
        "first_row_id",
        "file_sequence_number",
    )

    def __init__(
        self,
        data_file: DataFile,
        partition_id: PartitionId,  # what files are grouped by: (spec id, typed values)
        partition_key: str,  # its injective rendering (lake.partition_key)
        added_at_ms: int,
        data_sequence_number: int = 0,  # its entry's (inherited); 0 in a format-version-1 table
        file_sequence_number: int | None = None,  # its entry's (inherited): the snapshot that added the file
    ) -> None:
        self.data_file = data_file
        self.partition_id = partition_id
        self.partition_key = partition_key
        self.added_at_ms = added_at_ms
        self.data_sequence_number = data_sequence_number
        self.is_delete: bool = data_file.content != DataFileContent.DATA
        self.path: str = file_key(data_file) if self.is_delete else data_file.file_path
        self.size: int = data_file.file_size_in_bytes
        self.data_bytes: int = _data_bytes(data_file)
        self.record_count: int = data_file.record_count
        self.spec_id: int = data_file.spec_id
        self.first_row_id: int | None = v3_field(data_file, FIRST_ROW_ID)
        self.file_sequence_number = file_sequence_number

    def __repr__(self) -> str:
        return f"LiveFile({self.path!r}, partition {self.partition_key!r}, seq {self.data_sequence_number})"


def _data_bytes(data_file: DataFile) -> int:
    """Compressed column data (manifest column sizes), or the file size when unrecorded. A
    column_sizes pyiceberg decoded lazily is summed from its arrays, not made a dict: that
    dict would stay with the cached entry (~90 MB at 200,000 files) for nothing."""
    sizes = data_file.column_sizes
    values = lazy_dict_values(sizes) if isinstance(sizes, LazyDict) else None
    if values is None:
        values = list(sizes.values()) if sizes else []
    return sum(values) if values else data_file.file_size_in_bytes


def partition_key(table: Table, data_file: DataFile) -> str:
    """The injective partition key of a file under its own spec ("" for the current spec unpartitioned)."""
    spec = table.specs()[data_file.spec_id]
    return render_partition(spec, table.schema(), data_file.partition, table.spec().spec_id)


def live_files(table: Table) -> list[LiveFile]:
    """All files of the current snapshot, each with the time of the snapshot that added it.

    A manifest's LiveFiles are made once per process for each (current spec, current schema) and
    kept beside its cached entries (manifests are immutable); they are reused while the snapshots
    their entries name still resolve to the same times. In a format-version-3 table the entries
    carry their data files' first_row_id as readers see it (format_v3.with_first_row_ids)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    added_at = {s.snapshot_id: s.timestamp_ms for s in table.metadata.snapshots}
    context = (table.spec().spec_id, table.schema().schema_id)
    keys: dict[PartitionId, tuple[PartitionId, str]] = {}  # partition id -> (shared id, key), once per partition
    files: list[LiveFile] = []
    version = table.metadata.format_version
    for manifest in snapshot_manifests(snapshot, table.io, version):
        contents = manifest_contents(manifest, table.io)
        if version >= MIN_LINEAGE_VERSION:
            contents = with_first_row_ids(contents, v3_field(manifest, MANIFEST_FIRST_ROW_ID))
        made = contents.derived.get(context)
        if made is None or any(added_at.get(s, snapshot.timestamp_ms) != ms for s, ms in made[1]):
            made = contents.derived[context] = _live(table, contents.entries, added_at, snapshot.timestamp_ms, keys)
        files.extend(made[0])
    return files


def _live(
    table: Table,
    entries: Iterable[ManifestEntry],
    added_at: dict[int, int],
    fallback_ms: int,
    keys: dict[PartitionId, tuple[PartitionId, str]],
) -> tuple[tuple[LiveFile, ...], tuple[tuple[int | None, int], ...]]:
    """LiveFiles of `entries`, and the (snapshot id, time) pairs their times were taken from."""
    files = []
    resolved: dict[int | None, int] = {}
    for entry in entries:
        data_file = entry.data_file
        pid = partition_id(data_file.spec_id, data_file.partition)
        shared = keys.get(pid)
        if shared is None:
            shared = keys[pid] = (pid, partition_key(table, data_file))
        sid = entry.snapshot_id
        added_ms = resolved.get(sid)
        if added_ms is None:
            added_ms = resolved[sid] = added_at.get(sid, fallback_ms) if sid is not None else fallback_ms
        files.append(
            LiveFile(data_file, shared[0], shared[1], added_ms, entry.sequence_number or 0, entry.file_sequence_number)
        )
    return tuple(files), tuple(resolved.items())


def live_data_files_by_path(table: Table) -> dict[str, DataFile]:
    """Path -> DataFile for every live data file (not delete files) of the current snapshot."""
    return {f.path: f.data_file for f in live_files(table) if not f.is_delete}
