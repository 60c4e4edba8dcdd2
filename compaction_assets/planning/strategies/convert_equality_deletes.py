"""`convert-equality-deletes` (a delete-file tier: data files are not rewritten): when at least
`equality_delete_file_threshold` equality-delete files of the partition alone apply, and reading
the key columns of the data files they apply to costs less than CONVERSION_MAX_COST_SHARE of those
files' bytes (what a rewrite would read), they become position deletes. The plan has no groups: it
carries the delete files to replace (`delete_paths`) and the data files they apply to
(`covered_data_paths`). Only delete files of the partition itself that apply to no other
partition's data files qualify: a global delete (of an unpartitioned spec) in a partitioned table
applies across partitions, and only data rewrites apply it."""

from __future__ import annotations

from compaction_assets.planning.benefit import benefit
from compaction_assets.planning.model import FileStat, Kind, PartitionPlan, is_position
from compaction_assets.planning.reasons import NoteSlot
from compaction_assets.planning.strategies.base import PlanInput

CONVERSION_MAX_COST_SHARE = 0.25  # an equality-delete conversion must read < 1/4 of a rewrite's bytes


class ConvertEqualityDeletesStrategy:
    note = NoteSlot.NEXT

    def plan(self, p: PlanInput) -> PartitionPlan | str:
        """convert-equality-deletes, or why not ("" when no equality delete applies)."""
        policy, deletes = p.policy, p.deletes
        own = [d for d in deletes.owned_by(p.files) if not is_position(d)]
        if not own and not p.stats.equality_delete_files:
            return ""
        if len(own) < policy.equality_delete_file_threshold:
            return (
                f"{len(own)} equality-delete file(s) of this partition alone, fewer than "
                f"equality-delete-file-threshold={policy.equality_delete_file_threshold}"
            )
        covered = deletes.covered(own)
        if busy := covered & set(p.in_flight):
            return f"equality deletes apply to {len(busy)} file(s) a running attempt holds: not converted now"
        read, rewrite = _costs(p, own, covered)
        if read >= CONVERSION_MAX_COST_SHARE * rewrite:
            return (
                f"converting {len(own)} equality-delete file(s) would read {read} B of key columns, "
                f"not < {CONVERSION_MAX_COST_SHARE:g} of the {rewrite} B a rewrite reads"
            )
        plan = PartitionPlan(
            p.stats,
            Kind.CONVERT_EQUALITY_DELETES,
            reason=(
                f"{Kind.CONVERT_EQUALITY_DELETES}: {len(own)} equality-delete file(s) >= "
                f"equality-delete-file-threshold={policy.equality_delete_file_threshold}, applying to "
                f"{len(covered)} file(s); reads {read} B of key columns, < {CONVERSION_MAX_COST_SHARE:g} of a "
                f"rewrite's {rewrite} B"
            ),
            delete_paths=tuple(d.path for d in own),
            covered_data_paths=tuple(sorted(covered)),
        )
        return benefit(plan, len(own) - 1, read + sum(d.size for d in own), 0.0)


def _costs(p: PlanInput, own: list[FileStat], covered: set[str]) -> tuple[int, int]:
    """Bytes a conversion reads (the key columns of the covered data files), and a rewrite would."""
    keys_by_file: dict[str, set[int]] = {}
    for d in own:
        for path in p.deletes.by_delete[d.path]:
            keys_by_file.setdefault(path, set()).update(d.data_file.equality_ids or ())
    by_path = {f.path: f for f in p.data}
    read = sum(_key_bytes(by_path[path], keys_by_file[path]) for path in covered)
    return read, sum(by_path[path].size for path in covered)


def _key_bytes(data: FileStat, field_ids: set[int]) -> int:
    """Bytes of the key columns in a data file (manifest column sizes), else its size."""
    sizes = data.data_file.column_sizes or {}
    if not field_ids or any(i not in sizes for i in field_ids):
        return data.size
    return sum(sizes[i] for i in field_ids)
