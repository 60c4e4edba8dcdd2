"""Planner: pure functions from file statistics to rewrite groups. No I/O; same input, same plan.

Minor compaction bin-packs fragments (files <= target/fragment_ratio) into groups of about one
target file. Packing counts each file's column data bytes (its manifest column sizes), not its
size on disk: a tiny file is mostly footer, which merging removes. Major compaction rewrites
every undersized file (< min_target_size_ratio x target) in groups of at most max_group_bytes,
writing target-size files. A partition with a file that some delete file can apply to (any
delete file of the table: same partition tuple, global, or referencing the file; decided by
lake.deletes, the rule the commit validates with) or with only files of an older partition spec
is left alone, with the reason; so is every partition of a table the caller refuses (e.g. a
format it cannot commit), with its reason. Files are grouped by partition id (spec id, typed
values), never by their rendered key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from compaction_assets.planning.policy import MiB, Policy


class Kind(StrEnum):
    MINOR = "minor"
    MAJOR = "major"


class FileStat(Protocol):
    """What the planner needs to know about one file (lake.files.LiveFile has these)."""

    @property
    def path(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def record_count(self) -> int: ...
    @property
    def spec_id(self) -> int: ...
    @property
    def is_delete(self) -> bool: ...

    partition_id: Hashable  # files with equal ids are one partition
    partition_key: str  # its injective rendering
    added_at_ms: int


@dataclass(frozen=True)
class PartitionStats:
    partition_key: str
    data_files: int
    data_bytes: int
    records: int
    fragments: int
    undersized: int
    delete_files: int
    last_write_ms: int
    spec_ids: tuple[int, ...]

    @property
    def avg_file_bytes(self) -> int:
        return self.data_bytes // self.data_files if self.data_files else 0


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
    stats: PartitionStats
    kind: Kind | None
    groups: tuple[FileGroup, ...] = ()
    reason: str = ""
    benefit: float = 0.0  # files removed per MiB rewritten

    @property
    def partition_key(self) -> str:
        return self.stats.partition_key

    @property
    def worth_compacting(self) -> bool:
        return bool(self.groups)

    @property
    def input_files(self) -> int:
        return sum(len(g.paths) for g in self.groups)

    @property
    def input_bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    @property
    def source_paths(self) -> list[str]:
        return [p for g in self.groups for p in g.paths]


@dataclass
class _Bin:
    capacity: int
    files: list[FileStat] = field(default_factory=list)
    used: int = 0  # data bytes


def partition_stats(partition_key: str, files: Sequence[FileStat], policy: Policy) -> PartitionStats:
    data = [f for f in files if not f.is_delete]
    return PartitionStats(
        partition_key=partition_key,
        data_files=len(data),
        data_bytes=sum(f.size for f in data),
        records=sum(f.record_count for f in data),
        fragments=sum(f.size <= policy.fragment_max_bytes for f in data),
        undersized=sum(f.size < policy.undersized_below_bytes for f in data),
        delete_files=len(files) - len(data),
        last_write_ms=max((f.added_at_ms for f in files), default=0),
        spec_ids=tuple(sorted({f.spec_id for f in data})),
    )


def plan_partition(
    partition_key: str,
    files: Sequence[FileStat],
    policy: Policy,
    current_spec_id: int,
    in_flight: Collection[str] = (),
    with_deletes: Collection[str] = (),
    refused: str = "",
) -> PartitionPlan:
    """Decide minor, major or nothing for one partition, and group its files. `with_deletes`:
    paths of the data files a delete file can apply to (rewriting them would bring deleted rows
    back, or make a delete older than the result stop applying). A non-empty `refused` is why the
    table is not compacted at all: the plan is nothing, with that reason."""
    stats = partition_stats(partition_key, files, policy)
    if refused:
        return PartitionPlan(stats, None, reason=refused)
    if not policy.enabled:
        return PartitionPlan(stats, None, reason="compaction is paused for this table (compaction.enabled=false)")
    if deleted := sum(not f.is_delete and f.path in with_deletes for f in files):
        return PartitionPlan(
            stats, None, reason=f"delete files can apply to {deleted} file(s): left alone (deletes are not rewritten)"
        )
    candidates = [f for f in files if f.spec_id == current_spec_id and f.path not in in_flight]
    fragments = [f for f in candidates if f.size <= policy.fragment_max_bytes]
    undersized = [f for f in candidates if f.size < policy.undersized_below_bytes]
    if len(fragments) >= policy.min_input_files:
        kind, chosen, capacity = Kind.MINOR, fragments, policy.target_file_size_bytes
    elif len(undersized) >= policy.min_input_files:
        kind, chosen, capacity = Kind.MAJOR, undersized, policy.max_group_bytes
    else:
        return PartitionPlan(
            stats, None, reason=_nothing_reason(stats, files, candidates, fragments, undersized, policy)
        )
    groups = tuple(_to_group(b, policy) for b in _bin_pack(chosen, capacity) if len(b.files) >= 2)
    if not groups:
        return PartitionPlan(stats, None, reason=f"{kind} candidates do not pack into any group of 2+ files")
    removed = sum(len(g.paths) - g.expected_outputs for g in groups)
    rewritten_mib = max(sum(g.bytes for g in groups), 1) / MiB
    return PartitionPlan(
        stats, kind, groups, reason=f"{kind}: {len(chosen)} candidate file(s)", benefit=removed / rewritten_mib
    )


def plan_table(
    files: Iterable[FileStat],
    policy: Policy,
    current_spec_id: int,
    in_flight: Collection[str] = (),
    with_deletes: Collection[str] = (),
    refused: str = "",
) -> list[PartitionPlan]:
    """Plan every partition (files grouped by partition id); best benefit first, then partition key.

    Raises:
        ValueError: two partitions share a key (keys must be injective: the CLI, the ledger and
            Dagster address partitions by key).
    """
    by_partition: dict[Hashable, list[FileStat]] = {}
    for f in files:
        by_partition.setdefault(f.partition_id, []).append(f)
    keys = Counter(v[0].partition_key for v in by_partition.values())
    if clashes := sorted(k for k, n in keys.items() if n > 1):
        raise ValueError(f"partition key {clashes[0]!r} names {keys[clashes[0]]} different partitions")
    plans = [
        plan_partition(v[0].partition_key, v, policy, current_spec_id, in_flight, with_deletes, refused)
        for v in by_partition.values()
    ]
    return sorted(plans, key=lambda p: (-p.benefit, p.partition_key))


def _bin_pack(files: Sequence[FileStat], capacity: int) -> list[_Bin]:
    """First-fit decreasing by data bytes (what lands in the output); ties broken by path."""
    bins: list[_Bin] = []
    for f in sorted(files, key=lambda f: (-f.data_bytes, f.path)):
        target = next((b for b in bins if b.used + f.data_bytes <= b.capacity), None)
        if target is None:
            target = _Bin(capacity)
            bins.append(target)
        target.files.append(f)
        target.used += f.data_bytes
    return bins


def _to_group(b: _Bin, policy: Policy) -> FileGroup:
    return FileGroup(
        paths=tuple(sorted(f.path for f in b.files)),
        bytes=sum(f.size for f in b.files),
        data_bytes=b.used,
        records=sum(f.record_count for f in b.files),
        expected_outputs=max(1, round(b.used / policy.target_file_size_bytes)),
    )


def _nothing_reason(stats, files, candidates, fragments, undersized, policy: Policy) -> str:
    if not stats.data_files:
        return "no data files"
    skipped = len(files) - len(candidates)
    note = f" ({skipped} file(s) of an older spec or in flight not counted)" if skipped else ""
    return (
        f"{len(fragments)} fragment(s) and {len(undersized)} undersized file(s), "
        f"fewer than min_input_files={policy.min_input_files}{note}"
    )
