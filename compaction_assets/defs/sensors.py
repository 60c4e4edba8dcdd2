"""Sensors: the fragmentation sensor requests compaction runs; the recovery sensor heals crashes
(of compaction attempts, and of the warm Spark Connect server in connect mode)."""

import datetime as dt
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
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
    JobDefinition,
    OpExecutionContext,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    graph,
    op,
    sensor,
)

from compaction_assets.commit.ledger import OPEN
from compaction_assets.commit.recovery import orphaned_because
from compaction_assets.config import CompactionConfig, TableRule
from compaction_assets.defs.gc_assets import MAINTENANCE_KEY, MAINTENANCE_PARTITIONS, maintenance_partition_request
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
from compaction_assets.engine import Engine
from compaction_assets.errors import CompactionError
from compaction_assets.execution import connect_server
from compaction_assets.execution.spark import require_server
from compaction_assets.lake.catalog import load_table, managed_tables, metadata_locations
from compaction_assets.planning.expiration import ExpireRule
from compaction_assets.planning.manifests import ManifestPlan
from compaction_assets.planning.planner import Kind, PartitionPlan
from compaction_assets.planning.scheduling import MANIFESTS_KEY, Batch, Candidate, Decision, decide
from compaction_assets.redact import redact

EXPIRE_REPLAN_SECONDS = 600  # an unchanged table with data expiration on is planned again this often
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


@dataclass
class FragmentationCursor:
    """Last seen version of each table and of compaction.yaml, and since when each deferred
    partition has waited, with the benefit its plan had. A table is re-planned only when its
    metadata file (SQL catalogs: read for all tables in one query) or snapshot changed, or the
    config did; an unchanged table's deferred partitions are candidates again as they were
    planned (a 200,000-file table is not re-planned every tick while its partitions queue). A table
    with data expiration on is also re-planned every EXPIRE_REPLAN_SECONDS: time alone moves rows
    past retention."""

    snapshots: dict[str, int | None] = field(default_factory=dict)
    waiting: dict[str, float] = field(default_factory=dict)  # "table|partition" -> epoch seconds
    versions: dict[str, str | None] = field(default_factory=dict)  # table -> metadata location
    config: str = ""  # fingerprint of the compaction.yaml last planned with
    benefits: dict[str, float] = field(default_factory=dict)  # "table|partition" (waiting) -> plan benefit
    # table -> epoch seconds when it must be planned again though unchanged (a full rewrite comes due)
    replan_at: dict[str, float] = field(default_factory=dict)
    expiring: dict[str, float] = field(default_factory=dict)  # table with expiration on -> last planned, epoch s

    @staticmethod
    def parse(raw: str | None) -> "FragmentationCursor":
        return FragmentationCursor(**json.loads(raw)) if raw else FragmentationCursor()

    def dump(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)}, sort_keys=True)


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
    fingerprint = hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:16]
    engine = _engine(config, fingerprint)
    sync_pool_limits(context.instance, config)
    cursor = FragmentationCursor.parse(context.cursor)
    if cursor.config != fingerprint:  # a policy, priority or queue changed: look at every table again
        cursor.snapshots, cursor.versions, cursor.benefits, cursor.config = {}, {}, {}, fingerprint
    locations = metadata_locations(engine.catalog)
    present = set(locations) if locations is not None else set(managed_tables(engine.catalog, config))
    present = {n for n in present if config.rule_for(n) is not None}
    added, dropped = sorted(present - set(tables) - left_out), sorted((set(tables) | left_out) - present)
    if added or dropped:
        reload_code_location(context, added, dropped)
    runs = context.instance.get_runs(RunsFilter(statuses=IN_PROGRESS))
    queue_load = Counter(r.tags[QUEUE_TAG] for r in runs if QUEUE_TAG in r.tags)
    in_flight = runs_in_flight(context.instance, runs)
    orders: dict[str, list[str]] = {}  # table -> its partition keys in the asset's order after this tick
    now = time.time()
    candidates: list[Candidate] = []
    partition_requests: list = []
    observations: list[AssetObservation] = []
    unchanged, planned, respecced = [], [], []
    waiting_of: dict[str, list[str]] = {}
    for key in cursor.waiting:
        waiting_of.setdefault(key.split("|", 1)[0], []).append(key)
    for name, partitioned in tables.items():
        rule = config.rule_for(name)
        if rule is None:
            context.log.info(f"{name}: no longer matches a `tables:` rule; skipped")
            continue
        if name not in present:
            continue  # dropped: the reload above removes its asset
        waiting = waiting_of.get(name, [])
        replayable = all(k in cursor.benefits for k in waiting)  # each waiting partition's planned benefit is kept
        replayable = replayable and now < cursor.replan_at.get(name, math.inf)  # no full rewrite came due
        replayable = replayable and now - cursor.expiring.get(name, now) < EXPIRE_REPLAN_SECONDS
        known = locations is not None and name in cursor.versions
        if known and cursor.versions[name] == locations.get(name) and replayable:
            unchanged.append(name)
            candidates.extend(_deferred(cursor, name, rule, waiting, cursor.snapshots.get(name)))
            continue
        try:
            table = load_table(engine.catalog, name)
            snapshot = table.current_snapshot()
            snapshot_id = snapshot.snapshot_id if snapshot else None
            # a new metadata file on the same snapshot (pause, a property, another engine's expiry)
            # is planned again: the deferred partitions' plan may no longer hold
            same = (
                cursor.snapshots.get(name, -1) == snapshot_id and cursor.versions.get(name) == table.metadata_location
            )
            if same and replayable:
                unchanged.append(name)
                candidates.extend(_deferred(cursor, name, rule, waiting, snapshot_id))
                continue
            if partitioned == table.spec().is_unpartitioned():
                # the asset was built for the other kind: its partition keys mean nothing until a reload
                context.log.info(
                    f"{name}: its partition spec became {'un' if partitioned else ''}partitioned; "
                    "not compacted until the code location reloads"
                )
                respecced.append(name)
                continue
            tplan = engine.plan_for(table, name)
        except CompactionError as exc:
            context.log.warning(redact(f"{name}: cannot plan: {exc}"))
            continue
        planned.append(name)
        if not tplan.policy.enabled:
            context.log.info(f"{name}: paused (compaction.enabled=false): not compacted; `compaction-assets resume`")
        if partitioned:
            held = {k for t, k in in_flight if t == name}
            requests, orders[name] = _partition_sync(
                context.instance, name, [p.partition_key for p in tplan.partitions], held
            )
            partition_requests.extend(requests)
        observations.extend(
            AssetObservation(
                asset_key=table_key(name),
                partition=p.partition_key if partitioned else None,
                metadata={
                    "data_files": p.stats.data_files,
                    "fragments": p.stats.fragments,
                    "small_files": p.stats.undersized,
                    "avg_file_bytes": p.stats.avg_file_bytes,
                    "data_bytes": p.stats.data_bytes,
                    "delete_files": p.stats.applying_delete_files,
                    "position_delete_files": p.stats.position_delete_files,
                    "equality_delete_files": p.stats.equality_delete_files,
                    "deleted_rows": p.stats.deleted_rows,
                    "read_amplification": round(p.stats.read_amplification, 3),
                    "paused": not tplan.policy.enabled,
                },
            )
            for p in tplan.partitions
        )
        if tplan.refused:
            context.log.info(f"{name}: not compacted: {tplan.refused}")
        # an unpartitioned asset's one run compacts every partition of the table worth it (files of
        # an older, partitioned spec have partition keys the asset does not have)
        worth: dict[str, PartitionPlan | ManifestPlan] = {p.partition_key: p for p in tplan.to_compact}
        if not partitioned and worth:
            worth = {"": max(worth.values(), key=lambda p: p.benefit)}
        if tplan.rewrite_manifests_due and tplan.manifests is not None:
            worth[MANIFESTS_KEY] = tplan.manifests
            context.log.info(f"{name}: {tplan.manifests.reason}")
        for key in waiting:
            if key.split("|", 1)[1] not in worth:
                del cursor.waiting[key]
                cursor.benefits.pop(key, None)
        for plan in tplan.partitions:
            if not plan.worth_compacting:
                context.log.debug(f"{name} [{plan.partition_key or '-'}]: nothing to do: {plan.reason}")
        for key, plan in worth.items():
            since = cursor.waiting.setdefault(f"{name}|{key}", now)
            cursor.benefits[f"{name}|{key}"] = plan.benefit
            candidates.append(Candidate(name, key, rule.queue, rule.priority, plan.benefit, since, snapshot_id))
        cursor.snapshots[name] = snapshot_id
        cursor.versions[name] = table.metadata_location
        if tplan.replan_at_ms is not None:
            cursor.replan_at[name] = tplan.replan_at_ms / 1000
        else:
            cursor.replan_at.pop(name, None)
        if isinstance(tplan.expire, ExpireRule):
            cursor.expiring[name] = now
        else:
            cursor.expiring.pop(name, None)
    if respecced:
        reload_code_location(context, [], [], respecced)
    if candidates and (down := _spark_down(config)):
        summary = (
            f"evaluated {len(tables)} table(s): {len(candidates)} partition(s) worth compacting wait, none "
            f"requested: {down} (the recovery sensor restarts a server it started)"
        )
        context.log.warning(summary)
        return SensorResult(
            dynamic_partitions_requests=partition_requests,
            asset_events=observations,
            cursor=cursor.dump(),  # they stay in `waiting`: candidates again on the next tick
            skip_reason=SkipReason(summary),
        )
    capacities = {q.name: q.capacity for q in config.queues}
    decisions, batches = decide(
        candidates,
        queue_load,
        capacities,
        set(in_flight),
        now,
        config.scheduling.ageing_points_per_minute,
        config.scheduling.max_partitions_per_run,
        orders,
    )
    skipped: Counter[str] = Counter()  # reason -> partitions skipped for it (not in progress)
    for d in decisions:
        c = d.candidate
        if d.requested or "already queued" in d.reason:
            cursor.waiting.pop(f"{c.table_name}|{c.partition_key}", None)
            cursor.benefits.pop(f"{c.table_name}|{c.partition_key}", None)
        if d.requested:
            context.log.debug(f"request {_where(d)} in run {d.batch}: benefit {c.benefit:.2f} files/MiB")
        elif run_id := in_flight.get((c.table_name, c.partition_key)):
            context.log.info(f"skip {_where(d)}: already in progress (run {run_id})")
        else:
            skipped[d.reason] += 1
            if skipped[d.reason] <= SKIPS_LOGGED:
                context.log.info(f"skip {_where(d)}: {d.reason}")
    run_requests = [_run_request(b, context.log) for b in batches]
    if rewrites := [b.table_name for b in batches if b.members[0].partition_key == MANIFESTS_KEY]:
        maintained = set(context.instance.get_dynamic_partitions(MAINTENANCE_PARTITIONS.name))
        for name in rewrites:
            partition_requests.extend(maintenance_partition_request(maintained, name))
    for reason, count in skipped.items():
        if count > SKIPS_LOGGED:
            context.log.info(f"skip {count - SKIPS_LOGGED} more partition(s), lower in priority: {reason}")
    summary = (
        f"evaluated {len(tables)} table(s): {len(planned)} planned, {len(unchanged)} unchanged; "
        f"{len(candidates)} partition(s) worth compacting, {sum(d.requested for d in decisions)} requested in "
        f"{len(run_requests)} run(s), {sum(not d.requested for d in decisions)} skipped"
    )
    context.log.info(summary)
    return SensorResult(
        run_requests=run_requests,
        dynamic_partitions_requests=partition_requests,
        asset_events=observations,
        cursor=cursor.dump(),
        skip_reason=None if run_requests else SkipReason(summary),
    )


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


def _deferred(
    cursor: FragmentationCursor, name: str, rule: TableRule, waiting: list[str], snapshot_id: int | None
) -> list[Candidate]:
    """The waiting partitions of an unchanged table, candidates again as they were planned."""
    return [
        Candidate(
            name, k.split("|", 1)[1], rule.queue, rule.priority, cursor.benefits[k], cursor.waiting[k], snapshot_id
        )
        for k in waiting
    ]


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


@op(description="Finish or undo every compaction attempt whose process is gone (compaction-assets recover).")
def recover_orphaned_attempts(context: OpExecutionContext, compaction: CompactionResource) -> None:
    report = compaction.engine().recover()
    context.log.info(
        f"recovered {report.handled}: confirmed {report.confirmed}, recommitted {report.recommitted}, "
        f"rolled back {report.rolled_back}, abandoned {report.abandoned}"
    )
    if report.errors:
        raise CompactionError(redact("could not recover: " + "; ".join(report.errors)))


RECOVER_JOB = "recover_compaction_tasks"


@graph
def recover_graph() -> None:
    recover_orphaned_attempts()


RESTART_JOB = "restart_spark_server"
# Back-off for a server that keeps dying: the n-th restart within the window waits
# RESTART_BACKOFF_S * 2**(n-1) (at most RESTART_BACKOFF_MAX_S) after the one before it.
RESTART_WINDOW_S = 3600
RESTART_BACKOFF_S = 60
RESTART_BACKOFF_MAX_S = 900


@op(description="Start the warm Spark Connect server again after it died; runs then join its new session.")
def start_spark_server(context: OpExecutionContext, compaction: CompactionResource) -> None:
    cfg = compaction.load().spark
    before = connect_server.status(cfg)
    if before.running:
        context.log.info(f"nothing to do: {before.describe()}")
        return
    context.log.info(f"{before.describe()}; starting it")
    began = time.monotonic()
    state = connect_server.start(cfg)
    context.log.info(f"restarted in {time.monotonic() - began:.1f} s with a new shared session: {state.describe()}")


@graph
def restart_spark_server_graph() -> None:
    start_spark_server()


def recovery_jobs(compaction: CompactionResource) -> list[JobDefinition]:
    """The recovery sensor's jobs, `compaction` bound here: a job left to take it from the
    Definitions makes Dagster copy the sensor, and that copy warns (BetaWarning about the sensor's
    `owners`) in every process that loads the code location."""
    resources = {"compaction": compaction}
    return [
        recover_graph.to_job(name=RECOVER_JOB, tags={"compaction/maintenance": "recovery"}, resource_defs=resources),
        restart_spark_server_graph.to_job(
            name=RESTART_JOB, tags={"compaction/maintenance": "spark-server"}, resource_defs=resources
        ),
    ]


def server_restart_request(context: SensorEvaluationContext, config: CompactionConfig) -> RunRequest | None:
    """Connect mode: a run of `restart_spark_server` when the server started from `spark.server_dir`
    died (its pid file is left, its process is gone, nothing listens). One restart at a time; a
    server that keeps dying is restarted less and less often, and the tick log says so."""
    if config.spark.mode != "connect":
        return None
    try:
        current = connect_server.status(config.spark)
    except CompactionError:  # spark.remote on another machine: not ours to supervise
        return None
    if current.state != "died":
        return None
    now = time.time()
    records = context.instance.get_run_records(
        RunsFilter(job_name=RESTART_JOB, created_after=dt.datetime.fromtimestamp(now - RESTART_WINDOW_S, dt.UTC))
    )
    if busy := [r.dagster_run.run_id for r in records if r.dagster_run.status in IN_PROGRESS]:
        context.log.info(f"{current.describe()}; already being restarted by run {busy[0]}")
        return None
    if records:
        wait = min(RESTART_BACKOFF_S * 2 ** (len(records) - 1), RESTART_BACKOFF_MAX_S)
        last = max(r.create_timestamp.timestamp() for r in records)
        if now - last < wait:
            at = dt.datetime.fromtimestamp(last + wait, dt.UTC).strftime("%H:%M:%S UTC")
            context.log.warning(
                f"{current.describe()}. It died again after {len(records)} restart(s) in the last "
                f"{RESTART_WINDOW_S // 60} min: backing off, next restart not before {at} "
                f"(read its log; `compaction-assets spark-server stop` ends the supervision)"
            )
            return None
    context.log.warning(f"{current.describe()}: requesting a {RESTART_JOB} run")
    return RunRequest(run_key=f"spark-server|{current.dead_pid}|{len(records)}", job_name=RESTART_JOB)


def recovery_sensor(interval_seconds: int, jobs: list[JobDefinition]) -> SensorDefinition:
    """Requests `jobs` (recovery_jobs) when attempts are orphaned or the warm Spark died."""

    @sensor(
        name="recovery_sensor",
        jobs=jobs,
        minimum_interval_seconds=interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description="Requests a recovery run when a compaction attempt is left open by a dead process, and "
        "(spark.mode: connect) a restart of the warm Spark Connect server when the one we started died.",
    )
    def _sensor(context: SensorEvaluationContext, compaction: CompactionResource):  # noqa: ANN202
        engine = compaction.engine()
        config = engine.config
        requests = []
        if restart := server_restart_request(context, config):
            requests.append(restart)
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=config.state.executing_timeout_seconds)
        orphaned = [a for a in engine.ledger.attempts(statuses=OPEN) if orphaned_because(a, cutoff)]
        for attempt in orphaned:
            context.log.info(f"orphaned {attempt.status} attempt {attempt.attempt_id} of {attempt.table_name}")
        if orphaned:
            key = ",".join(sorted(a.attempt_id for a in orphaned))
            requests.append(RunRequest(run_key=key, job_name=RECOVER_JOB))
        if not requests:
            return SkipReason("no orphaned compaction attempts")
        return requests[0] if len(requests) == 1 else SensorResult(run_requests=requests)

    return _sensor
