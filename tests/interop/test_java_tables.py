"""Iceberg Java writes, the project compacts, Java reads: row by row against the oracle (the rows
Java was told to write, less those it was told to delete) and against Java's own read before we
touched the table; then Java's metadata tables agree with pyiceberg's and Java's maintenance
procedures run on our output. One Java process for the module.

Run alone: `.venv/bin/pytest tests/interop -q` (after `bash tests/interop/setup_java.sh`)."""

from __future__ import annotations

import datetime

import pytest

from compaction_assets.lake.delete_files import commit_delete_files, equality_delete_file
from compaction_assets.lake.files import live_files
from compaction_assets.planning.model import Kind
from tests.interop.checks import assert_metadata_agrees, assert_rows, compaction_snapshots, java_maintenance
from tests.interop.conftest import SharedLake
from tests.interop.java import multiset
from tests.interop.sqltext import insert
from tests.interop.tables import DELETE_TIER, MOR, Writer, compact, create, rows, seed_for


def round_trip(lake: SharedLake, w: Writer, kinds: set[Kind]) -> list:
    """Java's read = the oracle; compact; every reader = the oracle; metadata agrees; Java maintains.
    Returns our compaction's outcomes."""
    expected = w.expected()
    assert_rows(lake, w.name, expected, "Java's write, before compaction", duckdb=False)
    outcomes = compact(lake, w.name, kinds)
    assert_rows(lake, w.name, expected, "after our compaction")
    assert_metadata_agrees(lake, w.name)
    ours = compaction_snapshots(lake, w.name)
    parent = lake.table(w.name).snapshot_by_id(ours[0]).parent_snapshot_id
    java_maintenance(lake, w.name, expected, parent)
    return outcomes


def test_many_small_appends_by_day_and_bucket(shared_lake: SharedLake):
    w = create(shared_lake, "ns.events", "days(ts), bucket(4, id)")
    for _ in range(8):
        w.append(40)
    before = len(shared_lake.sql("SELECT * FROM {c}.ns.events.files"))
    round_trip(shared_lake, w, {Kind.MINOR})
    after = len(shared_lake.sql("SELECT * FROM {c}.ns.events.files"))
    assert after < before


def test_merge_on_read_delete_update_merge(shared_lake: SharedLake):
    w = create(shared_lake, "ns.mor", "days(ts)", {**MOR, "compaction.delete-file-threshold": "1"})
    for _ in range(6):
        w.append(30)
    w.sql("DELETE FROM {t} WHERE id % 7 = 0")
    w.oracle = {i: r for i, r in w.oracle.items() if i % 7}
    w.sql("UPDATE {t} SET payload = concat('u-', payload), amount = amount + 1 WHERE id % 5 = 1")
    for r in w.oracle.values():
        if r["id"] % 5 == 1:
            r["payload"], r["amount"] = "u-" + r["payload"], r["amount"] + 1
    matched = [dict(r, payload="m-" + r["payload"]) for r in rows(0, 40) if r["id"] % 7 and r["id"] % 3 == 0]
    source = rows(1000, 20) + matched
    w.sql(
        "CREATE OR REPLACE TEMPORARY VIEW src AS SELECT * FROM VALUES "
        + insert("x", source).split(" VALUES ", 1)[1]
        + " AS src(id, ts, payload, amount)"
    )
    w.sql(
        "MERGE INTO {t} t USING src s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET t.payload = s.payload WHEN NOT MATCHED THEN INSERT *"
    )
    for s in source:
        if s["id"] in w.oracle:
            w.oracle[s["id"]]["payload"] = s["payload"]
        else:
            w.oracle[s["id"]] = s
    deletes = shared_lake.sql("SELECT count(*) AS n FROM {c}.ns.mor.delete_files")[0]["n"]
    assert deletes > 0, "Java wrote no position deletes: the table is not merge-on-read"
    outcomes = round_trip(shared_lake, w, {Kind.MAJOR, Kind.MINOR})
    assert shared_lake.sql("SELECT count(*) AS n FROM {c}.ns.mor.delete_files")[0]["n"] == 0
    # Java's position deletes applied on the Polars path (polars_deletes), not only the per-file one
    assert any(o.engine == "polars" and o.rows_deleted for o in outcomes)


def test_schema_and_partition_evolution(shared_lake: SharedLake):
    lake = shared_lake
    lake.sql(
        "CREATE TABLE {c}.ns.evo (id int, ts timestamp, payload string, amount double) USING iceberg "
        "PARTITIONED BY (bucket(2, id)) TBLPROPERTIES ('format-version'='2')"
    )
    w = Writer(lake, "ns.evo")
    for _ in range(6):
        w.append(20)
    w.sql("ALTER TABLE {t} ADD COLUMN note string")
    for r in w.oracle.values():
        r["note"] = None
    for _ in range(3):
        w.append(20, note="n")
    w.sql("ALTER TABLE {t} RENAME COLUMN payload TO body")
    w.sql("ALTER TABLE {t} DROP COLUMN amount")
    w.sql("ALTER TABLE {t} ALTER COLUMN id TYPE bigint")
    for r in w.oracle.values():
        r["body"] = r.pop("payload")
        r.pop("amount")
    w.sql("ALTER TABLE {t} ADD PARTITION FIELD days(ts)")
    for _ in range(6):
        batch = [{"id": r["id"], "ts": r["ts"], "body": r["payload"], "note": "v2"} for r in rows(w.next_id, 20)]
        w.next_id += 20
        lake.sql(insert("{c}.ns.evo", batch))
        w.oracle.update({r["id"]: r for r in batch})
    round_trip(lake, w, {Kind.MINOR, Kind.MAJOR, Kind.OLD_SPEC})
    specs = {f["spec_id"] for f in lake.sql("SELECT spec_id FROM {c}.ns.evo.files")}
    assert specs == {1}, f"files of an old spec remain: {specs}"


def test_a_table_with_a_sort_order(shared_lake: SharedLake):
    w = create(shared_lake, "ns.sorted", "days(ts)")
    w.sql("ALTER TABLE {t} WRITE ORDERED BY amount DESC, id")
    for _ in range(6):
        w.append(30)
    round_trip(shared_lake, w, {Kind.MINOR, Kind.MAJOR})


# Each tier on a table Java wrote: the table properties that make it the one planned, and the writes.
TIERS = {
    Kind.FULL: {"compaction.full.trigger-interval-ms": "1", "compaction.min-input-files": "100"},
    Kind.SPLIT: {"compaction.max-file-size-bytes": "2000", "compaction.target-file-size-bytes": "1000"},
    Kind.CLUSTER: {"compaction.cluster.min-overlap": "2", "compaction.target-file-size-bytes": "4000"},
    Kind.EXPIRE: {"compaction.expire.field": "ts", "compaction.expire.retention-ms": str(365 * 86_400_000)},
    Kind.REWRITE_POSITION_DELETES: {
        **MOR,
        **DELETE_TIER,
        "write.delete.granularity": "partition",
        "compaction.position-delete-file-threshold": "2",
    },
    # Spark does not write equality deletes (Flink does): they are committed as another engine would
    Kind.CONVERT_EQUALITY_DELETES: {**DELETE_TIER, "compaction.equality-delete-file-threshold": "2"},
}


@pytest.mark.parametrize("kind", list(TIERS), ids=str)
def test_every_tier_on_a_java_table(shared_lake: SharedLake, kind: Kind):
    name = f"ns.tier_{kind.value.replace('-', '_')}"
    w = create(shared_lake, name, "" if kind == Kind.SPLIT else "days(ts)", TIERS[kind])
    seed_for(w, kind, appends=3)
    at_before = None
    if kind == Kind.EXPIRE:
        old = [dict(r, ts=r["ts"] - datetime.timedelta(days=800)) for r in rows(w.next_id, 30)]
        shared_lake.sql(insert(f"{{c}}.{name}", old))
        at_before = w.expected() + multiset(old)
    if kind == Kind.REWRITE_POSITION_DELETES:
        for m in (3, 5, 11):
            w.sql(f"DELETE FROM {{t}} WHERE id % {m} = 0")
        w.oracle = {i: r for i, r in w.oracle.items() if i % 3 and i % 5 and i % 11}
    if kind == Kind.CONVERT_EQUALITY_DELETES:
        table = shared_lake.table(name)
        some = table.inspect.files().to_pylist()[0]
        data = next(f.data_file for f in live_files(table) if f.data_file.file_path == some["file_path"])
        gone = [i for i in w.oracle if i % 4 == 0 and w.oracle[i]["ts"].date() == w.oracle[min(w.oracle)]["ts"].date()]
        deletes = [
            equality_delete_file(table, data.spec_id, data.partition, ["id"], [{"id": i} for i in gone[k::3]])
            for k in range(3)
        ]
        commit_delete_files(table, deletes)
        w.oracle = {i: r for i, r in w.oracle.items() if i not in gone}
    expected = w.expected()  # without the expired rows, which Java reads until we drop them
    if kind not in (Kind.EXPIRE, Kind.CONVERT_EQUALITY_DELETES):  # pyiceberg cannot read equality deletes
        assert_rows(shared_lake, name, expected, "Java's write, before compaction", duckdb=False)
    compact(shared_lake, name, {kind})
    assert_rows(shared_lake, name, expected, f"after our {kind}")
    assert_metadata_agrees(shared_lake, name, expired=kind == Kind.EXPIRE)
    ours = compaction_snapshots(shared_lake, name)
    parent = shared_lake.table(name).snapshot_by_id(ours[0]).parent_snapshot_id
    java_maintenance(shared_lake, name, expected, parent, at_before)


def test_rewrite_manifests_on_a_java_table(shared_lake: SharedLake):
    w = create(shared_lake, "ns.manifests", "days(ts)", {"compaction.rewrite-manifests.min-count": "3"})
    for _ in range(8):
        w.append(10)
    expected = w.expected()
    before = shared_lake.table("ns.manifests").current_snapshot().snapshot_id
    report = shared_lake.engine.rewrite_manifests("ns.manifests")
    assert report.status == "committed", report
    assert len(shared_lake.sql("SELECT * FROM {c}.ns.manifests.manifests")) < 8
    assert_rows(shared_lake, "ns.manifests", expected, "after our manifest rewrite")
    assert_metadata_agrees(shared_lake, "ns.manifests")
    java_maintenance(shared_lake, "ns.manifests", expected, before)
