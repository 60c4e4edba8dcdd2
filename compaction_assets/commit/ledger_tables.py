"""The task ledger's tables and their storage: the attempt rows and the per-table lock rows
(SQLAlchemy ORM), the migration of an existing ledger to the current columns, JSON columns that
keep NaN and infinities, and SQLite's pragmas. The ledger's operations are in commit/ledger.py.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from enum import StrEnum
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Engine,
    Integer,
    String,
    Table,
    Text,
    inspect,
    text,
)
from sqlalchemy.exc import DatabaseError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Status(StrEnum):
    EXECUTING = "EXECUTING"
    PREPARED = "PREPARED"
    COMMITTED = "COMMITTED"
    FAILED = "FAILED"
    ROLLED_BACK = "ROLLED_BACK"


OPEN = (Status.EXECUTING, Status.PREPARED)
TABLE_WIDE_KIND = "rewrite-manifests"  # commit.manifest_rewrite.KIND: holds no partition (see Ledger.begin)
KIND_LENGTH = 64  # "convert-equality-deletes" needs 24; ledgers created before it have 16


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class _Base(DeclarativeBase):
    pass


class AttemptRow(_Base):
    __tablename__ = "compaction_attempts"

    attempt_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(255), index=True)
    attempt_number: Mapped[int] = mapped_column(Integer)
    table_name: Mapped[str] = mapped_column(String(512), index=True)
    partition_key: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(KIND_LENGTH))
    status: Mapped[str] = mapped_column(String(16), index=True)
    base_snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    source_files: Mapped[list[str]] = mapped_column(JSON)
    result_files: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    output_dirs: Mapped[list[str]] = mapped_column(JSON)
    rows_in: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_in: Mapped[int] = mapped_column(BigInteger, default=0)
    rows_out: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    bytes_out: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    committed_snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # data files a delete-file rewrite covered (convert-equality-deletes: the files it computed positions for)
    covered_files: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # delete files the commit removed, attributed to this attempt (COMMITTED only)
    removed_deletes: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # rows of rows_in a data expiration dropped on purpose (kind expire; None: none expired)
    rows_expired: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # the table's uuid when the attempt began (recovery leaves an attempt alone on another table of its name)
    table_uuid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # the owner process beyond host and pid (process_identity: PID namespace and start time)
    process: Mapped[str | None] = mapped_column(String(128), nullable=True)


class TableLock(_Base):
    """One row per table, updated first by every claiming `begin`: claims of a table take turns."""

    __tablename__ = "compaction_table_locks"

    table_name: Mapped[str] = mapped_column(String(512), primary_key=True)
    claims: Mapped[int] = mapped_column(BigInteger, default=0)


def _migrate(engine: Engine) -> None:
    """Bring a ledger created by an older version up to this one's columns (see the module doc).
    Safe when several processes open it at once: a column another one just added is skipped."""
    table = cast(Table, AttemptRow.__table__)  # a declarative class's table; typed as a FromClause
    existing = {c["name"]: c for c in inspect(engine).get_columns(table.name)}
    for column in table.columns:
        if column.name in existing:
            continue
        ddl = f"ALTER TABLE {table.name} ADD COLUMN {column.name} {column.type.compile(dialect=engine.dialect)}"
        try:
            with engine.begin() as connection:
                connection.execute(text(ddl))
        except DatabaseError:
            if column.name not in {c["name"] for c in inspect(engine).get_columns(table.name)}:
                raise
    kind = existing.get("kind")
    length = getattr(kind.get("type"), "length", None) if kind is not None else None
    if engine.dialect.name == "postgresql" and length is not None and length < KIND_LENGTH:
        with engine.begin() as connection:
            connection.execute(text(f"ALTER TABLE {table.name} ALTER COLUMN kind TYPE VARCHAR({KIND_LENGTH})"))


_NONFINITE = "$float"  # NaN and +/-Infinity in JSON columns (partition values): {"$float": "NaN"}


def _json_dumps(value: Any) -> str:
    """JSON for the ledger's columns; NaN and +/-Infinity (which PostgreSQL's JSON refuses) tagged."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_tag_nonfinite(value), allow_nan=False)


def _tag_nonfinite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return {_NONFINITE: repr(value).replace("nan", "NaN").replace("inf", "Infinity")}
    if isinstance(value, dict):
        return {k: _tag_nonfinite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_tag_nonfinite(v) for v in value]
    return value


def _json_loads(raw: str) -> Any:
    return json.loads(raw, object_hook=lambda d: float(d[_NONFINITE]) if d.keys() == {_NONFINITE} else d)


def _sqlite_pragmas(dbapi_connection, _record) -> None:  # noqa: ANN001 - DB-API objects
    """WAL lets readers (status, the sensor) run while a commit writes; wait instead of failing."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()
