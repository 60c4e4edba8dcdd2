"""`old-spec` (Iceberg's rewrite_data_files `output-spec-id`): a partition of an earlier partition
spec (its partition id names that spec): all its data files no running attempt holds, in groups
of at most max_group_bytes (a single file qualifies: the point is the spec), rewritten into the
current spec, each row into the partition the current spec gives it. Its delete files are
applied, as in every data rewrite. Table property `compaction.rewrite-old-specs=false` turns it
off (the partition then plans as before: at most a delete-file tier). The size triggers count
current-spec files only, so they never fire on such a partition: its why-not replaces theirs."""

from __future__ import annotations

from dataclasses import replace

from compaction_assets.planning.benefit import OLD_SPEC_WEIGHT, READS_SAVED_WEIGHT, deletes_gone, reads_saved
from compaction_assets.planning.model import Kind, PartitionPlan
from compaction_assets.planning.packing import pack_groups
from compaction_assets.planning.policy import MiB
from compaction_assets.planning.reasons import NoteSlot
from compaction_assets.planning.strategies.base import PlanInput


class OldSpecStrategy:
    note = NoteSlot.LEAD

    def plan(self, p: PlanInput) -> PartitionPlan | str:
        """old-spec: every data file of a partition of an earlier spec, rewritten into the current spec
        in groups of at most max_group_bytes (one file is enough: the point is the spec); or why not
        ("" for a partition of the current spec)."""
        data, current = p.data, p.current_spec_id
        old = sorted({f.spec_id for f in data} - {current})
        if not old:
            return ""
        specs = f"spec {', '.join(map(str, old))}, not the current spec {current}"
        if not p.policy.rewrite_old_specs:
            return f"{len(data)} file(s) of {specs}: not rewritten (compaction.rewrite-old-specs=false)"
        chosen = [f for f in data if f.path not in p.in_flight]
        if not chosen:
            return f"{len(data)} file(s) of {specs}, all held by a running attempt"
        groups = pack_groups(chosen, p.policy.max_group_bytes, p.policy)
        why = f"{len(chosen)} file(s) of {specs}: rewritten into spec {current}"
        if applied := sum(f.path in p.deletes.by_data for f in chosen) if p.deletes.by_data else 0:
            why += f"; {applied} file(s) get their deletes applied"
        plan = PartitionPlan(p.stats, Kind.OLD_SPEC, groups, reason=f"{Kind.OLD_SPEC}: {why}")
        saved = reads_saved(p.stats, deletes_gone({f.path for f in chosen}, p.deletes))
        per_mib = OLD_SPEC_WEIGHT * len(chosen) / (max(sum(g.bytes for g in groups), 1) / MiB)
        return replace(plan, benefit=per_mib + READS_SAVED_WEIGHT * max(saved, 0.0))
