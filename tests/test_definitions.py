"""The code location: assets, partitions, lineage, checks and jobs built from compaction.yaml."""

import os
import subprocess
from pathlib import Path

from dagster import AssetKey, DynamicPartitionsDefinition
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField

from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions, table_job
from compaction_assets.defs.naming import run_tables
from compaction_assets.lake.catalog import open_catalog
from compaction_assets.lake.table_details import details_from_metadata
from tests.conftest import REPO, venv_bin, write_config

DAGSTER = venv_bin("dagster")


def validate(config: Path | None, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ}
    env.pop("COMPACTION_CONFIG", None)
    if config:
        env["COMPACTION_CONFIG"] = str(config)
    command = [DAGSTER, "definitions", "validate", "-w", str(REPO / "workspace.yaml")]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def test_assets_partitions_lineage_and_checks(queued_lake):
    defs = build_definitions(load_config(queued_lake.config_path))
    graph = defs.resolve_asset_graph()
    orders = graph.get(AssetKey(["lake", "sales", "orders"]))
    assert isinstance(orders.partitions_def, DynamicPartitionsDefinition)
    assert orders.partitions_def.name == "lake__sales__orders"
    assert orders.group_name == "sales"
    assert {"iceberg", "spark"} <= set(orders.kinds)
    assert AssetKey(["writers", "orders_stream"]) in orders.parent_keys  # lineage from compaction.yaml
    assert graph.get(AssetKey(["lake", "ns", "flat"])).partitions_def is None  # unpartitioned table
    check_keys = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    for table in ("lake/sales/orders", "lake/ns/events", "lake/ns/flat"):
        assert (table, "precommit_commit_consistency") in check_keys
    assert table_job(defs, "sales.orders") is not None
    assert {s.name for s in defs.sensors} == {"fragmentation_sensor", "recovery_sensor"}
    maintenance = graph.get(AssetKey("maintenance"))  # GC and manifest rewrites: a partition per table
    assert isinstance(maintenance.partitions_def, DynamicPartitionsDefinition)
    assert maintenance.partitions_def.name == "maintenance_tables"
    assert not any(k.path[0] == "gc" for k in graph.get_all_asset_keys())  # one maintenance asset, not one per table
    assert [s.name for s in defs.schedules] == ["gc_daily"]


def test_dagster_validates_the_default_config_and_another_catalog(queued_lake, tmp_path):
    default = validate(None, REPO)
    assert default.returncode == 0, default.stderr
    other = validate(queued_lake.config_path, REPO)
    assert other.returncode == 0, other.stderr
    assert "Validation successful" in other.stderr + other.stdout


def partitioned_keys(defs) -> dict[str, bool]:  # noqa: ANN001
    graph = defs.resolve_asset_graph()
    return {
        "/".join(k.path[1:]): graph.get(k).partitions_def is not None
        for k in graph.get_all_asset_keys()
        if k.path[0] == "lake"
    }


def test_details_follow_the_catalog_and_a_run_worker_defines_only_its_tables(tmp_path):
    """Details are cached by metadata file: a reload shows a table created since, and a table that
    became partitioned (a new metadata file) as partitioned; `only` builds the run's tables alone."""
    config = load_config(write_config(tmp_path))
    catalog = open_catalog(config.catalog)
    catalog.create_namespace("ns")
    schema = Schema(
        NestedField(1, "id", LongType(), required=False), NestedField(2, "p", IntegerType(), required=False)
    )
    catalog.create_table("ns.a", schema=schema)
    catalog.create_table("ns.b", schema=schema, properties={"compaction.min-input-files": "7"})
    assert partitioned_keys(build_definitions(config)) == {"ns/a": False, "ns/b": False}

    catalog.create_table("ns.c", schema=schema)
    with catalog.load_table("ns.a").update_spec() as spec:
        spec.add_identity("p")
    defs = build_definitions(config)
    assert partitioned_keys(defs) == {"ns/a": True, "ns/b": False, "ns/c": False}
    b = defs.resolve_asset_graph().get(AssetKey(["lake", "ns", "b"]))
    assert "min input files 7" in b.description  # the policy from table properties, read from the cache

    scoped = build_definitions(config, only=["ns.c"])
    assert partitioned_keys(scoped) == {"ns/c": False}
    assert table_job(scoped, "ns.c") is not None
    assert run_tables([AssetKey(["lake", "ns", "c"]), AssetKey(["lake", "ns", "a"])]) == ["ns.a", "ns.c"]
    assert run_tables([AssetKey("maintenance")]) == []  # a maintenance run defines no table asset
    assert run_tables([AssetKey("maintenance"), AssetKey(["lake", "ns", "a"])]) == ["ns.a"]
    assert any(
        k == AssetKey("maintenance")
        for k in build_definitions(config, only=[]).resolve_asset_graph().get_all_asset_keys()
    )
    assert run_tables([AssetKey(["writers", "orders_stream"])]) is None and run_tables(None) is None


def test_metadata_details_of_every_format_version():
    v1 = {"location": "s3://b/t", "partition-spec": [{"name": "p", "transform": "identity", "source-id": 2}]}
    assert details_from_metadata(v1).partitioned
    spec = {"spec-id": 1, "fields": []}
    v2 = {"location": "s3://b/t", "default-spec-id": 1, "partition-specs": [{"spec-id": 0, "fields": [{}]}, spec]}
    assert not details_from_metadata(v2).partitioned  # the default spec, not the first, decides
    assert details_from_metadata(v2 | {"properties": {"owner": "x", "compaction.enabled": "false"}}).properties == {
        "compaction.enabled": "false"
    }
