"""Compaction through the engine on real local Spark, a real SQLite catalog and real Parquet files."""

import math

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from compaction_assets.commit.ledger import Status
from compaction_assets.commit.two_phase import ATTEMPT_ID_PROPERTY, TASK_ID_PROPERTY
from compaction_assets.lake.digest import rows_digest
from compaction_tools.demo import append_fragments
from tests.conftest import SCHEMA, batch, create_fragmented, data_files
from tests.lakekit.reads import assert_duckdb_reads_what_pyiceberg_reads, local

TARGET = 64 * 1024  # the lake fixture's target_file_size_bytes


def test_two_partitions_of_small_files_compact_to_target_files(lake):
    table = create_fragmented(lake, "ns.events", {"eu": 130, "us": 110, "tiny": 3})
    before = rows_digest(table)
    files_before = data_files(table)
    bytes_by_region = {}
    for f in files_before:
        region = f["partition"]["region"]
        bytes_by_region[region] = bytes_by_region.get(region, 0) + f["file_size_in_bytes"]
    assert len(files_before) == 243

    outcomes = {o.partition_key: o for o in lake.engine.compact("ns.events")}

    assert {k: o.status for k, o in outcomes.items()} == {
        "region=eu": "committed",
        "region=us": "committed",
        "region=tiny": "skipped",
    }
    assert "min_input_files=5" in outcomes["region=tiny"].reason
    # partitions that finish together commit together: one snapshot for the table, not one each
    assert outcomes["region=eu"].snapshot_id == outcomes["region=us"].snapshot_id
    assert len(lake.table("ns.events").metadata.snapshots) == len(table.metadata.snapshots) + 1
    table = lake.table("ns.events")
    after_files = data_files(table)
    for region in ("eu", "us"):
        count = sum(f["partition"]["region"] == region for f in after_files)
        assert 1 <= count <= math.ceil(bytes_by_region[region] / TARGET) + 1, (region, count)
    tiny_before = sorted(f["file_path"] for f in files_before if f["partition"]["region"] == "tiny")
    tiny_after = sorted(f["file_path"] for f in after_files if f["partition"]["region"] == "tiny")
    assert tiny_after == tiny_before  # left alone
    assert rows_digest(table) == before
    assert_duckdb_reads_what_pyiceberg_reads(table)

    new_files = [f for f in after_files if f["partition"]["region"] != "tiny"]
    field_ids = {f.name: f.field_id for f in table.schema().fields}
    for f in new_files:
        parquet = pq.ParquetFile(local(f["file_path"]))
        ids = {field.name: int(field.metadata[b"PARQUET:field_id"]) for field in parquet.schema_arrow}
        assert ids == field_ids
        assert parquet.metadata.num_rows == f["record_count"]
        assert f["lower_bounds"] and f["upper_bounds"] and f["column_sizes"]  # statistics are recorded
        assert parquet.read().column("region").unique().to_pylist() == [f["partition"]["region"]]

    snapshot = table.current_snapshot()
    assert snapshot.summary[TASK_ID_PROPERTY] and snapshot.summary[ATTEMPT_ID_PROPERTY]
    assert {a.status for a in lake.engine.ledger.attempts()} == {Status.COMMITTED}

    assert lake.engine.plan("ns.events").to_compact == []  # a second plan proposes nothing


def test_renamed_and_added_columns_keep_their_values(lake):
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "name", StringType(), False))
    table = lake.catalog.create_table("ns.people", schema=schema)
    old = [pa.table({"id": pa.array([i], pa.int64()), "name": [f"old-{i}"]}) for i in range(10)]
    append_fragments(table, old)
    with table.update_schema() as update:
        update.rename_column("name", "full_name")
        update.add_column("email", StringType())
    new = [
        pa.table({"id": pa.array([i], pa.int64()), "full_name": [f"new-{i}"], "email": [f"{i}@x.org"]})
        for i in range(10, 20)
    ]
    append_fragments(table, new)

    [outcome] = lake.engine.compact("ns.people")

    assert outcome.status == "committed" and outcome.files_after == 1
    rows = sorted(lake.table("ns.people").scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    expected = [{"id": i, "full_name": f"old-{i}", "email": None} for i in range(10)] + [
        {"id": i, "full_name": f"new-{i}", "email": f"{i}@x.org"} for i in range(10, 20)
    ]
    assert rows == expected
    assert_duckdb_reads_what_pyiceberg_reads(lake.table("ns.people"))
    [new_file] = data_files(lake.table("ns.people"))
    names = pq.ParquetFile(local(new_file["file_path"])).schema_arrow.names
    assert names == ["id", "full_name", "email"]


def test_major_compaction_sorts_by_the_table_sort_order(lake):
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "payload", StringType(), False))
    order = SortOrder(SortField(source_id=1, transform=IdentityTransform()))
    table = lake.catalog.create_table("ns.sorted", schema=schema, sort_order=order)
    chunks = [batch(i * 700, 700, "x").select(["id", "payload"]) for i in range(6)]
    chunks = [c.take(pa.array(list(reversed(range(c.num_rows))))) for c in chunks[::-1]]  # descending input
    append_fragments(table, chunks)
    # A table property (which wins over compaction.yaml) makes the files undersized, not fragments.
    largest = max(f["file_size_in_bytes"] for f in data_files(lake.table("ns.sorted")))
    with lake.table("ns.sorted").transaction() as txn:
        txn.set_properties({"compaction.target-file-size-bytes": str(4 * largest)})
    before = rows_digest(lake.table("ns.sorted"))

    plan = lake.engine.plan("ns.sorted")
    assert [p.kind for p in plan.to_compact] == ["major"]
    [outcome] = lake.engine.compact("ns.sorted")

    assert outcome.status == "committed"
    table = lake.table("ns.sorted")
    assert rows_digest(table) == before
    assert_duckdb_reads_what_pyiceberg_reads(table)
    for f in data_files(table):
        ids = pq.read_table(local(f["file_path"]), columns=["id"]).column("id").to_pylist()
        assert ids == sorted(ids)


def test_compaction_folds_a_streaming_writers_manifests(lake):
    """One manifest per fast append piles up; the rewrite merges them as Java's RewriteFiles does."""
    table = lake.catalog.create_table("ns.stream", schema=SCHEMA)
    for i in range(130):
        table.append(batch(i * 10, 10, "eu" if i % 2 else "us"))
    before = rows_digest(table)
    assert len(table.current_snapshot().manifests(table.io)) == 130

    outcomes = lake.engine.compact("ns.stream")

    assert [o.status for o in outcomes] == ["committed"]
    table = lake.table("ns.stream")
    assert len(table.current_snapshot().manifests(table.io)) <= 2
    assert rows_digest(table) == before
    assert_duckdb_reads_what_pyiceberg_reads(table)
    assert len(data_files(table)) < 10


def test_format_version_1_table_compacts_through_pyiceberg_writer(lake):
    """v1 manifests cannot be restated from their bytes (lake.manifest_io); pyiceberg writes them."""
    table = lake.catalog.create_table("ns.v1", schema=SCHEMA, properties={"format-version": "1"})
    append_fragments(table, [batch(i * 20, 20, "eu") for i in range(8)])
    table = lake.table("ns.v1")
    before = rows_digest(table)

    outcomes = lake.engine.compact("ns.v1")

    assert [o.status for o in outcomes] == ["committed"]
    table = lake.table("ns.v1")
    assert table.format_version == 1
    assert rows_digest(table) == before
    assert_duckdb_reads_what_pyiceberg_reads(table)
    assert len(data_files(table)) == 1
    deleted = [
        e
        for m in table.current_snapshot().manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
        if e.status == ManifestEntryStatus.DELETED
    ]
    assert len(deleted) == 8
