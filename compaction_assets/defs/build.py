"""Definitions for the tables of one compaction.yaml: assets, checks, jobs, sensors, resources."""

from __future__ import annotations

import logging

from dagster import AssetKey, AssetSelection, AssetSpec, Definitions, define_asset_job, in_process_executor

from compaction_assets.config import CompactionConfig
from compaction_assets.defs.assets import table_asset
from compaction_assets.defs.demo_writer import DEMO_WRITER_KEY, orders_stream
from compaction_assets.defs.gc_assets import gc_asset, gc_schedule
from compaction_assets.defs.naming import job_name, table_key
from compaction_assets.defs.resources import CompactionResource, pyspark_resource
from compaction_assets.defs.sensors import fragmentation_sensor, recover_job, recovery_sensor, restart_spark_server_job
from compaction_assets.errors import CatalogError, ConfigError
from compaction_assets.lake.catalog import load_table, managed_tables, open_catalog
from compaction_assets.planning.policy import Policy, resolve_policy
from compaction_assets.redact import redact

log = logging.getLogger(__name__)


def build_definitions(config: CompactionConfig) -> Definitions:
    catalog = open_catalog(config.catalog)
    assets, jobs = [], []
    partitioned: dict[str, bool] = {}
    left_out: set[str] = set()
    upstream: set[AssetKey] = set()
    for name in managed_tables(catalog, config):
        try:
            table = load_table(catalog, name)
        except CatalogError as exc:  # one unusable table must not take the code location down
            log.warning(redact(f"{name}: left out: {exc}"))
            left_out.add(name)
            continue
        rule = config.rule_for(name)
        try:
            policy = resolve_policy(name, rule.policy, table.properties)
        except ConfigError:
            policy = Policy()  # the sensor reports the invalid property on every tick
        partitioned[name] = not table.spec().is_unpartitioned()
        assets.append(table_asset(name, rule, partitioned[name], table.location(), policy))
        assets.append(gc_asset(name))
        jobs.append(define_asset_job(job_name(name), selection=AssetSelection.assets(table_key(name))))
        upstream.update(AssetKey.from_user_string(u) for u in rule.upstream)
    if DEMO_WRITER_KEY in upstream:
        assets.append(orders_stream)
    # Writers we do not run still appear in the lineage graph.
    assets.extend(AssetSpec(key, group_name="writers") for key in sorted(upstream - {DEMO_WRITER_KEY}, key=str))
    scheduling = config.scheduling
    return Definitions(
        assets=assets,
        jobs=[*jobs, recover_job, restart_spark_server_job],
        schedules=[gc_schedule(list(partitioned))] if partitioned else [],
        sensors=[
            fragmentation_sensor(partitioned, jobs, scheduling.sensor_interval_seconds, frozenset(left_out)),
            recovery_sensor(scheduling.recovery_interval_seconds),
        ],
        resources={"compaction": CompactionResource(config_path=config.source), "pyspark": pyspark_resource(config)},
        executor=in_process_executor,
    )
