"""Type fidelity of every rewrite path on a table of every type Iceberg users write (the bench's
"typed" rows: decimals, timestamptz, timestamp, date, bool, ints, floats, nullable strings,
binary, list, struct, map): the compacted file has the Parquet schema, field ids and column
statistics pyiceberg's own writer gives the same rows, and pyiceberg and DuckDB read it back
identical."""

from collections import Counter
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import IntegerType, NestedField, StringType, StructType

from compaction_assets.execution import polars_rewrite
from compaction_assets.lake.appends import append_fragments
from compaction_assets.lake.digest import rows_digest
from compaction_tools.bench.datasets import typed_rows
from tests.conftest import data_files
from tests.lakekit.duckdb_reader import duckdb_rows

FILES, ROWS = 6, 300
STATISTICS = ("record_count", "value_counts", "null_value_counts", "nan_value_counts", "lower_bounds", "upper_bounds")


def _parquet_columns(path: str) -> list[tuple]:
    """Every leaf column's path, physical and logical type, levels, and every field id in the file."""
    metadata = pq.read_metadata(urlparse(path).path)
    leaves = [
        (c.path, c.physical_type, str(c.logical_type), c.max_definition_level, c.max_repetition_level)
        for c in (metadata.schema.column(k) for k in range(metadata.num_columns))
    ]
    return leaves + sorted(_field_ids(pq.read_schema(urlparse(path).path)))


def _field_ids(schema: pa.Schema) -> list[tuple[str, bytes]]:
    ids = []

    def visit(name: str, f: pa.Field) -> None:
        ids.append((name, (f.metadata or {}).get(b"PARQUET:field_id")))
        t = f.type
        if pa.types.is_map(t):
            visit(f"{name}.key", t.key_field)
            visit(f"{name}.value", t.item_field)
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            visit(f"{name}.element", t.value_field)
        elif pa.types.is_struct(t):
            for k in range(t.num_fields):
                visit(f"{name}.{t.field(k).name}", t.field(k))

    for f in schema:
        visit(f.name, f)
    return ids


def _duckdb_multiset(table: Table) -> Counter:
    return Counter(repr(sorted(r.items())) for r in duckdb_rows(table))


def _reference(lake, name: str, source: Table, initial: pa.Schema, added: bool) -> Table:
    """The same rows written by pyiceberg's own writer, as one file, into a table of the same
    schema history (so the same field ids)."""
    table = lake.catalog.create_table(name, schema=initial, properties=source.properties)
    if added:
        with table.update_schema() as update:
            update.add_column("added", StringType())
    lake.table(name).append(source.scan().to_arrow())
    return lake.table(name)


@pytest.mark.parametrize("path", ["polars", "arrow bulk", "arrow projected"])
def test_a_compacted_typed_table_is_what_pyiceberg_would_write(lake, monkeypatch, path):
    batches = [typed_rows(k * ROWS, ROWS, k) for k in range(FILES)]
    one_file = {"compaction.target-file-size-bytes": str(64 << 20)}
    table = lake.catalog.create_table("ns.typed", schema=batches[0].schema, properties=one_file)
    if path == "arrow projected":  # half the files predate a column: projected by field id, the rest in bulk
        append_fragments(table, batches[: FILES // 2])
        with table.update_schema() as update:
            update.add_column("added", StringType())
        table = lake.table("ns.typed")
        grown = [b.append_column("added", pa.array([f"a{i}" for i in range(b.num_rows)])) for b in batches]
        append_fragments(table, grown[FILES // 2 :])
    else:
        append_fragments(table, batches)
    if path == "arrow bulk":
        monkeypatch.setattr(polars_rewrite, "qualifies", lambda *args, **kwargs: False)
    table = lake.table("ns.typed")
    before, duck_before = rows_digest(table), _duckdb_multiset(table)
    reference = _reference(lake, "ns.reference", table, batches[0].schema, path == "arrow projected")

    [outcome] = lake.engine.compact("ns.typed")

    assert outcome.status == "committed" and outcome.engine == path.split()[0]
    table = lake.table("ns.typed")
    assert rows_digest(table) == before == rows_digest(reference)
    assert _duckdb_multiset(table) == duck_before == _duckdb_multiset(reference)
    [ours], [theirs] = data_files(table), data_files(reference)
    assert _parquet_columns(ours["file_path"]) == _parquet_columns(theirs["file_path"])
    for key in STATISTICS:
        assert ours[key] == theirs[key], key


def test_a_nested_name_that_meant_another_field_keeps_polars_off(tmp_path):
    """Polars reads struct children by name: point.x and point.y trading names would swap values."""
    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/w")
    catalog.create_namespace("ns")
    point = StructType(NestedField(2, "x", IntegerType(), False), NestedField(3, "y", IntegerType(), False))
    table = catalog.create_table("ns.t", schema=Schema(NestedField(1, "point", point, required=False)))
    assert polars_rewrite.names_are_ids(table.metadata)
    for old, new in (("x", "tmp"), ("y", "x"), ("tmp", "y")):
        with table.update_schema() as update:
            update.rename_column(("point", old), new)
    assert not polars_rewrite.names_are_ids(catalog.load_table("ns.t").metadata)


@pytest.mark.parametrize(
    ("arrow_type", "written"),
    [
        (pa.decimal128(38, 10), pa.decimal128(38, 10)),
        (pa.timestamp("us", tz="UTC"), pa.timestamp("us", tz="UTC")),
        (pa.list_(pa.field("element", pa.string())), pa.large_list(pa.field("element", pa.large_string()))),
        (
            pa.map_(pa.string(), pa.struct([("a", pa.binary())])),
            pa.map_(pa.large_string(), pa.struct([("a", pa.large_binary())])),
        ),
        (pa.uuid(), None),
        (pa.binary(16), None),
        (pa.time64("us"), None),
        (pa.timestamp("ns"), None),
        (pa.struct([("ok", pa.int64()), ("t", pa.time64("us"))]), None),
    ],
    ids=str,
)
def test_polars_takes_the_types_it_writes_as_pyiceberg_does(arrow_type, written):
    target = polars_rewrite.polars_schema(pa.schema([pa.field("c", arrow_type)]))
    assert (target and target.field("c").type) == written
