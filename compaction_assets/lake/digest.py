"""A content fingerprint of a table: the multiset of its rows, independent of file layout."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
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
    and of how an engine typed its timestamps or strings."""
    parts = [np.zeros(0, np.uint64)]
    for batch in batches:
        if batch.num_rows:
            columns = {name: _normalised(batch.column(name)) for name in sorted(batch.schema.names)}
            frame = pa.table(columns).to_pandas()
            parts.append(pd.util.hash_pandas_object(frame, index=False).to_numpy())
    hashes = np.sort(np.concatenate(parts))
    return RowsDigest(len(hashes), hashlib.sha256(hashes.tobytes()).hexdigest())


def _normalised(column: pa.Array) -> pa.Array:
    if pa.types.is_timestamp(column.type):
        return pc.cast(column, pa.timestamp("us")).cast(pa.int64())
    if pa.types.is_large_string(column.type):
        return column.cast(pa.string())
    return column
