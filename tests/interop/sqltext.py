"""Rows as Spark SQL literals, so a test knows exactly what Java was told to write (the oracle)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any


def literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return f"{value}L" if abs(value) > 2**31 - 1 else str(value)
    if isinstance(value, float):
        return f"CAST({value!r} AS DOUBLE)"
    if isinstance(value, datetime.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, datetime.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise TypeError(f"no SQL literal for {value!r}")


def insert(table: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """INSERT INTO table (columns) VALUES ...: every row has the same keys, in the same order."""
    columns = list(rows[0])
    values = ", ".join("(" + ", ".join(literal(r[c]) for c in columns) + ")" for r in rows)
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES {values}"
