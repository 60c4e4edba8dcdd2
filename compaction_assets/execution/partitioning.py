"""Rows into partitions of a partition spec: what an old-spec rewrite writes (one set of files per
partition of the current spec).

The transforms are pyiceberg's own (`Transform.pyarrow_transform`, pyiceberg-core for bucket,
truncate and the time transforms); partition values become their Record representation as
pyiceberg's writes make them (`partition_record_value`), and folders their partition keys
(lake.partition_key). Rows are grouped by hashing the transformed values (Arrow's group_by),
not by filtering on each value, so every row lands in exactly one partition (NULL and NaN keys
included) and keeps its order within it.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.partitioning import PartitionSpec, partition_record_value
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record

from compaction_assets.lake.partition_key import render_partition

_ROW = "__row"


def split_by_partition(
    batch: pa.RecordBatch, spec: PartitionSpec, schema: Schema
) -> list[tuple[Record, pa.RecordBatch]]:
    """`batch` (columns in `schema`'s order, as the output file schema has them) as one batch per
    partition of `spec` its rows fall in, with that partition's values; rows in their order."""
    if not spec.fields or batch.num_rows == 0:
        return [(Record(), batch)] if batch.num_rows else []
    keys = {f"p{i}": _transformed(batch, spec, schema, i) for i in range(len(spec.fields))}
    keys[_ROW] = pa.array(range(batch.num_rows), pa.int64())
    grouped = pa.table(keys).group_by([k for k in keys if k != _ROW], use_threads=False).aggregate([(_ROW, "list")])
    rows = grouped.column(f"{_ROW}_list")
    parts = []
    for index, values in enumerate(grouped.drop_columns([f"{_ROW}_list"]).to_pylist()):
        record = Record(*(partition_record_value(f, values[f"p{i}"], schema) for i, f in enumerate(spec.fields)))
        parts.append((record, batch.take(rows[index].values)))
    return parts


def partition_folder(data_path: str, spec: PartitionSpec, schema: Schema, partition: Record) -> str:
    """Where files of `partition` go: the table's data folder / the partition's key (as other writes)."""
    key = render_partition(spec, schema, partition, spec.spec_id)
    return f"{data_path.rstrip('/')}/{key}" if key else data_path


def _transformed(batch: pa.RecordBatch, spec: PartitionSpec, schema: Schema, position: int) -> pa.Array:
    """The partition field's values of each row: its transform of its source column (by field id),
    extension types as their storage."""
    partition_field = spec.fields[position]
    accessor = schema.accessor_for_field(partition_field.source_id)
    column = batch.column(accessor.position)
    while accessor.inner is not None:  # a source inside a struct
        accessor = accessor.inner
        column = pc.struct_field(column, [accessor.position])
    source_type = schema.find_field(partition_field.source_id).field_type
    values = partition_field.transform.pyarrow_transform(source_type)(column)
    if pa.types.is_timestamp(values.type) and values.type.unit == "ns":
        # identity of a timestamp_ns: its nanoseconds, as a partition record holds them (pyarrow
        # turns them into Python values only through pandas, as pd.Timestamp, which pyiceberg keeps)
        return values.cast(pa.int64())
    # group_by takes no extension keys (identity of a uuid is extension<arrow.uuid>): group by the
    # storage (its 16 bytes, as a partition record holds a uuid)
    return values.storage if isinstance(values.type, pa.BaseExtensionType) else values
