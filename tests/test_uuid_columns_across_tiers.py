"""Third outside attack on the issue-20 tiers: each test is a finding on real tables (SQLite pyiceberg
catalog, real Parquet, real Spark), read back by pyiceberg and DuckDB."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import date, datetime, time

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, UUIDType
from pyiceberg.utils.datetime import date_to_days, datetime_to_micros, time_to_micros

from compaction_assets.lake.files import live_files
from compaction_assets.planning.model import Kind
from compaction_tools.demo import append_fragments
from tests.lakekit.deletes import read_column
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.oracle import row_key
from tests.lakekit.spec_reader import spec_rows


def _internal(value: object) -> object:
    """A value as pyiceberg's Python transforms take it (dates as days, timestamps as micros)."""
    if isinstance(value, datetime):
        return datetime_to_micros(value)
    if isinstance(value, date):
        return date_to_days(value)
    if isinstance(value, time):
        return time_to_micros(value)
    return value


def _stored(value: object) -> object:
    """A partition value as a manifest holds it (UUIDs as their 16 bytes)."""
    return value.bytes if isinstance(value, uuid.UUID) else value


def assert_partitions_match_rows(table) -> int:
    """Every live data file is of the current spec and its rows' values under that spec's transforms
    (pyiceberg's Python transforms) are its partition tuple."""
    spec, schema = table.spec(), table.schema()
    files = [f.data_file for f in live_files(table) if not f.is_delete]
    for data_file in files:
        assert data_file.spec_id == spec.spec_id, f"{data_file.file_path} is of spec {data_file.spec_id}"
        for position, partition_field in enumerate(spec.fields):
            source = schema.find_field(partition_field.source_id)
            transform = partition_field.transform.transform(source.field_type)
            values = {
                _stored(transform(_internal(v))) for v in read_column(table, data_file, source.field_id, source.name)
            }
            assert values == {_stored(data_file.partition[position])}, (
                f"{data_file.file_path}: {partition_field.name}={data_file.partition[position]!r} holds {values}"
            )
    return len(files)


# ------------------------------------------------------------------ old spec into identity(uuid)

KEYED = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "u", UUIDType(), required=False))


def test_old_spec_into_an_identity_uuid_partition_fails_on_every_run(lake):
    """A table gains identity(u) on a uuid column (Spark: ALTER TABLE ADD PARTITION FIELD u). The
    old-spec group splits rows by the new spec with Arrow's group_by on the transformed values, and
    identity keeps pyarrow's `extension<arrow.uuid>` type, which group_by refuses
    (ArrowNotImplementedError: Keys of type extension<arrow.uuid>): the group fails, nothing is
    written, and the partition is planned and fails again on every run."""
    table = lake.catalog.create_table("ns.keyed", schema=KEYED)
    arrow = KEYED.as_arrow()
    chunks = [
        pa.table(
            {
                "id": pa.array(range(i * 30, i * 30 + 30), pa.int64()),
                "u": pa.array(
                    [None if j % 5 == 0 else uuid.UUID(int=j % 3).bytes for j in range(30)], arrow.field("u").type
                ),
            },
            schema=arrow,
        )
        for i in range(3)
    ]
    append_fragments(table, chunks)
    table = lake.table("ns.keyed")
    with table.update_spec() as update:
        update.add_identity("u")
    table = lake.table("ns.keyed")
    expected = Counter(row_key(r) for r in spec_rows(table))
    assert [p.kind for p in lake.engine.plan("ns.keyed").partitions] == [Kind.OLD_SPEC]

    outcomes = lake.engine.compact("ns.keyed")

    assert outcomes and all(o.ok for o in outcomes), [(o.partition_key, o.status, o.reason) for o in outcomes]
    table = lake.table("ns.keyed")
    assert Counter(row_key(r) for r in spec_rows(table)) == expected
    assert Counter(row_key(r) for r in duckdb_rows(table)) == expected
    assert assert_partitions_match_rows(table) == 4  # u = NULL and three values


# ------------------------------------------------------------------ a table sorted by a uuid column

from pyiceberg.table.sorting import SortField, SortOrder  # noqa: E402
from pyiceberg.transforms import IdentityTransform  # noqa: E402

from compaction_assets.execution.external_sort import ExternalSort, SortSpec  # noqa: E402


def _keyed_chunks(files: int, rows: int) -> list[pa.Table]:
    arrow = KEYED.as_arrow()
    return [
        pa.table(
            {
                "id": pa.array(range(i * rows, (i + 1) * rows), pa.int64()),
                "u": pa.array(
                    [None if j % 7 == 0 else uuid.UUID(int=(j * 7919 + i) % 1000 << 64).bytes for j in range(rows)],
                    arrow.field("u").type,
                ),
            },
            schema=arrow,
        )
        for i in range(files)
    ]


def test_full_optimizing_of_a_table_sorted_by_a_uuid_column_fails_on_every_run(lake):
    """A table whose sort order is a uuid column (ORDER BY a key, as CDC targets often are): every
    sorted rewrite (major, full, cluster) sorts the batches by it, and the reader hands uuid columns
    over as extension<arrow.uuid>, which pyarrow cannot sort ("Sorting not supported for type
    extension<arrow.uuid>"): the group fails, on every run."""
    order = SortOrder(SortField(source_id=2, transform=IdentityTransform()))
    table = lake.catalog.create_table(
        "ns.keyed", schema=KEYED, sort_order=order, properties={"compaction.full.trigger-interval-ms": "60000"}
    )
    append_fragments(table, _keyed_chunks(4, 40))
    table = lake.table("ns.keyed")
    expected = Counter(row_key(r) for r in spec_rows(table))
    [plan] = lake.engine.plan("ns.keyed").to_compact
    assert plan.kind == Kind.FULL, plan.reason

    [outcome] = lake.engine.compact("ns.keyed")

    assert outcome.status == "committed", f"{outcome.status}: {outcome.reason}"
    table = lake.table("ns.keyed")
    assert Counter(row_key(r) for r in spec_rows(table)) == expected
    assert Counter(row_key(r) for r in duckdb_rows(table)) == expected
    values = [v for f in live_files(table) for v in read_column(table, f.data_file, 2, "u")]
    assert [v for v in values if v is not None] == sorted(v for v in values if v is not None)


def test_external_sort_of_a_uuid_column_larger_than_its_budget(tmp_path):
    """The same sort spilled: splitters, range ids and the sort of each range on a uuid column."""
    table = pa.concat_tables(_keyed_chunks(10, 2000))
    sort = ExternalSort(SortSpec(keys=(("u", "ascending"),)), budget_bytes=32 * 1024, spill_dir=str(tmp_path))

    out = pa.Table.from_batches(list(sort.sorted(iter(table.to_batches(max_chunksize=1000)))))

    assert sort.spill_files > 1 and out.schema == table.schema
    assert Counter(out.column("id").to_pylist()) == Counter(range(20_000))
    values = out.column("u").to_pylist()
    present = [v for v in values if v is not None]
    assert present == sorted(present) and values[len(present) :] == [None] * (len(values) - len(present))


def test_zorder_over_a_uuid_column_is_refused_as_not_primitive(lake):
    """compaction.zorder-columns naming a uuid column: the README lists UUIDs among the z-order
    types (lake/ordinal.py maps fixed-size binary), but pyiceberg types a uuid column
    extension<arrow.uuid>, which ordinal.orderable rejects: every plan of the table raises
    "z-order needs primitive columns" for a primitive column."""
    table = lake.catalog.create_table(
        "ns.keyed",
        schema=KEYED,
        properties={"compaction.zorder-columns": "u,id", "compaction.full.trigger-interval-ms": "60000"},
    )
    append_fragments(table, _keyed_chunks(4, 40))
    table = lake.table("ns.keyed")
    expected = Counter(row_key(r) for r in spec_rows(table))

    [outcome] = lake.engine.compact("ns.keyed")

    assert outcome.status == "committed" and outcome.kind == Kind.FULL, f"{outcome.status}: {outcome.reason}"
    table = lake.table("ns.keyed")
    assert Counter(row_key(r) for r in spec_rows(table)) == expected
    assert Counter(row_key(r) for r in duckdb_rows(table)) == expected
