"""The code location: assets, partitions, lineage, checks and jobs built from compaction.yaml."""

import os
import subprocess
from pathlib import Path

from dagster import AssetKey, DynamicPartitionsDefinition

from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions, table_job
from tests.conftest import REPO, venv_bin

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
    gc = graph.get(AssetKey(["gc", "sales", "orders"]))
    assert gc.parent_keys == {AssetKey(["lake", "sales", "orders"])}  # GC is downstream of the table
    assert [s.name for s in defs.schedules] == ["gc_daily"]


def test_dagster_validates_the_default_config_and_another_catalog(queued_lake, tmp_path):
    default = validate(None, REPO)
    assert default.returncode == 0, default.stderr
    other = validate(queued_lake.config_path, REPO)
    assert other.returncode == 0, other.stderr
    assert "Validation successful" in other.stderr + other.stdout
