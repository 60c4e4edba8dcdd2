"""Merge-on-read compaction end to end: real delete files written as another engine would, the
engine's plan, Spark rewrite (or tier job) and commit, then every reader: the spec-literal reader,
DuckDB's Iceberg scan, and pyiceberg once no equality delete is left (it refuses them)."""

from __future__ import annotations

from collections import Counter

from pyiceberg.table.snapshots import Operation

from compaction_assets.lake.delete_files import commit_delete_files, equality_delete_file, position_delete_file
from compaction_assets.lake.files import live_files
from compaction_assets.planning.model import Kind
from tests.conftest import Lake, batch, create_fragmented
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.files import data_of, kinds, rows
from tests.lakekit.oracle import row_key
from tests.lakekit.spec_reader import spec_rows


def test_a_partition_with_both_kinds_of_deletes_is_rewritten_to_live_rows_and_its_delete_files_go(lake: Lake):
    table = create_fragmented(lake, "ns.t", {"eu": 12, "us": 6})
    eu = data_of(table, "eu")
    commit_delete_files(
        table, [position_delete_file(table, eu[0], [0, 5, 49]), position_delete_file(table, eu[3], [7])]
    )
    table = lake.table("ns.t")
    # partition-scoped equality deletes (on id and on a NULL-safe column) in two commits
    for ids in ([10, 11, 12, 200], [300, 301]):
        commit_delete_files(table, [equality_delete_file(table, 0, eu[0].partition, ["id"], [{"id": i} for i in ids])])
        table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    assert sum(expected.values()) == 18 * 50 - 4 - 6
    # ids are unique across regions, so DuckDB 1.4.4 applying partition-scoped deletes everywhere is harmless
    assert rows(duckdb_rows, table) == expected

    outcomes = {o.partition_key: o for o in lake.engine.compact("ns.t")}

    eu_outcome = outcomes["region=eu"]
    assert eu_outcome.status == "committed", eu_outcome.reason
    assert eu_outcome.deletes_applied == 4 and eu_outcome.rows_deleted == 10
    assert eu_outcome.delete_files_removed == 4
    after = lake.table("ns.t")
    assert kinds(after) == Counter({"DATA": 2})  # one file per region, no delete file left
    assert rows(spec_rows, after) == expected
    assert rows(duckdb_rows, after) == expected
    assert Counter(row_key(r) for r in after.scan().to_arrow().to_pylist()) == expected
    summary = after.current_snapshot().summary
    assert summary["removed-delete-files"] == "4" and summary["total-delete-files"] == "0"


def test_an_equality_delete_that_still_applies_to_a_file_left_alone_is_kept(lake: Lake):
    table = create_fragmented(lake, "ns.t", {"eu": 6})
    table.append(batch(10_000, 20_000, "eu"))  # a large file: no size trigger picks it
    table = lake.table("ns.t")
    eu = data_of(table, "eu")
    commit_delete_files(table, [equality_delete_file(table, 0, eu[0].partition, ["id"], [{"id": 3}, {"id": 10_001}])])
    table = lake.table("ns.t")
    expected = rows(spec_rows, table)

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed", outcome.reason
    after = lake.table("ns.t")
    assert kinds(after)["EQUALITY_DELETES"] == 1  # it still applies to the large file
    assert rows(spec_rows, after) == expected


def test_equality_deletes_are_converted_to_position_deletes_without_rewriting_data(lake: Lake):
    table = create_fragmented(lake, "ns.t", {"eu": 3}, rows=2000)
    with table.transaction() as txn:  # files over the target: no size trigger
        txn.set_properties({"compaction.target-file-size-bytes": str(16 * 1024)})
    table = lake.table("ns.t")
    eu = data_of(table, "eu")
    for ids in ([1, 2], [2500, None], [5999]):  # three commits, one key NULL (matches nothing: no NULL ids)
        values = [{"id": i} for i in ids]
        commit_delete_files(table, [equality_delete_file(table, 0, eu[0].partition, ["id"], values)])
        table = lake.table("ns.t")
    data_before = {f.file_path for f in eu}
    expected = rows(spec_rows, table)
    [plan] = lake.engine.plan("ns.t").partitions
    assert plan.kind == Kind.CONVERT_EQUALITY_DELETES, plan.reason

    [outcome] = lake.engine.compact("ns.t")

    assert (outcome.status, outcome.kind) == ("committed", "convert-equality-deletes"), outcome.reason
    assert outcome.delete_files_removed == 3
    after = lake.table("ns.t")
    assert {f.path for f in live_files(after) if not f.is_delete} == data_before  # data untouched
    assert kinds(after) == Counter({"DATA": 3, "POSITION_DELETES": 1})
    assert rows(spec_rows, after) == expected
    assert rows(duckdb_rows, after) == expected
    assert Counter(row_key(r) for r in after.scan().to_arrow().to_pylist()) == expected
    assert after.current_snapshot().summary.operation == Operation.REPLACE


def test_small_position_delete_files_are_combined_into_one(lake: Lake):
    table = create_fragmented(lake, "ns.t", {"eu": 5}, rows=2000)
    with table.transaction() as txn:
        txn.set_properties({"compaction.target-file-size-bytes": str(16 * 1024)})
    table = lake.table("ns.t")
    for i, data_file in enumerate(data_of(table, "eu")):  # five commits, one position delete each
        commit_delete_files(table, [position_delete_file(table, data_file, [i, i + 100])])
        table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    [plan] = lake.engine.plan("ns.t").partitions
    assert plan.kind == Kind.REWRITE_POSITION_DELETES, plan.reason

    [outcome] = lake.engine.compact("ns.t")

    assert (outcome.status, outcome.kind) == ("committed", "rewrite-position-deletes"), outcome.reason
    after = lake.table("ns.t")
    assert kinds(after) == Counter({"DATA": 5, "POSITION_DELETES": 1})
    assert rows(spec_rows, after) == expected
    assert rows(duckdb_rows, after) == expected
    assert Counter(row_key(r) for r in after.scan().to_arrow().to_pylist()) == expected
