"""Seeded histories of Iceberg Java committing while the project compacts a table Java writes.

Each history: Java makes a partitioned table of many small appends; then steps, each a compaction
of ours with a Java statement landed at a race point (before our commit's first try, or between
its check and the catalog swap), or a compaction that dies after PREPARED, Java statements, and
recovery. Java's statements: appends, copy-on-write and merge-on-read deletes, dynamic partition
overwrites, an added column, an added partition field, expire_snapshots, rollback_to_snapshot and
set_current_snapshot. The oracle holds the rows of every snapshot the history made, so a rollback
knows what the table must read. After every step Java and pyiceberg read the table, at the end DuckDB.
"""

from __future__ import annotations

import datetime
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from compaction_assets import faults
from compaction_assets.commit.recovery import recover
from tests.interop.conftest import SharedLake
from tests.interop.java import comparable
from tests.interop.sqltext import insert
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.oracle import diff
from tests.lakekit.races import raced

DAY = datetime.datetime(2026, 5, 1)
JAVA_OPS = (
    "append",
    "delete_cow",
    "delete_mor",
    "overwrite",
    "add_column",
    "add_partition_field",
    "expire",
    "rollback",
    "set_current",
)
RACE_AT = ("after_prepare", "in_commit")


@dataclass
class Figures:
    histories: int = 0
    steps: int = 0
    java_commits: int = 0
    our_commits: int = 0
    backed_off: int = 0
    recovered: Counter = field(default_factory=Counter)
    java_ops: Counter = field(default_factory=Counter)
    rows_checked: int = 0
    lost: int = 0
    duplicated: int = 0
    resurrected: int = 0

    def line(self) -> str:
        return (
            f"histories={self.histories} steps={self.steps} java_commits={self.java_commits} "
            f"our_commits={self.our_commits} backed_off={self.backed_off} rows_checked={self.rows_checked} "
            f"lost={self.lost} duplicated={self.duplicated} resurrected={self.resurrected} "
            f"recovery={dict(self.recovered)} java_ops={dict(self.java_ops)}"
        )


class History:
    """One table, one seed: Java's writes mirrored in `rows` (id -> row) and `at` (snapshot -> rows)."""

    def __init__(self, lake: SharedLake, name: str, seed: int, figures: Figures) -> None:
        self.lake, self.name, self.rng, self.figures = lake, name, random.Random(seed), figures
        self.rows: dict[int, dict] = {}
        self.at: dict[int | None, dict[int, dict]] = {}
        self.columns = ["id", "ts", "payload"]
        self.next_id = 0
        self.spec_changed = False
        lake.sql(
            f"CREATE TABLE {{c}}.{name} (id bigint, ts timestamp, payload string) USING iceberg "
            "PARTITIONED BY (days(ts)) TBLPROPERTIES ('format-version'='2', 'compaction.min-input-files'='3', "
            "'compaction.delete-file-threshold'='1', 'commit.retry.num-retries'='2')"
        )
        for _ in range(6):
            self.java("append")

    # ------------------------------------------------------------------ Java's side
    def _snapshot(self) -> int | None:
        snapshot = self.lake.table(self.name).current_snapshot()
        return snapshot.snapshot_id if snapshot else None

    def _record(self) -> None:
        self.at[self._snapshot()] = {i: dict(r) for i, r in self.rows.items()}

    def _batch(self, count: int, days: int = 3) -> list[dict]:
        batch = []
        for i in range(self.next_id, self.next_id + count):
            ts = DAY + datetime.timedelta(days=self.rng.randrange(days), seconds=i)
            row = {"id": i, "ts": ts, "payload": f"p{i}"}
            row.update({c: f"{c}-{i}" for c in self.columns[3:]})
            batch.append(row)
        self.next_id += count
        return batch

    def java(self, op: str) -> None:
        """One Java statement; the oracle follows it (and records the snapshot it made)."""
        t = f"{{c}}.{self.name}"
        short = f"ns.{self.name.split('.', 1)[1]}"
        self.figures.java_ops[op] += 1
        if op == "append":
            batch = self._batch(self.rng.randint(3, 12))
            self.lake.sql(insert(t, batch))
            self.rows.update({r["id"]: r for r in batch})
        elif op in ("delete_cow", "delete_mor"):
            mode = "copy-on-write" if op == "delete_cow" else "merge-on-read"
            self.lake.sql(f"ALTER TABLE {t} SET TBLPROPERTIES ('write.delete.mode'='{mode}')")
            m, k = self.rng.choice([(3, 0), (4, 1), (5, 2), (7, 3)])
            self.lake.sql(f"DELETE FROM {t} WHERE id % {m} = {k}")
            self.rows = {i: r for i, r in self.rows.items() if i % m != k}
        elif op == "overwrite":
            if self.spec_changed:  # dynamic overwrite replaces files of the current spec only
                return self.java("append")
            batch = self._batch(self.rng.randint(2, 6), days=1)  # one day: that day's rows are replaced
            day = batch[0]["ts"].date()
            self.lake.java.sql("SET spark.sql.sources.partitionOverwriteMode=dynamic")
            self.lake.sql(insert(t, batch).replace("INSERT INTO", "INSERT OVERWRITE", 1))
            self.rows = {i: r for i, r in self.rows.items() if r["ts"].date() != day}
            self.rows.update({r["id"]: r for r in batch})
        elif op == "add_column":
            column = f"c{len(self.columns)}"
            self.lake.sql(f"ALTER TABLE {t} ADD COLUMN {column} string")
            self.columns.append(column)
            for snapshot_rows in [self.rows, *self.at.values()]:
                for r in snapshot_rows.values():
                    r.setdefault(column, None)
            return  # a schema change makes no snapshot
        elif op == "add_partition_field":
            if self.spec_changed:
                return self.java("append")
            self.lake.sql(f"ALTER TABLE {t} ADD PARTITION FIELD bucket(2, id)")
            self.spec_changed = True
            return
        elif op == "expire":
            now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(seconds=1)
            self.lake.sql(
                f"CALL {{c}}.system.expire_snapshots(table => '{short}', older_than => TIMESTAMP '{now}', "
                f"retain_last => {self.rng.randint(1, 3)})"
            )
            return
        elif op in ("rollback", "set_current"):
            history = self.lake.sql(f"SELECT snapshot_id, is_current_ancestor FROM {t}.history")
            current = self._snapshot()
            targets = [
                h["snapshot_id"]
                for h in history
                if h["snapshot_id"] != current and (h["is_current_ancestor"] or op == "set_current")
            ]
            alive = {s.snapshot_id for s in self.lake.table(self.name).snapshots()}
            targets = [s for s in targets if s in self.at and s in alive]
            if not targets:
                return self.java("append")
            target = self.rng.choice(targets)
            procedure = "rollback_to_snapshot" if op == "rollback" else "set_current_snapshot"
            self.lake.sql(f"CALL {{c}}.system.{procedure}('{short}', {target})")
            self.rows = {i: dict(r) for i, r in self.at[target].items()}
            self.figures.java_commits += 1
            return
        self.figures.java_commits += 1
        self._record()

    # ------------------------------------------------------------------ our side
    def _ours_landed(self, before: int | None) -> None:
        """Snapshots we committed since `before` (ours change no row): the oracle records them."""
        table = self.lake.table(self.name)
        for s in table.snapshots():
            if s.snapshot_id not in self.at and "compaction.task-id" in s.summary.additional_properties:
                parent = self.at.get(s.parent_snapshot_id)
                if parent is not None:
                    self.at[s.snapshot_id] = {i: dict(r) for i, r in parent.items()}

    def compact(self, at: str | None, op: str | None) -> None:
        before = self._snapshot()
        if at is None:
            out = self.lake.engine.compact(self.name)
        else:
            with raced(at, lambda: self.java(op)):
                out = self.lake.engine.compact(self.name)
        self.figures.our_commits += sum(o.status == "committed" for o in out)
        self.figures.backed_off += sum(o.status == "backed_off" for o in out)
        self._ours_landed(before)

    def crash_then_recover(self, ops: list[str]) -> None:
        faults.arm("after_prepare")
        try:
            self.lake.engine.compact(self.name)
        except faults.InjectedCrash:
            pass
        finally:
            faults.disarm()
        for op in ops:
            self.java(op)
        report = recover(self.lake.engine.catalog, self.lake.engine.ledger, 0)
        assert not report.errors, report.errors
        for kind in ("recommitted", "rolled_back", "confirmed", "abandoned"):
            self.figures.recovered[kind] += len(getattr(report, kind))
        self.figures.our_commits += len(report.recommitted)
        self._ours_landed(None)

    def step(self) -> None:
        self.figures.steps += 1
        choice = self.rng.random()
        if choice < 0.2:
            self.java("append")
            self.compact(None, None)
        elif choice < 0.8:
            for _ in range(self.rng.randint(0, 2)):
                self.java("append")
            self.compact(self.rng.choice(RACE_AT), self.rng.choice(JAVA_OPS))
        else:
            self.java("append")
            self.crash_then_recover([self.rng.choice(JAVA_OPS) for _ in range(self.rng.randint(1, 2))])
        self.check(duckdb=False)

    # ------------------------------------------------------------------ the check
    def expected(self) -> Counter:
        return Counter(comparable({c: r.get(c) for c in self.columns}) for r in self.rows.values())

    def check(self, duckdb: bool) -> None:
        expected = self.expected()
        readers = {"java": self.lake.java_multiset(self.name), "pyiceberg": self.lake.ours_multiset(self.name)}
        if duckdb:
            readers["duckdb"] = Counter(comparable(r) for r in duckdb_rows(self.lake.table(self.name)))
        for reader, actual in readers.items():
            d = diff(expected, actual)
            self.figures.rows_checked += sum(actual.values())
            self.figures.lost += d.lost
            self.figures.duplicated += d.duplicated
            self.figures.resurrected += d.unexpected
            assert d.ok, f"{reader}: {d} after step {self.figures.steps} ({self.figures.line()})"


def run(lake: SharedLake, seeds: range, steps: int, deadline: float | None = None) -> Figures:
    """Histories for `seeds` (each `steps` long), or until `deadline` (time.monotonic())."""
    figures = Figures()
    for seed in seeds:
        if deadline is not None and time.monotonic() > deadline:
            break
        history = History(lake, f"ns.race_{seed}", seed, figures)
        figures.histories += 1
        for _ in range(steps):
            history.step()
        history.check(duckdb=True)
    return figures
