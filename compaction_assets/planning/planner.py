"""Planner: pure functions from file statistics to rewrite groups. No I/O; same input, same plan.

Files are grouped by partition id (spec id, typed values), never by their rendered key. Per
partition the planner measures its files and the delete load on them (planning/evaluation.py:
`PartitionStats`; which live delete files apply to which data file is the spec's exact rule,
lake.deletes.ApplyingDeletes, in `DeleteMap`; a rewrite applies them and writes only live rows),
then tries one strategy per kind (planning/strategies/, each behind `Strategy`), first match wins:
0. `expire` (strategies/expire.py): rows past the table's retention, whatever else is due;
1. `full` (strategies/full.py): full optimizing, when the partition is due for it;
2. `major` / `minor` (strategies/rewrite.py): a data rewrite when a delete trigger fires, else by
   file size. Minor bin-packs fragments (files <= target/fragment_ratio) into groups of about one
   target file; packing counts each file's column data bytes (its manifest column sizes), not its
   size on disk: a tiny file is mostly footer, which merging removes (planning/packing.py);
2b. `split` (strategies/split.py): oversized data files, when no data rewrite above is due;
2c. `cluster` (strategies/cluster.py): healthy sizes, badly clustered (tables with a sort order or
   z-order columns);
3. `old-spec` (strategies/old_spec.py): a partition of an earlier partition spec, rewritten into
   the current one;
4. `convert-equality-deletes` (strategies/convert_equality_deletes.py) and
5. `rewrite-position-deletes` (strategies/rewrite_position_deletes.py): the delete-file tiers,
   which replace delete files and rewrite no data file;
6. nothing, with the reason.
Minor, major, full, split and cluster take only files of the current spec that no running attempt
holds. The chosen plan's reason says why the strategies before it did not fire
(planning/reasons.py). A table the caller refuses (e.g. a format it cannot commit) plans nothing,
with its reason. Plans are ranked by benefit (planning/benefit.py).

The model (`Kind`, `PartitionPlan`, `FileGroup`, `DeleteMap`, `FullClock`, ...) lives in
planning/model.py; its names are re-exported here for the modules that import them from the planner.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import replace

from compaction_assets.lake.clustering import Clustering
from compaction_assets.planning.benefit import EXPIRE_BENEFIT
from compaction_assets.planning.evaluation import partition_stats
from compaction_assets.planning.expiration import ExpireRule
from compaction_assets.planning.model import (
    DeleteMap,
    FileGroup,
    FileStat,
    FullClock,
    Kind,
    PartitionPlan,
    PartitionStats,
    read_amplification,
)
from compaction_assets.planning.policy import Policy
from compaction_assets.planning.reasons import Notes, NoteSlot, load_text
from compaction_assets.planning.strategies.base import PlanInput, Strategy
from compaction_assets.planning.strategies.cluster import ClusterStrategy
from compaction_assets.planning.strategies.convert_equality_deletes import ConvertEqualityDeletesStrategy
from compaction_assets.planning.strategies.expire import ExpireStrategy
from compaction_assets.planning.strategies.full import FullStrategy
from compaction_assets.planning.strategies.old_spec import OldSpecStrategy
from compaction_assets.planning.strategies.rewrite import RewriteStrategy
from compaction_assets.planning.strategies.rewrite_position_deletes import RewritePositionDeletesStrategy
from compaction_assets.planning.strategies.split import SplitStrategy

__all__ = [
    "EXPIRE_BENEFIT",
    "STRATEGIES",
    "DeleteMap",
    "FileGroup",
    "FileStat",
    "FullClock",
    "Kind",
    "PartitionPlan",
    "PartitionStats",
    "partition_stats",
    "plan_partition",
    "plan_table",
    "read_amplification",
]

# The order is the planner's rule (the module doc): the first strategy that plans a partition wins.
STRATEGIES: tuple[Strategy, ...] = (
    ExpireStrategy(),
    FullStrategy(),
    RewriteStrategy(),
    SplitStrategy(),
    ClusterStrategy(),
    OldSpecStrategy(),
    ConvertEqualityDeletesStrategy(),
    RewritePositionDeletesStrategy(),
)


def plan_partition(
    partition_key: str,
    files: Sequence[FileStat],
    policy: Policy,
    current_spec_id: int,
    in_flight: Collection[str] = (),
    deletes: DeleteMap | None = None,
    refused: str = "",
    clock: FullClock | None = None,
    expire: ExpireRule | str | None = None,
    clustering: Clustering | None = None,
    clustered: Collection[str] = frozenset(),
    tiers_refused: str = "",
) -> PartitionPlan:
    """Decide an expiration, a data rewrite, a cheaper tier or nothing for one partition (see the
    module doc). A non-empty `tiers_refused` is why the delete-file tiers are not considered (said
    when one would have been due).

    `deletes`: which delete files apply to which data files, for the whole table (global deletes
    live in another partition); None: computed from `files` alone. A non-empty `refused` is why
    the table is not compacted at all: the plan is nothing, with that reason. `clock`: when the
    partition was last fully rewritten; None: full optimizing is not considered. `expire`: the
    table's expiration rule, None when off, or why it cannot run (added to the reason).
    `clustering`: the table's clustering columns (None: no sort order, no z-order); `clustered`:
    the data files our last cluster rewrite of their partition wrote."""
    deletes = deletes if deletes is not None else DeleteMap.of(files)
    stats = partition_stats(partition_key, files, policy, deletes, clustering)
    if refused:
        return PartitionPlan(stats, None, reason=refused)
    notes = Notes(load_text(stats))
    if not policy.enabled:
        paused = "compaction is paused for this table (compaction.enabled=false)"
        return PartitionPlan(stats, None, reason=f"{paused}; {notes.load}")
    if not isinstance(expire, ExpireRule):
        notes.add(NoteSlot.LOAD, expire or "")  # why the expiration rule cannot run
    data = [f for f in files if not f.is_delete]
    p = PlanInput(stats, files, data, policy, current_spec_id, in_flight, deletes, clock, expire, clustering, clustered)
    for strategy in STRATEGIES:
        outcome = strategy.plan(p)
        if not isinstance(outcome, PartitionPlan):
            notes.add(strategy.note, outcome)
        elif outcome.is_tier and tiers_refused:
            notes.add(NoteSlot.NEXT, f"{outcome.kind} not run: {tiers_refused}")
        else:
            return replace(outcome, reason=notes.reason_of(outcome))
    return PartitionPlan(stats, None, reason=notes.nothing())


def plan_table(
    files: Iterable[FileStat],
    policy: Policy,
    current_spec_id: int,
    in_flight: Collection[str] = (),
    deletes: DeleteMap | None = None,
    refused: str = "",
    clock: FullClock | None = None,
    expire: ExpireRule | str | None = None,
    clustering: Clustering | None = None,
    clustered: Collection[str] = frozenset(),
    tiers_refused: str = "",
) -> list[PartitionPlan]:
    """Plan every partition (files grouped by partition id); best benefit first, then partition key.
    `deletes`: DeleteMap.of(files) when None (the engine passes the one it also builds jobs from).
    `clock`, `expire`, `clustering`, `clustered`, `tiers_refused`: see plan_partition (the engine
    always passes a clock).

    Raises:
        ValueError: two partitions share a key (keys must be injective: the CLI, the ledger and
            Dagster address partitions by key).
    """
    files = list(files)
    deletes = deletes if deletes is not None else DeleteMap.of(files)
    by_partition: dict[Hashable, list[FileStat]] = {}
    for f in files:
        by_partition.setdefault(f.partition_id, []).append(f)
    keys = Counter(v[0].partition_key for v in by_partition.values())
    if clashes := sorted(k for k, n in keys.items() if n > 1):
        raise ValueError(f"partition key {clashes[0]!r} names {keys[clashes[0]]} different partitions")
    plans = [
        plan_partition(
            v[0].partition_key,
            v,
            policy,
            current_spec_id,
            in_flight,
            deletes,
            refused,
            clock,
            expire,
            clustering,
            clustered,
            tiers_refused,
        )
        for v in by_partition.values()
    ]
    return sorted(plans, key=lambda p: (-p.benefit, p.partition_key))
