"""The fragmentation sensor's decisions for one tick: pure, no Dagster, no I/O.

The sensor (defs/sensors.py) gathers what it observes and translates what `Tick` decides into
Dagster's terms (run requests, partition requests, observations, the cursor). A tick costs
O(changed tables): a table is looked at in steps, each a decision here and an observation there:
1. `Tick.look(name, ...)`: from the cursor and the catalog's metadata locations alone (SQL
   catalogs list them in one query): skip it, replay it unchanged, or load it;
2. `Tick.after_load(name, ...)`: from its snapshot and metadata file: replay it, leave it until the
   code location reloads (it became (un)partitioned), or plan it;
3. `Tick.replay(...)` / `Tick.record(PlannedTable)`: its candidates, and the cursor's memory of it;
4. `Tick.decide(...)`: which runs to request within each queue's capacity (planning/scheduling.py),
   the new cursor, and the tick's summary.

Cursor (`FragmentationCursor`): the last seen version of each table and of compaction.yaml, and
since when each deferred partition has waited, with the benefit its plan had. A table is re-planned
only when its metadata file or snapshot changed, or the config did; an unchanged table's deferred
partitions are candidates again as they were planned (a 200,000-file table is not re-planned every
tick while its partitions queue). A table with data expiration on is also re-planned every
EXPIRE_REPLAN_SECONDS: time alone moves rows past retention; one whose full rewrite comes due, at
that time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum

from compaction_assets.config import TableRule
from compaction_assets.planning.model import PartitionStats
from compaction_assets.planning.scheduling import MANIFESTS_KEY, Batch, Candidate, Decision, decide

EXPIRE_REPLAN_SECONDS = 600  # an unchanged table with data expiration on is planned again this often
ALREADY_QUEUED = "already queued"  # in the reason scheduling.decide gives a partition a run covers


@dataclass
class FragmentationCursor:
    """See the module doc. Keys of `waiting` and `benefits`: "table|candidate key"."""

    snapshots: dict[str, int | None] = field(default_factory=dict)
    waiting: dict[str, float] = field(default_factory=dict)  # "table|partition" -> epoch seconds
    versions: dict[str, str | None] = field(default_factory=dict)  # table -> metadata location
    config: str = ""  # fingerprint of the compaction.yaml last planned with
    benefits: dict[str, float] = field(default_factory=dict)  # "table|partition" (waiting) -> plan benefit
    # table -> epoch seconds when it must be planned again though unchanged (a full rewrite comes due)
    replan_at: dict[str, float] = field(default_factory=dict)
    expiring: dict[str, float] = field(default_factory=dict)  # table with expiration on -> last planned, epoch s

    @staticmethod
    def parse(raw: str | None) -> FragmentationCursor:
        return FragmentationCursor(**json.loads(raw)) if raw else FragmentationCursor()

    def dump(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)}, sort_keys=True)


class Look(StrEnum):
    """What the sensor does with a managed table this tick."""

    NO_RULE = "no-rule"  # it matches no `tables:` rule any more: skipped (said in the log)
    DROPPED = "dropped"  # gone from the catalog: the code location reload removes its asset
    REPLAY = "replay"  # unchanged: its waiting partitions are candidates as they were planned
    LOAD = "load"  # load it: its metadata location is unknown here or changed
    RESPECCED = "respecced"  # it became (un)partitioned: its asset's keys mean nothing until a reload
    PLAN = "plan"  # changed: plan it


@dataclass(frozen=True)
class PlannedTable:
    """What the sensor learned by planning a table (engine.TablePlan, as the decisions need it)."""

    name: str
    snapshot_id: int | None
    metadata_location: str | None
    benefits: Mapping[str, float]  # candidate key -> benefit: what is worth compacting (candidate_benefits)
    replan_at_ms: int | None = None  # when a full rewrite comes due (engine.TablePlan.replan_at_ms)
    expiring: bool = False  # data expiration is on (and resolved)


@dataclass(frozen=True)
class TickDecision:
    """What the tick decided: the runs to request (`batches`, which requested `decisions` index),
    the cursor to store, and the summary. `held`: why nothing is requested though candidates wait
    (they stay in the cursor); no decisions then."""

    cursor: FragmentationCursor
    decisions: list[Decision]
    batches: list[Batch]
    summary: str
    held: str | None = None


def catalog_change(
    tables: Collection[str], left_out: Collection[str], present: Collection[str]
) -> tuple[list[str], list[str]]:
    """Managed tables new to the catalog and gone from it, against those the code location has (as
    an asset, `tables`, or left out because it could not load them): a reload follows either."""
    known = set(tables) | set(left_out)
    return sorted(set(present) - known), sorted(known - set(present))


def candidate_benefits(
    partitioned: bool, worth: Iterable[tuple[str, float]], manifests_benefit: float | None
) -> dict[str, float]:
    """Candidate key -> benefit of a planned table: its partitions worth compacting (`worth`: key,
    benefit), else its manifest rewrite when due (`manifests_benefit`). An unpartitioned asset's one
    run compacts every partition of the table worth it (files of an older, partitioned spec have
    partition keys the asset does not have): one candidate, keyed "", at the best benefit."""
    benefits = dict(worth)
    if not partitioned and benefits:
        benefits = {"": max(benefits.values())}
    if manifests_benefit is not None:
        benefits[MANIFESTS_KEY] = manifests_benefit
    return benefits


def observation_metadata(stats: PartitionStats, paused: bool) -> dict[str, int | float | bool]:
    """The fragmentation the sensor records of a planned partition (an AssetObservation's metadata)."""
    return {
        "data_files": stats.data_files,
        "fragments": stats.fragments,
        "small_files": stats.undersized,
        "avg_file_bytes": stats.avg_file_bytes,
        "data_bytes": stats.data_bytes,
        "delete_files": stats.applying_delete_files,
        "position_delete_files": stats.position_delete_files,
        "equality_delete_files": stats.equality_delete_files,
        "deleted_rows": stats.deleted_rows,
        "read_amplification": round(stats.read_amplification, 3),
        "paused": paused,
    }


class Tick:
    """One tick's decisions, table by table (the module doc). Holds the cursor it updates and the
    candidates it gathers; does no I/O."""

    def __init__(self, cursor: FragmentationCursor, fingerprint: str, now: float) -> None:
        """`fingerprint`: of the compaction.yaml in force; a change (a policy, priority or queue)
        makes every table be looked at again."""
        self.cursor, self.now = cursor, now
        if cursor.config != fingerprint:
            cursor.snapshots, cursor.versions, cursor.benefits, cursor.config = {}, {}, {}, fingerprint
        self.candidates: list[Candidate] = []
        self.unchanged: list[str] = []
        self.planned: list[str] = []
        self.respecced: list[str] = []
        self._waiting: dict[str, list[str]] = {}  # table -> its "table|key" waiting when the tick began
        for key in cursor.waiting:
            self._waiting.setdefault(key.split("|", 1)[0], []).append(key)

    def look(
        self, name: str, rule: TableRule | None, present: Collection[str], locations: Mapping[str, str | None] | None
    ) -> Look:
        """What to do with a managed table before loading it. `locations`: every table's metadata
        location (None: the catalog cannot list them: every present table is loaded)."""
        if rule is None:
            return Look.NO_RULE
        if name not in present:
            return Look.DROPPED
        cursor = self.cursor
        unchanged = locations is not None and name in cursor.versions and cursor.versions[name] == locations.get(name)
        if unchanged and self._replayable(name):
            return Look.REPLAY
        return Look.LOAD

    def after_load(
        self, name: str, partitioned: bool, snapshot_id: int | None, metadata_location: str | None, unpartitioned: bool
    ) -> Look:
        """What to do with a loaded table. A new metadata file on the same snapshot (pause, a
        property, another engine's expiry) is planned again: the deferred partitions' plan may no
        longer hold. `partitioned`: its asset's; `unpartitioned`: its current spec's."""
        cursor = self.cursor
        same = cursor.snapshots.get(name, -1) == snapshot_id and cursor.versions.get(name) == metadata_location
        if same and self._replayable(name):
            return Look.REPLAY
        if partitioned == unpartitioned:
            self.respecced.append(name)
            return Look.RESPECCED
        return Look.PLAN

    def replay(self, name: str, rule: TableRule, snapshot_id: int | None) -> None:
        """An unchanged table: its waiting partitions are candidates again as they were planned."""
        cursor = self.cursor
        self.unchanged.append(name)
        self.candidates.extend(
            Candidate(
                name, k.split("|", 1)[1], rule.queue, rule.priority, cursor.benefits[k], cursor.waiting[k], snapshot_id
            )
            for k in self._waiting.get(name, [])
        )

    def record(self, rule: TableRule, table: PlannedTable) -> None:
        """A planned table: its candidates, and what the cursor remembers of it. A waiting partition
        no longer worth compacting stops waiting; one still worth it keeps its waiting time."""
        cursor, name, now = self.cursor, table.name, self.now
        self.planned.append(name)
        for key in self._waiting.get(name, []):
            if key.split("|", 1)[1] not in table.benefits:
                del cursor.waiting[key]
                cursor.benefits.pop(key, None)
        for key, benefit in table.benefits.items():
            since = cursor.waiting.setdefault(f"{name}|{key}", now)
            cursor.benefits[f"{name}|{key}"] = benefit
            self.candidates.append(Candidate(name, key, rule.queue, rule.priority, benefit, since, table.snapshot_id))
        cursor.snapshots[name] = table.snapshot_id
        cursor.versions[name] = table.metadata_location
        if table.replan_at_ms is not None:
            cursor.replan_at[name] = table.replan_at_ms / 1000
        else:
            cursor.replan_at.pop(name, None)
        if table.expiring:
            cursor.expiring[name] = now
        else:
            cursor.expiring.pop(name, None)

    def decide(
        self,
        tables: int,
        queue_load: Mapping[str, int],
        capacities: Mapping[str, int],
        in_flight: set[tuple[str, str]],
        ageing_points_per_minute: float,
        max_partitions_per_run: int,
        orders: Mapping[str, Sequence[str]],
        spark_down: str | None = None,
    ) -> TickDecision:
        """The runs to request (scheduling.decide), after `tables` managed tables were looked at.
        A requested partition, or one a run already covers, stops waiting; the others wait on.
        `spark_down`: why runs would fail now (connect mode, no server): nothing is requested."""
        cursor, candidates = self.cursor, self.candidates
        if candidates and spark_down:
            held = (
                f"evaluated {tables} table(s): {len(candidates)} partition(s) worth compacting wait, none "
                f"requested: {spark_down} (the recovery sensor restarts a server it started)"
            )
            return TickDecision(cursor, [], [], held, held=held)
        decisions, batches = decide(
            candidates,
            queue_load,
            capacities,
            in_flight,
            self.now,
            ageing_points_per_minute,
            max_partitions_per_run,
            orders,
        )
        for d in decisions:
            if d.requested or ALREADY_QUEUED in d.reason:
                cursor.waiting.pop(f"{d.candidate.table_name}|{d.candidate.partition_key}", None)
                cursor.benefits.pop(f"{d.candidate.table_name}|{d.candidate.partition_key}", None)
        summary = (
            f"evaluated {tables} table(s): {len(self.planned)} planned, {len(self.unchanged)} unchanged; "
            f"{len(candidates)} partition(s) worth compacting, {sum(d.requested for d in decisions)} requested in "
            f"{len(batches)} run(s), {sum(not d.requested for d in decisions)} skipped"
        )
        return TickDecision(cursor, decisions, batches, summary)

    def _replayable(self, name: str) -> bool:
        """Whether an unchanged table's waiting partitions may be replayed: each one's planned
        benefit is kept, no full rewrite came due, and expiration (if on) was planned recently."""
        cursor, now = self.cursor, self.now
        return (
            all(k in cursor.benefits for k in self._waiting.get(name, []))
            and now < cursor.replan_at.get(name, math.inf)
            and now - cursor.expiring.get(name, now) < EXPIRE_REPLAN_SECONDS
        )
