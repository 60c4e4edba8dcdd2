"""Definitions for the tables of one compaction.yaml: assets, checks, jobs, sensors, resources.

Loading them costs one catalog query (SQL catalogs: names and metadata files of every table) and
one query of the details cache (lake/table_details); a metadata file is read only the first time
it is seen. The Dagster objects are a few ops per queue (each table of the queue is an asset of
one of them: see naming.op_name) and one maintenance asset partitioned by table (gc_assets), not
an op and a job per table: the sensor requests a table by asset selection.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from dagster import AssetKey, AssetSpec, Definitions, JobDefinition, in_process_executor

from compaction_assets.config import CompactionConfig
from compaction_assets.defs.assets import queue_assets, table_spec
from compaction_assets.defs.demo_writer import DEMO_WRITER_KEY, orders_stream
from compaction_assets.defs.gc_assets import gc_schedule, maintenance
from compaction_assets.defs.naming import op_name, table_key
from compaction_assets.defs.recovery import recovery_jobs, recovery_sensor
from compaction_assets.defs.resources import CompactionResource, pyspark_resource
from compaction_assets.defs.sensors import fragmentation_sensor
from compaction_assets.errors import ConfigError
from compaction_assets.lake.catalog import managed_versions, open_catalog
from compaction_assets.lake.table_details import DetailsCache, managed_details
from compaction_assets.planning.policy import Policy, resolve_policy
from compaction_assets.redact import redact

log = logging.getLogger(__name__)


def build_definitions(config: CompactionConfig, only: Collection[str] | None = None) -> Definitions:
    """Every managed table's asset; with `only`, just those tables' (a run worker needs no more:
    see dagster_host), so a run's start does not grow with the number of tables."""
    catalog = open_catalog(config.catalog)
    versions = managed_versions(catalog, config)
    if only is not None:
        versions = {name: v for name, v in versions.items() if name in only}
    cache = DetailsCache(config.state_uri)
    try:
        details = managed_details(catalog, versions, cache, lambda message: log.warning(redact(message)))
    finally:
        cache.dispose()
    specs_by_op: dict[tuple[str, str], dict[str, AssetSpec]] = {}
    upstream: set[AssetKey] = set()
    for name, found in details.items():
        rule = config.managed_rule(name)
        try:
            policy = resolve_policy(name, rule.policy, found.properties)
        except ConfigError:
            policy = Policy()  # the sensor reports the invalid property on every tick
        spec = table_spec(name, rule, found.partitioned, found.location, policy)
        specs_by_op.setdefault((op_name(rule.queue, name), rule.queue), {})[name] = spec
        upstream.update(AssetKey.from_user_string(u) for u in rule.upstream)
    assets: list = [queue_assets(op, queue, specs) for (op, queue), specs in sorted(specs_by_op.items())]
    assets.append(maintenance)
    if DEMO_WRITER_KEY in upstream:
        assets.append(orders_stream)
    # Writers we do not run still appear in the lineage graph.
    assets.extend(AssetSpec(key, group_name="writers") for key in sorted(upstream - {DEMO_WRITER_KEY}, key=str))
    scheduling = config.scheduling
    partitioned = {name: found.partitioned for name, found in details.items()}
    left_out = frozenset(versions) - frozenset(details)
    compaction = CompactionResource(config_path=config.source)
    jobs = recovery_jobs(compaction)
    return Definitions(
        assets=assets,
        jobs=jobs,
        schedules=[gc_schedule(list(details) if only is None else None)],
        sensors=[
            fragmentation_sensor(partitioned, scheduling.sensor_interval_seconds, left_out),
            recovery_sensor(scheduling.recovery_interval_seconds, jobs),
        ],
        resources={"compaction": compaction, "pyspark": pyspark_resource(config)},
        executor=in_process_executor,
    )


def table_job(defs: Definitions, table_name: str) -> JobDefinition:
    """What a run the sensor requests for the table executes: Dagster's asset job, subset to the
    table's asset and its check."""
    return defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection={table_key(table_name)})
