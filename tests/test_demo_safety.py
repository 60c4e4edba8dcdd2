"""The demo replaces tables only in a catalog it created itself, and refuses any other by name."""

import os
import subprocess

import pytest

from compaction_assets.config import load_config
from compaction_assets.lake.catalog import open_catalog
from compaction_tools.demo import DEMO_TABLES, NotADemoLake, claim_demo_catalog, create_demo_lake
from tests.conftest import BY_REGION, CLI, SCHEMA, batch, write_config


def test_demo_refuses_a_catalog_it_did_not_create(tmp_path):
    config_path = write_config(tmp_path)
    catalog = open_catalog(load_config(config_path).catalog)
    catalog.create_namespace("sales")
    orders = catalog.create_table("sales.orders", schema=SCHEMA, partition_spec=BY_REGION)
    orders.append(batch(0, 10, "eu"))
    snapshot = orders.current_snapshot().snapshot_id

    env = {**os.environ, "COMPACTION_CONFIG": str(config_path)}
    run = subprocess.run([*CLI, "demo", "--no-ui"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "catalog 'lake'" in run.stderr and str(tmp_path / "catalog.db") in run.stderr
    assert "not created by the demo" in run.stderr
    assert catalog.load_table("sales.orders").current_snapshot().snapshot_id == snapshot
    with pytest.raises(NotADemoLake):
        create_demo_lake(catalog, files_per_partition=2)
    assert catalog.load_table("sales.orders").current_snapshot().snapshot_id == snapshot


def test_demo_creates_marks_and_reuses_its_own_catalog(tmp_path):
    config = load_config(write_config(tmp_path))
    db = claim_demo_catalog(config.catalog)
    assert db == tmp_path / "catalog.db" and (tmp_path / "catalog.db.demo-lake").exists()
    catalog = open_catalog(config.catalog)
    assert set(create_demo_lake(catalog, files_per_partition=2)) == set(DEMO_TABLES)
    claim_demo_catalog(config.catalog)  # a rerun finds its own mark
    assert set(create_demo_lake(catalog, files_per_partition=2)) == set(DEMO_TABLES)


def test_demo_refuses_a_catalog_that_is_not_a_local_sqlite_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PW", "Planted-S3cret-pw")
    uri = "postgresql+psycopg://lake:${PW}@db.example:5432/lake"
    config = load_config(write_config(tmp_path, catalog={"name": "prod", "properties": {"type": "sql", "uri": uri}}))
    with pytest.raises(NotADemoLake) as err:
        claim_demo_catalog(config.catalog)
    assert "catalog 'prod'" in str(err.value) and "db.example" in str(err.value)
    assert "Planted-S3cret-pw" not in str(err.value)
