"""Format-version 3 tables are refused at planning, with the reason, in plan, compact and the sensor's
tick log (review finding r5); and no failure between beginning attempts and the rewrite leaves one
open. Real tables upgraded to v3 as Java does (same manifests; metadata format-version 3)."""

import json
import sqlite3
import uuid

import pytest
from dagster import build_sensor_context, instance_for_test

from compaction_assets.commit.ledger import Status
from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.engine import TablePlan
from compaction_assets.lake.catalog import load_table
from compaction_assets.lake.files import live_files
from compaction_assets.planning.planner import plan_table
from tests.conftest import create_fragmented, make_lake

REASON = "format-version 3 tables are not compacted: row lineage"


@pytest.fixture
def lake(tmp_path):
    with make_lake(tmp_path, spark=None) as lake:  # nothing here may start Spark
        yield lake


def upgrade_to_v3(lake, name: str):
    """Point the catalog at a copy of the table's metadata with format-version 3 and next-row-id."""
    table = lake.table(name)
    with open(table.metadata_location.removeprefix("file://")) as metadata:
        doc = json.load(metadata)
    doc["format-version"], doc["next-row-id"] = 3, 0
    location = table.metadata_location.rsplit("/", 1)[0] + f"/00099-{uuid.uuid4()}.metadata.json"
    with open(location.removeprefix("file://"), "w") as out:
        out.write(json.dumps(doc))
    with sqlite3.connect(lake.root / "catalog.db") as db:
        db.execute("update iceberg_tables set metadata_location=? where table_name=?", (location, name.split(".")[1]))
    table = lake.table(name)
    assert table.format_version == 3
    return table


def test_v3_table_is_planned_as_refused_and_compact_skips_it_leaving_nothing_open(lake):
    create_fragmented(lake, "ns.t", {"eu": 10, "us": 10})
    before = upgrade_to_v3(lake, "ns.t").metadata_location

    tplan = lake.engine.plan("ns.t")
    assert tplan.refused.startswith(REASON) and not tplan.to_compact
    assert [p.reason for p in tplan.partitions] == [tplan.refused] * 2

    outcomes = lake.engine.compact("ns.t")

    assert [(o.status, o.reason) for o in outcomes] == [("skipped", tplan.refused)] * 2
    assert lake.engine.ledger.attempts() == []
    assert lake.table("ns.t").metadata_location == before

    shown = lake.cli("plan", "ns.t")
    assert shown.returncode == 0 and REASON in shown.stdout
    assert json.loads(lake.cli("plan", "ns.t", "--json").stdout)["refused"] == tplan.refused
    compacted = lake.cli("compact", "ns.t")
    assert compacted.returncode == 0 and compacted.stdout.count(f"skipped: {REASON}") == 2
    assert lake.engine.ledger.attempts() == []


def test_sensor_tick_log_says_why_a_v3_table_is_not_compacted(lake, capfd):
    create_fragmented(lake, "ns.t", {"eu": 10})
    upgrade_to_v3(lake, "ns.t")
    defs = build_definitions(load_config(lake.config_path))
    with instance_for_test() as instance:
        context = build_sensor_context(
            instance=instance,
            definitions=defs,
            resources={"compaction": CompactionResource(config_path=str(lake.config_path))},
        )
        result = defs.get_sensor_def("fragmentation_sensor")(context)
    assert not result.run_requests
    assert f"dagster - INFO - ns.t: not compacted: {REASON}" in capfd.readouterr().err


def test_a_failure_after_attempts_began_abandons_them(lake):
    """The job cannot be built for this table (pyiceberg 0.12 cannot serialise v3 metadata): the attempt
    already begun for the first partition ends FAILED with the error, none stays EXECUTING."""
    create_fragmented(lake, "ns.t", {"eu": 10, "us": 10})
    table = upgrade_to_v3(lake, "ns.t")
    engine = lake.engine
    policy = engine.policy(table, "ns.t")
    plans = plan_table(live_files(table), policy, table.spec().spec_id)  # as if v3 were not refused
    tplan = TablePlan("ns.t", table.current_snapshot().snapshot_id, policy, plans)
    files = {f.path: f for f in live_files(table)}

    with pytest.raises(NotImplementedError):
        engine._begin(
            load_table(engine.catalog, "ns.t"), "ns.t", tplan, files, tplan.to_compact, (None, len(tplan.to_compact))
        )

    attempts = engine.ledger.attempts()
    assert len(attempts) == 2
    assert all(a.status == Status.FAILED and "could not start the rewrite" in a.reason for a in attempts)
