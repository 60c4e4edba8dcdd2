"""Tables whose rows carry times on each side of a retention cutoff, the engine's clock fixed at
NOW (the `clocked` fixture in tests/conftest.py), and reads to compare them by."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import DateType, IntegerType, LongType, NestedField, StringType, TimestampType, TimestamptzType

from compaction_assets.lake.appends import append_fragments
from tests.conftest import BY_REGION, Lake
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.oracle import row_key

NOW = datetime(2024, 6, 1, tzinfo=UTC)


NOW_MS = int(NOW.timestamp() * 1000)


DAY = timedelta(days=1)


CUTOFF = NOW - DAY  # retention one day


OLD, NEW = CUTOFF - timedelta(hours=5), CUTOFF + timedelta(hours=5)


EXPIRE = {"compaction.expire.field": "ts", "compaction.expire.retention-ms": str(DAY // timedelta(milliseconds=1))}


SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "ts", TimestamptzType(), required=False),
    NestedField(4, "ts_local", TimestampType(), required=False),
    NestedField(5, "day", DateType(), required=False),
    NestedField(6, "ms", LongType(), required=False),
    NestedField(7, "ms_int", IntegerType(), required=False),
)


ARROW = SCHEMA.as_arrow()


class Writer:
    """Appends files whose `ts` values are given; the other time columns carry the same instant
    (ms_int: in milliseconds since the cutoff's midnight, so that it fits an int; NULL where it does not)."""

    def __init__(self) -> None:
        self.next_id = 0
        self.rows: list[dict] = []

    def files(self, region: str, *files: Sequence[datetime | None]) -> list[pa.Table]:
        out = []
        for values in files:
            rows = [self._row(region, ts) for ts in values]
            self.rows += rows
            out.append(pa.Table.from_pylist(rows, schema=ARROW))
        return out

    def _row(self, region: str, ts: datetime | None) -> dict:
        self.next_id += 1
        base = datetime(CUTOFF.year, CUTOFF.month, CUTOFF.day, tzinfo=UTC)
        ms_int = int((ts - base).total_seconds() * 1000) if ts else None
        return {
            "id": self.next_id,
            "region": region,
            "ts": ts,
            "ts_local": ts.replace(tzinfo=None) if ts else None,
            "day": ts.date() if ts else None,
            "ms": int(ts.timestamp() * 1000) if ts else None,
            "ms_int": ms_int if ms_int is not None and abs(ms_int) < 2**31 else None,
        }

    def kept(self, column: str = "ts", cutoff: object = CUTOFF) -> Counter:
        return Counter(row_key(r) for r in self.rows if r[column] is None or r[column] >= cutoff)


def make_table(lake: Lake, writer: Writer, layout: dict[str, list[Sequence[datetime | None]]], **props: str) -> Table:
    table = lake.catalog.create_table("ns.ev", schema=SCHEMA, partition_spec=BY_REGION, properties=props or EXPIRE)
    append_fragments(table, [t for region, files in layout.items() for t in writer.files(region, *files)])
    return lake.table("ns.ev")


def read(table: Table) -> Counter:
    return Counter(row_key(r) for r in table.scan().to_arrow().to_pylist())


def read_duckdb(table: Table) -> Counter:
    return Counter(row_key(r) for r in duckdb_rows(table))


MIXED = {
    "old": [[OLD, OLD - DAY], [OLD - 2 * DAY], [OLD, OLD]],  # every row past retention
    "mixed": [
        [OLD - DAY, OLD],  # dropped unread
        [OLD, NEW, OLD - DAY, NEW + DAY],  # straddles the cutoff: rewritten
        [NEW, NEW + DAY],  # kept
        [OLD, None, OLD],  # all old but a NULL: rewritten, the NULL kept
    ],
    "new": [[NEW], [NEW + DAY]],
}
