"""The `compaction-assets` command on any table a pyiceberg user can read, via COMPACTION_CONFIG."""

import json

import yaml
from pyiceberg.catalog.sql import SqlCatalog

from compaction_assets.lake.digest import rows_digest
from tests.conftest import SCHEMA, batch


def test_compact_a_plain_pyiceberg_table_in_another_catalog(tmp_path, lake):
    # A table as any pyiceberg user makes it: one append per micro-batch, no help from us.
    other = tmp_path / "elsewhere"
    other.mkdir()
    catalog = SqlCatalog("prod", uri=f"sqlite:///{other}/cat.db", warehouse=f"file://{other}/wh")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.tbl", schema=SCHEMA)
    for i in range(8):
        table.append(batch(i * 10, 10, "eu"))
    before = rows_digest(table)
    config = other / "other.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "catalog": {
                    "name": "prod",
                    "properties": {"type": "sql", "uri": "sqlite:///cat.db", "warehouse": "wh"},
                },
                "spark": {"master": "local[2]"},
                "tables": [{"match": "ns.*"}],
            }
        )
    )

    planned = lake.cli("plan", "ns.tbl", "--json", config=config)
    assert planned.returncode == 0, planned.stderr
    [partition] = json.loads(planned.stdout)["partitions"]
    assert partition["kind"] == "minor" and partition["stats"]["data_files"] == 8

    run = lake.cli("compact", "ns.tbl", config=config)

    assert run.returncode == 0, run.stderr
    assert "committed minor: 8 -> 1 files" in run.stdout
    for noise in (" WARN ", "Setting default log level", "log4j profile", "[Stage "):  # Spark's, not ours
        assert noise not in run.stderr + run.stdout, run.stderr
    table = catalog.load_table("ns.tbl")
    assert len(table.inspect.files()) == 1
    assert rows_digest(table) == before
    status = json.loads(lake.cli("status", "--json", config=config).stdout)
    assert status["tasks_by_state"] == {"COMMITTED": 1}
    [row] = status["tables"]
    assert (row["table"], row["data_files"], row["fragments"], row["paused"]) == ("ns.tbl", 1, 1, False)
    assert row["last_compaction"] and row["open_tasks"] == 0
    assert [q["queue"] for q in status["queues"]] == ["default"]
    assert (other / "compaction_state.db").exists()  # the ledger defaults to beside the catalog
