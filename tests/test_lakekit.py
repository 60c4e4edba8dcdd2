"""The test helpers themselves: delete files another engine would write, and the independent reader.

What DuckDB 1.4.4's Iceberg scan honours is pinned here, so the stateful test can trust it: position
deletes, equality deletes, and data sequence numbers (an equality delete removes only rows committed
before it)."""

from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from tests.lakekit.deletes import commit_delete_files, equality_delete_file, position_delete_file, read_column
from tests.lakekit.duckdb_reader import duckdb_multiset
from tests.lakekit.oracle import row_key
from tests.lakekit.spec_reader import spec_rows
from tests.stateful.machine import TableHistory

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "cat", IntegerType(), required=False),
)
SPEC = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"))


@pytest.fixture
def table(tmp_path: Path):
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=SCHEMA, partition_spec=SPEC)
    yield table
    catalog.engine.dispose()


def rows(ids: range, region: str | None) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "region": region, "cat": i % 3} for i in ids], schema=SCHEMA.as_arrow())


def pyiceberg_multiset(table) -> Counter:
    return Counter(row_key(r) for r in table.scan().to_arrow().to_pylist())


def spec_multiset(table) -> Counter:
    return Counter(row_key(r) for r in spec_rows(table))


def expected(ids, region) -> Counter:
    return Counter(row_key({"id": i, "region": region, "cat": i % 3}) for i in ids)


def test_duckdb_reads_what_pyiceberg_reads_including_null_partitions(table):
    table.append(rows(range(0, 5), None))
    table.append(rows(range(5, 10), "null"))
    table.append(rows(range(10, 12), "a/b %+ é"))
    want = expected(range(0, 5), None) + expected(range(5, 10), "null") + expected(range(10, 12), "a/b %+ é")
    assert pyiceberg_multiset(table) == want
    assert duckdb_multiset(table) == want
    assert spec_multiset(table) == want


def test_position_deletes_are_honoured_by_both_readers(table):
    table.append(rows(range(0, 10), "eu"))
    [data_file] = [t.file for t in table.scan().plan_files()]
    ids = read_column(table, data_file, 1, "id")
    commit_delete_files(table, [position_delete_file(table, data_file, [1, 4])])

    summary = table.current_snapshot().summary
    assert summary.operation.value == "delete"
    assert summary["added-position-deletes"] == "2" and summary["added-delete-files"] == "1"
    want = expected([i for i in range(10) if i not in (ids[1], ids[4])], "eu")
    assert pyiceberg_multiset(table) == want
    assert duckdb_multiset(table) == want
    assert spec_multiset(table) == want


def test_equality_deletes_respect_data_sequence_numbers_in_duckdb(table):
    table.append(rows(range(0, 9), "eu"))
    table.append(rows(range(9, 12), "us"))
    deletes = [
        equality_delete_file(table, t.file.spec_id, t.file.partition, ["cat"], [{"cat": 0}])
        for t in table.scan().plan_files()
    ]
    commit_delete_files(table, deletes)
    table.append(rows(range(12, 15), "eu"))  # committed after the delete: its cat 0 row survives

    assert [f["equality_ids"] for f in table.inspect.delete_files().to_pylist()] == [[3], [3]]
    assert table.current_snapshot().summary["total-equality-deletes"] == "2"
    want = expected([i for i in range(9) if i % 3], "eu") + expected([10, 11], "us") + expected(range(12, 15), "eu")
    assert duckdb_multiset(table) == want
    assert spec_multiset(table) == want
    with pytest.raises(ValueError, match="equality"):  # pyiceberg 0.12 refuses to read them
        table.scan().to_arrow()


def test_duckdb_applies_a_partition_scoped_equality_delete_to_every_partition(table):
    """A known deviation of DuckDB 1.4.4 from the spec (an equality delete in a partition applies only
    to data files of that partition): helpers write one equality-delete file per live partition
    with the same values, where the deviation changes nothing. This test says when it is fixed."""
    table.append(rows(range(0, 3), "eu"))
    table.append(rows(range(3, 6), "us"))
    eu = next(t.file for t in table.scan().plan_files() if t.file.partition[0] == "eu")
    commit_delete_files(table, [equality_delete_file(table, eu.spec_id, eu.partition, ["cat"], [{"cat": 0}])])
    by_spec = expected([1, 2], "eu") + expected([3, 4, 5], "us")
    assert spec_multiset(table) == by_spec
    assert duckdb_multiset(table) == by_spec - expected([3], "us")


def test_duckdb_fails_on_an_equality_delete_in_a_null_partition(table):
    """Another known DuckDB 1.4.4 failure: the stateful test writes no equality delete while a live
    file has a NULL partition value. This test says when it is fixed."""
    table.append(rows(range(0, 3), None))
    [data_file] = [t.file for t in table.scan().plan_files()]
    delete = equality_delete_file(table, data_file.spec_id, data_file.partition, ["cat"], [{"cat": 0}])
    commit_delete_files(table, [delete])
    with pytest.raises(duckdb.InternalException, match="Comparison on NULL values"):
        duckdb_multiset(table)
    assert spec_multiset(table) == expected([1, 2], None)


def test_duckdb_loses_rows_with_equality_deletes_after_an_expiry_where_the_spec_reader_does_not(tmp_path):
    """A history the stateful test found (no compaction in it): DuckDB 1.4.4 drops rows no delete
    matches, so the stateful test compares DuckDB only on tables without equality deletes. This test
    says when it is fixed."""
    TableHistory.root = tmp_path
    machine = TableHistory()
    try:
        machine.append(files=2, region="null", rows=1)
        machine.append(files=2, region="sp ace", rows=1)
        machine.equality_delete(by_id=True, value=247)
        machine.append(files=3, region="", rows=2)
        machine.expire_snapshots_by_another_engine()
        machine.equality_delete(by_id=False, value=200)
        table = machine.table()
        want = machine.oracle.view(table.schema())
        assert spec_multiset(table) == want
        assert sum((want - duckdb_multiset(table)).values()) > 0
    finally:
        machine.teardown()
