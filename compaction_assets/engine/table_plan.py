"""A table's plan as the engine runs it: the planner's partition plans (planning/planner.py) on
the table's live files, the ledger's in-flight sources and the table's refusals, narrowed to the
partitions asked for, with the manifest rewrite and when to plan again."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from pyiceberg.table import Table

from compaction_assets.commit.ledger import Ledger
from compaction_assets.errors import CompactionError
from compaction_assets.lake.clustering import Clustering, clustering_of
from compaction_assets.lake.deletes import global_spec_ids
from compaction_assets.lake.features import manifest_refusal, refusal, tier_refusal
from compaction_assets.lake.files import LiveFile, live_files
from compaction_assets.planning.expiration import ExpireRule, expire_rule
from compaction_assets.planning.manifests import ManifestPlan, plan_manifests
from compaction_assets.planning.model import DeleteMap, FullClock, Kind, PartitionPlan
from compaction_assets.planning.planner import plan_table
from compaction_assets.planning.policy import Policy


@dataclass(frozen=True)
class TablePlan:
    table_name: str
    snapshot_id: int | None
    policy: Policy
    partitions: list[PartitionPlan]
    refused: str = ""  # why the whole table is not compacted (e.g. format-version 3), or ""
    deletes: DeleteMap = field(default_factory=DeleteMap)  # which delete files apply to which data files
    manifests: ManifestPlan | None = None  # the table-level manifest rewrite (None: no snapshot yet)
    # full optimizing: when a partition fully rewritten before comes due again (epoch ms), or None;
    # the table must be planned again then even if it did not change (the sensor does)
    replan_at_ms: int | None = None
    expire: ExpireRule | str | None = None  # the expiration planned with (None: off; str: why it cannot run)
    clustering: Clustering | None = None  # z-order columns, else sort order (None: neither)
    table_uuid: str | None = None  # the planned table's (recovery refuses an attempt on another of its name)

    @property
    def to_compact(self) -> list[PartitionPlan]:
        return [p for p in self.partitions if p.worth_compacting]

    @property
    def rewrite_manifests_due(self) -> bool:
        """The manifest rewrite is due and no partition is: compactions first (they rewrite
        manifests too, and a rewrite now would be undone by theirs)."""
        return self.manifests is not None and self.manifests.due and not self.to_compact


def plan_loaded_table(
    table: Table,
    table_name: str,
    policy: Policy,
    ledger: Ledger,
    clock: Callable[[], int],
    partition: str | None = None,
    only: Collection[str] | None = None,
) -> tuple[TablePlan, dict[str, LiveFile]]:
    """The table's plan under `policy` and its live files by path. `clock`: now, in epoch ms;
    `partition`: only that partition, which must exist (else CompactionError naming the table's);
    `only`: only those of these partitions the table has."""
    files = live_files(table)
    deletes = DeleteMap.of(files, global_spec_ids(table.metadata.specs().values()))
    in_flight = ledger.in_flight_sources(table_name)
    refused = refusal(table)
    full = full_clock(ledger, table_name, policy, clock)
    expire = expire_rule(table_name, table.schema(), policy, clock())
    clustering = clustering_of(table, table_name, policy)
    clustered = ledger.last_outputs(table_name, str(Kind.CLUSTER)) if clustering else set()
    plans = plan_table(
        files,
        policy,
        table.spec().spec_id,
        in_flight,
        deletes,
        refused,
        clock=full,
        expire=expire,
        clustering=clustering,
        clustered=clustered,
        tiers_refused=tier_refusal(table),
    )
    top_level = {f.field_id for f in table.schema().fields}
    plans = _narrow(table_name, [_unappliable(p, deletes, top_level) for p in plans], partition, only)
    snapshot = table.current_snapshot()
    manifests = plan_manifests(snapshot.manifests(table.io), policy, manifest_refusal(table)) if snapshot else None
    replan_at = None
    if policy.full_trigger_interval_ms is not None:
        replan_at = full.next_due_ms((p.partition_key for p in plans), policy.full_trigger_interval_ms)
    tplan = TablePlan(
        table_name,
        snapshot.snapshot_id if snapshot else None,
        policy,
        plans,
        refused,
        deletes,
        manifests,
        replan_at,
        expire,
        clustering,
        str(table.metadata.table_uuid),
    )
    return tplan, {f.path: f for f in files}


def full_clock(ledger: Ledger, table_name: str, policy: Policy, clock: Callable[[], int]) -> FullClock:
    """Now, and when each partition last had a full rewrite committed (read only when full optimizing is on)."""
    now_ms = clock()
    if policy.full_trigger_interval_ms is None:
        return FullClock(now_ms)
    committed = ledger.last_committed(table_name, str(Kind.FULL))
    return FullClock(now_ms, {k: int(at.timestamp() * 1000) for k, at in committed.items()})


def _narrow(
    table_name: str, plans: list[PartitionPlan], partition: str | None, only: Collection[str] | None
) -> list[PartitionPlan]:
    """The plans of `partition` (which must exist) and of `only`'s partitions, if given."""
    if partition is not None:
        known = sorted(p.partition_key for p in plans)
        plans = [p for p in plans if p.partition_key == partition]
        if not plans:
            known_text = _known(table_name, partition, known)
            raise CompactionError(f"table '{table_name}' has no partition '{partition}' {known_text}")
    if only is not None:
        wanted = set(only)
        plans = [p for p in plans if p.partition_key in wanted]
    return plans


def _known(table_name: str, partition: str, known: list[str]) -> str:
    """The table's partitions for a message: a few (the likeliest meant first) and the count."""
    if not any(known):
        return "(it is unpartitioned: leave out --partition)"
    shown = difflib.get_close_matches(partition, known, n=3, cutoff=0.6) or known[:3]
    more = f", ... ({len(known)} in all)" if len(known) > len(shown) else ""
    return f"(it has {', '.join(shown)}{more}; `compaction-assets plan {table_name}` lists them)"


def _unappliable(plan: PartitionPlan, deletes: DeleteMap, top_level: set[int]) -> PartitionPlan:
    """The plan, or why not, when an equality delete it must apply (or convert) is keyed on a field
    that is no top-level column of the current schema: execution refuses it, every attempt would fail."""
    if not plan.worth_compacting:
        return plan
    applying = deletes.distinct([*(p for g in plan.groups for p in g.paths), *plan.covered_data_paths])
    if plan.is_tier:
        applying = [d for d in applying if d.path in set(plan.delete_paths)]
    for d in applying:
        if missing := sorted(set(d.data_file.equality_ids or ()) - top_level):
            return PartitionPlan(
                plan.stats,
                None,
                reason=f"equality delete file {d.path} is keyed on field id(s) {missing}, no top-level column "
                "of the current schema: it cannot be applied, so the partition is not compacted",
            )
    return plan
