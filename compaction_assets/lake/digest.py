"""A content fingerprint of a table: the multiset of its rows, independent of file layout."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

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
    """Hash every row, sort the hashes, hash the sorted list: equal iff the row multisets are equal."""
    hashes = sorted(table_row_hashes(table, snapshot_id).elements())
    return RowsDigest(len(hashes), hashlib.sha256(b"".join(hashes)).hexdigest())
