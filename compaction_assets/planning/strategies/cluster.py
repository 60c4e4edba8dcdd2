"""`cluster` (when the table has a sort order or z-order columns and no strategy before it fires):
the partition's files are healthy in size but badly clustered: their bounds_overlap
(planning/overlap.py) on the clustering columns is at least `cluster_min_overlap`. Every data file
of the current spec is rewritten sorted / z-ordered, bin-packed into groups of at most
max_group_bytes. A partition whose data files all came from our last cluster rewrite of it is left
alone, however much they still overlap (`clustered`: the engine reads them from the ledger), so an
unchanged partition is clustered once, not forever."""

from __future__ import annotations

from dataclasses import replace

from compaction_assets.planning.benefit import CLUSTER_WEIGHT, CLUSTERED_OVERLAP
from compaction_assets.planning.model import Kind, PartitionPlan
from compaction_assets.planning.packing import pack_groups
from compaction_assets.planning.policy import MiB
from compaction_assets.planning.reasons import NoteSlot
from compaction_assets.planning.strategies.base import PlanInput


class ClusterStrategy:
    note = NoteSlot.NEXT

    def plan(self, p: PlanInput) -> PartitionPlan | str:
        """cluster: the partition rewritten sorted / z-ordered, or why not ("" when the table has no
        clustering columns)."""
        if p.clustering is None:
            return ""
        policy = p.policy
        overlap = p.stats.bounds_overlap or 0.0
        measured = f"bounds overlap {overlap:.2f} on {p.clustering.describe()}"
        candidates = [f for f in p.data if f.spec_id == p.current_spec_id]
        if len(candidates) < 2:
            return f"{measured}: fewer than 2 data files of the current spec, nothing to cluster"
        if overlap < policy.cluster_min_overlap:
            return f"{measured} < cluster-min-overlap={policy.cluster_min_overlap:g}"
        if all(f.path in p.clustered for f in p.data):
            return f"{measured}, but every file comes from our last cluster rewrite of it: not clustered again"
        if busy := [f for f in candidates if f.path in p.in_flight]:
            return f"{measured}, but {len(busy)} of its file(s) are held by a running attempt: not clustered now"
        groups = pack_groups(candidates, policy.max_group_bytes, policy)
        plan = PartitionPlan(
            p.stats,
            Kind.CLUSTER,
            groups,
            reason=(
                f"{Kind.CLUSTER}: {measured} >= cluster-min-overlap={policy.cluster_min_overlap:g}; "
                f"{len(candidates)} file(s) rewritten in {len(groups)} group(s)"
            ),
        )
        per_mib = max(overlap - CLUSTERED_OVERLAP, 0.0) / (max(plan.input_bytes, 1) / MiB)
        return replace(plan, benefit=CLUSTER_WEIGHT * per_mib)
