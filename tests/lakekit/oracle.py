"""The oracle: the rows every writer was told were committed, minus the rows deletes removed.

Rows are kept by Iceberg field id, so schema evolution (rename, add, drop, widen) is a change of
view, not of data: a renamed column keeps its values, an added one reads NULL in older rows, a
dropped one disappears. Each row has a unique `id` (never reused, never renamed or dropped), so a
delete names the rows it removes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.schema import Schema

Row = tuple[tuple[str, Any], ...]


def row_key(row: Mapping[str, Any]) -> Row:
    """A hashable, column-order-independent form of one row (lists and structs as tuples)."""
    return tuple(sorted((name, _hashable(value)) for name, value in row.items()))


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return ("list", *(_hashable(v) for v in value))
    if isinstance(value, dict):
        return ("struct", *sorted((k, _hashable(v)) for k, v in value.items()))
    return value


@dataclass
class Oracle:
    rows: dict[int, dict[int, Any]] = field(default_factory=dict)  # id -> field id -> value

    def append(self, rows: Iterable[dict[int, Any]], id_field: int) -> None:
        for row in rows:
            assert row[id_field] not in self.rows, f"row id {row[id_field]} written twice by the test"
            self.rows[row[id_field]] = dict(row)

    def delete(self, ids: Iterable[int]) -> int:
        """Remove rows by id (a delete of a row already gone removes nothing); returns how many."""
        return sum(self.rows.pop(i, None) is not None for i in ids)

    def ids_where(self, predicate: Callable[[dict[int, Any]], bool]) -> list[int]:
        return [i for i, row in self.rows.items() if predicate(row)]

    def view(self, schema: Schema, predicate: Callable[[dict[int, Any]], bool] | None = None) -> Counter[Row]:
        """The multiset of rows as a reader of the table's current schema sees them."""
        columns = [(f.field_id, f.name) for f in schema.fields]
        return Counter(
            row_key({name: row.get(field_id) for field_id, name in columns})
            for row in self.rows.values()
            if predicate is None or predicate(row)
        )


@dataclass
class Diff:
    lost: int
    duplicated: int  # a row read more times than it was written
    unexpected: int  # a row the oracle does not have at all: resurrected (deleted) or corrupted

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected)


def diff(expected: Counter[Row], actual: Counter[Row]) -> Diff:
    missing, extra = expected - actual, actual - expected
    duplicated = sum(n for row, n in extra.items() if row in expected)
    return Diff(lost=sum(missing.values()), duplicated=duplicated, unexpected=sum(extra.values()) - duplicated)
