"""One picture of the service: per table fragmentation and tasks, per queue load and limits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TypedDict

from compaction_assets.commit.ledger import OPEN, Status
from compaction_assets.config import SparkConfig
from compaction_assets.engine.facade import Engine
from compaction_assets.engine.table_plan import TablePlan
from compaction_assets.errors import CompactionError
from compaction_assets.lake.catalog import load_table, managed_tables


@dataclass(frozen=True)
class TableStatus:
    table: str
    queue: str
    priority: int
    paused: bool
    partitions: int
    data_files: int
    fragments: int
    small_files: int  # undersized: < min_target_size_ratio x target
    avg_file_bytes: int
    partitions_to_compact: int
    open_tasks: int
    last_compaction: str | None  # when the newest COMMITTED attempt finished
    error: str | None = None


class _TableFacts(TypedDict):
    """The TableStatus fields known without planning the table."""

    table: str
    queue: str
    priority: int
    open_tasks: int
    last_compaction: str | None


@dataclass(frozen=True)
class QueueStatus:
    queue: str
    running: int | None  # None when no Dagster instance is reachable
    queued: int | None
    capacity: int
    limit: int


def table_statuses(engine: Engine) -> list[TableStatus]:
    attempts = engine.ledger.attempts()
    statuses = []
    for name in managed_tables(engine.catalog, engine.config):
        base = _table_facts(engine, name, attempts)
        try:
            plan = engine.plan_for(load_table(engine.catalog, name), name)
        except CompactionError as exc:
            zero = {"partitions": 0, "data_files": 0, "fragments": 0, "small_files": 0, "avg_file_bytes": 0}
            statuses.append(TableStatus(**base, **zero, paused=False, partitions_to_compact=0, error=str(exc)))
            continue
        statuses.append(_planned_status(base, plan))
    return statuses


def _table_facts(engine: Engine, name: str, attempts: list) -> _TableFacts:
    """A table's queue, priority and task facts from its rule and the ledger's attempts."""
    rule = engine.config.managed_rule(name)
    mine = [a for a in attempts if a.table_name == name]
    committed = [a.finished_at for a in mine if a.status == Status.COMMITTED and a.finished_at]
    return {
        "table": name,
        "queue": rule.queue,
        "priority": rule.priority,
        "open_tasks": sum(a.status in OPEN for a in mine),
        "last_compaction": max(committed).isoformat() if committed else None,
    }


def _planned_status(base: _TableFacts, plan: TablePlan) -> TableStatus:
    """A table's status from its plan: file counts and sizes summed over its partitions."""
    stats = [p.stats for p in plan.partitions]
    files = sum(s.data_files for s in stats)
    return TableStatus(
        **base,
        paused=not plan.policy.enabled,
        partitions=len(stats),
        data_files=files,
        fragments=sum(s.fragments for s in stats),
        small_files=sum(s.undersized for s in stats),
        avg_file_bytes=sum(s.data_bytes for s in stats) // files if files else 0,
        partitions_to_compact=len(plan.to_compact),
    )


def queue_statuses(engine: Engine, load: Mapping[str, tuple[int, int]] | None) -> list[QueueStatus]:
    """`load`: queue -> (running, queued) from the Dagster instance, if one is reachable."""
    return [
        QueueStatus(
            q.name,
            load.get(q.name, (0, 0))[0] if load is not None else None,
            load.get(q.name, (0, 0))[1] if load is not None else None,
            q.capacity,
            q.max_concurrent_runs,
        )
        for q in engine.config.queues
    ]


SPARK_PROBE_TIMEOUT_S = 3.0  # status stays fast: one request, answered in time or reported as not answering


def spark_server_status(cfg: SparkConfig) -> tuple[dict, str] | None:
    """Connect mode: the warm server's health (state, pid, whether it answers) and one line
    saying it; None in local mode, where every run starts its own Spark."""
    if cfg.mode != "connect":
        return None
    from compaction_assets.execution import connect_server

    try:
        health = connect_server.health(cfg, timeout_s=SPARK_PROBE_TIMEOUT_S)
    except CompactionError as exc:  # e.g. a spark.remote that is not this machine
        return {"state": "unknown", "running": False, "detail": str(exc)}, f"Spark Connect server: {exc}"
    return health.as_dict(), health.describe()


def as_dict(
    tables: list[TableStatus], queues: list[QueueStatus], tasks: Mapping[str, int], spark_server: dict | None = None
) -> dict:
    out = {"queues": [asdict(q) for q in queues], "tables": [asdict(t) for t in tables], "tasks_by_state": dict(tasks)}
    if spark_server is not None:
        out["spark_server"] = spark_server
    return out
