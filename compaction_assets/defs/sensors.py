"""The fragmentation sensor: requests compaction runs. It observes (the catalog, the runs, the changed
tables' plans) and translates what planning/tick.py decides; the recovery sensor is in
defs/recovery.py."""

import hashlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlparse

from dagster import (
    AddDynamicPartitionsRequest,
    AssetObservation,
    AssetSelection,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    DeleteDynamicPartitionsRequest,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from compaction_assets.config import CompactionConfig, TableRule
from compaction_assets.defs.gc_assets import MAINTENANCE_KEY, MAINTENANCE_PARTITIONS_NAME, maintenance_partition_request
from compaction_assets.defs.naming import (
    LOCATION_NAME,
    MAINTENANCE_TAG,
    PARTITION_TAG,
    PRIORITY_TAG,
    QUEUE_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    TABLE_TAG,
    WEBSERVER_ENV,
    partitions_name,
    pool_name,
    table_key,
)
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.engine.facade import Engine
from compaction_assets.engine.table_plan import TablePlan
from compaction_assets.errors import CompactionError
from compaction_assets.execution.spark import require_server
from compaction_assets.lake.catalog import load_table, managed_tables, metadata_locations
from compaction_assets.planning.expiration import ExpireRule
from compaction_assets.planning.model import Kind
from compaction_assets.planning.scheduling import MANIFESTS_KEY, Batch, Decision
from compaction_assets.planning.tick import (
    FragmentationCursor,
    Look,
    PlannedTable,
    Tick,
    candidate_benefits,
    catalog_change,
    observation_metadata,
)
from compaction_assets.redact import redact

SKIPS_LOGGED = 20  # per reason: a table of thousands of waiting partitions logs these and a count
IN_PROGRESS = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def queue_load(instance: DagsterInstance) -> dict[str, tuple[int, int]]:
    """Queue -> (running, queued) compaction runs."""
    load: dict[str, tuple[int, int]] = {}
    for run in instance.get_runs(RunsFilter(statuses=IN_PROGRESS)):
        if queue := run.tags.get(QUEUE_TAG):
            running, queued = load.get(queue, (0, 0))
            waiting = run.status in (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED)
            load[queue] = (running + (not waiting), queued + waiting)
    return load


def sync_pool_limits(instance: DagsterInstance, config: CompactionConfig) -> None:
    """compaction.yaml is the one source of queue limits; the instance's pools follow it."""
    storage = instance.event_log_storage
    known = storage.get_concurrency_keys()
    for queue in config.queues:
        pool = pool_name(queue.name)
        if pool not in known or storage.get_concurrency_info(pool).slot_count != queue.max_concurrent_runs:
            storage.set_concurrency_slots(pool, queue.max_concurrent_runs)


# The tables' assets (naming.table_key: `lake/...`) and the maintenance asset, as a selection the UI
# shows as text: key_prefixes has no text form (the UI showed its Python repr), and key wildcards and
# kinds reach the UI as every matching key listed. (A writer key containing "lake/" would be selected
# too: harmless, the sensor requests only tables and maintenance.)
COMPACTED_ASSETS = AssetSelection.key_substring("lake/") | AssetSelection.assets(MAINTENANCE_KEY)


def fragmentation_sensor(
    tables: dict[str, bool], interval_seconds: int, left_out: frozenset[str] = frozenset()
) -> SensorDefinition:
    """`tables`: managed table name -> partitioned?; `left_out`: managed tables that have no asset
    because they could not be loaded (a catalog change is a table entering or leaving either).
    A run request selects the table's asset (Dagster's asset job runs it): no job per table."""

    @sensor(
        name="fragmentation_sensor",
        asset_selection=COMPACTED_ASSETS,
        minimum_interval_seconds=interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description="Plans tables whose snapshot changed, records their fragmentation as observations, and "
        "requests compaction of fragmented partitions (or, of a table with none, a rewrite of its small "
        "manifests), by priority, within each queue's capacity.",
    )
    def _sensor(context: SensorEvaluationContext, compaction: CompactionResource) -> SensorResult:
        return evaluate_fragmentation(context, compaction.load(), tables, left_out)

    return _sensor


def evaluate_fragmentation(
    context: SensorEvaluationContext,
    config: CompactionConfig,
    tables: dict[str, bool],
    left_out: frozenset[str] = frozenset(),
) -> SensorResult:
    """One tick: observe the catalog, the runs and the changed tables; planning/tick.py decides;
    this translates its decisions into run and partition requests, observations and the cursor."""
    fingerprint = hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:16]
    engine = _engine(config, fingerprint)
    sync_pool_limits(context.instance, config)
    tick = Tick(FragmentationCursor.parse(context.cursor), fingerprint, time.time())
    locations = metadata_locations(engine.catalog)
    present = _present(engine, config, locations)
    added, dropped = catalog_change(tables, left_out, present)
    if added or dropped:
        reload_code_location(context, added, dropped)
    runs = context.instance.get_runs(RunsFilter(statuses=IN_PROGRESS))
    in_flight = runs_in_flight(context.instance, runs)
    seen = _Observed()
    for name, partitioned in tables.items():
        rule = config.rule_for(name)
        _observe(context, engine, tick, seen, rule, name, partitioned, present, locations, in_flight)
    if tick.respecced:
        reload_code_location(context, [], [], tick.respecced)
    decision = tick.decide(
        len(tables),
        _runs_per_queue(runs),
        {q.name: q.capacity for q in config.queues},
        set(in_flight),
        config.scheduling.ageing_points_per_minute,
        config.scheduling.max_partitions_per_run,
        seen.orders,
        _spark_down(config) if tick.candidates else None,
    )
    if decision.held:
        context.log.warning(decision.held)
        return SensorResult(
            dynamic_partitions_requests=seen.partition_requests,
            asset_events=seen.observations,
            cursor=decision.cursor.dump(),  # they stay in `waiting`: candidates again on the next tick
            skip_reason=SkipReason(decision.held),
        )
    _log_decisions(context.log, decision.decisions, in_flight)
    run_requests = [_run_request(b, context.log) for b in decision.batches]
    seen.partition_requests.extend(_maintenance_partitions(context.instance, decision.batches))
    context.log.info(decision.summary)
    return SensorResult(
        run_requests=run_requests,
        dynamic_partitions_requests=seen.partition_requests,
        asset_events=seen.observations,
        cursor=decision.cursor.dump(),
        skip_reason=None if run_requests else SkipReason(decision.summary),
    )


def _present(engine: Engine, config: CompactionConfig, locations: dict[str, str | None] | None) -> set[str]:
    """The catalog's tables a `tables:` rule manages (one query where the catalog lists locations)."""
    present = set(locations) if locations is not None else set(managed_tables(engine.catalog, config))
    return {n for n in present if config.rule_for(n) is not None}


def _runs_per_queue(runs: Sequence[DagsterRun]) -> Counter[str]:
    """Queue -> its queued and running compaction runs (back-pressure counts both)."""
    return Counter(r.tags[QUEUE_TAG] for r in runs if QUEUE_TAG in r.tags)


def _maintenance_partitions(instance: DagsterInstance, batches: Sequence[Batch]) -> list:
    """Requests adding the maintenance asset's partition of each table a manifest rewrite is requested for."""
    if not (rewrites := [b.table_name for b in batches if b.members[0].partition_key == MANIFESTS_KEY]):
        return []
    maintained = set(instance.get_dynamic_partitions(MAINTENANCE_PARTITIONS_NAME))
    return [r for name in rewrites for r in maintenance_partition_request(maintained, name)]


@dataclass
class _Observed:
    """What the tick's table observations hand to Dagster besides the decisions."""

    partition_requests: list = field(default_factory=list)  # dynamic partitions added or deleted
    observations: list[AssetObservation] = field(default_factory=list)
    orders: dict[str, list[str]] = field(default_factory=dict)  # table -> its partition keys after this tick


def _observe(
    context: SensorEvaluationContext,
    engine: Engine,
    tick: Tick,
    seen: _Observed,
    rule: TableRule | None,
    name: str,
    partitioned: bool,
    present: set[str],
    locations: dict[str, str | None] | None,
    in_flight: dict[tuple[str, str], str],
) -> None:
    """Look at one managed table as far as the tick needs: not at all, its metadata location, the
    loaded table, or its plan."""
    look = tick.look(name, rule, present, locations)
    if look is Look.NO_RULE or rule is None:  # the same: no rule is Look.NO_RULE
        context.log.info(f"{name}: no longer matches a `tables:` rule; skipped")
        return
    if look is Look.REPLAY:
        tick.replay(name, rule, tick.cursor.snapshots.get(name))
    if look is not Look.LOAD:
        return
    try:
        table = load_table(engine.catalog, name)
        snapshot = table.current_snapshot()
        snapshot_id = snapshot.snapshot_id if snapshot else None
        look = tick.after_load(name, partitioned, snapshot_id, table.metadata_location, table.spec().is_unpartitioned())
        if look is Look.REPLAY:
            tick.replay(name, rule, snapshot_id)
            return
        if look is Look.RESPECCED:
            context.log.info(
                f"{name}: its partition spec became {'un' if partitioned else ''}partitioned; "
                "not compacted until the code location reloads"
            )
            return
        tplan = engine.plan_for(table, name)
    except CompactionError as exc:
        context.log.warning(redact(f"{name}: cannot plan: {exc}"))
        return
    _record_plan(context, tick, seen, rule, tplan, partitioned, table.metadata_location, in_flight)


def _record_plan(
    context: SensorEvaluationContext,
    tick: Tick,
    seen: _Observed,
    rule: TableRule,
    tplan: TablePlan,
    partitioned: bool,
    metadata_location: str | None,
    in_flight: dict[tuple[str, str], str],
) -> None:
    """A planned table: its partitions synced and observed, its candidates to the tick."""
    name = tplan.table_name
    due_manifests = tplan.manifests if tplan.rewrite_manifests_due else None
    _log_plan(context.log, tplan, due_manifests is not None)
    if partitioned:
        held = {k for t, k in in_flight if t == name}
        requests, seen.orders[name] = _partition_sync(
            context.instance, name, [p.partition_key for p in tplan.partitions], held
        )
        seen.partition_requests.extend(requests)
    paused = not tplan.policy.enabled
    seen.observations.extend(
        AssetObservation(
            asset_key=table_key(name),
            partition=p.partition_key if partitioned else None,
            metadata=observation_metadata(p.stats, paused),
        )
        for p in tplan.partitions
    )
    benefits = candidate_benefits(
        partitioned,
        ((p.partition_key, p.benefit) for p in tplan.to_compact),
        due_manifests.benefit if due_manifests is not None else None,
    )
    expiring = isinstance(tplan.expire, ExpireRule)
    planned = PlannedTable(name, tplan.snapshot_id, metadata_location, benefits, tplan.replan_at_ms, expiring)
    tick.record(rule, planned)


def _log_plan(log: logging.Logger, tplan: TablePlan, manifests_due: bool) -> None:
    """What a table's plan says beyond its candidates: paused, refused, a manifest rewrite due, and
    (debug) why each partition has nothing to do."""
    name = tplan.table_name
    if not tplan.policy.enabled:
        log.info(f"{name}: paused (compaction.enabled=false): not compacted; `compaction-assets resume`")
    if tplan.refused:
        log.info(f"{name}: not compacted: {tplan.refused}")
    if manifests_due and tplan.manifests is not None:
        log.info(f"{name}: {tplan.manifests.reason}")
    for plan in tplan.partitions:
        if not plan.worth_compacting:
            log.debug(f"{name} [{plan.partition_key or '-'}]: nothing to do: {plan.reason}")


def _log_decisions(log: logging.Logger, decisions: Sequence[Decision], in_flight: dict[tuple[str, str], str]) -> None:
    """Each decision in the tick log; of the partitions skipped for one reason, the first SKIPS_LOGGED."""
    skipped: Counter[str] = Counter()  # reason -> partitions skipped for it (not in progress)
    for d in decisions:
        c = d.candidate
        if d.requested:
            log.debug(f"request {_where(d)} in run {d.batch}: benefit {c.benefit:.2f} files/MiB")
        elif run_id := in_flight.get((c.table_name, c.partition_key)):
            log.info(f"skip {_where(d)}: already in progress (run {run_id})")
        else:
            skipped[d.reason] += 1
            if skipped[d.reason] <= SKIPS_LOGGED:
                log.info(f"skip {_where(d)}: {d.reason}")
    for reason, count in skipped.items():
        if count > SKIPS_LOGGED:
            log.info(f"skip {count - SKIPS_LOGGED} more partition(s), lower in priority: {reason}")


def _run_request(batch: Batch, log: logging.Logger) -> RunRequest:
    """One partition: a run of that partition (or of the unpartitioned table); several: a run of
    the range from the first to the last, in the asset's partition order."""
    first = batch.members[0]
    tags = {QUEUE_TAG: batch.queue, TABLE_TAG: batch.table_name, PRIORITY_TAG: str(batch.priority)}
    where = f"(queue {batch.queue}, priority {batch.priority})"
    if first.partition_key == MANIFESTS_KEY:  # the table's maintenance partition, see defs/gc_assets.py
        log.info(f"request {batch.table_name} rewrite-manifests {where}: benefit {first.benefit:.2f}")
        return RunRequest(
            run_key=f"{batch.table_name}|{MANIFESTS_KEY}|{first.snapshot_id}",
            asset_selection=[MAINTENANCE_KEY],
            partition_key=batch.table_name,
            tags={**tags, MAINTENANCE_TAG: str(Kind.REWRITE_MANIFESTS)},
        )
    if len(batch.members) == 1:
        log.info(
            f"request {batch.table_name} [{first.partition_key or '-'}] {where}: benefit {first.benefit:.2f} files/MiB"
        )
        return RunRequest(
            run_key=f"{batch.table_name}|{first.partition_key}|{first.snapshot_id}",
            asset_selection=[table_key(batch.table_name)],
            partition_key=first.partition_key or None,
            tags=tags,
        )
    log.info(
        f"request {batch.table_name} [{batch.first} .. {batch.last}]: {len(batch.members)} partitions, one run {where}"
    )
    return RunRequest(
        run_key=f"{batch.table_name}|{batch.first}..{batch.last}|{first.snapshot_id}",
        asset_selection=[table_key(batch.table_name)],
        tags={**tags, RANGE_START_TAG: batch.first, RANGE_END_TAG: batch.last},
    )


def runs_in_flight(instance: DagsterInstance, runs: Sequence[DagsterRun]) -> dict[tuple[str, str], str]:
    """(table, partition key) -> id of the queued or running run that covers it: its partition,
    or every key of its partition range (in the table's partition order now; every key of the
    table if an end of the range is gone)."""
    in_flight: dict[tuple[str, str], str] = {}
    orders: dict[str, list[str]] = {}
    for run in runs:
        if (table := run.tags.get(TABLE_TAG)) is None:
            continue
        if run.tags.get(MAINTENANCE_TAG) == str(Kind.REWRITE_MANIFESTS):
            in_flight[(table, MANIFESTS_KEY)] = run.run_id
            continue
        if (start := run.tags.get(RANGE_START_TAG)) is None:
            in_flight[(table, run.tags.get(PARTITION_TAG, ""))] = run.run_id
            continue
        if table not in orders:
            orders[table] = list(instance.get_dynamic_partitions(partitions_name(table)))
        order, end = orders[table], run.tags.get(RANGE_END_TAG)
        if start in order and end in order:
            in_flight.update(((table, k), run.run_id) for k in order[order.index(start) : order.index(end) + 1])
        else:  # an end deleted by hand (the sensor keeps them): the range is unknown, so hold them all
            in_flight.update(((table, k), run.run_id) for k in order)
    return in_flight


_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def _engine(config: CompactionConfig, fingerprint: str) -> Engine:
    """The sensor's Engine for this config, made once per process (opening the catalog and the
    ledger costs a tick tens of milliseconds). No Spark: the sensor only plans."""
    with _engines_lock:
        engine = _engines.get(fingerprint)
        if engine is None:
            _engines.clear()  # a changed config replaces the one before it
            engine = _engines[fingerprint] = Engine(config)
        return engine


def _where(d: Decision) -> str:
    c = d.candidate
    return f"{c.table_name} [{c.partition_key or '-'}] (queue {c.queue}, priority {d.priority})"


def _spark_down(config: CompactionConfig) -> str | None:
    """Why runs would fail at once now (connect mode, no server answering), or None. Requests
    made then would fail, and their run keys (one per snapshot) would not be requested again."""
    try:
        require_server(config.spark, timeout_s=2.0)
    except CompactionError as exc:
        return str(exc)
    return None


def reload_code_location(
    context: SensorEvaluationContext, added: list[str], dropped: list[str], respecced: Sequence[str] = ()
) -> None:
    """New or dropped managed tables, or tables that became partitioned or unpartitioned
    (`respecced`): reload the code location so its assets follow the catalog.

    Through the webserver's GraphQL API (`reload_repository_location`), whose address the demo
    puts in $COMPACTION_DAGSTER_URL; without it the log says how to reload by hand. The call runs
    beside the tick: the reload replaces the process this sensor runs in."""
    origin = context.code_location_origin
    location = origin.location_name if origin else LOCATION_NAME
    change = "; ".join(
        part
        for part in (
            f"new: {', '.join(added)}" if added else "",
            f"dropped: {', '.join(dropped)}" if dropped else "",
            f"partitioning changed: {', '.join(respecced)}" if respecced else "",
        )
        if part
    )
    url = os.environ.get(WEBSERVER_ENV)
    if not url:
        context.log.info(
            f"tables changed ({change}): reload code location '{location}' to show them (UI: Deployment > "
            f"Reload, or set {WEBSERVER_ENV}=http://host:port for the sensor to do it)"
        )
        return
    context.log.info(f"tables changed ({change}): reloading code location '{location}' through {url}")
    threading.Thread(target=_reload, args=(url, location), daemon=True).start()


def _reload(url: str, location: str) -> None:
    from dagster_graphql import DagsterGraphQLClient

    parsed = urlparse(url)
    client = DagsterGraphQLClient(parsed.hostname or "127.0.0.1", port_number=parsed.port, timeout=120)
    info = client.reload_repository_location(location)
    logging.getLogger(__name__).info(f"code location '{location}' reloaded: {info.status}")


def _partition_sync(
    instance: DagsterInstance, table_name: str, keys: list[str], held: set[str]
) -> tuple[list, list[str]]:
    """Requests that make the table's dynamic partitions equal its Iceberg partitions, and their
    order once applied (Dagster's: in the order they were added). A key a queued or running run
    covers (`held`) is kept until that run ends: a range run whose end key is gone cannot start,
    and a range is only known by its ends."""
    name = partitions_name(table_name)
    existing = list(instance.get_dynamic_partitions(name))
    wanted = set(keys) | (held & set(existing))
    requests: list = []
    added = sorted(wanted - set(existing))
    if added:
        requests.append(AddDynamicPartitionsRequest(partitions_def_name=name, partition_keys=added))
    if vanished := sorted(set(existing) - wanted):
        requests.append(DeleteDynamicPartitionsRequest(partitions_def_name=name, partition_keys=vanished))
    return requests, [k for k in existing if k in wanted] + added
