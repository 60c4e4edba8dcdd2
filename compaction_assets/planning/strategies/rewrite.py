"""`major` / `minor`: a data rewrite when a delete trigger fires, else by file size.

Delete triggers (kind major): a candidate file with at least `delete_file_threshold` applying
delete files is rewritten; when the partition's deleted-row ratio reaches
`delete_ratio_threshold`, every candidate file with an applying delete is. They are bin-packed with
the partition's fragments into groups of about one target file (so a large rewrite spreads over
Spark tasks); a file with deletes is a group of its own if nothing packs with it (it shrinks; its
deletes go). By file size: minor bin-packs at least `min_input_files` fragments (files <=
target/fragment_ratio) into groups of about one target file; else major rewrites at least that many
undersized files (< min_target_size_ratio x target) in groups of at most max_group_bytes. Fragments
with deletes get them applied. Candidates: files of the current spec no running attempt holds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compaction_assets.planning.benefit import rewrite_benefit
from compaction_assets.planning.model import DeleteMap, FileStat, Kind, PartitionPlan, PartitionStats
from compaction_assets.planning.packing import bin_pack, to_group
from compaction_assets.planning.policy import Policy
from compaction_assets.planning.reasons import NoteSlot
from compaction_assets.planning.strategies.base import PlanInput


@dataclass(frozen=True)
class _Candidates:
    """The partition's files a data rewrite may take, by what makes them worth it."""

    data: Sequence[FileStat]  # every data file
    candidates: Sequence[FileStat]  # current spec, not in flight
    fragments: Sequence[FileStat]
    undersized: Sequence[FileStat]
    with_deletes: Sequence[FileStat]

    @classmethod
    def of(cls, p: PlanInput) -> _Candidates:
        policy = p.policy
        candidates = [f for f in p.data if f.spec_id == p.current_spec_id and f.path not in p.in_flight]
        fragment_max, undersized_below = policy.fragment_max_bytes, policy.undersized_below_bytes
        return cls(
            data=p.data,
            candidates=candidates,
            fragments=[f for f in candidates if f.size <= fragment_max],
            undersized=[f for f in candidates if f.size < undersized_below],
            with_deletes=[f for f in candidates if f.path in p.deletes.by_data] if p.deletes.by_data else [],
        )


class RewriteStrategy:
    note = NoteSlot.LEAD

    def plan(self, p: PlanInput) -> PartitionPlan | str:
        """A data rewrite (delete triggers first, then file size), or why there is none."""
        c = _Candidates.of(p)
        chosen = _by_deletes(p, c) or _by_size(p.policy, c)
        if chosen is None:
            return _nothing_reason(p.stats, c, p.deletes, p.policy)
        kind, files, capacity, why = chosen
        # a group of one is worth it only when the file sheds deletes
        bins = [b for b in bin_pack(files, capacity) if len(b.files) >= 2 or p.deletes.for_data(b.files[0].path)]
        if not bins:
            return f"{kind} candidates do not pack into any group of 2+ files or a file with deletes"
        groups = tuple(to_group(b, p.policy) for b in bins)
        if p.deletes.by_data and (applied := sum(path in p.deletes.by_data for g in groups for path in g.paths)):
            why += f"; {applied} file(s) get their deletes applied"
        return rewrite_benefit(PartitionPlan(p.stats, kind, groups, reason=f"{kind}: {why}"), p.deletes)


_Choice = tuple[Kind, list[FileStat], int, str]  # kind, files, group capacity, why


def _by_deletes(p: PlanInput, c: _Candidates) -> _Choice | None:
    """A major rewrite of the candidate files a delete trigger names, with the fragments."""
    policy, stats, deletes = p.policy, p.stats, p.deletes
    by_count = [f for f in c.with_deletes if len(deletes.for_data(f.path)) >= policy.delete_file_threshold]
    by_ratio = c.with_deletes if stats.delete_ratio >= policy.delete_ratio_threshold else []
    triggers = []
    if by_count:
        triggers.append(
            f"{len(by_count)} file(s) with >= delete-file-threshold={policy.delete_file_threshold} delete files"
        )
    if by_ratio:
        triggers.append(
            f"deleted-row ratio {stats.delete_ratio:.2f} >= delete-ratio-threshold={policy.delete_ratio_threshold}: "
            f"its {len(by_ratio)} file(s) with deletes"
        )
    if not triggers:
        return None
    triggered = {f.path: f for f in [*by_count, *by_ratio]}
    extra = [f for f in c.fragments if f.path not in triggered]
    why = f"{' and '.join(triggers)} rewritten" + (f", packed with {len(extra)} fragment(s)" if extra else "")
    return Kind.MAJOR, [*triggered.values(), *extra], policy.target_file_size_bytes, why


def _by_size(policy: Policy, c: _Candidates) -> _Choice | None:
    """Minor when enough fragments, else major when enough undersized files."""
    if len(c.fragments) >= policy.min_input_files:
        why = f"{len(c.fragments)} fragment(s) >= min_input_files={policy.min_input_files}"
        return Kind.MINOR, list(c.fragments), policy.target_file_size_bytes, why
    if len(c.undersized) >= policy.min_input_files:
        why = f"{len(c.undersized)} undersized file(s) >= min_input_files={policy.min_input_files}"
        return Kind.MAJOR, list(c.undersized), policy.max_group_bytes, why
    return None


def _nothing_reason(stats: PartitionStats, c: _Candidates, deletes: DeleteMap, policy: Policy) -> str:
    if not stats.data_files:
        return "no data files"
    skipped = len(c.data) - len(c.candidates)
    note = f" ({skipped} file(s) of an older spec or in flight not counted)" if skipped else ""
    reason = (
        f"{len(c.fragments)} fragment(s) and {len(c.undersized)} undersized file(s), "
        f"fewer than min_input_files={policy.min_input_files}{note}"
    )
    if stats.applying_delete_files:
        most = max((len(deletes.for_data(f.path)) for f in c.with_deletes), default=0)
        reason += (
            f"; no delete trigger: at most {most} delete file(s) on a candidate file "
            f"(delete-file-threshold={policy.delete_file_threshold}), deleted-row ratio {stats.delete_ratio:.2f} "
            f"(delete-ratio-threshold={policy.delete_ratio_threshold})"
        )
        if len(c.with_deletes) < stats.data_files_with_deletes:
            reason += f"; {stats.data_files_with_deletes - len(c.with_deletes)} file(s) with deletes not candidates"
    return reason
