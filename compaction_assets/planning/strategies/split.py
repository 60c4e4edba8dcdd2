"""`split` (Iceberg's max-file-size-bytes): each data file larger than `split_above_bytes` is a
group of its own, written into `split_outputs` target-size files (Iceberg's rule: the remainder is
a file of its own when it is not undersized, else spread over the others while they stay within
1.1 x target). Only when no data rewrite before it is due: the fragments go first, the split comes
on a later run."""

from __future__ import annotations

from compaction_assets.planning.benefit import SPLIT_WEIGHT
from compaction_assets.planning.model import FileGroup, FileStat, Kind, PartitionPlan
from compaction_assets.planning.policy import MiB, Policy
from compaction_assets.planning.reasons import NoteSlot
from compaction_assets.planning.strategies.base import PlanInput

SPLIT_SPREAD_MAX = 1.1  # a split's remainder is spread over the other outputs while they stay within 1.1 x target


class SplitStrategy:
    note = NoteSlot.NEXT

    def plan(self, p: PlanInput) -> PartitionPlan | str:
        """Split oversized files, or "" when the partition has none (candidates: current spec, not in flight)."""
        limit = p.policy.split_above_bytes
        oversized = sorted(
            (f for f in p.data if f.size > limit and f.spec_id == p.current_spec_id and f.path not in p.in_flight),
            key=lambda f: f.path,
        )
        if not oversized:
            return ""
        groups = tuple(g for g in (_split_group(f, p.policy) for f in oversized) if g.expected_outputs > 1)
        if not groups:
            too_little = "hold too little column data or rows to split"
            return f"{len(oversized)} file(s) > max-file-size-bytes={limit} {too_little}"
        added = sum(g.expected_outputs - 1 for g in groups)
        why = (
            f"{Kind.SPLIT}: {len(groups)} file(s) > max-file-size-bytes={limit} split into "
            f"{len(groups) + added} file(s) of about target={p.policy.target_file_size_bytes}"
        )
        if p.deletes.by_data and (applied := sum(g.paths[0] in p.deletes.by_data for g in groups)):
            why += f"; {applied} file(s) get their deletes applied"
        read_mib = max(sum(g.bytes for g in groups), 1) / MiB
        return PartitionPlan(p.stats, Kind.SPLIT, groups, reason=why, benefit=SPLIT_WEIGHT * added / read_mib)


def _split_group(f: FileStat, policy: Policy) -> FileGroup:
    """One oversized file as its own group; a file of fewer rows than outputs (large values) splits
    into at most a row each."""
    outputs = min(split_outputs(f.data_bytes, policy), f.record_count)
    return FileGroup((f.path,), f.size, f.data_bytes, f.record_count, outputs)


def split_outputs(data_bytes: int, policy: Policy) -> int:
    """Files an oversized file's data becomes, as Iceberg's SizeBasedFileRewriter.numOutputFiles: the
    remainder past whole target-size files is a file of its own when it would not be undersized;
    else it is spread over the others if that keeps them within SPLIT_SPREAD_MAX x target."""
    target = policy.target_file_size_bytes
    if data_bytes < target:
        return 1
    whole, remainder = divmod(data_bytes, target)
    if remainder > policy.undersized_below_bytes:
        return whole + 1
    if data_bytes / whole < min(SPLIT_SPREAD_MAX * target, policy.split_above_bytes):
        return whole
    return whole + 1
