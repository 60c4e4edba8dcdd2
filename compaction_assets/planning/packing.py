"""Bin packing: a partition's chosen files into rewrite groups (one Spark task's files each).

First-fit decreasing by data bytes, then balanced. Which groups then share a Spark task is
execution/packing.py's concern, not this one's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from compaction_assets.planning.model import FileGroup, FileStat
from compaction_assets.planning.policy import Policy


@dataclass
class Bin:
    capacity: int
    files: list[FileStat] = field(default_factory=list)
    used: int = 0  # data bytes


def bin_pack(files: Sequence[FileStat], capacity: int) -> list[Bin]:
    """First-fit decreasing by data bytes (what lands in the output); ties broken by path. Then the
    same number of bins is balanced (each file to the least-filled bin, largest first) where that
    keeps every bin within capacity: groups are Spark tasks, and the fullest one sets the pace."""
    ordered = sorted(files, key=lambda f: (-f.data_bytes, f.path))
    bins: list[Bin] = []
    for f in ordered:
        target = next((b for b in bins if b.used + f.data_bytes <= b.capacity), None)
        if target is None:
            target = Bin(capacity)
            bins.append(target)
        target.files.append(f)
        target.used += f.data_bytes
    if len(bins) < 2:
        return bins
    balanced = [Bin(capacity) for _ in bins]
    for f in ordered:
        target = min(balanced, key=lambda b: b.used)
        target.files.append(f)
        target.used += f.data_bytes
    return balanced if all(b.used <= capacity for b in balanced) else bins


def to_group(b: Bin, policy: Policy) -> FileGroup:
    """A packed bin as a rewrite group, with the target-size files it is expected to write."""
    return FileGroup(
        paths=tuple(sorted(f.path for f in b.files)),
        bytes=sum(f.size for f in b.files),
        data_bytes=b.used,
        records=sum(f.record_count for f in b.files),
        expected_outputs=max(1, round(b.used / policy.target_file_size_bytes)),
    )


def pack_groups(files: Sequence[FileStat], capacity: int, policy: Policy) -> tuple[FileGroup, ...]:
    """`files` bin-packed into groups of at most `capacity` data bytes."""
    return tuple(to_group(b, policy) for b in bin_pack(files, capacity))
