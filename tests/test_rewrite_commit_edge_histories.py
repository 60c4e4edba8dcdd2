"""Histories an outside review drove through the commit path (RewriteFiles semantics): each
test is one history other engines can make, checked by the spec's rules and by DuckDB."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import FloatType, LongType, NestedField

import compaction_assets.commit.two_phase as two_phase
from compaction_assets.commit.ledger import Status
from compaction_assets.iceberg_compat.arrow import dataframe_to_data_files
from compaction_assets.lake.files import live_files
from compaction_tools.demo import append_fragments
from tests.conftest import BY_REGION, SCHEMA, batch, create_fragmented
from tests.foreign_deletes import commit_deletes, equality_delete
from tests.lakekit.crash_points import on_crash_point
from tests.lakekit.format_v3 import upgrade_to_v3
from tests.lakekit.manifests import duckdb_ids, entries, region_files, spec_ids
from tests.lakekit.reads import rows


def _many_manifests(lake, props, appends=6, per=3):
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION, properties=props)
    start = 0
    for _ in range(appends):
        for region in ("eu", "us"):
            for _ in range(per):
                table.append(batch(start, 50, region))
                start += 50
    return lake.table("ns.t")


def test_merged_manifests_keep_the_base_sequence_number(lake, monkeypatch):
    """Manifest merge (min count 2) rewrites this snapshot's ADDED entries: they keep the base's
    data sequence number, so an equality delete committed after the base still applies."""
    table = _many_manifests(lake, {"commit.manifest.min-count-to-merge": "2"})
    base = table.current_snapshot()
    all_ids = [r["id"] for r in rows(table)]
    eu = region_files(table)[0].partition
    doomed = [0, 1, 2]

    def delete() -> None:
        other = lake.table("ns.t")
        commit_deletes(other, [equality_delete(other, doomed, spec_id=0, partition=eu)])

    on_crash_point(monkeypatch, "after_prepare", delete)
    outcomes = lake.engine.compact("ns.t")
    assert {o.status for o in outcomes} == {"committed"}, [o.reason for o in outcomes]
    table = lake.table("ns.t")
    snap = table.current_snapshot()
    added = [
        e for _, e in entries(table) if e.status == ManifestEntryStatus.ADDED and e.snapshot_id == snap.snapshot_id
    ]
    assert {e.sequence_number for e in added} == {base.sequence_number}
    expected = sorted(i for i in all_ids if i not in doomed)
    assert spec_ids(table) == expected
    assert duckdb_ids(table) == expected


def test_v1_upgraded_between_prepare_and_commit_with_equality_delete(lake, monkeypatch):
    """A format-version-1 base (sequence number 0) committed on a table upgraded to v2 meanwhile,
    with an equality delete after the upgrade: the results' number 0 keeps the delete applying."""
    table = _many_manifests(lake, {"format-version": "1"}, appends=2, per=5)
    all_ids = [r["id"] for r in rows(table)]
    eu = region_files(table)[0].partition
    doomed = [0, 1, 2]

    def upgrade_and_delete() -> None:
        other = lake.table("ns.t")
        with other.transaction() as txn:
            txn.upgrade_table_version(2)
        other = lake.table("ns.t")
        commit_deletes(other, [equality_delete(other, doomed, spec_id=0, partition=eu)])

    on_crash_point(monkeypatch, "after_prepare", upgrade_and_delete)
    outcomes = lake.engine.compact("ns.t")
    assert {o.status for o in outcomes} == {"committed"}, [o.reason for o in outcomes]
    table = lake.table("ns.t")
    expected = sorted(i for i in all_ids if i not in doomed)
    assert spec_ids(table) == expected
    assert duckdb_ids(table) == expected


FLOAT_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "amount", FloatType(), required=False),
)


@pytest.mark.parametrize("amount", [math.inf, -math.inf])
def test_an_infinite_float32_partition_commits(lake, amount):
    """pyiceberg binds EqualTo(inf) on a float (32-bit) partition field as 'above the type's max':
    AlwaysFalse, so the manifest pruning of the commit skipped the manifest holding the replaced
    files and every try failed 'Missing required files to delete': the partition never compacted."""
    table = lake.catalog.create_table("ns.f", schema=FLOAT_SCHEMA)
    with table.update_spec() as update:
        update.add_identity("amount")  # spec 1
    table = lake.table("ns.f")
    unpartitioned = table.metadata.model_copy(update={"default_spec_id": 0})
    arrow_schema = pa.schema([pa.field("id", pa.int64()), pa.field("amount", pa.float32())])
    for value, start in [(amount, 0), (1.5, 1000)]:  # one manifest each
        with table.transaction() as txn, txn.update_snapshot().fast_append() as append:
            for i in range(6):
                ids = range(start + 20 * i, start + 20 * i + 20)
                rows_ = pa.table({"id": list(ids), "amount": [value] * 20}, schema=arrow_schema)
                for data_file in dataframe_to_data_files(unpartitioned, rows_, table.io):
                    data_file[3] = Record(value)  # the partition tuple, as Spark or Flink would write it
                    data_file.spec_id = 1
                    append.append_data_file(data_file)
    table = lake.table("ns.f")
    before = sorted((r["id"], r["amount"]) for r in table.scan().to_arrow().to_pylist())

    outcomes = lake.engine.compact("ns.f")

    assert [o.status for o in outcomes] == ["committed", "committed"], [o.reason for o in outcomes]
    table = lake.table("ns.f")
    assert len(live_files(table)) == 2
    assert sorted((r["id"], r["amount"]) for r in table.scan().to_arrow().to_pylist()) == before
    assert duckdb_ids(table) == [i for i, _ in before]


def test_a_parent_without_a_summary_leaves_the_totals_out(lake):
    """A format-version-1 snapshot may have no summary (older writers left it out): the parent's
    totals are unknown, so the replace states none, as Java's SnapshotProducer does. It claimed
    total-records 0 (as if the table had been empty before) for a table of 1,000 rows."""
    create_fragmented_v1 = lake.catalog.create_table(
        "ns.old", schema=SCHEMA, partition_spec=BY_REGION, properties={"format-version": "1"}
    )
    append_fragments(create_fragmented_v1, [batch(i * 50, 50, region) for region in ("eu", "us") for i in range(10)])
    old = lake.table("ns.old")
    doc = json.loads(old.metadata.model_dump_json(by_alias=True, exclude_none=True))
    for snapshot in doc["snapshots"]:
        del snapshot["summary"]
    location = old.metadata_location.replace("/metadata/", "/metadata/99999-no-summary-")
    with old.io.new_output(location).create() as out:
        out.write(json.dumps(doc).encode())
    table = lake.catalog.register_table("ns.t", location)
    assert table.current_snapshot().summary is None
    expected = rows(table)

    outcomes = lake.engine.compact("ns.t")

    assert {o.status for o in outcomes} == {"committed"}, [o.reason for o in outcomes]
    table = lake.table("ns.t")
    summary = table.current_snapshot().summary
    assert summary["added-records"] == summary["deleted-records"] == "1000"
    assert not [k for k in summary.additional_properties if k.startswith("total-")], summary
    assert rows(table) == expected  # DuckDB 1.4.4 refuses a snapshot without a summary, even in v1


def test_partition_source_column_dropped_between_prepare_and_commit(lake, monkeypatch):
    """Another engine drops the partition column from the spec, then from the schema, while the
    rewrite runs. pyiceberg 0.12 types the old spec's field `unknown`: binding the manifest pruning
    predicate raised TypeError, the outcome was 'unknown' and the attempt stayed PREPARED (recovery
    hit the same error every time). The commit types an old spec by the newest schema that still
    has its source columns."""
    append_fragments(
        lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION),
        [batch(i * 50, 50, "eu") for i in range(10)],
    )
    table = lake.table("ns.t")
    expected = sorted(r["id"] for r in rows(table))

    def evolve() -> None:
        with lake.table("ns.t").update_spec() as update:
            update.remove_field("region")
        with lake.table("ns.t").update_schema() as update:
            update.delete_column("region")

    on_crash_point(monkeypatch, "after_prepare", evolve)

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed", outcome.reason
    table = lake.table("ns.t")
    assert sorted(r["id"] for r in rows(table)) == expected
    assert duckdb_ids(table) == expected


@pytest.mark.parametrize("when", ["after_prepare", "inside_the_commit"])
def test_a_table_upgraded_to_v3_before_the_commit_backs_off(lake, monkeypatch, when):
    """Another engine upgrades the table to format version 3 while the rewrite runs, or while the
    commit runs. The rewrite was planned for a v2 table: its results hold no row lineage, so
    committing them would give the rows new row ids. The commit checks on every try that a v3
    table's results carry row lineage: it backs off with that reason (inside the commit, the
    changed format version fails the commit's requirement, two_phase.numbered, and the retry on
    the v3 metadata backs off; before, pyiceberg's ValueError left the attempt PREPARED)."""
    table = create_fragmented(lake, "ns.t", {"eu": 10})
    expected = rows(table)
    if when == "after_prepare":
        on_crash_point(monkeypatch, "after_prepare", lambda: upgrade_to_v3(lake, "ns.t"))
    else:
        real, raced = two_phase._commit_once, []

        def racing(table_, attempts, live):
            if not raced:
                raced.append(upgrade_to_v3(lake, "ns.t"))
            real(table_, attempts, live)

        monkeypatch.setattr(two_phase, "_commit_once", racing)

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "backed_off", outcome.reason
    assert "holds no row lineage" in outcome.reason and "upgraded after the plan" in outcome.reason
    assert [a.status for a in lake.engine.ledger.attempts()] == [Status.ROLLED_BACK]
    assert rows(lake.table("ns.t")) == expected
