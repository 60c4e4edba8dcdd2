"""`expire` (data expiration, planning/expiration.py): comes first. When `compaction.expire.field`
and `compaction.expire.retention-ms` are both set, a partition with data files that hold rows past
retention gets kind `expire`, whatever else it needs: its files whose every row expired are dropped
by a metadata-only delete (`drop_paths`, never read; a partition whose files all go is dropped
whole), the files with some expired rows are rewritten without them (`groups`, deletes applying to
them applied as in any rewrite). Files of every spec count, those a running attempt holds do not.
A rule the caller could not resolve (its column is not in the current schema) stops the tier: the
reason says so and the other kinds plan as usual."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from compaction_assets.planning.benefit import EXPIRE_BENEFIT
from compaction_assets.planning.expiration import ExpireRule, Verdict
from compaction_assets.planning.model import FileStat, Kind, PartitionPlan
from compaction_assets.planning.packing import pack_groups
from compaction_assets.planning.policy import MiB
from compaction_assets.planning.reasons import NoteSlot
from compaction_assets.planning.strategies.base import PlanInput


class ExpireStrategy:
    note = NoteSlot.LOAD

    def plan(self, p: PlanInput) -> PartitionPlan | str:
        """An expiration, or why not ("" when off or no row of the partition is past retention)."""
        rule = p.expire
        if not isinstance(rule, ExpireRule):
            return ""  # off, or unresolved: the planner says why before any strategy runs
        drops, rewrites, busy = _expiring(p, rule)
        held = f"{busy} file(s) with rows past retention held by a running attempt" if busy else ""
        if not drops and not rewrites:
            return f"{Kind.EXPIRE}: {held}, not expired now" if held else ""
        estimates = {f.path: rule.estimated_rows(f.data_file) for f in rewrites}
        why = _what_goes(drops, rewrites, estimates, whole=len(drops) == len(p.data))
        plan = PartitionPlan(
            p.stats,
            Kind.EXPIRE,
            pack_groups(rewrites, p.policy.target_file_size_bytes, p.policy),
            reason=f"{Kind.EXPIRE}: {rule.describe()}: {why}" + (f"; {held}" if held else ""),
            drop_paths=tuple(f.path for f in drops),
            expired_rows=sum(f.record_count for f in drops) + sum(estimates.values()),
        )
        freed = sum(f.size for f in drops) + sum(f.size * estimates[f.path] / max(f.record_count, 1) for f in rewrites)
        return replace(plan, benefit=EXPIRE_BENEFIT + freed / MiB)


def _expiring(p: PlanInput, rule: ExpireRule) -> tuple[list[FileStat], list[FileStat], int]:
    """The data files to drop (by path) and to rewrite, of those no running attempt holds, and how
    many files with expired rows a running attempt holds."""
    verdicts = {f.path: rule.verdict(f.data_file) for f in p.data}
    expiring = [f for f in p.data if verdicts[f.path] != Verdict.KEEP]
    todo = [f for f in expiring if f.path not in p.in_flight]
    drops = sorted((f for f in todo if verdicts[f.path] == Verdict.DROP), key=lambda f: f.path)
    rewrites = [f for f in todo if verdicts[f.path] == Verdict.REWRITE]
    return drops, rewrites, len(expiring) - len(todo)


def _what_goes(
    drops: Sequence[FileStat], rewrites: Sequence[FileStat], estimates: Mapping[str, int], whole: bool
) -> str:
    """What the expiration drops and rewrites."""
    dropped_rows = sum(f.record_count for f in drops)
    if whole:
        return f"whole partition past retention: its {len(drops)} file(s) ({dropped_rows} rows) dropped by metadata"
    parts = [f"{len(drops)} file(s) ({dropped_rows} rows) dropped by metadata"] if drops else []
    if rewrites:
        parts.append(
            f"{len(rewrites)} file(s) ({sum(f.record_count for f in rewrites)} rows, ~{sum(estimates.values())} "
            "expired, estimated from bounds) rewritten without expired rows"
        )
    return "; ".join(parts)
