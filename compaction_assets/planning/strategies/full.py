"""`full` (full optimizing, Amoro's full trigger interval), when `full_trigger_interval_ms` is set
and the partition is due: it was never fully rewritten, or its last full rewrite (`FullClock`: the
engine reads it from the ledger, the planner does no I/O) is at least that long ago. Every data
file of the partition (current spec; none in flight, else it waits) is rewritten, deletes applied,
in groups of at most max_group_bytes (the engine sorts them by the table's sort order, as major).
A partition already optimal is left alone, with the reason: no delete applies and the rewrite
would not lower its file count (a single file, or files of about the target size already)."""

from __future__ import annotations

from dataclasses import replace

from compaction_assets.planning.benefit import FULL_WEIGHT, rewrite_benefit
from compaction_assets.planning.model import Kind, PartitionPlan
from compaction_assets.planning.packing import pack_groups
from compaction_assets.planning.reasons import NoteSlot
from compaction_assets.planning.strategies.base import PlanInput


class FullStrategy:
    note = NoteSlot.NEXT

    def plan(self, p: PlanInput) -> PartitionPlan | str:
        """Full optimizing, or why not ("" when it is off or does not concern the partition)."""
        interval, data = p.policy.full_trigger_interval_ms, p.data
        if interval is None or p.clock is None or not data or data[0].spec_id != p.current_spec_id:
            return ""  # files of an older spec are another partition's (the old-spec tier's)
        due, why = p.clock.due(p.stats.partition_key, interval)
        if not due:
            return why
        if busy := [f for f in data if f.path in p.in_flight]:
            return f"full: due ({why}) but {len(busy)} file(s) are held by a running attempt: waits"
        groups = pack_groups(data, p.policy.max_group_bytes, p.policy)
        with_deletes = sum(f.path in p.deletes.by_data for f in data) if p.deletes.by_data else 0
        outputs = sum(g.expected_outputs for g in groups)
        if not with_deletes and len(data) - outputs <= 0:
            return (
                f"full: due ({why}) but already optimal: {len(data)} data file(s) would stay {outputs}, "
                "no deletes apply"
            )
        why = f"{Kind.FULL}: due ({why}): all {len(data)} data file(s) rewritten in {len(groups)} group(s)"
        if with_deletes:
            why += f"; {with_deletes} file(s) get their deletes applied"
        plan = rewrite_benefit(PartitionPlan(p.stats, Kind.FULL, groups, reason=why), p.deletes)
        return replace(plan, benefit=FULL_WEIGHT * plan.benefit)
