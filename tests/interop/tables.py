"""Tables Iceberg Java writes for the interop tests: a writer mirrored in an oracle, the table
properties that plan each tier, and our compaction checked to commit what was planned."""

from __future__ import annotations

import datetime
from collections import Counter

from compaction_assets.planning.planner import Kind
from tests.interop.conftest import SharedLake
from tests.interop.java import multiset
from tests.interop.sqltext import insert

DAY = datetime.datetime(2026, 3, 1)


def rows(start: int, count: int, days: int = 2) -> list[dict]:
    return [
        {
            "id": i,
            "ts": DAY + datetime.timedelta(days=i % days, minutes=i),
            "payload": f"p{i:06d}-{(i * 2654435761) % 2**32:010d}",
            "amount": i * 0.5,
        }
        for i in range(start, start + count)
    ]


class Writer:
    """Java's writes to one table, mirrored in the oracle (id -> row as the current schema names it)."""

    def __init__(self, lake: SharedLake, name: str) -> None:
        self.lake, self.name, self.oracle = lake, name, {}
        self.next_id = 0

    def append(self, count: int, **extra) -> None:
        batch = [{**r, **extra} for r in rows(self.next_id, count)]
        self.next_id += count
        self.lake.sql(insert(f"{{c}}.{self.name}", batch))
        self.oracle.update({r["id"]: r for r in batch})

    def sql(self, statement: str) -> None:
        self.lake.sql(statement.replace("{t}", f"{{c}}.{self.name}"))

    def expected(self) -> Counter:
        return multiset(list(self.oracle.values()))


def compact(lake: SharedLake, name: str, kinds: set[Kind]) -> list:
    """Compact; every partition planned `kinds` commits, at least one does."""
    out = lake.engine.compact(name)
    done = [o for o in out if o.status == "committed"]
    planned = {o.kind for o in done}
    sizes = [f["file_size_in_bytes"] for f in lake.table(name).inspect.files().to_pylist()]
    assert done and planned <= kinds, ([(o.partition_key, o.kind, o.status, o.reason[:200]) for o in out], sizes)
    return done


def create(lake: SharedLake, name: str, partitioned_by: str, properties: dict[str, str] | None = None) -> Writer:
    props = {"format-version": "2", **(properties or {})}
    tbl = ", ".join(f"'{k}'='{v}'" for k, v in props.items())
    lake.sql(
        f"CREATE TABLE {{c}}.{name} (id bigint, ts timestamp, payload string, amount double) USING iceberg "
        f"{f'PARTITIONED BY ({partitioned_by})' if partitioned_by else ''} TBLPROPERTIES ({tbl})"
    )
    return Writer(lake, name)


MOR = {"write.delete.mode": "merge-on-read", "write.update.mode": "merge-on-read", "write.merge.mode": "merge-on-read"}


DELETE_TIER = {
    "compaction.delete-file-threshold": "100",
    "compaction.delete-ratio-threshold": "0.99",
    "compaction.min-input-files": "100",
}


def seed_for(w: Writer, kind: Kind, appends: int) -> None:
    """The files that make `kind` the rewrite planned: one file well above the split threshold
    (split), files of healthy size whose `amount` ranges all overlap under WRITE ORDERED BY amount
    (cluster), else `appends` small appends."""
    if kind == Kind.SPLIT:
        w.append(400)
    elif kind == Kind.CLUSTER:
        w.sql("ALTER TABLE {t} WRITE ORDERED BY amount")
        for _ in range(4):
            batch = rows(w.next_id, 200)
            for r in batch:
                r["amount"] = float((r["id"] * 7919) % 1000)
            w.next_id += 200
            w.lake.sql(insert(f"{{c}}.{w.name}", batch))
            w.oracle.update({r["id"]: r for r in batch})
    else:
        for _ in range(appends):
            w.append(40)


LINEAGE = "id, _row_id, _last_updated_sequence_number"


def create_v3(lake: SharedLake, name: str, partitioned_by: str, properties: dict[str, str] | None = None) -> Writer:
    props = {"format-version": "3", **MOR, **(properties or {})}
    tbl = ", ".join(f"'{k}'='{v}'" for k, v in props.items())
    lake.sql(
        f"CREATE TABLE {{c}}.{name} (id bigint, ts timestamp, payload string, amount double) USING iceberg "
        f"{f'PARTITIONED BY ({partitioned_by})' if partitioned_by else ''} TBLPROPERTIES ({tbl})"
    )
    return Writer(lake, name)


def lineage(lake: SharedLake, name: str) -> dict[int, tuple[int, int]]:
    """id -> (_row_id, _last_updated_sequence_number) as Java reads them."""
    rows = lake.sql(f"SELECT {LINEAGE} FROM {{c}}.{name}")
    found = {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in rows}
    assert len(found) == len(rows), "ids are unique in these tables"
    return found
