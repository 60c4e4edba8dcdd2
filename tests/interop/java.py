"""The test side of Apache Iceberg Java: the bench's server (compaction_tools/bench/iceberg_java.py)
with its values turned back into the types pyiceberg's reader gives.

`setup_java.sh` installs that venv (pyspark 3.5.9, Iceberg 1.10.2's Spark runtime, JDBC drivers);
`.ci/run` calls it. One Java process serves a whole test run (it starts in 20-40 s); each test
registers a catalog of its own name on it, over a PostgreSQL schema of its own, that pyiceberg
(and so the project) opens as a SqlCatalog of the same name: both sides see one catalog.
"""

from __future__ import annotations

import datetime
import decimal
from collections import Counter
from typing import Any

from compaction_tools.bench import iceberg_java
from compaction_tools.bench.iceberg_java import JavaError, unavailable
from tests.lakekit.oracle import Row, row_key

__all__ = ["JavaError", "JavaIceberg", "unavailable", "from_java", "comparable", "multiset"]


class JavaIceberg(iceberg_java.JavaIceberg):
    """The bench's Iceberg Java session; `sql` answers in Python values."""

    def sql(self, statement: str) -> list[dict[str, Any]]:
        rows, _ = self.sql_timed(statement)
        return [{k: from_java(v) for k, v in row.items()} for row in rows]


def from_java(value: Any) -> Any:
    """A value as `java_server.plain` sent it, back in the types pyiceberg's reader gives."""
    if isinstance(value, list):
        return [from_java(v) for v in value]
    if not isinstance(value, dict):
        return value
    ((kind, body),) = value.items()
    if kind == "ts":
        return datetime.datetime.fromisoformat(body)
    if kind == "date":
        return datetime.date.fromisoformat(body)
    if kind == "decimal":
        return decimal.Decimal(body)
    if kind == "binary":
        return bytes.fromhex(body)
    if kind == "float":
        return float(body)
    if kind == "struct":
        return {k: from_java(v) for k, v in body.items()}
    if kind == "map":
        return {from_java(k): from_java(v) for k, v in body}
    raise ValueError(f"unknown value from Java: {value}")


def comparable(row: dict[str, Any]) -> Row:
    """One row as both readers can agree on it: timestamps as naive UTC, NaN as a marker."""
    return row_key({k: _comparable(v) for k, v in row.items()})


def _comparable(value: Any) -> Any:
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.UTC).replace(tzinfo=None)
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def multiset(rows: list[dict[str, Any]]) -> Counter[Row]:
    return Counter(comparable(r) for r in rows)
