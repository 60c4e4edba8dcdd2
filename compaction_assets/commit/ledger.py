"""The task ledger: one row per task attempt, in any SQL database SQLAlchemy reaches.

Lifecycle: EXECUTING -> PREPARED -> COMMITTED, or FAILED / ROLLED_BACK with a reason. Every
transition is a conditional UPDATE on the expected status, so a report from a stale attempt
(superseded by a newer attempt of its task, or already ended) is rejected, never applied.

An existing ledger is migrated when opened: columns added since it was created are added
(nullable, so older rows read as "not recorded"), and `kind` is widened where the database
enforces a length (PostgreSQL).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    CursorResult,
    create_engine,
    event,
    func,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from compaction_assets.commit.ledger_tables import (
    OPEN,
    TABLE_WIDE_KIND,
    AttemptRow,
    Status,
    TableLock,
    _Base,
    _json_dumps,
    _json_loads,
    _migrate,
    _now,
    _sqlite_pragmas,
)
from compaction_assets.commit.process_identity import process_identity
from compaction_assets.errors import CompactionError
from compaction_assets.lake.storage import Claims
from compaction_assets.redact import redact


@dataclass(frozen=True)
class Attempt:
    """A detached copy of a ledger row."""

    attempt_id: str
    task_id: str
    attempt_number: int
    table_name: str
    partition_key: str
    kind: str
    status: Status
    base_snapshot_id: int | None
    source_files: list[str]
    result_files: list[dict[str, Any]]
    output_dirs: list[str]
    rows_in: int
    bytes_in: int
    rows_out: int | None
    bytes_out: int | None
    committed_snapshot_id: int | None
    reason: str | None
    host: str
    pid: int
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    covered_files: list[str] | None  # None: not recorded (see AttemptRow)
    removed_deletes: list[str]
    rows_expired: int | None = None  # see AttemptRow
    table_uuid: str | None = None  # see AttemptRow
    process: str | None = None  # see AttemptRow

    @classmethod
    def _from_row(cls, row: AttemptRow) -> Attempt:
        values = {name: getattr(row, name) for name in cls.__dataclass_fields__}
        for name in ("created_at", "updated_at", "finished_at"):  # SQLite drops the zone
            if values[name] is not None and values[name].tzinfo is None:
                values[name] = values[name].replace(tzinfo=dt.UTC)
        return cls(**{**values, "status": Status(row.status), "removed_deletes": row.removed_deletes or []})


class StaleAttempt(CompactionError):
    """A report from an attempt that is not in the state the transition needs (stale or ended)."""

    def __init__(self, attempt_id: str, expected: Iterable[Status], actual: str | None, why: str = "") -> None:
        self.actual = actual
        expected_s = "/".join(expected)
        super().__init__(f"attempt {attempt_id}: expected {expected_s}, found {actual or 'no such attempt'}{why}")


class Claimed(CompactionError):
    """A claiming `begin` found the partition held by another open attempt."""

    def __init__(self, holder: Attempt) -> None:
        self.holder = holder
        super().__init__(f"held by attempt {holder.attempt_id} ({holder.status}) of {holder.table_name}")


class Ledger:
    """Task attempts and their transitions, in the database at `uri` (created if missing)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._locked_tables: set[str] = set()  # tables whose compaction_table_locks row exists
        is_sqlite = uri.startswith("sqlite")
        self._engine = create_engine(
            uri,
            connect_args={"timeout": 30} if is_sqlite else {},
            json_serializer=_json_dumps,
            json_deserializer=_json_loads,
        )
        if is_sqlite:
            event.listen(self._engine, "connect", _sqlite_pragmas)
        _Base.metadata.create_all(self._engine)
        _migrate(self._engine)

    def dispose(self) -> None:
        self._engine.dispose()

    def begin(
        self,
        task_id: str,
        table_name: str,
        partition_key: str,
        kind: str,
        base_snapshot_id: int | None,
        source_files: list[str],
        output_dirs: list[str],
        rows_in: int,
        bytes_in: int,
        covered_files: list[str] | None = None,
        claim: bool = False,
        table_uuid: str | None = None,
    ) -> Attempt:
        """Record a new EXECUTING attempt of `task_id` (attempt numbers count up per task).

        `claim`: only if no other open attempt of the table holds the partition (any kind but a
        manifest rewrite), else raise Claimed naming it. An attempt's sources are files of its own
        partition (partition keys are injective), so this also keeps two attempts off one file; the
        commit's checks (sources still live) are what keeps rows right either way. Race-free across
        processes and hosts: the check and the insert run in one transaction that first updates
        the table's row in compaction_table_locks (a row lock in PostgreSQL, the write lock in
        SQLite), so two claims of one table take turns and the second sees the first's attempt.

        `source_files` are the files it replaces (data or delete files); `covered_files`, for an
        attempt that replaces equality deletes, the data files whose rows it accounted for (the
        commit refuses it if a replaced equality delete applies to any other live data file).
        A task id may not contain a comma: a snapshot that commits several attempts lists their
        task ids comma-separated in its `compaction.task-id` summary property."""
        if "," in task_id:
            raise CompactionError(f"task id {task_id!r} contains a comma (reserved as the separator of task ids)")
        if claim:
            self._ensure_lock_row(table_name)
        with Session(self._engine) as session, session.begin():
            if claim:
                session.execute(
                    update(TableLock).where(TableLock.table_name == table_name).values(claims=TableLock.claims + 1)
                )
                if holder := _holder(session, table_name, partition_key):
                    raise Claimed(holder)
            last = session.scalar(select(func.max(AttemptRow.attempt_number)).where(AttemptRow.task_id == task_id))
            now = _now()
            row = AttemptRow(
                attempt_id=uuid.uuid4().hex,
                task_id=task_id,
                attempt_number=(last or 0) + 1,
                table_name=table_name,
                partition_key=partition_key,
                kind=kind,
                status=Status.EXECUTING,
                base_snapshot_id=base_snapshot_id,
                source_files=source_files,
                result_files=[],
                output_dirs=output_dirs,
                rows_in=rows_in,
                bytes_in=bytes_in,
                covered_files=covered_files,
                host=socket.gethostname(),
                pid=os.getpid(),
                process=process_identity(),
                table_uuid=table_uuid,
                created_at=now,
                updated_at=now,
            )
            session.add(row)
            session.flush()
            return Attempt._from_row(row)

    def _ensure_lock_row(self, table_name: str) -> None:
        if table_name in self._locked_tables:
            return
        with Session(self._engine) as session:
            if session.get(TableLock, table_name) is None:
                session.add(TableLock(table_name=table_name, claims=0))
                try:
                    session.commit()
                except IntegrityError:  # another process added it first
                    session.rollback()
        self._locked_tables.add(table_name)

    def prepare(
        self,
        attempt_id: str,
        result_files: list[dict[str, Any]],
        rows_out: int,
        bytes_out: int,
        covered_files: list[str] | None = None,
        rows_expired: int | None = None,
    ) -> Attempt:
        """EXECUTING -> PREPARED with the exact result files (and, if given, the data files the
        attempt covered, when only its run knows them: see `begin`; for a data expiration, the rows
        it dropped on purpose: rows_out = rows_in - rows deleted - rows_expired); only for the
        task's latest attempt."""
        with Session(self._engine) as session, session.begin():
            row = session.get(AttemptRow, attempt_id)
            if row is not None and row.status == Status.EXECUTING:
                latest = session.scalar(
                    select(func.max(AttemptRow.attempt_number)).where(AttemptRow.task_id == row.task_id)
                )
                if latest != row.attempt_number:
                    raise StaleAttempt(
                        attempt_id, [Status.EXECUTING], row.status, f" (superseded by attempt {latest} of its task)"
                    )
        return self._transition(
            attempt_id,
            [Status.EXECUTING],
            Status.PREPARED,
            result_files=result_files,
            rows_out=rows_out,
            bytes_out=bytes_out,
            **({} if covered_files is None else {"covered_files": covered_files}),
            **({} if rows_expired is None else {"rows_expired": rows_expired}),
        )

    def mark_committed(
        self, attempt_id: str, snapshot_id: int | None, removed_deletes: list[str] | None = None
    ) -> Attempt:
        """PREPARED -> COMMITTED, with the snapshot that committed it (None: not known any more)
        and the delete files that snapshot removed on this attempt's account."""
        return self._transition(
            attempt_id,
            [Status.PREPARED],
            Status.COMMITTED,
            committed_snapshot_id=snapshot_id,
            removed_deletes=removed_deletes or [],
        )

    def mark_failed(self, attempt_id: str, reason: str) -> Attempt:
        return self._transition(attempt_id, [Status.EXECUTING], Status.FAILED, reason=redact(reason))

    def mark_rolled_back(self, attempt_id: str, reason: str) -> Attempt:
        return self._transition(attempt_id, list(OPEN), Status.ROLLED_BACK, reason=redact(reason))

    def park(self, attempt_id: str, reason: str) -> Attempt:
        """An open attempt recovery cannot finish: FAILED with the reason, its files left as they are."""
        return self._transition(attempt_id, list(OPEN), Status.FAILED, reason=redact(f"parked: {reason}"))

    def note_recovery_failure(self, attempt_id: str, error: str) -> int:
        """Record on an open attempt that recovering it failed; returns how many times it has so far."""
        attempt = self.get(attempt_id)
        match = _FAILURES.match(attempt.reason or "") if attempt else None
        count = (int(match.group(1)) if match else 0) + 1
        with Session(self._engine) as session, session.begin():
            session.execute(
                update(AttemptRow)
                .where(AttemptRow.attempt_id == attempt_id, AttemptRow.status.in_([str(s) for s in OPEN]))
                .values(reason=redact(f"recovery failed {count}x: {error}"))
            )
        return count

    def heartbeat(self, attempt_ids: list[str]) -> None:
        """Mark open attempts as alive (recovery treats a long-silent open attempt as dead)."""
        if not attempt_ids:
            return
        with Session(self._engine) as session, session.begin():
            session.execute(
                update(AttemptRow)
                .where(AttemptRow.attempt_id.in_(attempt_ids), AttemptRow.status.in_([str(s) for s in OPEN]))
                .values(updated_at=_now())
            )

    def get(self, attempt_id: str) -> Attempt | None:
        with Session(self._engine) as session:
            row = session.get(AttemptRow, attempt_id)
            return Attempt._from_row(row) if row else None

    def attempts(
        self,
        *,
        statuses: Iterable[Status] | None = None,
        table_name: str | None = None,
        task_id: str | None = None,
        task_ids: Iterable[str] | None = None,
    ) -> list[Attempt]:
        if task_ids is not None:  # in chunks: a bound parameter per id, and databases cap those
            ids = sorted(set(task_ids))
            chunks = [ids[i : i + 500] for i in range(0, len(ids), 500)]
            found = [a for c in chunks for a in self._attempts(statuses, table_name, task_id, c)]
            return sorted(found, key=lambda a: (a.created_at, a.attempt_id))
        return self._attempts(statuses, table_name, task_id, None)

    def _attempts(
        self,
        statuses: Iterable[Status] | None,
        table_name: str | None,
        task_id: str | None,
        task_ids: list[str] | None,
    ) -> list[Attempt]:
        query = select(AttemptRow).order_by(AttemptRow.created_at, AttemptRow.attempt_id)
        if task_ids is not None:
            query = query.where(AttemptRow.task_id.in_(task_ids))
        if statuses is not None:
            query = query.where(AttemptRow.status.in_([str(s) for s in statuses]))
        if table_name is not None:
            query = query.where(AttemptRow.table_name == table_name)
        if task_id is not None:
            query = query.where(AttemptRow.task_id == task_id)
        with Session(self._engine) as session:
            return [Attempt._from_row(r) for r in session.scalars(query)]

    def in_flight_sources(self, table_name: str) -> set[str]:
        """Source files of the table's open attempts: the planner must not schedule them again."""
        return {p for a in self.attempts(statuses=OPEN, table_name=table_name) for p in a.source_files}

    def last_committed(self, table_name: str, kind: str) -> dict[str, dt.datetime]:
        """When each partition of the table (by key) last had an attempt of `kind` committed."""
        query = (
            select(AttemptRow.partition_key, func.max(AttemptRow.finished_at))
            .where(
                AttemptRow.table_name == table_name,
                AttemptRow.kind == kind,
                AttemptRow.status == str(Status.COMMITTED),
            )
            .group_by(AttemptRow.partition_key)
        )
        with Session(self._engine) as session:
            rows = session.execute(query).all()
        return {key: at if at.tzinfo else at.replace(tzinfo=dt.UTC) for key, at in rows if at is not None}

    def last_outputs(self, table_name: str, kind: str) -> set[str]:
        """Data files written by the last COMMITTED attempt of `kind` on each partition of the table
        (the planner leaves a partition alone that holds only these: planning/planner.py, cluster)."""
        query = (
            select(AttemptRow.partition_key, AttemptRow.result_files)
            .where(AttemptRow.table_name == table_name, AttemptRow.kind == kind)
            .where(AttemptRow.status == str(Status.COMMITTED))
            .order_by(AttemptRow.finished_at, AttemptRow.attempt_id)
        )
        with Session(self._engine) as session:
            last = {key: files for key, files in session.execute(query)}
        return {d["file_path"] for files in last.values() for d in files or ()}

    def open_claims(self, table_name: str) -> Claims:
        """The files the table's open attempts own (sources, results, and names they write under),
        and when the oldest of them began."""
        attempts = self.attempts(statuses=OPEN, table_name=table_name)
        paths = {p for a in attempts for p in a.source_files}
        paths |= {d["file_path"] for a in attempts for d in a.result_files}
        oldest = min((int(a.created_at.timestamp() * 1000) for a in attempts), default=None)
        return Claims(frozenset(paths), tuple(a.attempt_id for a in attempts), oldest)

    def counts(self) -> dict[str, int]:
        with Session(self._engine) as session:
            rows = session.execute(select(AttemptRow.status, func.count()).group_by(AttemptRow.status))
            return {status: n for status, n in rows}

    def _transition(self, attempt_id: str, expected: list[Status], new: Status, **values: Any) -> Attempt:
        now = _now()
        finished = {"finished_at": now} if new not in OPEN else {}
        with Session(self._engine) as session, session.begin():
            # an UPDATE's result is a CursorResult (it has rowcount); Session.execute is typed Result
            result = cast(
                "CursorResult[Any]",
                session.execute(
                    update(AttemptRow)
                    .where(AttemptRow.attempt_id == attempt_id, AttemptRow.status.in_([str(s) for s in expected]))
                    .values(status=str(new), updated_at=now, **finished, **values)
                ),
            )
            row = session.get(AttemptRow, attempt_id)
            if result.rowcount != 1 or row is None:  # the row updated exists: rowcount 1 means found
                raise StaleAttempt(attempt_id, expected, row.status if row else None)
            session.refresh(row)
            return Attempt._from_row(row)


def _holder(session: Session, table_name: str, partition_key: str) -> Attempt | None:
    """The first open attempt of the table on the partition (a manifest rewrite holds none)."""
    query = (
        select(AttemptRow)
        .where(
            AttemptRow.table_name == table_name,
            AttemptRow.status.in_([str(s) for s in OPEN]),
            AttemptRow.partition_key == partition_key,
            AttemptRow.kind != TABLE_WIDE_KIND,
        )
        .order_by(AttemptRow.created_at, AttemptRow.attempt_id)
        .limit(1)
    )
    row = session.scalars(query).first()
    return Attempt._from_row(row) if row is not None else None


_FAILURES = re.compile(r"^recovery failed (\d+)x: ")
