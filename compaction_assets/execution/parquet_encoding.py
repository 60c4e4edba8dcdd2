"""The Arrow path's Parquet writer: which columns of an output file are dictionary-encoded, and
exact bounds for nanosecond timestamps.

pyarrow (as pyiceberg configures it, and parquet-mr alike) starts every column chunk with a
dictionary and falls back to plain encoding once the dictionary page passes
`write.parquet.dict-size-bytes` (2 MB). On a column of mostly distinct values (a double, an id, a
timestamp) that is all cost: every value is hashed into a dictionary that is then thrown away.
The bench's sorted group (3M rows: id, ts, name, city, price, qty), written on one thread: 1.74 s
with a dictionary tried on every column, 0.62 s with one on `city` alone, and the file 134 -> 115
MiB (the fallback's large dictionary pages cost more than they saved).

So the file's first row group decides, per top-level primitive column, on 8,192 of its rows taken
evenly (about a millisecond a column): a dictionary where their distinct values are at most half
of them and those values' plain bytes fit the dictionary page limit, plain encoding where not. Columns inside structs,
lists and maps keep pyarrow's default (a dictionary).

Bounds: pyiceberg 0.12 takes a column's min and max from the Parquet footer as Python values
(`Statistics.min`), which pyarrow gives for TIMESTAMP(NANOS) as pandas Timestamps, and serialises
them through `datetime_to_nanos`, which keeps whole microseconds: a file whose largest value is
...001001 ns got the upper bound ...001000, below its own rows, and a reader that prunes files by
bounds (Iceberg Java, DuckDB, pyiceberg) skips it for `ts = ...001001`. The footer holds the exact
nanoseconds (`min_raw` / `max_raw`); `file_statistics` puts those in the file's bounds, and never
asks pyarrow for a nanosecond value as a Python object.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io.fileformat import DataFileStatistics
from pyiceberg.io.pyarrow import (
    MetricModeTypes,
    ParquetFormatWriter,
    StatisticsCollector,
    StatsAggregator,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    match_metrics_mode,
    parquet_path_to_id_mapping,
)
from pyiceberg.schema import Schema
from pyiceberg.types import TimestampNanoType, TimestamptzNanoType

NANO_TYPES = (TimestampNanoType, TimestamptzNanoType)  # columns whose bounds file_statistics takes from the footer
REPEATS = 2  # rows per distinct value, at least, for a dictionary to pay
SAMPLE_ROWS = 8_192  # rows of the first row group whose values are counted (all of them: 0.4 s on 578k rows)


def dictionary_columns(table: pa.Table, limit_bytes: int) -> list[str]:
    """Parquet leaf paths of `table`'s columns that are to be dictionary-encoded (see the module
    docstring): nested columns' leaves always; a primitive column when its values repeat."""
    chosen: list[str] = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_nested(field.type):
            chosen.extend(_leaf_paths(field.name, field.type))
        elif _repeats(column, limit_bytes):
            chosen.append(field.name)
    return chosen


def _repeats(column: pa.ChunkedArray, limit_bytes: int) -> bool:
    if isinstance(column.type, pa.BaseExtensionType):  # a uuid: its 16 bytes
        column = pa.chunked_array([c.storage for c in column.chunks], column.type.storage_type)
    try:
        if len(column) > SAMPLE_ROWS:  # every k-th row: a sorted column's neighbours would all be alike
            column = column.take(np.linspace(0, len(column) - 1, SAMPLE_ROWS).astype(np.int64))
        distinct = pc.count_distinct(column).as_py()
    except pa.ArrowNotImplementedError:  # no take or distinct count for this type (string_view): pyarrow's default
        return True
    valid = len(column) - column.null_count
    if valid == 0:
        return True  # all null: nothing to encode either way
    try:
        width = max(1, column.type.bit_width // 8)
    except ValueError:  # no fixed width (strings, binary): their average length
        width = max(1, column.nbytes // valid)
    return distinct * REPEATS <= valid and distinct * width <= limit_bytes


def _leaf_paths(prefix: str, kind: pa.DataType) -> list[str]:
    """The Parquet column paths under `prefix` (pyarrow's compliant nested names)."""
    if pa.types.is_struct(kind):
        return [p for f in kind for p in _leaf_paths(f"{prefix}.{f.name}", f.type)]
    if pa.types.is_map(kind):
        return _leaf_paths(f"{prefix}.key_value.key", kind.key_type) + _leaf_paths(
            f"{prefix}.key_value.value", kind.item_type
        )
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaf_paths(f"{prefix}.list.element", kind.value_type)
    return [prefix]


def file_statistics(footer: pq.FileMetaData, schema: Schema, properties: dict[str, str]) -> DataFileStatistics:
    """pyiceberg's statistics of the file `footer` describes, with nanosecond timestamps' bounds
    taken from the footer's raw INT64 values: pyiceberg only counts those columns (it would turn
    their min and max into pandas Timestamps, see the module docstring)."""
    plan = compute_statistics_plan(schema, properties)
    nanos = {
        i: c
        for i, c in plan.items()
        if isinstance(c.iceberg_type, NANO_TYPES) and c.mode.type not in (MetricModeTypes.NONE, MetricModeTypes.COUNTS)
    }
    counted = {i: replace(c, mode=match_metrics_mode("counts")) for i, c in nanos.items()}
    ids = parquet_path_to_id_mapping(schema)
    statistics = data_file_statistics_from_parquet_metadata(footer, {**plan, **counted}, ids)
    statistics.column_aggregates.update(_nano_bounds(footer, ids, nanos))
    return statistics


def _nano_bounds(
    footer: pq.FileMetaData, ids: dict[str, int], nanos: dict[int, StatisticsCollector]
) -> dict[int, StatsAggregator]:
    """Bounds of the `nanos` columns from the row groups' raw INT64 values; none for a column
    some row group (not only nulls) has no min and max for."""
    bounds: dict[int, StatsAggregator] = {}
    unknown: set[int] = set()
    for group in range(footer.num_row_groups):
        row_group = footer.row_group(group)
        for position in range(row_group.num_columns):
            column = row_group.column(position)
            if (field_id := ids.get(column.path_in_schema)) not in nanos:
                continue
            stats = column.statistics if column.is_stats_set else None
            if stats is not None and stats.has_null_count and stats.null_count == column.num_values:
                continue  # only nulls here: no min or max, and none needed
            if stats is None or not stats.has_min_max or not isinstance(stats.min_raw, int):
                unknown.add(field_id)  # a row group without them: no bounds, as pyiceberg does
                continue
            aggregate = bounds.setdefault(field_id, StatsAggregator(nanos[field_id].iceberg_type, stats.physical_type))
            aggregate.update_min(stats.min_raw)
            aggregate.update_max(stats.max_raw)
    return {i: a for i, a in bounds.items() if i not in unknown}


class ArrowPathWriter(ParquetFormatWriter):
    """pyiceberg's Parquet writer with the dictionary columns chosen from the first row group, and
    exact bounds for nanosecond timestamps (see the module docstring).

    Written against pyiceberg 0.12: its ParquetFormatWriter opens the pq.ParquetWriter on the first
    `write`, from the keyword arguments it read from the table's properties
    (`_parquet_writer_kwargs`); no property or public argument selects columns for dictionary
    encoding, so the choice is added there before that first write. Its `close` closes the
    pq.ParquetWriter and computes the statistics from its footer; `close` here does the same
    with `file_statistics`.
    """

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            kwargs = self._parquet_writer_kwargs
            kwargs["use_dictionary"] = dictionary_columns(table, kwargs["dictionary_pagesize_limit"])
        super().write(table)

    def close(self) -> DataFileStatistics:
        """pyiceberg's `close`, with `file_statistics` in place of its statistics."""
        if self._result is not None:
            return self._result
        if self._writer is None or self._fos is None:
            raise ValueError("Cannot close a writer that was never written to")
        with self._fos:
            self._writer.close()
            self._result = file_statistics(self._writer.writer.metadata, self._file_schema, self._properties)
        return self._result
