"""A content fingerprint of a table: the multiset of its rows, independent of file layout."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from pyiceberg.table import Table


@dataclass(frozen=True)
class RowsDigest:
    rows: int
    sha256: str


def rows_digest(table: Table, snapshot_id: int | None = None) -> RowsDigest:
    """Hash every row, sort the hashes, hash the sorted list: equal iff the row multisets are equal."""
    row_hashes: list[bytes] = []
    for batch in table.scan(snapshot_id=snapshot_id).to_arrow_batch_reader():
        row_hashes.extend(hashlib.sha256(repr(sorted(row.items())).encode()).digest() for row in batch.to_pylist())
    row_hashes.sort()
    return RowsDigest(len(row_hashes), hashlib.sha256(b"".join(row_hashes)).hexdigest())
