"""A content fingerprint of a table: the multiset of its rows, independent of file layout."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table


@dataclass(frozen=True)
class RowsDigest:
    rows: int
    sha256: str


def row_hash(row: dict) -> bytes:
    return hashlib.sha256(repr(sorted(row.items())).encode()).digest()


def row_hashes(rows: Iterable[dict]) -> Counter[bytes]:
    """The multiset of rows, as hashes."""
    return Counter(row_hash(r) for r in rows)


def table_row_hashes(table: Table, snapshot_id: int | None = None) -> Counter[bytes]:
    hashes: Counter[bytes] = Counter()
    for batch in table.scan(snapshot_id=snapshot_id).to_arrow_batch_reader():
        hashes.update(row_hashes(batch.to_pylist()))
    return hashes


def rows_digest(table: Table, snapshot_id: int | None = None) -> RowsDigest:
    """The multiset of the table's rows (see batches_digest)."""
    return batches_digest(table.scan(snapshot_id=snapshot_id).to_arrow_batch_reader())


def batches_digest(batches: Iterable[pa.RecordBatch]) -> RowsDigest:
    """Hash every row (vectorised, 64 bits), sort the hashes, hash the sorted list: equal iff the
    row multisets are equal (up to a 2^-64 collision). Independent of file layout, column order
    and of how an engine typed its integers, timestamps, strings, decimals, dictionaries or lists
    (large, view).

    Flat columns are hashed by Polars (`hash_rows`, seeded: the same in every process of one
    Polars version; 10M rows of six columns 1.8 s, 9.3 s through pandas); a nested column is first
    hashed element by element, with list positions, in Arrow (`_row_hashes`) and enters as those
    hashes."""
    parts = [np.zeros(0, np.uint64)]
    for batch in batches:
        if batch.num_rows:
            columns = {name: _hashable(batch.column(name)) for name in sorted(batch.schema.names)}
            frame = pl.from_arrow(pa.table(columns))
            parts.append(frame.hash_rows(seed=ROW_HASH_SEED).to_numpy())  # type: ignore[union-attr]
    hashes = np.sort(np.concatenate(parts))
    return RowsDigest(len(hashes), hashlib.sha256(hashes.tobytes()).hexdigest())


ROW_HASH_SEED = 20261128


def _hashable(column: pa.Array) -> pa.Array:
    """`column` in one canonical type per kind of value, as Polars hashes it."""
    t = column.type
    if pa.types.is_dictionary(t):
        return _hashable(column.dictionary_decode())
    if pa.types.is_signed_integer(t):
        return column.cast(pa.int64())
    if pa.types.is_unsigned_integer(t):
        return column.cast(pa.uint64())
    if pa.types.is_timestamp(t):
        return pc.cast(column, pa.timestamp("us")).cast(pa.int64())
    if pa.types.is_date64(t):
        return column.cast(pa.date32())
    if pa.types.is_decimal(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return column.cast(pa.string())
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t):
        return column.cast(pa.binary())
    if isinstance(t, pa.ExtensionType):
        return _hashable(column.storage)
    if pa.types.is_nested(t):
        return pa.array(_row_hashes(column), pa.uint64())
    return column


def _row_hashes(column: pa.Array | pa.ChunkedArray, *extra: np.ndarray) -> np.ndarray:
    """One uint64 per value of `column` (and of `extra`), equal iff the values are equal (up to collisions)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    frame = pd.DataFrame({str(k): c for k, c in enumerate([*_flat_parts(column), *extra])})
    return pd.util.hash_pandas_object(frame, index=False).to_numpy()


def _flat_parts(column: pa.Array) -> list:
    """`column` as flat columns pandas can hash, row for row."""
    t = column.type
    if pa.types.is_struct(t):
        return _struct_parts(column)
    if pa.types.is_map(t):  # a map is a list of key-value structs, entry order kept
        entries = pa.field("entries", pa.struct([t.key_field, t.item_field]), nullable=False)
        return _flat_parts(column.view(pa.list_(entries)))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return _list_parts(column)
    if pa.types.is_timestamp(t):
        return [pc.cast(column, pa.timestamp("us")).cast(pa.int64()).to_pandas()]
    if pa.types.is_decimal(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return [column.cast(pa.string()).to_pandas()]
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t):
        return [column.cast(pa.binary()).to_pandas()]
    if isinstance(t, pa.ExtensionType):
        return _flat_parts(column.storage)
    return [column.to_pandas()]


def _struct_parts(column: pa.StructArray) -> list:
    """A struct column as flat columns: validity, then each field's (a null struct hiding its fields)."""
    parts: list = [column.is_valid().to_numpy(zero_copy_only=False)]
    for k in range(column.type.num_fields):
        parts += _flat_parts(column.field(k) if column.null_count == 0 else _masked(column, k))
    return parts


def _list_parts(column: pa.Array) -> list:
    """A list column as flat columns: validity, length, and the sum of its elements' hashes (with their positions)."""
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy().astype(np.int64)
    values = pc.list_flatten(column)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    element = _row_hashes(values, np.arange(len(values)) - np.repeat(offsets[:-1], lengths))
    sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(element, dtype=np.uint64)])
    return [column.is_valid().to_numpy(zero_copy_only=False), lengths, sums[offsets[1:]] - sums[offsets[:-1]]]


def _masked(column: pa.StructArray, k: int) -> pa.Array:
    """Child `k` of a struct with the struct's own nulls applied (a null struct hides its fields)."""
    return pc.if_else(column.is_valid(), column.field(k), pa.nulls(len(column), column.type.field(k).type))
