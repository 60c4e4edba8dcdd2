"""Relative warehouse paths: absolute in the config; a table an outside writer created under a
relative `file://` warehouse is refused by every command in one line, naming it."""

import os
import subprocess

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

from compaction_assets.config import load_config
from tests.conftest import CLI, write_config


@pytest.mark.parametrize("warehouse", ["file://.lake/warehouse", "file:.lake/warehouse", ".lake/warehouse"])
def test_relative_warehouse_resolves_to_an_absolute_uri(tmp_path, warehouse):
    props = {"type": "sql", "uri": "sqlite:///.lake/catalog.db", "warehouse": warehouse}
    config = load_config(write_config(tmp_path, catalog={"name": "lake", "properties": props}))
    assert config.catalog.properties["warehouse"] == f"file://{tmp_path / '.lake' / 'warehouse'}"
    assert config.catalog.properties["uri"] == f"sqlite:///{tmp_path / '.lake' / 'catalog.db'}"


def test_a_table_with_a_relative_location_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the outside writer copied README's relative warehouse
    (tmp_path / ".lake" / "warehouse").mkdir(parents=True)
    writer = load_catalog("lake", type="sql", uri="sqlite:///.lake/catalog.db", warehouse="file://.lake/warehouse")
    writer.create_namespace("ext")
    table = writer.create_table("ext.t", schema=pa.schema([("id", pa.int64())]))
    for i in range(6):
        table.append(pa.table({"id": [i]}))
    snapshot = table.current_snapshot().snapshot_id
    props = {"type": "sql", "uri": "sqlite:///.lake/catalog.db", "warehouse": "file://.lake/warehouse"}
    config_path = write_config(tmp_path, catalog={"name": "lake", "properties": props})

    env = {**os.environ, "COMPACTION_CONFIG": str(config_path)}
    for args in (["gc", "--dry-run", "ext.t"], ["compact", "ext.t"], ["plan", "ext.t"]):
        run = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=300, cwd="/")
        assert run.returncode == 2, run.stderr
        [line] = run.stderr.strip().splitlines()
        assert "table 'ext.t'" in line and "file://.lake/warehouse/ext/t" in line and "file:///" in line
    assert writer.load_table("ext.t").current_snapshot().snapshot_id == snapshot
