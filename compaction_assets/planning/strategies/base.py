"""The interface every strategy implements, and what it is given."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from compaction_assets.lake.clustering import Clustering
from compaction_assets.planning.expiration import ExpireRule
from compaction_assets.planning.model import DeleteMap, FileStat, FullClock, PartitionPlan, PartitionStats
from compaction_assets.planning.policy import Policy
from compaction_assets.planning.reasons import NoteSlot


@dataclass(frozen=True)
class PlanInput:
    """One partition as every strategy sees it (planner.plan_partition documents the fields)."""

    stats: PartitionStats
    files: Sequence[FileStat]  # data and delete files of the partition
    data: Sequence[FileStat]  # its data files
    policy: Policy
    current_spec_id: int
    in_flight: Collection[str]  # paths a running attempt holds
    deletes: DeleteMap  # which delete files apply to which data files, table-wide
    clock: FullClock | None = None
    expire: ExpireRule | str | None = None
    clustering: Clustering | None = None
    clustered: Collection[str] = frozenset()


class Strategy(Protocol):
    """Plans one kind (or, for the size-triggered rewrite, minor or major) for a partition."""

    note: NoteSlot  # where its why-not goes when a later strategy's plan is chosen

    def plan(self, p: PlanInput) -> PartitionPlan | str:
        """The partition's plan of this kind, or why not ("" when the kind does not concern it)."""
        ...
