"""The fast path of a group rewrite: Polars' streaming Parquet engine, for groups that qualify.

Polars (Rust) decodes and encodes on all cores with no Python per batch or per file, which is
what thousands of tiny files and CPU-bound re-encoding need. It reads columns by name, so a group
is handed to it only when reading by name is reading by Iceberg field id:
- every column name (nested ones too) in the table's schema history has always had one field id, and the first
  source file's columns are the table's columns (same ids, order and Arrow types: the projection
  pyiceberg would apply is a pure relabel, see SourceReader.relabel_target);
- Polars itself refuses any file with a missing, extra or differently typed column
  (`missing_columns` / `extra_columns` = "raise", no casts), so an older file of an evolved table
  fails the scan, and the group then goes through the per-file projecting path;
- columns of types Polars writes with the Parquet types and field ids pyiceberg's writer gives
  them (primitives, decimals, UTC or local microsecond timestamps, lists, structs, maps; not
  uuid, fixed or time), no sort order, and no Parquet table property Polars cannot honour;
- files Polars reaches itself (execution/polars_storage.py): local files, or all on S3 with FileIO
  properties that translate to object_store's options (no role to assume, no remote signer);
- small source files (average <= 8 MiB): the regime where per-file cost dominates and Polars wins
  most. Large files decode in parallel into large buffers (a 2.9 GB group of 39 MB files peaked at
  750 MiB), so they stream through pyarrow, whose memory is bounded by one row-group buffer.
Result files carry the same field ids, codec, row-group limit and page size as pyiceberg's writer
would give them; their statistics come from their footers through pyiceberg's own functions.
Anything unexpected (a Polars error, a row count that does not add up) deletes what this path
wrote and returns None: the caller then rewrites the group on the per-file path, which names a
bad file precisely.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    PyArrowFileIO,
    StatisticsCollector,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema, index_by_name
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record
from pyiceberg.utils.properties import property_as_int

from compaction_assets.execution.polars_storage import (
    PolarsStorage,
    footer_reads,
    local_path,
    scan_concurrency,
    storage_for,
)
from compaction_assets.faults import crash_point
from compaction_assets.lake.properties import int_property
from compaction_assets.redact import redact

if TYPE_CHECKING:
    import polars as pl

log = logging.getLogger(__name__)

_UNSUPPORTED_PROPERTIES = (
    TableProperties.PARQUET_DICT_SIZE_BYTES,
    TableProperties.PARQUET_PAGE_ROW_LIMIT,
    TableProperties.PARQUET_ROW_GROUP_SIZE_BYTES,
    TableProperties.PARQUET_BLOOM_FILTER_MAX_BYTES,
)
MAX_AVERAGE_SOURCE_BYTES = 8 * 1024 * 1024
ROW_GROUP_BYTES = 8 * 1024 * 1024  # decoded bytes per output row group (see rewrite_with_polars)
MIN_ROW_GROUP_ROWS = 16_384
_CODECS = {"uncompressed": "uncompressed", "snappy": "snappy", "gzip": "gzip", "zstd": "zstd", "lz4": "lz4"}


def names_are_ids(metadata: TableMetadata) -> bool:
    """True if no column name, nested ones included (`a.b`), ever meant two field ids in the
    table's schema history."""
    ids: dict[str, int] = {}
    for schema in metadata.schemas:
        for name, field_id in index_by_name(schema).items():
            if ids.setdefault(name, field_id) != field_id:
                return False
    return True


def polars_schema(target: pa.Schema) -> pa.Schema | None:
    """`target` as Polars can write it (large strings, binaries and lists), or None if a type is
    not one Polars writes as pyiceberg does."""
    fields = []
    for f in target:
        t = _polars_type(f.type)
        if t is None:
            return None
        fields.append(f.with_type(t))
    return pa.schema(fields)


_PRIMITIVES = (
    pa.types.is_boolean,
    pa.types.is_int32,
    pa.types.is_int64,
    pa.types.is_float32,
    pa.types.is_float64,
    pa.types.is_date32,
    pa.types.is_decimal128,
)


def _polars_type(t: pa.DataType) -> pa.DataType | None:
    """The Arrow type Polars writes for `t`; None where Polars cannot write it with the same
    Parquet type and field ids (uuid, fixed, time, nanosecond or non-UTC timestamps)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.large_string()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.large_binary()
    if pa.types.is_timestamp(t):
        return t if t.unit == "us" and t.tz in (None, "UTC", "+00:00") else None
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_struct(t) or pa.types.is_map(t):
        return _polars_nested_type(t)
    return t if any(is_type(t) for is_type in _PRIMITIVES) else None


def _polars_nested_type(t: pa.DataType) -> pa.DataType | None:
    """Decides the Polars type of a list, struct or map: None if any child type has none."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        child = _polars_type(t.value_type)
        return None if child is None else pa.large_list(t.value_field.with_type(child))
    if pa.types.is_struct(t):
        children = [t.field(k) for k in range(t.num_fields)]
        types = [_polars_type(c.type) for c in children]
        return None if None in types else pa.struct([c.with_type(x) for c, x in zip(children, types, strict=True)])
    key, item = _polars_type(t.key_type), _polars_type(t.item_type)
    if key is None or item is None:
        return None
    return pa.map_(t.key_field.with_type(key), t.item_field.with_type(item))


def qualifies(metadata: TableMetadata, io: FileIO, sources: list, sorted_output: bool) -> bool:
    """The group-level conditions (the schema conditions are checked on the first file)."""
    props = metadata.properties
    return (
        not sorted_output
        and bool(sources)
        and sum(s.size for s in sources) <= MAX_AVERAGE_SOURCE_BYTES * len(sources)
        and storage_for(io, [s.path for s in sources]) is not None
        and not any(key in props for key in _UNSUPPORTED_PROPERTIES)
        and not any(key.startswith(TableProperties.PARQUET_BLOOM_FILTER_COLUMN_ENABLED_PREFIX) for key in props)
        and props.get(TableProperties.PARQUET_COMPRESSION, TableProperties.PARQUET_COMPRESSION_DEFAULT) in _CODECS
        and names_are_ids(metadata)
    )


@dataclass(frozen=True)
class Statistics:
    """pyiceberg's statistics plan and Parquet-path-to-field-id mapping for a file schema."""

    plan: dict[int, StatisticsCollector]
    id_mapping: dict[str, int]


def statistics_for(file_schema: Schema, properties: dict[str, str]) -> Statistics:
    return Statistics(compute_statistics_plan(file_schema, properties), parquet_path_to_id_mapping(file_schema))


def rewrite_with_polars(
    io: FileIO,
    metadata: TableMetadata,
    statistics: Statistics,
    target: pa.Schema,
    sources: list,
    partition: Record,
    spec_id: int,
    name: str,
    max_files: int,
    footer: pq.FileMetaData,
    deleted: Sequence[np.ndarray] | None = None,
) -> list[DataFile] | None:
    """Write `sources` (SourceFile-like) as up to `max_files` files `<name>-NNNNN.parquet`,
    without the rows at `deleted[i]` (sorted, unique positions) of `sources[i]`: merge-on-read
    (execution/polars_deletes works them out).

    `footer` is the first source's: the other sources have footers like it (it sizes Polars' tail
    reads on object storage, polars_storage.footer_reads), and its decoded bytes per row size the
    row groups: about ROW_GROUP_BYTES each, at most the table's row-group limit. Polars buffers a
    whole row group before encoding it, so pyiceberg's default of 1,048,576 rows held 400 MiB for
    20 typed columns and ran 2-3x slower than row groups of ~8 MiB (which the Arrow path writes too)."""
    import polars as pl

    options = _write_options(metadata, target, footer)
    storage = storage_for(io, [s.path for s in sources])
    if storage is None:
        return None
    row_bytes = held_row_bytes(footer)
    written: list[DataFile] = []
    opened: list[str] = []
    reference = None  # the first chunk's Polars schema: the one validated against the table
    gone = dict(zip((s.path for s in sources), deleted or (), strict=False))
    try:
        for k, chunk in enumerate(_split(sources, max_files)):
            location = f"{name}-{k:05d}.parquet"
            dropped = _chunk_positions(chunk, gone)
            expected = sum(s.records for s in chunk) - (0 if dropped is None else len(dropped))
            frame = _scan_chunk(storage, chunk, dropped)
            # Polars checks a chunk's files against the chunk's first file only; the relabel below
            # is positional, and was validated on the group's first file (the first chunk's): a
            # later chunk of other columns (an older order, a dropped column) must not take it.
            # Checked before a chunk is skipped, so the reference is always the first chunk's.
            with footer_reads(footer.serialized_size):  # reads up to 16 files' footers, then drops them
                schema = frame.collect_schema()
            if reference is None:
                reference = schema
            elif schema != reference:
                raise ValueError(f"{location}: its sources' columns differ from the group's first file's")
            if expected == 0:
                continue  # deletes took every row: no file, as on the per-file path
            opened.append(location)
            physical = schema.names()
            if physical != target.names:
                frame = frame.rename(dict(zip(physical, target.names, strict=True)))
            _sink_chunk(frame, storage, location, chunk, footer, row_bytes, options)
            out_footer, size = _footer(io, storage, location)
            if out_footer.num_rows != expected:
                raise ValueError(f"{location}: {out_footer.num_rows} rows, sources and deletes say {expected}")
            written.append(_data_file(statistics, out_footer, location, partition, size, spec_id))
            crash_point("worker_mid_group")
    # any failure, a Polars panic too (no Exception: a user's unparsable POLARS_* value raises one):
    # clean up, let the per-file path decide
    except (Exception, pl.exceptions.PanicException) as exc:  # noqa: BLE001
        storage.register_secrets()  # a Polars error may quote its options; the log line must not
        log.warning("polars rewrite of %s fell back to the per-file path: %s", name, redact(str(exc).splitlines()[0]))
        _delete_opened(io, opened)
        return None
    return written


def _write_options(metadata: TableMetadata, target: pa.Schema, footer: pq.FileMetaData) -> dict:
    """Decides Polars' sink_parquet options from the table's Parquet properties and the first footer."""
    props = metadata.properties
    codec = props.get(TableProperties.PARQUET_COMPRESSION, TableProperties.PARQUET_COMPRESSION_DEFAULT)
    return {
        "compression": _CODECS[codec],
        "compression_level": property_as_int(props, TableProperties.PARQUET_COMPRESSION_LEVEL),
        "row_group_size": row_group_rows(metadata.properties, decoded_row_bytes(footer)),
        "data_page_size": property_as_int(
            props, TableProperties.PARQUET_PAGE_SIZE_BYTES, TableProperties.PARQUET_PAGE_SIZE_BYTES_DEFAULT
        ),
        "statistics": True,
        "arrow_schema": target,
    }


def _scan_chunk(storage: PolarsStorage, chunk: list, dropped: np.ndarray | None) -> pl.LazyFrame:
    """Decides the lazy scan of a chunk's files, without the rows at `dropped` (scan row numbers)."""
    import polars as pl

    frame = pl.scan_parquet(
        [storage.path(s.path) for s in chunk],
        glob=False,
        hive_partitioning=False,
        missing_columns="raise",
        extra_columns="raise",
        storage_options=storage.options,
        row_index_name=ROW_INDEX if dropped is not None else None,
    )
    if dropped is not None:  # the scan's row numbers across the chunk's files
        kept = ~pl.col(ROW_INDEX).is_in(pl.Series(dropped, dtype=pl.get_index_type()).implode())
        frame = frame.filter(kept).drop(ROW_INDEX)
    return frame


def _sink_chunk(
    frame: pl.LazyFrame,
    storage: PolarsStorage,
    location: str,
    chunk: list,
    footer: pq.FileMetaData,
    row_bytes: float,
    options: dict,
) -> None:
    """Writes a chunk's frame to `location`, deciding its local folder and scan concurrency."""
    output = storage.path(location)
    if storage.local:  # a partition's first file: Polars makes no local folders
        os.makedirs(os.path.dirname(output), exist_ok=True)
    sizes = [s.size for s in chunk]
    # small sources: one GET each; many local ones in flight, as many as their decoded size
    # allows (object storage: not measured yet)
    decoded = [max(s.size, int(s.records * row_bytes)) for s in chunk]
    concurrency = scan_concurrency(decoded) if storage.local else contextlib.nullcontext()
    with footer_reads(footer.serialized_size, sizes), concurrency:
        frame.sink_parquet(output, storage_options=storage.options, **options)


def _data_file(
    statistics: Statistics, out_footer: pq.FileMetaData, location: str, partition: Record, size: int, spec_id: int
) -> DataFile:
    """Decides the DataFile entry of a written file from its footer's statistics."""
    stats = data_file_statistics_from_parquet_metadata(out_footer, statistics.plan, statistics.id_mapping)
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=partition,
        file_size_in_bytes=size,
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
        **stats.to_serialized_dict(),
    )
    data_file.spec_id = spec_id
    return data_file


def _delete_opened(io: FileIO, opened: list[str]) -> None:
    """Deletes the files this path began writing, only those that exist."""
    for location in opened:  # only what exists: pyarrow's S3 delete leaves a folder marker behind
        with contextlib.suppress(OSError):
            if io.new_input(location).exists():
                io.delete(location)


ROW_INDEX = "__compaction_row_index"  # not an Iceberg column name the group can have: names_are_ids


def _chunk_positions(chunk: list, deleted: dict[str, np.ndarray]) -> np.ndarray | None:
    """The deleted rows of a chunk's sources as row numbers of one scan over them (None: no row
    is deleted). Positions are within each source's records (polars_deletes), so offsetting by
    the records before it numbers them as the scan does."""
    parts, offset = [], 0
    for source in chunk:
        positions = deleted.get(source.path)
        if positions is not None and len(positions):
            parts.append(positions + offset)
        offset += source.records
    return np.concatenate(parts) if parts else None


def row_group_rows(properties: dict[str, str], row_bytes: float) -> int:
    """Rows per output row group: about ROW_GROUP_BYTES decoded, within [MIN_ROW_GROUP_ROWS, the table's limit]."""
    limit = int_property(
        properties, TableProperties.PARQUET_ROW_GROUP_LIMIT, TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT
    )
    return max(1, min(limit, max(MIN_ROW_GROUP_ROWS, int(ROW_GROUP_BYTES / max(row_bytes, 1.0)))))


def read_footer(io: FileIO, location: str) -> pq.FileMetaData:
    """The footer of a Parquet file: from the disk if local, else through the FileIO."""
    local = local_path(io.properties, location) if isinstance(io, PyArrowFileIO) else None
    if local is not None:
        return pq.read_metadata(local)
    with io.new_input(location).open() as stream:
        return pq.read_metadata(stream)


def held_row_bytes(footer: pq.FileMetaData) -> float:
    """Bytes per row a scan holds of a file like this one decoded: its uncompressed bytes per row,
    and at least 8 per leaf column. Parquet's uncompressed sizes are after encoding: a column of
    long runs or few distinct values stores in a few bytes what decodes to 8 per row (300 files of
    39 KiB that decoded to 6 MiB each, 64 in flight, took a worker to 756 MiB)."""
    return max(decoded_row_bytes(footer), 8.0 * footer.num_columns)


def decoded_row_bytes(footer: pq.FileMetaData) -> float:
    """Uncompressed bytes per row of a file (about its Arrow size per row)."""
    rows = footer.num_rows
    return sum(footer.row_group(k).total_byte_size for k in range(footer.num_row_groups)) / rows if rows else 0.0


def _footer(io: FileIO, storage: PolarsStorage, location: str) -> tuple[pq.FileMetaData, int]:
    """A written file's footer and size: from the disk, or through the FileIO (the size its
    open learnt: on object storage, one request fewer than asking for the length again)."""
    if storage.local:
        path = storage.path(location)
        return pq.read_metadata(path), os.path.getsize(path)
    with io.new_input(location).open() as stream:
        return pq.read_metadata(stream), stream.seek(0, os.SEEK_END)


def _split(sources: list, parts: int) -> list[list]:
    """Consecutive runs of `sources` of about equal bytes, at most `parts` of them."""
    total = sum(s.size for s in sources)
    runs: list[list] = [[]]
    done = 0
    for source in sources:
        if runs[-1] and len(runs) < parts and done >= total * len(runs) / parts:
            runs.append([])
        runs[-1].append(source)
        done += source.size
    return runs
