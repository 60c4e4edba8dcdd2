"""The Arrow path's Parquet writer dictionary-encodes the columns whose values repeat and writes
the rest plain (execution/parquet_encoding.py); the files read back the same rows, by pyarrow and
by DuckDB, with their Iceberg statistics."""

from __future__ import annotations

import uuid
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.conversions import from_bytes
from pyiceberg.io.pyarrow import PyArrowFileIO, schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestamptzNanoType,
    UUIDType,
)

from compaction_assets.execution.parquet_encoding import ArrowPathWriter, dictionary_columns

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "city", StringType(), required=False),
    NestedField(3, "price", DoubleType(), required=False),
    NestedField(4, "qty", IntegerType(), required=False),
    NestedField(5, "note", StringType(), required=False),
    NestedField(6, "tags", ListType(7, StringType(), element_required=False), required=False),
    NestedField(8, "addr", StructType(NestedField(9, "zip", StringType(), required=False)), required=False),
    NestedField(10, "key", UUIDType(), required=False),
    NestedField(11, "code", StringType(), required=False),
)


def _rows(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.Table.from_pydict(
        {
            "id": np.arange(n, dtype=np.int64),
            "city": rng.choice(["Amsterdam", "Berlin", "Lisbon"], n),
            "price": rng.random(n),
            "qty": rng.integers(0, 50, n).astype(np.int32),
            "note": [None] * n,
            "tags": [["a", "b"] if i % 3 else None for i in range(n)],
            "addr": [{"zip": f"{i % 7:05d}"} for i in range(n)],
            "key": [uuid.UUID(int=i).bytes for i in range(n)],
            "code": [f"code-{i:08d}" for i in range(n)],  # distinct strings
        },
        schema=schema_to_pyarrow(SCHEMA),
    )


def test_repeating_columns_get_a_dictionary_and_distinct_ones_do_not():
    chosen = dictionary_columns(_rows(10_000), 2 * 1024 * 1024)
    assert set(chosen) == {"city", "qty", "note", "tags.list.element", "addr.zip"}


def test_distinct_values_past_the_dictionary_page_limit_are_written_plain():
    table = pa.table({"s": [f"value-{i % 1_000:06d}" for i in range(40_000)]})  # 40 rows a value, 12 bytes each
    assert dictionary_columns(table, 1024 * 1024) == ["s"]
    assert dictionary_columns(table, 8 * 1024) == []


def test_a_type_with_no_sampling_kernel_keeps_pyarrows_default():
    # string_view: pyarrow has no take for it (found by an outside attack: 8,193 rows raised)
    table = pa.table({"s": pa.array([f"v{i}" for i in range(8_193)], pa.string_view())})
    assert dictionary_columns(table, 2 * 1024 * 1024) == ["s"]


def test_written_files_read_back_with_their_encodings_and_statistics(tmp_path: Path):
    table = _rows(10_000)
    path = tmp_path / "out.parquet"
    writer = ArrowPathWriter(PyArrowFileIO().new_output(str(path)), SCHEMA, {})
    writer.write(table.slice(0, 6_000))
    writer.write(table.slice(6_000))
    stats = writer.close()

    metadata = pq.ParquetFile(path).metadata
    assert metadata.num_row_groups == 2
    for group in range(metadata.num_row_groups):
        encodings = {
            metadata.row_group(group).column(c).path_in_schema: metadata.row_group(group).column(c).encodings
            for c in range(metadata.num_columns)
        }
        dictionary = {name for name, used in encodings.items() if "RLE_DICTIONARY" in used}
        assert {"city", "qty", "tags.list.element", "addr.zip"} <= dictionary
        assert not dictionary & {"id", "price", "key", "code"}
    assert pq.read_table(path).equals(table)
    assert stats.record_count == 10_000 and stats.value_counts[3] == 10_000
    bounds = stats.to_serialized_dict()
    assert int.from_bytes(bounds["upper_bounds"][1], "little") == 9_999
    count, total, cities = duckdb.sql(
        f"select count(*), sum(price), count(distinct city) from read_parquet('{path}')"
    ).fetchone()
    assert count == 10_000 and cities == 3 and abs(total - pa.compute.sum(table["price"]).as_py()) < 1e-6


@pytest.mark.parametrize("kind", [TimestampNanoType(), TimestamptzNanoType()])
def test_nanosecond_timestamps_get_exact_bounds(tmp_path: Path, kind):
    # pyiceberg 0.12 serialised them through datetime_to_nanos: upper bound ...001000 for a largest
    # value of ...001001, below the file's own rows (found by an outside attack on another change)
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "at", kind))
    unit = pa.timestamp("ns", tz="UTC" if isinstance(kind, TimestamptzNanoType) else None)
    values = [-1_000_000_000_000_000_999, 1_700_000_000_000_001_001, None, 1_700_000_000_000_000_007]
    path = tmp_path / "ns.parquet"
    writer = ArrowPathWriter(PyArrowFileIO().new_output(str(path)), schema, {})
    writer.write(pa.table({"id": pa.array(range(4), pa.int64()), "at": pa.array(values, unit)}))
    writer.write(pa.table({"id": pa.array([9], pa.int64()), "at": pa.array([1_700_000_000_000_001_002], unit)}))
    # a row group of nulls only has no min or max: the others' bounds stand (an attack found them dropped)
    writer.write(pa.table({"id": pa.array([10, 11], pa.int64()), "at": pa.array([None, None], unit)}))
    bounds = writer.close().to_serialized_dict()

    assert from_bytes(kind, bounds["lower_bounds"][2]) == -1_000_000_000_000_000_999
    assert from_bytes(kind, bounds["upper_bounds"][2]) == 1_700_000_000_000_001_002
    assert from_bytes(LongType(), bounds["upper_bounds"][1]) == 11
    assert bounds["null_value_counts"][2] == 3
