"""Tables whose partition spec evolved (rows written by region, then another spec), and the check
that every file's partition tuple is what the current spec gives its rows."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import pyarrow as pa
from pyiceberg.expressions import BooleanExpression
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import (
    IdentityTransform,
)
from pyiceberg.types import (
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
)
from pyiceberg.utils.datetime import datetime_to_micros

from compaction_assets.lake.files import live_files
from compaction_tools.demo import append_fragments
from tests.lakekit.deletes import read_column
from tests.lakekit.oracle import row_key

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "cat", IntegerType(), required=False),
    NestedField(4, "ts", TimestampType(), required=False),
)


REGIONS = ["eu", "us", None]


START = datetime(2024, 1, 30, 12)


def make_spec(*fields: tuple[int, object, str]) -> PartitionSpec:
    return PartitionSpec(
        *(PartitionField(source_id=s, field_id=1000 + i, transform=t, name=n) for i, (s, t, n) in enumerate(fields))
    )


def region_rows(start: int, count: int, region: str | None) -> pa.Table:
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


def write_by_region(table: Table, first_id: int, files_per_region: int, rows: int = 12) -> int:
    batches = []
    for region in REGIONS:
        for _ in range(files_per_region):
            batches.append(region_rows(first_id, rows, region))
            first_id += rows
    append_fragments(table, batches)
    return first_id


def _internal(value: object) -> object:
    """A value as partition transforms take it (timestamps as microseconds)."""
    return datetime_to_micros(value) if isinstance(value, datetime) else value


def assert_partitions_match_rows(table: Table, only_spec: int | None = None) -> int:
    """Every live data file (or every one of spec `only_spec`) is of the current spec, and each of its
    rows' values under that spec's transforms (pyiceberg's Python transforms, not the Arrow ones the
    rewrite used) are its partition tuple. Returns the number of files checked."""
    spec, schema = table.spec(), table.schema()
    files = [f.data_file for f in live_files(table) if not f.is_delete]
    files = [f for f in files if only_spec is None or f.spec_id == only_spec]
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


def scan_rows(table: Table, row_filter: BooleanExpression | None = None) -> Counter:
    scan = table.scan(row_filter=row_filter) if row_filter is not None else table.scan()
    return Counter(row_key(r) for r in scan.to_arrow().to_pylist())


def evolved_table(lake) -> tuple[Table, Counter]:
    """ns.t: files by region, then identity(cat) added; returns the table and its rows."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    write_by_region(table, 0, files_per_region=2)
    table = lake.table("ns.t")
    with table.update_spec() as update:
        update.add_identity("cat")
    table = lake.table("ns.t")
    return table, scan_rows(table)


BY_REGION = make_spec((2, IdentityTransform(), "region"))
