"""`rewrite-position-deletes` (a delete-file tier): when at least `position_delete_file_threshold`
small position-delete files of the partition alone apply (small: undersized, < min_target_size_ratio
x target, as the min-file-size of Iceberg's rewrite_position_delete_files), they are combined into
one. Like every delete-file tier, the plan has no groups (`delete_paths`, `covered_data_paths`)
and takes only delete files that apply to no other partition's data files."""

from __future__ import annotations

from compaction_assets.planning.benefit import benefit
from compaction_assets.planning.model import Kind, PartitionPlan, is_position
from compaction_assets.planning.reasons import NoteSlot
from compaction_assets.planning.strategies.base import PlanInput


class RewritePositionDeletesStrategy:
    note = NoteSlot.NEXT

    def plan(self, p: PlanInput) -> PartitionPlan | str:
        """rewrite-position-deletes, or why not ("" when no position delete applies)."""
        policy = p.policy
        small = [d for d in p.deletes.owned_by(p.files) if is_position(d) and d.size < policy.undersized_below_bytes]
        if not small and not p.stats.position_delete_files:
            return ""
        if len(small) < policy.position_delete_file_threshold:
            return (
                f"{len(small)} small position-delete file(s) of this partition alone, fewer than "
                f"position-delete-file-threshold={policy.position_delete_file_threshold}"
            )
        covered = p.deletes.covered(small)
        if busy := covered & set(p.in_flight):
            return f"position deletes apply to {len(busy)} file(s) a running attempt holds: not rewritten now"
        plan = PartitionPlan(
            p.stats,
            Kind.REWRITE_POSITION_DELETES,
            reason=(
                f"{Kind.REWRITE_POSITION_DELETES}: {len(small)} small position-delete file(s) >= "
                f"position-delete-file-threshold={policy.position_delete_file_threshold}, applying to "
                f"{len(covered)} file(s): combined into one"
            ),
            delete_paths=tuple(d.path for d in small),
            covered_data_paths=tuple(sorted(covered)),
        )
        return benefit(plan, len(small) - 1, sum(d.size for d in small), 0.0)
