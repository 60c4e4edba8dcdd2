"""Old partition specs (issue 20): data files written under an earlier spec are rewritten into the
table's current spec, each row into the partition the current spec gives it. Real tables (SQLite
pyiceberg catalog), real Parquet files, real Spark; rows checked against the rows written, DuckDB's
Iceberg reader, and each output file's partition values against the rows it holds."""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.expressions import BooleanExpression, EqualTo, GreaterThanOrEqual, LessThan
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.update.spec import UpdateSpec
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    IdentityTransform,
    MonthTransform,
    TruncateTransform,
    VoidTransform,
)
from pyiceberg.types import (
    DateType,
    DoubleType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
)
from pyiceberg.utils.datetime import date_to_days, datetime_to_micros

from compaction_assets import faults
from compaction_assets.commit.consistency import check_consistency
from compaction_assets.commit.ledger import Status
from compaction_assets.commit.recovery import recover
from compaction_assets.execution.partitioning import split_by_partition
from compaction_assets.execution.worker import GroupSpec
from compaction_assets.execution.writers import MAX_BUFFER_BYTES, PartitionedWriter
from compaction_assets.lake.files import live_files
from compaction_assets.lake.partition_key import NULL_TOKEN, partition_id
from compaction_assets.planning.planner import Kind
from tests.lakekit.deletes import commit_delete_files, equality_delete_file, position_delete_file
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.evolved_specs import (
    BY_REGION,
    SCHEMA,
    assert_partitions_match_rows,
    evolved_table,
    make_spec,
    region_rows,
    scan_rows,
    write_by_region,
)
from tests.lakekit.oracle import row_key
from tests.lakekit.spec_reader import spec_rows


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


# (initial spec, format version, evolution, a filter on the new spec's field, rows it selects)
EVOLUTIONS: dict[str, tuple[PartitionSpec, int, Callable[[UpdateSpec], None], BooleanExpression | None]] = {
    "added_identity": (BY_REGION, 2, _add_cat, EqualTo("cat", 1)),
    "removed_field": (
        make_spec((2, IdentityTransform(), "region"), (3, IdentityTransform(), "cat")),
        2,
        _drop_cat,
        None,
    ),
    "removed_field_void_v1": (
        make_spec((2, IdentityTransform(), "region"), (3, IdentityTransform(), "cat")),
        1,
        _drop_cat,
        None,
    ),
    "day_to_month": (
        make_spec((4, DayTransform(), "ts_day")),
        2,
        _day_to_month,
        GreaterThanOrEqual("ts", "2024-02-01T00:00:00"),
    ),
    "day_to_month_v1": (  # the day field stays, void, beside the month field on the same column
        make_spec((4, DayTransform(), "ts_day")),
        1,
        _day_to_month,
        LessThan("ts", "2024-02-01T00:00:00"),
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


@pytest.mark.parametrize("evolution", sorted(EVOLUTIONS))
def test_old_spec_files_are_rewritten_into_the_current_spec(lake, evolution):
    initial, version, evolve, row_filter = EVOLUTIONS[evolution]
    table = lake.catalog.create_table(
        "ns.t", schema=SCHEMA, partition_spec=initial, properties={"format-version": str(version)}
    )
    next_id = write_by_region(table, 0, files_per_region=2)
    old_spec = table.spec().spec_id
    with table.update_spec() as update:
        evolve(update)
    table = lake.table("ns.t")
    # a few files of the new spec too (pyiceberg 0.12 refuses to append under a spec with two
    # fields on one column, as the v1 day -> month spec has)
    new_files = evolution != "day_to_month_v1"
    if new_files:
        write_by_region(table, next_id, files_per_region=1)
    table = lake.table("ns.t")
    current = table.spec().spec_id
    assert current != old_spec
    expected = scan_rows(table)
    assert sum(expected.values()) == 12 * 3 * (3 if new_files else 2)

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
    assert scan_rows(table) == expected
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
        assert scan_rows(table, row_filter) == want and want


def test_old_spec_rewrite_applies_the_deletes_of_its_files(lake):
    """Position and equality deletes of an old-spec partition are applied by the rewrite and
    removed with it; rows moved to the new spec's partitions are exactly the live ones."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    write_by_region(table, 0, files_per_region=2)
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
    assert (eu_outcome.files_before, eu_outcome.files_after) == (2, 0)
    assert eu_outcome.reason.startswith("2 file(s) of spec 0 -> 3 file(s) in 3 partition(s) of spec 1")
    assert eu_outcome.delete_files_removed == 2
    table = lake.table("ns.t")
    assert not [f for f in live_files(table) if f.is_delete]
    assert Counter(row_key(r) for r in spec_rows(table)) == expected
    assert Counter(row_key(r) for r in duckdb_rows(table)) == expected
    assert scan_rows(table) == expected
    assert_partitions_match_rows(table)


def test_equality_delete_added_after_the_base_in_the_old_partition_makes_the_rewrite_back_off(lake):
    """An equality delete committed meanwhile in the old partition would apply to the replaced rows
    but not to their new files (another partition): the commit must give way, not resurrect rows."""
    table, _ = evolved_table(lake)
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
    [attempt] = lake.engine.ledger.attempts(table_name="ns.t")
    assert attempt.status == Status.ROLLED_BACK and _attempt_files(table, attempt.attempt_id) == []


def test_old_spec_rewrite_is_off_with_the_table_property(lake):
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    write_by_region(table, 0, files_per_region=1)
    table = lake.table("ns.t")
    with table.transaction() as txn:
        txn.update_spec().add_identity("cat").commit()
        txn.set_properties({"compaction.rewrite-old-specs": "false"})
    plans = lake.engine.plan("ns.t").partitions
    assert plans and all(p.kind is None for p in plans)
    assert all("compaction.rewrite-old-specs=false" in p.reason for p in plans)


def _attempt_files(table: Table, attempt_id: str) -> list[Path]:
    return sorted(Path(table.location().removeprefix("file://"), "data").rglob(f"{attempt_id}*"))


def _crash_at(lake, point: str, partition: str) -> None:  # noqa: ANN001
    """Compact `partition`, the process 'crashing' at `point` (the attempt left as a crash leaves it)."""
    faults.arm(point)
    try:
        with pytest.raises(faults.InjectedCrash):
            lake.engine.compact("ns.t", partition=partition)
    finally:
        faults.disarm()


def test_crash_before_prepare_is_abandoned_and_its_files_in_every_new_partition_swept(lake):
    table, expected = evolved_table(lake)
    _crash_at(lake, "after_rewrite", "spec-0:region=eu")
    [attempt] = lake.engine.ledger.attempts(table_name="ns.t", statuses=[Status.EXECUTING])
    written = _attempt_files(table, attempt.attempt_id)
    assert len({p.parent for p in written}) == 4  # cat=0, 1, 2 and NULL below region=eu

    report = recover(lake.engine.catalog, lake.engine.ledger, 0)
    assert report.abandoned == [attempt.attempt_id] and not report.errors
    assert _attempt_files(table, attempt.attempt_id) == []
    table = lake.table("ns.t")
    assert scan_rows(table) == expected
    assert [p.kind for p in lake.engine.plan("ns.t", "spec-0:region=eu").partitions] == [Kind.OLD_SPEC]


@pytest.mark.parametrize("point", ["after_prepare", "after_iceberg_commit"])
def test_crash_after_prepare_is_recommitted_or_confirmed_with_each_files_spec_and_partition(lake, point):
    table, expected = evolved_table(lake)
    current = table.spec().spec_id
    _crash_at(lake, point, "spec-0:region=us")
    [attempt] = lake.engine.ledger.attempts(table_name="ns.t", statuses=[Status.PREPARED])
    # the ledger keeps each result file's own spec id and partition: what a recommit commits
    assert {d["spec_id"] for d in attempt.result_files} == {current}
    assert {d["partition"][1] for d in attempt.result_files} == {0, 1, 2, None}
    assert all(d["partition"][0] == "us" for d in attempt.result_files)

    report = recover(lake.engine.catalog, lake.engine.ledger, 0)
    assert (report.recommitted if point == "after_prepare" else report.confirmed) == [attempt.attempt_id]
    table = lake.table("ns.t")
    assert scan_rows(table) == expected
    assert Counter(row_key(r) for r in duckdb_rows(table)) == expected
    assert not [f for f in live_files(table) if f.partition_key == "spec-0:region=us"]
    assert_partitions_match_rows(lake.table("ns.t"), only_spec=current)
    [done] = lake.engine.ledger.attempts(table_name="ns.t")
    assert done.status == Status.COMMITTED
    report = check_consistency(table, lake.engine.ledger, "spec-0:region=us", done.task_id, 60)
    assert report.passed, report.problems


def _bits(value: object) -> object:
    return ("float", struct.pack(">d", value)) if isinstance(value, float) else value


def test_rows_are_split_into_their_partitions_each_exactly_once():
    """The split on its own, over the awkward values: NaN (one partition), -0.0 and 0.0 (two), NULL,
    a source inside a struct, bucket, truncate, month of a date, a void field."""
    schema = Schema(
        NestedField(1, "f", DoubleType(), required=False),
        NestedField(2, "st", StructType(NestedField(3, "x", StringType(), required=False)), required=False),
        NestedField(4, "d", DateType(), required=False),
        NestedField(5, "n", LongType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(1, 1000, IdentityTransform(), "f"),
        PartitionField(3, 1001, TruncateTransform(1), "x_trunc"),
        PartitionField(4, 1002, MonthTransform(), "d_month"),
        PartitionField(5, 1003, BucketTransform(3), "n_bucket"),
        PartitionField(5, 1004, VoidTransform(), "n_void"),
    )
    floats = [math.nan, float("nan"), -0.0, 0.0, None, 1.5, -0.0, 0.0]
    strings = [{"x": "ab"}, None, {"x": None}, {"x": "bc"}, {"x": "ab"}, {"x": "b"}, None, {"x": "bz"}]
    dates = [date(2024, 1, 1), None, date(2024, 3, 1), date(2024, 1, 31)] * 2
    longs = [1, 2, None, 4, 5, 6, 7, 8]
    batch = pa.RecordBatch.from_pydict(
        {"f": floats, "st": strings, "d": dates, "n": longs},
        schema=schema_to_pyarrow(schema, include_field_ids=False),
    )
    parts = split_by_partition(batch, spec, schema)
    assert sorted(n for _, b in parts for n in b.column("n").to_pylist() if n is not None) == [1, 2, 4, 5, 6, 7, 8]
    assert sum(b.num_rows for _, b in parts) == batch.num_rows
    assert len({partition_id(0, record) for record, _ in parts}) == len(parts)
    sources = [(1, "f"), (3, None), (4, "d"), (5, "n"), (5, "n")]
    for record, rows in parts:
        table = rows.to_pydict()
        for i in range(rows.num_rows):
            for position, (source_id, column) in enumerate(sources):
                value = (
                    table["st"][i]["x"] if column is None and table["st"][i] else table[column][i] if column else None
                )
                if source_id == 4 and value is not None:
                    value = date_to_days(value)
                partition_field = spec.fields[position]
                want = partition_field.transform.transform(schema.find_field(source_id).field_type)(value)
                assert _bits(want) == _bits(record[position]), (record, table, i, position)


def test_cli_plan_shows_old_spec_with_its_reason(lake):
    evolved_table(lake)
    shown = lake.cli("plan", "ns.t")
    assert shown.returncode == 0, shown.stderr
    [line] = [ln for ln in shown.stdout.splitlines() if ln.startswith("spec-0:region=eu ")]
    assert "2 files in 1 group(s)" in line and "old-spec: 2 file(s) of spec 0, not the current spec 1" in line


def test_partitioned_writer_keeps_all_partitions_buffers_within_one_row_group_budget(lake):
    """Many output partitions (bucket 16) and batches of several MiB: the buffers of all the
    partitions' writers together never exceed MAX_BUFFER_BYTES; every row is written once."""
    spec = make_spec((1, BucketTransform(16), "id_bucket"))
    table = lake.catalog.create_table("ns.w", schema=SCHEMA, partition_spec=spec)
    group = GroupSpec(
        sources=[],
        partition=[],
        spec_id=0,
        output_dir=f"{table.location()}/data",
        file_prefix="attempt",
        max_files=1,
        polars=False,
        output_spec_id=spec.spec_id,
    )
    writer = PartitionedWriter(table.io, table.metadata, group, 64 * 2**20, 0)
    rows = 0
    for n in range(12):
        arrow = region_rows(n * 40_000, 40_000, "x" * 100)  # ~4 MiB a batch
        writer.write(writer.convert(arrow.to_batches()[0]))
        rows += arrow.num_rows
        assert sum(w.buffered for w in writer._writers.values()) <= MAX_BUFFER_BYTES
    written = writer.close()
    assert sum(f.record_count for f in written) == rows
    assert {f.partition[0] for f in written} == set(range(16)) and {f.spec_id for f in written} == {spec.spec_id}


def test_an_old_spec_whose_source_column_was_dropped_is_rewritten(lake):
    """Another engine removed cat from the spec, then dropped the column: the old spec's files are
    read under their own spec (its field's source is gone from the current schema) and rewritten."""
    both = make_spec((2, IdentityTransform(), "region"), (3, IdentityTransform(), "cat"))
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=both)
    write_by_region(table, 0, files_per_region=1)
    with lake.table("ns.t").update_spec() as update:
        update.remove_field("cat")
    with lake.table("ns.t").update_schema() as update:
        update.delete_column("cat")
    table = lake.table("ns.t")
    expected = Counter(row_key(r) for r in spec_rows(table))

    outcomes = lake.engine.compact("ns.t")

    assert outcomes and {(o.kind, o.status) for o in outcomes} == {("old-spec", "committed")}, [
        (o.partition_key, o.reason) for o in outcomes
    ]
    table = lake.table("ns.t")
    assert Counter(row_key(r) for r in spec_rows(table)) == expected
    assert Counter(row_key(r) for r in duckdb_rows(table)) == expected
    assert assert_partitions_match_rows(table) == 12  # a file per old partition (region, cat)


def _objects(s3, table: Table, attempt_id: str) -> list[str]:
    """Keys below the table's data folder on the S3 server named after the attempt (listed by boto3)."""
    prefix = table.location().removeprefix(f"s3://{s3.bucket}/") + "/data/"
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    return [k for k in keys if k.rsplit("/", 1)[1].startswith(attempt_id)]


def test_old_spec_on_s3_writes_each_partitions_folder_and_sweeps_an_abandoned_attempt(s3_lake, s3_server):
    table, expected = evolved_table(s3_lake)
    _crash_at(s3_lake, "after_rewrite", "spec-0:region=eu")
    [attempt] = s3_lake.engine.ledger.attempts(table_name="ns.t", statuses=[Status.EXECUTING])
    assert len(_objects(s3_server, table, attempt.attempt_id)) == 4
    assert recover(s3_lake.engine.catalog, s3_lake.engine.ledger, 0).abandoned == [attempt.attempt_id]
    assert _objects(s3_server, table, attempt.attempt_id) == []

    outcomes = s3_lake.engine.compact("ns.t")

    assert {(o.kind, o.status) for o in outcomes} == {("old-spec", "committed")}
    table = s3_lake.table("ns.t")
    assert scan_rows(table) == expected
    assert Counter(row_key(r) for r in duckdb_rows(table)) == expected
    assert assert_partitions_match_rows(table) == 12  # (eu, us, NULL) x (cat 0, 1, 2, NULL)
    assert {f.path.rsplit("/", 2)[1] for f in live_files(table)} == {"cat=0", "cat=1", "cat=2", f"cat={NULL_TOKEN}"}


def test_an_identity_partition_of_nanosecond_timestamps_holds_their_nanoseconds():
    # pyarrow gives a nanosecond value to Python only through pandas (pd.Timestamp, which pyiceberg
    # kept as the partition value): the record holds the nanoseconds since the epoch, as Iceberg's do
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "at", TimestampNanoType()))
    spec = make_spec((2, IdentityTransform(), "at"))
    at = [1_700_000_000_000_001_001, -999, None, 1_700_000_000_000_001_001]
    batch = pa.record_batch({"id": pa.array(range(4), pa.int64()), "at": pa.array(at, pa.timestamp("ns"))})
    parts = {record[0]: rows.column("id").to_pylist() for record, rows in split_by_partition(batch, spec, schema)}
    assert parts == {1_700_000_000_000_001_001: [0, 3], -999: [1], None: [2]}
    assert all(type(key) is int for key in parts if key is not None)
