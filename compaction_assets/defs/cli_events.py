"""Work the CLI did outside Dagster, reported to a Dagster instance as runless materialisations.

`compact`, `expire`, `recover`, `rewrite-manifests` and `gc` call `report_*` after their work when
a Dagster instance is configured: the table's asset partitions (and the maintenance asset's
partition of the table) then show the same materialisations, with the same metadata, as a run's.
Dagster's `DagsterInstance.report_runless_asset_event` records them; a dynamic partition the
sensor has not added yet is added first, so the event belongs to a partition the UI lists.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from dagster import AssetMaterialization, DagsterInstance

from compaction_assets.commit.ledger import Status
from compaction_assets.commit.manifest_rewrite import ManifestRewriteReport
from compaction_assets.commit.recovery import RecoveryReport
from compaction_assets.defs.assets import outcome_materialization
from compaction_assets.defs.gc_assets import MAINTENANCE_PARTITIONS_NAME, gc_metadata, manifests_metadata
from compaction_assets.defs.naming import MAINTENANCE_KEY, partitions_name
from compaction_assets.engine.facade import Engine
from compaction_assets.engine.outcomes import PartitionOutcome
from compaction_assets.lake.catalog import load_table
from compaction_assets.maintenance.gc import GcReport


def report_outcomes(home: Path, engine: Engine, outcomes: list[PartitionOutcome]) -> int:
    """A materialisation per committed partition of `outcomes` (a CLI `compact` or `expire`);
    returns how many were reported. Partitions left alone are not materialisations outside a run."""
    committed = [o for o in outcomes if o.status == "committed"]
    figures = {"partitions_in_run": len(outcomes), "reported_by": "compaction-assets CLI"}
    return _report(home, engine, committed, figures)


def report_recovery(home: Path, engine: Engine, report: RecoveryReport) -> int:
    """A materialisation per attempt `recover` committed or found committed (its partition's)."""
    outcomes = []
    for attempt_id, how in [
        *((a, "recommitted") for a in report.recommitted),
        *((a, "confirmed") for a in report.confirmed),
    ]:
        a = engine.ledger.get(attempt_id)
        if a is None or a.status != Status.COMMITTED:
            continue
        outcomes.append(
            PartitionOutcome(
                table_name=a.table_name,
                partition_key=a.partition_key,
                status="committed",
                reason=f"{how} by `compaction-assets recover` (attempt {a.attempt_id})",
                kind=a.kind,
                task_id=a.task_id,
                attempt_id=a.attempt_id,
                snapshot_id=a.committed_snapshot_id,
                files_before=len(a.source_files),
                files_after=len(a.result_files),
                bytes_before=a.bytes_in,
                bytes_after=a.bytes_out or 0,
                rows=a.rows_in,
                rows_expired=a.rows_expired or 0,
            )
        )
    return _report(home, engine, outcomes, {"reported_by": "compaction-assets recover"})


def report_maintenance(home: Path, reports: Iterable[ManifestRewriteReport | GcReport]) -> int:
    """The maintenance asset's materialisation of each table's manifest rewrite or GC (not dry runs)."""
    events = [
        AssetMaterialization(
            asset_key=MAINTENANCE_KEY,
            partition=r.table_name,
            metadata=manifests_metadata(r) if isinstance(r, ManifestRewriteReport) else gc_metadata(r),
        )
        for r in reports
        if not (r.status == "dry_run" if isinstance(r, ManifestRewriteReport) else r.dry_run)
    ]
    with DagsterInstance.from_config(str(home)) as instance:
        _ensure_partitions(instance, MAINTENANCE_PARTITIONS_NAME, [str(e.partition) for e in events])
        for event in events:
            instance.report_runless_asset_event(event)
    return len(events)


def _report(home: Path, engine: Engine, outcomes: list[PartitionOutcome], figures: dict) -> int:
    if not outcomes:
        return 0
    partitioned: dict[str, bool] = {}
    for name in {o.table_name for o in outcomes}:
        partitioned[name] = not load_table(engine.catalog, name).spec().is_unpartitioned()
    with DagsterInstance.from_config(str(home)) as instance:
        for name, is_partitioned in partitioned.items():
            if is_partitioned:
                keys = [o.partition_key for o in outcomes if o.table_name == name and o.partition_key]
                _ensure_partitions(instance, partitions_name(name), keys)
        for o in outcomes:
            rule = engine.config.rule_for(o.table_name)
            queue = rule.queue if rule else "default"
            instance.report_runless_asset_event(outcome_materialization(o, queue, partitioned[o.table_name], figures))
    return len(outcomes)


def _ensure_partitions(instance: DagsterInstance, name: str, keys: list[str]) -> None:
    """Add the keys the dynamic partitions definition `name` lacks (the sensor adds them too)."""
    existing = set(instance.get_dynamic_partitions(name))
    if missing := sorted(set(keys) - existing):
        instance.add_dynamic_partitions(name, missing)
