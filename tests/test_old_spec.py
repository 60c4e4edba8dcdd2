"""Old partition specs (issue 20): data files written under an earlier spec are rewritten into the
table's current spec, each row into the partition the current spec gives it. Real tables (SQLite
pyiceberg catalog), real Parquet files, real Spark; rows checked against the rows written, DuckDB's
Iceberg reader, and each output file's partition values against the rows it holds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

import pyarrow as pa
import pytest
from pyiceberg.expressions import BooleanExpression, EqualTo, GreaterThanOrEqual, LessThan
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.update.spec import UpdateSpec
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform, MonthTransform
from pyiceberg.types import IntegerType, LongType, NestedField, StringType, TimestampType
from pyiceberg.utils.datetime import datetime_to_micros

from compaction_assets.demo import append_fragments
from compaction_assets.lake.files import live_files
from compaction_assets.planning.planner import Kind
from tests.lakekit.deletes import commit_delete_files, equality_delete_file, position_delete_file, read_column
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.oracle import row_key
from tests.lakekit.spec_reader import spec_rows

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "cat", IntegerType(), required=False),
    NestedField(4, "ts", TimestampType(), required=False),
)
REGIONS = ["eu", "us", None]
START = datetime(2024, 1, 30, 12)


def _spec(*fields: tuple[int, object, str]) -> PartitionSpec:
    return PartitionSpec(
        *(PartitionField(source_id=s, field_id=1000 + i, transform=t, name=n) for i, (s, t, n) in enumerate(fields))
    )


def _rows(start: int, count: int, region: str | None) -> pa.Table:
    ids = range(start, start + count)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([region] * count, pa.string()),
            "cat": pa.array([None if i % 7 == 0 else i % 3 for i in ids], pa.int32()),
            # two days a row apart, across a month boundary; a NULL now and then
            "ts": pa.array([None if i % 11 == 0 else START + timedelta(hours=9 * i) for i in ids], pa.timestamp("us")),
        }
    )


def _write(table: Table, first_id: int, files_per_region: int, rows: int = 12) -> int:
    batches = []
    for region in REGIONS:
        for _ in range(files_per_region):
            batches.append(_rows(first_id, rows, region))
            first_id += rows
    append_fragments(table, batches)
    return first_id


def _add_cat(u: UpdateSpec) -> None:
    u.add_identity("cat")


def _drop_cat(u: UpdateSpec) -> None:
    u.remove_field("cat")


def _day_to_month(u: UpdateSpec) -> None:
    u.remove_field("ts_day")
    u.add_field("ts", MonthTransform(), "ts_month")


def _identity_to_bucket(u: UpdateSpec) -> None:
    u.remove_field("region")
    u.add_field("region", BucketTransform(4), "region_bucket")


def _partition(u: UpdateSpec) -> None:
    u.add_identity("region")


def _unpartition(u: UpdateSpec) -> None:
    u.remove_field("region")


BY_REGION = _spec((2, IdentityTransform(), "region"))
# (initial spec, format version, evolution, a filter on the new spec's field, rows it selects)
EVOLUTIONS: dict[str, tuple[PartitionSpec, int, Callable[[UpdateSpec], None], BooleanExpression | None]] = {
    "added_identity": (BY_REGION, 2, _add_cat, EqualTo("cat", 1)),
    "removed_field": (_spec((2, IdentityTransform(), "region"), (3, IdentityTransform(), "cat")), 2, _drop_cat, None),
    "removed_field_void_v1": (
        _spec((2, IdentityTransform(), "region"), (3, IdentityTransform(), "cat")),
        1,
        _drop_cat,
        None,
    ),
    "day_to_month": (
        _spec((4, DayTransform(), "ts_day")),
        2,
        _day_to_month,
        GreaterThanOrEqual("ts", "2024-02-01T00:00:00"),
    ),
    "identity_to_bucket": (BY_REGION, 2, _identity_to_bucket, EqualTo("region", "eu")),
    "unpartitioned_to_partitioned": (PartitionSpec(), 2, _partition, EqualTo("region", "us")),
    "partitioned_to_unpartitioned": (BY_REGION, 2, _unpartition, None),
}


def _matches(row: dict, expression: BooleanExpression) -> bool:
    """The test's own evaluation of the few filters above."""
    value = row[expression.term.name]
    if value is None:
        return False
    literal = expression.literal.value
    if isinstance(value, datetime):
        value, literal = datetime_to_micros(value), datetime_to_micros(datetime.fromisoformat(literal))
    if isinstance(expression, EqualTo):
        return value == literal
    if isinstance(expression, GreaterThanOrEqual):
        return value >= literal
    assert isinstance(expression, LessThan)
    return value < literal


def _internal(value: object) -> object:
    """A value as partition transforms take it (timestamps as microseconds)."""
    return datetime_to_micros(value) if isinstance(value, datetime) else value


def assert_partitions_match_rows(table: Table) -> int:
    """Every live data file is of the current spec, and each of its rows' values under that spec's
    transforms (pyiceberg's Python transforms, not the Arrow ones the rewrite used) are its partition
    tuple. Returns the number of files checked."""
    spec, schema = table.spec(), table.schema()
    files = [f.data_file for f in live_files(table) if not f.is_delete]
    for data_file in files:
        assert data_file.spec_id == spec.spec_id, f"{data_file.file_path} is of spec {data_file.spec_id}"
        for position, partition_field in enumerate(spec.fields):
            source = schema.find_field(partition_field.source_id)
            transform = partition_field.transform.transform(source.field_type)
            values = {transform(_internal(v)) for v in read_column(table, data_file, source.field_id, source.name)}
            assert values == {data_file.partition[position]}, (
                f"{data_file.file_path}: {partition_field.name}={data_file.partition[position]!r} holds {values}"
            )
    return len(files)


def _scan_rows(table: Table, row_filter: BooleanExpression | None = None) -> Counter:
    scan = table.scan(row_filter=row_filter) if row_filter is not None else table.scan()
    return Counter(row_key(r) for r in scan.to_arrow().to_pylist())


@pytest.mark.parametrize("evolution", sorted(EVOLUTIONS))
def test_old_spec_files_are_rewritten_into_the_current_spec(lake, evolution):
    initial, version, evolve, row_filter = EVOLUTIONS[evolution]
    table = lake.catalog.create_table(
        "ns.t", schema=SCHEMA, partition_spec=initial, properties={"format-version": str(version)}
    )
    next_id = _write(table, 0, files_per_region=2)
    old_spec = table.spec().spec_id
    with table.update_spec() as update:
        evolve(update)
    table = lake.table("ns.t")
    _write(table, next_id, files_per_region=1)  # a few files of the new spec too
    table = lake.table("ns.t")
    current = table.spec().spec_id
    assert current != old_spec
    expected = _scan_rows(table)
    assert sum(expected.values()) == 12 * 3 * 3

    plans = lake.engine.plan("ns.t").partitions
    old = [p for p in plans if p.stats.spec_ids == (old_spec,)]
    assert old and all(p.kind == Kind.OLD_SPEC for p in old), [(p.partition_key, p.reason) for p in plans]
    assert all(f"spec {old_spec}, not the current spec {current}" in p.reason for p in old)
    assert all(p.partition_key.startswith(f"spec-{old_spec}:") for p in old)

    outcomes = lake.engine.compact("ns.t")
    committed = [o for o in outcomes if o.status == "committed"]
    assert {o.partition_key for o in committed if o.kind == Kind.OLD_SPEC} == {p.partition_key for p in old}
    assert all(o.ok for o in outcomes), [(o.partition_key, o.reason) for o in outcomes]

    table = lake.table("ns.t")
    assert _scan_rows(table) == expected
    assert Counter(row_key(r) for r in duckdb_rows(table)) == expected
    assert Counter(row_key(r) for r in spec_rows(table)) == expected
    assert assert_partitions_match_rows(table) > 0
    assert all(p.kind != Kind.OLD_SPEC for p in lake.engine.plan("ns.t").partitions)
    # each file the rewrite wrote sits in its partition's folder, as the other rewrites put theirs
    attempts = tuple(a.attempt_id for a in lake.engine.ledger.attempts(table_name="ns.t"))
    for f in [f for f in live_files(table) if f.path.rsplit("/", 1)[1].startswith(attempts)]:
        folder = f.path.rsplit("/", 1)[0]
        assert folder.endswith(f"/data/{f.partition_key}" if f.partition_key else "/data"), (f.path, f.partition_key)

    if row_filter is not None:  # the new field prunes: only files of matching partitions are planned
        tasks = list(table.scan(row_filter=row_filter).plan_files())
        assert 0 < len(tasks) < len([f for f in live_files(table) if not f.is_delete])
        want = Counter({k: n for k, n in expected.items() if _matches(dict(k), row_filter)})
        assert _scan_rows(table, row_filter) == want and want


def test_old_spec_rewrite_applies_the_deletes_of_its_files(lake):
    """Position and equality deletes of an old-spec partition are applied by the rewrite and
    removed with it; rows moved to the new spec's partitions are exactly the live ones."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    _write(table, 0, files_per_region=2)
    table = lake.table("ns.t")
    eu = sorted((f.data_file for f in live_files(table) if f.partition_key == "region=eu"), key=lambda f: f.file_path)
    commit_delete_files(table, [position_delete_file(table, eu[0], [0, 5])])
    table = lake.table("ns.t")
    commit_delete_files(table, [equality_delete_file(table, eu[1].spec_id, eu[1].partition, ["cat"], [{"cat": 2}])])
    table = lake.table("ns.t")
    with table.update_spec() as update:
        update.add_identity("cat")
    table = lake.table("ns.t")
    expected = Counter(row_key(r) for r in spec_rows(table))
    [plan] = [p for p in lake.engine.plan("ns.t").partitions if p.partition_key == "spec-0:region=eu"]
    assert plan.kind == Kind.OLD_SPEC and "get their deletes applied" in plan.reason

    outcomes = {o.partition_key: o for o in lake.engine.compact("ns.t")}
    eu_outcome = outcomes["spec-0:region=eu"]
    assert eu_outcome.status == "committed" and eu_outcome.deletes_applied == 2
    assert eu_outcome.delete_files_removed == 2
    table = lake.table("ns.t")
    assert not [f for f in live_files(table) if f.is_delete]
    assert Counter(row_key(r) for r in spec_rows(table)) == expected
    assert Counter(row_key(r) for r in duckdb_rows(table)) == expected
    assert _scan_rows(table) == expected
    assert_partitions_match_rows(table)


def test_equality_delete_added_after_the_base_in_the_old_partition_makes_the_rewrite_back_off(lake):
    """An equality delete committed meanwhile in the old partition would apply to the replaced rows
    but not to their new files (another partition): the commit must give way, not resurrect rows."""
    from compaction_assets import faults

    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    _write(table, 0, files_per_region=2)
    table = lake.table("ns.t")
    with table.update_spec() as update:
        update.add_identity("cat")
    table = lake.table("ns.t")
    some = next(f.data_file for f in live_files(table) if f.partition_key == "spec-0:region=us")

    def concurrent_delete() -> None:
        other = lake.table("ns.t")
        commit_delete_files(other, [equality_delete_file(other, some.spec_id, some.partition, ["cat"], [{"cat": 1}])])

    faults.arm("after_prepare", concurrent_delete)
    try:
        outcomes = {o.partition_key: o for o in lake.engine.compact("ns.t", partition="spec-0:region=us")}
    finally:
        faults.disarm()
    assert outcomes["spec-0:region=us"].status == "backed_off", outcomes["spec-0:region=us"].reason
    assert "moves rows between partitions" in outcomes["spec-0:region=us"].reason
    table = lake.table("ns.t")
    assert not any(r["region"] == "us" and r["cat"] == 1 for r in spec_rows(table))
    # nothing of the rolled-back attempt is left in the new partitions' folders
    data = table.location().removeprefix("file://") + "/data"
    from pathlib import Path

    attempt = lake.engine.ledger.attempts(table_name="ns.t")[-1]
    assert not [p for p in Path(data).rglob(f"{attempt.attempt_id}*")]


def test_old_spec_rewrite_is_off_with_the_table_property(lake):
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    _write(table, 0, files_per_region=1)
    table = lake.table("ns.t")
    with table.transaction() as txn:
        txn.update_spec().add_identity("cat").commit()
        txn.set_properties({"compaction.rewrite-old-specs": "false"})
    plans = lake.engine.plan("ns.t").partitions
    assert plans and all(p.kind is None for p in plans)
    assert all("compaction.rewrite-old-specs=false" in p.reason for p in plans)
