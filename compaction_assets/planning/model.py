"""The planner's data model: what it reads (`FileStat`, `DeleteMap`), what it measures
(`PartitionStats`) and what it decides (`PartitionPlan` of `FileGroup`s, of a `Kind`).

No I/O and no decisions here: planning/evaluation.py measures a partition, planning/strategies/
holds one module per kind that decides, planning/planner.py runs them in order.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from pyiceberg.manifest import DataFile, DataFileContent

from compaction_assets.lake.deletes import ApplyingDeletes


class Kind(StrEnum):
    MINOR = "minor"
    MAJOR = "major"
    CONVERT_EQUALITY_DELETES = "convert-equality-deletes"  # equality deletes -> position deletes, data untouched
    REWRITE_POSITION_DELETES = "rewrite-position-deletes"  # small position-delete files -> one
    # maintenance tiers (issue 20)
    FULL = "full"  # full optimizing: every data file of the partition, in the table's sort order
    SPLIT = "split"  # an oversized data file -> target-size files
    CLUSTER = "cluster"  # healthy sizes, badly clustered: rewritten sorted / z-ordered
    OLD_SPEC = "old-spec"  # files of an earlier partition spec -> the current spec
    EXPIRE = "expire"  # rows past the retention dropped (whole files by metadata, the rest rewritten)
    REWRITE_MANIFESTS = "rewrite-manifests"  # small manifests merged, clustered by partition (table-wide)

    @property
    def is_tier(self) -> bool:
        """A cheaper merge-on-read tier: delete files are replaced, data files are not rewritten."""
        return self in (Kind.CONVERT_EQUALITY_DELETES, Kind.REWRITE_POSITION_DELETES)


class FileStat(Protocol):
    """What the planner needs to know about one file (lake.files.LiveFile has these)."""

    @property
    def path(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def data_bytes(self) -> int: ...
    @property
    def record_count(self) -> int: ...
    @property
    def spec_id(self) -> int: ...
    @property
    def is_delete(self) -> bool: ...
    @property
    def data_file(self) -> DataFile: ...  # content, partition, bounds, equality ids, column sizes
    @property
    def data_sequence_number(self) -> int: ...

    @property
    def partition_id(self) -> Hashable: ...  # files with equal ids are one partition
    @property
    def partition_key(self) -> str: ...  # its injective rendering
    @property
    def added_at_ms(self) -> int: ...


@dataclass(frozen=True)
class DeleteMap:
    """Which live delete files apply to which live data files, by the spec's exact rule
    (lake.deletes.ApplyingDeletes). Built once per plan; the engine fills the rewrite job from it."""

    by_data: Mapping[str, tuple[FileStat, ...]] = field(default_factory=dict)  # data path -> deletes, by path
    by_delete: Mapping[str, frozenset[str]] = field(default_factory=dict)  # delete path -> data paths

    @classmethod
    def of(cls, files: Iterable[FileStat], global_specs: frozenset[int] = frozenset()) -> DeleteMap:
        """`global_specs`: the specs of void fields only, whose deletes are global (global_spec_ids)."""
        files = list(files)
        index = ApplyingDeletes((f for f in files if f.is_delete), global_specs)
        if not index:
            return cls()
        by_data: dict[str, tuple[FileStat, ...]] = {}
        by_delete: dict[str, set[str]] = {}
        shared: dict[tuple[int, ...], tuple[FileStat, ...]] = {}  # one sorted tuple per distinct delete list
        sharing: dict[int, tuple[tuple[FileStat, ...], list[str]]] = {}  # its data files
        for f in files:
            if f.is_delete or not (deletes := index.for_data_file(f)):
                continue
            key = tuple(map(id, deletes))  # the index returns its own objects in a stable order
            if (ordered := shared.get(key)) is None:
                ordered = shared[key] = tuple(sorted(deletes, key=lambda d: d.path))
            by_data[f.path] = ordered
            sharing.setdefault(id(ordered), (ordered, []))[1].append(f.path)
        for ordered, paths in sharing.values():
            for d in ordered:
                by_delete.setdefault(d.path, set()).update(paths)
        return cls(by_data, {k: frozenset(v) for k, v in by_delete.items()})

    def for_data(self, path: str) -> tuple[FileStat, ...]:
        return self.by_data.get(path, ())

    def distinct(self, data_paths: Iterable[str]) -> list[FileStat]:
        """The delete files applying to any of `data_paths`, each once, by path."""
        if not self.by_data:
            return []
        lists = {id(t): t for t in map(self.for_data, data_paths)}  # data files share delete lists
        found = {d.path: d for t in lists.values() for d in t}
        return [found[k] for k in sorted(found)]

    def owned_by(self, files: Sequence[FileStat]) -> list[FileStat]:
        """The partition's (`files`) own delete files that apply to some of its data files and to no
        other partition's (a delete-file tier may replace only those), by path."""
        data = {f.path for f in files if not f.is_delete}
        own = [f for f in files if f.is_delete and self._applies_only_to(f, data)]
        return sorted(own, key=lambda f: f.path)

    def covered(self, delete_files: Sequence[FileStat]) -> set[str]:
        """The data files any of `delete_files` applies to."""
        return {p for d in delete_files for p in self.by_delete[d.path]}

    def _applies_only_to(self, delete: FileStat, data_paths: set[str]) -> bool:
        covered = self.by_delete.get(delete.path, frozenset())
        return bool(covered) and covered <= data_paths


def read_amplification(records: int, delete_records: int) -> float:
    """Rows a reader decodes per live row it returns: (records + delete_records) / max(live, 1).

    `records`: the rows of the data files; `delete_records`: the rows of the delete files that
    apply to them, each delete file read once; live = records - delete_records, i.e. each delete
    row is taken to delete one row (an estimate: an equality-delete row can match none or many,
    a position-delete row of another file none). 1.0 when no deletes apply."""
    if not delete_records:
        return 1.0
    return (records + delete_records) / max(records - delete_records, 1)


@dataclass(frozen=True)
class PartitionStats:
    partition_key: str
    data_files: int
    data_bytes: int
    records: int
    fragments: int
    undersized: int
    delete_files: int  # delete files of this partition id (applying or not, to any partition)
    last_write_ms: int
    spec_ids: tuple[int, ...]
    # the delete load: distinct delete files applying to the partition's data files (global ones too)
    position_delete_files: int = 0
    equality_delete_files: int = 0
    data_files_with_deletes: int = 0
    deleted_rows: int = 0  # estimate: the record counts of the applying delete files
    delete_ratio: float = 0.0  # deleted_rows / records, at most 1
    read_amplification: float = 1.0  # see read_amplification()
    bounds_overlap: float | None = None  # on the clustering columns (planning/overlap.py); None: not clustered
    deletion_vectors: int = 0  # of position_delete_files, the deletion vectors (format version 3: one per data file)

    @property
    def avg_file_bytes(self) -> int:
        return self.data_bytes // self.data_files if self.data_files else 0

    @property
    def applying_delete_files(self) -> int:
        return self.position_delete_files + self.equality_delete_files


@dataclass(frozen=True)
class FileGroup:
    """Files rewritten together by one Spark task."""

    paths: tuple[str, ...]
    bytes: int
    data_bytes: int
    records: int
    expected_outputs: int  # files to write: round(data_bytes / target), at least 1


@dataclass(frozen=True)
class PartitionPlan:
    """What to do to one partition. A data rewrite (minor, major) has `groups`; a tier has
    `delete_paths` (the delete files it replaces) and `covered_data_paths` (the data files they
    apply to, which the tier reads but does not rewrite), and no groups. An expiration has
    `drop_paths` (data files removed by metadata), `groups` (files rewritten without expired rows),
    or both, and `expired_rows` (estimated: the dropped files' rows and a share of the others')."""

    stats: PartitionStats
    kind: Kind | None
    groups: tuple[FileGroup, ...] = ()
    reason: str = ""
    benefit: float = 0.0  # see planning/benefit.py
    delete_paths: tuple[str, ...] = ()
    covered_data_paths: tuple[str, ...] = ()
    drop_paths: tuple[str, ...] = ()
    expired_rows: int = 0

    @property
    def partition_key(self) -> str:
        return self.stats.partition_key

    @property
    def worth_compacting(self) -> bool:
        return bool(self.groups or self.delete_paths or self.drop_paths)

    @property
    def is_tier(self) -> bool:
        return self.kind is not None and self.kind.is_tier

    @property
    def input_files(self) -> int:
        return sum(len(g.paths) for g in self.groups)

    @property
    def input_bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    @property
    def source_paths(self) -> list[str]:
        """The data files the plan replaces: rewritten (groups) or dropped."""
        return [*(p for g in self.groups for p in g.paths), *self.drop_paths]


@dataclass(frozen=True)
class FullClock:
    """What full optimizing needs to know besides file statistics: now, and when each partition
    (by key) last had a full rewrite committed (epoch ms; the engine reads it from the ledger)."""

    now_ms: int
    last_full_ms: Mapping[str, int] = field(default_factory=dict)

    def due(self, partition_key: str, interval_ms: int) -> tuple[bool, str]:
        """Whether the partition is due for a full rewrite, and why (or when it will be)."""
        last = self.last_full_ms.get(partition_key)
        if last is None:
            return True, "never fully rewritten"
        age = self.now_ms - last
        if age >= interval_ms:
            return True, f"last full rewrite {age / 1000:.0f}s ago >= full.trigger-interval-ms={interval_ms}"
        return False, f"full: next due in {(interval_ms - age) / 1000:.0f}s (full.trigger-interval-ms={interval_ms})"

    def next_due_ms(self, partition_keys: Iterable[str], interval_ms: int) -> int | None:
        """The earliest time one of these partitions, fully rewritten before, comes due again (after now)."""
        due = [last + interval_ms for k in partition_keys if (last := self.last_full_ms.get(k)) is not None]
        return min((t for t in due if t > self.now_ms), default=None)


def is_position(delete: FileStat) -> bool:
    """A position-delete file (a deletion vector too), not an equality-delete file."""
    return delete.data_file.content == DataFileContent.POSITION_DELETES
