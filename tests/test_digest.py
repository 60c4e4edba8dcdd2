"""The row-multiset digest the bench and the tests compare contenders' tables by."""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest

from compaction_assets.lake.digest import batches_digest

ROWS = [
    {
        "id": 1,
        "name": "a",
        "at": datetime.datetime(2026, 1, 1, 12),
        "price": decimal.Decimal("1.50"),
        "tags": ["x", "y"],
        "point": {"x": 1.0, "y": None},
        "attrs": [("k", 1)],
        "day": datetime.date(2026, 1, 1),
    },
    {"id": 2, "name": None, "at": None, "price": None, "tags": None, "point": None, "attrs": None, "day": None},
    {"id": 2, "name": None, "at": None, "price": None, "tags": None, "point": None, "attrs": None, "day": None},
    {
        "id": 3,
        "name": "",
        "at": datetime.datetime(2026, 1, 2),
        "price": decimal.Decimal("-2.00"),
        "tags": [],
        "point": {"x": None, "y": 2.0},
        "attrs": [],
        "day": datetime.date(2026, 1, 2),
    },
]
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("at", pa.timestamp("us")),
        ("price", pa.decimal128(9, 2)),
        ("tags", pa.list_(pa.string())),
        ("point", pa.struct([("x", pa.float64()), ("y", pa.float64())])),
        ("attrs", pa.map_(pa.string(), pa.int32())),
        ("day", pa.date32()),
    ]
)
# the same values as another engine may type them
OTHER_TYPES = pa.schema(
    [
        ("day", pa.date32()),
        ("id", pa.int32()),
        ("name", pa.large_string()),
        ("at", pa.timestamp("ns")),
        ("price", pa.decimal128(9, 2)),
        ("tags", pa.large_list(pa.large_string())),
        ("point", pa.struct([("x", pa.float64()), ("y", pa.float64())])),
        ("attrs", pa.map_(pa.string(), pa.int32())),
    ]
)


def digest(rows: list[dict], schema: pa.Schema = SCHEMA, batch_rows: int = 10) -> object:
    table = pa.Table.from_pylist(rows, schema=schema)
    return batches_digest(table.to_batches(max_chunksize=batch_rows))


def test_the_same_rows_in_any_order_batching_column_order_or_typing_have_one_digest() -> None:
    expected = digest(ROWS)
    assert expected.rows == 4
    assert digest(list(reversed(ROWS)), batch_rows=1) == expected
    assert digest(ROWS, OTHER_TYPES, batch_rows=3) == expected
    table = pa.Table.from_pylist(ROWS, schema=SCHEMA)
    encoded = table.set_column(1, "name", table.column("name").dictionary_encode())
    assert batches_digest(encoded.to_batches()) == expected


@pytest.mark.parametrize(
    "change",
    [
        lambda rows: rows[:3],  # a row lost
        lambda rows: [*rows, rows[0]],  # a row duplicated
        lambda rows: [rows[0], rows[1], rows[3], rows[3]],  # one duplicate for another
        lambda rows: [{**rows[0], "name": "b"}, *rows[1:]],  # a value changed
        lambda rows: [*rows[:3], {**rows[3], "name": None}],  # empty string -> null
        lambda rows: [{**rows[0], "tags": ["y", "x"]}, *rows[1:]],  # list order
        lambda rows: [{**rows[0], "point": {"x": None, "y": 1.0}}, *rows[1:]],  # values moved between fields
        lambda rows: [{**rows[0], "id": 3}, *rows[1:3], {**rows[3], "id": 1}],  # values moved between rows
    ],
)
def test_any_change_to_the_multiset_changes_the_digest(change) -> None:  # noqa: ANN001
    assert digest(change([dict(r) for r in ROWS])) != digest(ROWS)
