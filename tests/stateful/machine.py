"""A model-based test of one real table: random histories of other engines' writes, deletes, expiry,
schema and spec changes, and our compaction (crashing, raced) and GC, against an oracle of the rows
every writer was told were committed.

The table's columns include a decimal, a timestamptz, a list and a struct (issue 19), so every
rewrite path (Polars, the bulk Arrow scan, per-file projection) carries typed and nested values
past the oracle; the figures count which path each commit took.

Real everything: a pyiceberg SQL catalog and task ledger in SQLite files, real Parquet and delete
files, the project's Engine on a real local Spark session. Readers: a spec-literal reader always,
DuckDB's Iceberg scan and pyiceberg (with partition and data-column filters) while the table has no
equality deletes (pyiceberg refuses them, DuckDB 1.4.4 mis-reads some: tests/test_lakekit.py).
Recovery runs as the recovery job does, with a 0 s timeout so this process's attempts count as dead.

Another engine may set main back to an earlier snapshot still in the metadata (rollback_to_snapshot,
set_current_snapshot), between our plan and commit (the race hooks) or between a crash and recovery:
the oracle then goes back to the rows that snapshot held when it was current (recorded at each check
of the rows). GC (grace 0) may run inside our commit, between its manifests and the pointer swap.

Data expiration (issue 20) is the one change of ours that removes rows: a rule turns it on (on the
`at` timestamptz or on `id` read as epoch millis, with a cutoff inside the rows written so far, the
engine's clock fixed at NOW) or off. When an expire snapshot lands (committed, or recommitted by
recovery), the oracle drops exactly the rows of that attempt's source files whose field was below
the cutoff in force when it was planned: rows appended meanwhile, NULLs and other files stay.

Storage: the warehouse is a local folder, or (STATEFUL_STORAGE=s3, with `TableHistory.s3` set by the
test) a fresh prefix per history on the local S3 server (compaction_tools/local_s3.py), reached
through the catalog's s3.* properties by pyiceberg, the Spark workers' FileIO and DuckDB's httpfs.
On S3, add_files writes its file through the table's FileIO and registers it as `s3://` or `s3a://`
(the local path spellings have no meaning there).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pyiceberg.expressions import EqualTo, IsNull
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, IdentityTransform, TruncateTransform, VoidTransform
from pyiceberg.types import (
    DecimalType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from compaction_assets import faults
from compaction_assets.commit.ledger import OPEN, Status
from compaction_assets.commit.recovery import recover as recover_attempts
from compaction_assets.commit.two_phase import commit_snapshot
from compaction_assets.config import load_config
from compaction_assets.engine import Engine
from compaction_assets.errors import CompactionError
from compaction_assets.lake.files import live_files
from compaction_assets.lake.manifest_cache import live_entries
from compaction_assets.lake.partition_key import render_partition
from compaction_tools.demo import append_fragments
from compaction_tools.local_s3 import LocalS3
from tests.conftest import write_config
from tests.lakekit.deletes import (
    commit_delete_files,
    equality_delete_file,
    position_delete_file,
    position_delete_rows,
    read_column,
)
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.oracle import Diff, Oracle, diff, row_key
from tests.lakekit.races import raced
from tests.lakekit.spec_reader import spec_rows

TABLE = "ns.t"
ID, REGION, CAT, PAYLOAD, AMOUNT, AT, TAGS, POINT = 1, 2, 3, 4, 5, 6, 7, 8
# typed and nested columns (issue 19): every rewrite path must carry decimals, timestamptz, lists
# and structs with their field ids; ids 9-11 are their children, added columns come after
LAST_BASE_ID = 11
SCHEMA = Schema(
    NestedField(ID, "id", LongType(), required=False),
    NestedField(REGION, "region", StringType(), required=False),
    NestedField(CAT, "cat", IntegerType(), required=False),
    NestedField(PAYLOAD, "payload", StringType(), required=False),
    NestedField(AMOUNT, "amount", DecimalType(18, 2), required=False),
    NestedField(AT, "at", TimestamptzType(), required=False),
    NestedField(TAGS, "tags", ListType(9, StringType(), element_required=False), required=False),
    NestedField(
        POINT,
        "point",
        StructType(
            NestedField(10, "x", IntegerType(), required=False), NestedField(11, "label", StringType(), required=False)
        ),
        required=False,
    ),
)
EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
EPOCH_MS = int(EPOCH.timestamp() * 1000)
NOW_MS = EPOCH_MS + 365 * 86_400_000  # the engine's clock: data expiration's cutoff = NOW_MS - retention
EXPIRE_FIELDS = {"at": AT, "id": ID}  # timestamptz, and a long read as epoch millis
# fields _evolve_spec toggles besides identities (on columns of their own: pyiceberg 0.12 cannot
# append under a spec with two fields on one column)
ID_BUCKET, AMOUNT_TRUNCATED = "id_bucket", "amount_trunc"
BY_REGION = PartitionSpec(PartitionField(source_id=REGION, field_id=1000, transform=IdentityTransform(), name="region"))
# Exploring past a known failure: STATEFUL_SKIP=add_files_file1,race_expire,crash_after_prepare,... turns
# those steps into no-ops; region_null_string leaves 'null' out of the partition values.
SKIP = set(filter(None, os.environ.get("STATEFUL_SKIP", "").split(",")))
STORAGE = os.environ.get("STATEFUL_STORAGE", "local")  # or s3: the warehouse on the local S3 server
if STORAGE not in ("local", "s3"):
    raise ValueError(f"STATEFUL_STORAGE={STORAGE!r}: expected local or s3")
# How add_files spells the registered file's path: local spellings of one file, or S3's two schemes.
ADD_FILES_SPELLINGS = ["plain", "file1", "file3"] if STORAGE == "local" else ["s3", "s3a"]
# NULL and the string 'null' must stay apart; the rest are escaped in partition paths and URIs
REGIONS = [
    v
    for v in [None, "null", "", "eu", "a/b", "50%", "x+y", "sp ace", "ünï=1"]
    if v != "null" or "region_null_string" not in SKIP
]
PAYLOAD_NAMES = ["payload", "body", "päyload"]  # rename targets of column 4
# Added columns get names never used before in the table: a dropped name added again is remapped by
# pyiceberg's name mapping to the new field, so files without field ids (add_files) would show the
# dropped column's values in the new one: a property of name mapping, not of compaction.
MAX_EXTRA_COLUMNS = 2
# Points an in-process test can reach (worker_mid_group runs in a Spark Python worker process).
IN_PROCESS_POINTS = [p for p in faults.POINTS if p not in ("worker_mid_group", "gc_after_expire")]
RACES = [
    "append",
    "position_delete",
    "position_delete+append",  # two commits: the delete is no longer the head when ours retries
    "equality_delete",
    "expire",
    "spec_change",
    "schema_change",
    "rollback",  # main set back to an earlier snapshot: every attempt planned since must back off
    "gc",  # our GC, grace 0: nothing the commit in flight wrote may go
]
MOR_TUNINGS: dict[str, dict[str, str]] = {
    "rewrite_every_delete": {"compaction.delete-file-threshold": "1"},
    "tiers": {  # data files over the target size: no size trigger; deletes never trigger a rewrite
        # position-delete files (~1.6 KB) are small, data files (3.3 KB and up) are not; below the
        # split tuning's max file size (a valid policy when both are set)
        "compaction.target-file-size-bytes": "2000",
        "compaction.min-target-size-ratio": "0.95",
        "compaction.delete-file-threshold": "1000",
        "compaction.delete-ratio-threshold": "1.0",
        "compaction.equality-delete-file-threshold": "1",
        "compaction.position-delete-file-threshold": "2",
    },
    "configured": {},
}
# another engine's commit during our manifest rewrite (at its prepare), or our GC inside its commit
MANIFEST_RACES = [None, "append", "position_delete", "rollback", "gc"]
# Oversized files (issue 20): the machine's files hold a few rows (~1 KB of column data, a few KB on
# disk), so a tiny target with a limit above the `tiers` target makes every file oversized and splittable.
SPLIT_TUNING = {"compaction.target-file-size-bytes": "256", "compaction.max-file-size-bytes": "2048"}
FULL_INTERVAL = "compaction.full.trigger-interval-ms"
# Clustering (issue 20): a sort order or z-order columns make majors and fulls sort, and healthy but
# overlapping partitions cluster (a 4 KiB target makes most files healthy); a tiny sort budget sends
# every sorted group through spill runs.
# Ids grow with every write, so files are disjoint on id (and at, amount): clustered by nature; every
# file spans all of cat's values (id % 3) and its partition's region: those overlap.
CLUSTERINGS = ["sort id", "sort cat desc", "zorder cat,region", "zorder at,amount", "off"]
CLUSTER_PROPERTIES = {
    "compaction.cluster.min-overlap": "0.5",
    "compaction.sort.memory-bytes": "512",
    "compaction.target-file-size-bytes": "4096",
}
RACE_AT = ["after_prepare", "in_commit"]  # before our commit's first try / between its check and CAS


@dataclass
class Figures:
    """What a run exercised and found, printed at the end of a long run (README quotes them)."""

    histories: int = 0
    steps: int = 0
    rules: Counter[str] = field(default_factory=Counter)
    crashes: Counter[str] = field(default_factory=Counter)
    races: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    rows_checked: int = 0
    rows_expired: int = 0  # rows the oracle dropped because an expire snapshot landed
    lost: int = 0
    duplicated: int = 0
    resurrected: int = 0

    def record(self, found: Diff, rows: int) -> None:
        self.rows_checked += rows
        self.lost += found.lost
        self.duplicated += found.duplicated
        self.resurrected += found.unexpected

    def summary(self) -> str:
        lines = [
            f"histories={self.histories} steps={self.steps} rows_checked={self.rows_checked} "
            f"rows_expired={self.rows_expired}",
            f"lost={self.lost} duplicated={self.duplicated} resurrected_or_corrupt={self.resurrected}",
            "rules: " + ", ".join(f"{k}={v}" for k, v in sorted(self.rules.items())),
            "crashes: " + ", ".join(f"{k}={v}" for k, v in sorted(self.crashes.items())),
            "races: " + ", ".join(f"{k}={v}" for k, v in sorted(self.races.items())),
            "compaction outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items())),
        ]
        return "\n".join(lines)


FIGURES = Figures()


class TableHistory(RuleBasedStateMachine):
    """One table, one history. `spark` and `root` are set by the test that runs the machine; `s3`
    too for a warehouse on the local S3 server (None: a local folder)."""

    spark: ClassVar[Any] = None
    root: ClassVar[Path | None] = None
    s3: ClassVar[LocalS3 | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="history-", dir=self.root))
        extra: dict[str, Any] = {}
        self.prefix: str | None = None
        if self.s3 is not None:
            self.prefix = f"stateful-{uuid.uuid4().hex[:10]}"
            properties = self.s3.catalog_properties("sqlite:///catalog.db", prefix=self.prefix)
            extra["catalog"] = {"name": "lake", "properties": properties}
        config = write_config(
            self.dir,
            tables=[
                {
                    "match": "*",
                    "queue": "default",
                    "policy": {
                        "target_file_size_bytes": 64 * 1024,
                        "min_input_files": 2,
                        "rewrite_manifests_min_count": 2,  # every few appends make the rewrite due
                    },
                }
            ],
            gc={"max_snapshot_age_hours": 0, "min_snapshots_to_keep": 1, "orphan_grace_hours": 0},
            **extra,
        )
        self.engine = Engine(load_config(config), spark=lambda: self.spark, clock=lambda: NOW_MS)
        self.engine.catalog.create_namespace("ns")
        self.engine.catalog.create_table(TABLE, schema=SCHEMA, partition_spec=BY_REGION)
        self.oracle = Oracle()
        self.next_id = 0
        self.pending_recovery = False
        self.expiry: tuple[int, Any] | None = (
            None  # data expiration in force: (field id, cutoff as the oracle holds it)
        )
        self.expirations: dict[str, tuple[int, Any]] = {}  # expire attempt id -> the expiry it was planned with
        self.settled: set[str] = set()  # expire attempts the oracle has accounted for (or never will: ended)
        self.seen: dict[str, DataFile] = {}  # data files live before one of our compactions, by path
        # the oracle's rows when a snapshot was current (recorded once the readers agreed with it): what
        # the table must read once another engine sets main back to that snapshot
        self.states: dict[int, dict[int, dict[int, Any]]] = {}
        FIGURES.histories += 1

    # ----------------------------------------------------------------- helpers (other engines)

    def table(self) -> Table:
        return self.engine.catalog.load_table(TABLE)

    def _rows(self, table: Table, region: str | None, count: int, cat: int | None) -> list[dict[int, Any]]:
        schema = table.schema()
        rows = []
        for _ in range(count):
            row: dict[int, Any] = {f.field_id: None for f in schema.fields}
            row.update({ID: self.next_id, REGION: region, CAT: cat if cat is not None else self.next_id % 3})
            row[PAYLOAD] = f"p{self.next_id} /%+ é"
            row.update(_typed_values(self.next_id))
            for f in schema.fields:
                if f.field_id > LAST_BASE_ID:
                    row[f.field_id] = f"{f.name}-{self.next_id}"
            rows.append(row)
            self.next_id += 1
        return rows

    def _arrow(self, table: Table, rows: list[dict[int, Any]]) -> pa.Table:
        schema = table.schema()
        return pa.Table.from_pylist(
            [{f.name: r.get(f.field_id) for f in schema.fields} for r in rows], schema=schema.as_arrow()
        )

    def _append(self, table: Table, region: str | None, files: int, rows: int, cat: int | None = None) -> None:
        batches = [self._rows(table, region, rows, cat) for _ in range(files)]
        append_fragments(table, [self._arrow(table, b) for b in batches])
        for batch in batches:
            self.oracle.append(batch, ID)

    def _live_data_files(self, table: Table) -> list[DataFile]:
        return [f.data_file for f in live_files(table) if not f.is_delete]

    def _position_delete(self, table: Table, data_file: DataFile, pick: int, pair: bool = False) -> int:
        """Delete up to two live rows of the file (`pair`: and up to two of another live data file of
        its spec and partition, in two delete files each naming rows of both, as Spark writes them:
        the partition's position deletes are then due for a rewrite under the `tiers` tuning);
        returns how many rows the oracle lost."""
        ids = read_column(table, data_file, ID, "id")
        live = [pos for pos, i in enumerate(ids) if i in self.oracle.rows]
        if not live:
            return 0
        positions = sorted({live[pick % len(live)], live[(pick * 7 + 3) % len(live)]})
        others = [
            f
            for f in self._live_data_files(table)
            if pair
            and f.file_path != data_file.file_path
            and f.spec_id == data_file.spec_id
            and f.partition == data_file.partition
        ]
        if not others:
            commit_delete_files(table, [position_delete_file(table, data_file, positions)])
            return self.oracle.delete(ids[p] for p in positions)
        other = others[pick % len(others)]
        other_ids = read_column(table, other, ID, "id")
        other_live = [pos for pos, i in enumerate(other_ids) if i in self.oracle.rows][:2]
        named = [(data_file.file_path, p) for p in positions] + [(other.file_path, p) for p in other_live]
        halves = [named[0::2], named[1::2]] if len(named) > 2 else [named]
        deletes = [
            position_delete_rows(table, data_file.spec_id, data_file.partition, *map(list, zip(*half, strict=True)))
            for half in halves
        ]
        commit_delete_files(table, deletes)
        FIGURES.rules["position_delete naming two files"] += 1
        return self.oracle.delete([*(ids[p] for p in positions), *(other_ids[p] for p in other_live)])

    def _roll_back_main(self, pick: int) -> int | None:
        """Another engine sets main back to an earlier snapshot still in the metadata whose rows
        are known (set_current_snapshot: rollback_to_snapshot's update when it is an ancestor, and
        any other line of history too); the oracle goes back to them. Returns the snapshot id, or
        None when there is none to go back to."""
        table = self.table()
        current = table.current_snapshot()
        present = {s.snapshot_id for s in table.metadata.snapshots}
        targets = [i for i in self.states if i in present and (current is None or i != current.snapshot_id)]
        if not targets:
            return None
        target = targets[pick % len(targets)]
        table.manage_snapshots().set_current_snapshot(target).commit()
        self.oracle.rows = dict(self.states[target])
        return target

    def _equality_delete(self, table: Table, column: str, value: Any) -> int:
        """Delete `column == value` everywhere: one file per live partition of every spec (a
        partition-scoped delete, which DuckDB 1.4.4 would apply to all partitions anyway)."""
        groups: dict[tuple[int, str], DataFile] = {}
        for data_file in self._live_data_files(table):
            groups.setdefault((data_file.spec_id, repr(data_file.partition)), data_file)
        if not groups or any(None in tuple(f.partition) for f in groups.values()):
            FIGURES.rules["equality_delete_not_written"] += 1  # DuckDB 1.4.4 fails on a NULL partition's
            return 0
        field_id = table.schema().find_field(column).field_id
        deletes = [
            equality_delete_file(table, f.spec_id, f.partition, [column], [{column: value}]) for f in groups.values()
        ]
        commit_delete_files(table, deletes)
        return self.oracle.delete(self.oracle.ids_where(lambda r: r.get(field_id) == value))

    def _expire(self, table: Table) -> int:
        """Expire every snapshot but the current one, as another engine's expire_snapshots would,
        deleting the files only the expired snapshots referenced (Java's ExpireSnapshots does)."""
        current = table.current_snapshot()
        older = [s.snapshot_id for s in table.metadata.snapshots if current and s.snapshot_id != current.snapshot_id]
        if not older:
            return 0
        before = _reachable(table, table.metadata.snapshots)
        table.maintenance.expire_snapshots().by_ids(older).commit()
        table.refresh()
        gone = before - _reachable(table, table.metadata.snapshots)
        for path in gone:
            table.io.delete(path)
        return len(older)

    def _evolve_spec(self, table: Table, which: int) -> str:
        """Toggle identity(region) or identity(cat), or swap them in one update, or toggle a
        bucket of id or a truncation of amount (other transforms: an old-spec rewrite computes them)."""
        present = {f.name for f in table.spec().fields}
        toggled = [["region"], ["cat"], ["region", "cat"], [ID_BUCKET], [AMOUNT_TRUNCATED]][which % 5]
        with table.update_spec() as update:
            for name in toggled:
                if name in present:
                    update.remove_field(name)
                elif name == ID_BUCKET:
                    update.add_field("id", BucketTransform(3), ID_BUCKET)
                elif name == AMOUNT_TRUNCATED:
                    update.add_field("amount", TruncateTransform(1000), AMOUNT_TRUNCATED)  # 10.00 wide
                else:
                    update.add_identity(name)
        return "toggle " + "+".join(toggled)

    def _evolve_schema(self, table: Table, which: int, name_pick: int) -> str:
        schema = table.schema()
        extras = [f.name for f in schema.fields if f.field_id > LAST_BASE_ID]
        choice = ["add", "rename", "drop", "widen"][which % 4]
        if choice == "widen" and isinstance(schema.find_field(CAT).field_type, IntegerType):
            with table.update_schema() as update:
                update.update_column("cat", LongType())
            return "widen cat"
        if choice == "drop" and extras:
            with table.update_schema() as update:
                update.delete_column(extras[name_pick % len(extras)])
            return "drop"
        if choice == "rename":
            current = schema.find_field(PAYLOAD).name
            target = [n for n in PAYLOAD_NAMES if n != current][name_pick % 2]
            with table.update_schema() as update:
                update.rename_column(current, target)
            return "rename payload"
        if len(extras) >= MAX_EXTRA_COLUMNS:
            return "nothing"
        with table.update_schema() as update:
            update.add_column(f"x{table.metadata.last_column_id + 1}", StringType())
        return "add"

    def _add_files(self, table: Table, region: str, spelling: str, rows: int) -> None:
        """Register a Parquet file written outside Iceberg (no field ids) under a path spelling:
        `/abs`, `file:/abs`, `file:///abs` on a local warehouse; `s3://` or `s3a://` on S3."""
        batch = self._rows(table, region, rows, cat=1)
        arrow = self._arrow(table, batch)
        arrow = arrow.cast(schema_to_pyarrow(table.schema(), include_field_ids=False))
        name = f"ext-{uuid.uuid4().hex}.parquet"
        if spelling in ("s3", "s3a"):
            assert table.location().startswith("s3://"), f"{spelling} on a table at {table.location()}"
            location = f"{table.location()}/data/external/{name}"
            with table.io.new_output(location).create(overwrite=True) as stream:
                pq.write_table(arrow, stream)
            path = location if spelling == "s3" else "s3a://" + location.removeprefix("s3://")
        else:
            local = Path(_local(table.location())) / "data" / "external" / name
            local.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(arrow, local)
            path = {"plain": str(local), "file1": f"file:{local}", "file3": f"file://{local}"}[spelling]
        table.add_files([path])
        self.oracle.append(batch, ID)

    # ----------------------------------------------------------------- our engine

    def _compact(self, partition_pick: int | None) -> None:
        table = self.table()
        self.seen.update((f.file_path, f) for f in self._live_data_files(table))
        equality = self._partitions_with_equality_deletes(table)
        partition = None
        if partition_pick is not None:
            todo = self.engine.plan(TABLE).to_compact
            partition = todo[partition_pick % len(todo)].partition_key if todo else None
        try:
            outcomes = self.engine.compact(TABLE, partition=partition)
        except CompactionError as exc:  # a clear refusal is allowed; counted, the table unchanged
            FIGURES.outcomes[f"refused: {str(exc)[:60]}"] += 1
            return
        for outcome in outcomes:
            FIGURES.outcomes[outcome.status] += 1
            if outcome.status == "committed":
                FIGURES.outcomes[f"committed {outcome.kind}"] += 1
                if outcome.bounds_overlap:  # a sorted / z-ordered rewrite, in memory or through spill runs
                    spilled = " spilled" if outcome.spill_files else ""
                    FIGURES.outcomes[f"sorted by {outcome.bounds_overlap['order']}{spilled}"] += 1
                FIGURES.outcomes[f"rewritten by {outcome.engine or 'none'}"] += 1
                if outcome.rows_deleted:  # merge-on-read: which path applied the deletes
                    FIGURES.outcomes[f"deletes applied by {outcome.engine}"] += 1
                    if outcome.partition_key in equality:
                        FIGURES.outcomes[f"equality deletes live, deletes applied by {outcome.engine}"] += 1
            elif outcome.kind == "old-spec":  # e.g. a raced equality delete in the old partition
                FIGURES.outcomes[f"{outcome.status} old-spec"] += 1

    @staticmethod
    def _partitions_with_equality_deletes(table: Table) -> set[str]:
        """The partition keys (as outcomes name them) holding a live equality-delete file."""
        specs, schema, current = table.specs(), table.schema(), table.spec().spec_id
        return {
            render_partition(specs[f.data_file.spec_id], schema, f.data_file.partition, current)
            for f in live_files(table)
            if f.data_file.content == DataFileContent.EQUALITY_DELETES
        }

    def _settle_expirations(self) -> None:
        """Account in the oracle for every expire snapshot that landed: each new expire attempt is
        tied to the expiry in force (attempts begin inside the step just run); one a snapshot
        carries (or the ledger calls COMMITTED) drops its source files' rows below the cutoff."""
        table = self.table()
        for attempt in self.engine.ledger.attempts(table_name=TABLE):
            if attempt.kind != "expire" or attempt.attempt_id in self.settled:
                continue
            assert self.expiry is not None or attempt.attempt_id in self.expirations, "expired while off"
            field_id, cutoff = self.expirations.setdefault(attempt.attempt_id, self.expiry)  # type: ignore[arg-type]
            if attempt.status in (Status.FAILED, Status.ROLLED_BACK):
                self.settled.add(attempt.attempt_id)
            elif attempt.status == Status.COMMITTED or commit_snapshot(table, attempt) is not None:
                ids = [i for p in attempt.source_files for i in read_column(table, self.seen[p], ID, "id")]
                gone = [i for i in ids if i in self.oracle.rows and _below(self.oracle.rows[i].get(field_id), cutoff)]
                FIGURES.rows_expired += self.oracle.delete(gone)
                self.settled.add(attempt.attempt_id)

    # ----------------------------------------------------------------- rules

    def _count(self, name: str) -> bool:
        """Count a step; False if STATEFUL_SKIP names it (then the step does nothing)."""
        FIGURES.steps += 1
        if name in SKIP:
            FIGURES.rules[f"{name} (skipped)"] += 1
            return False
        FIGURES.rules[name] += 1
        return True

    @initialize(region=st.sampled_from(REGIONS), files=st.integers(2, 4))
    def seed_rows(self, region: str | None, files: int) -> None:
        if not self._count("seed"):
            return
        self._append(self.table(), region, files, 3)

    @rule(region=st.sampled_from(REGIONS), files=st.integers(1, 4), rows=st.integers(1, 4))
    def append(self, region: str | None, files: int, rows: int) -> None:
        if not self._count("append"):
            return
        self._append(self.table(), region, files, rows)

    @rule(pick=st.none() | st.integers(0, 50))
    def compact(self, pick: int | None) -> None:
        if not self._count("compact" if pick is None else "compact_partition"):
            return
        self._compact(pick)

    @rule(
        point=st.sampled_from(IN_PROCESS_POINTS),
        region=st.sampled_from(REGIONS),
        pick=st.none() | st.integers(0, 50),
        roll_back=st.booleans(),
    )
    def compact_and_crash(self, point: str, region: str | None, pick: int | None, roll_back: bool) -> None:
        """Two more small files first, so the compaction has work and reaches the point. After the
        crash, another engine may set main back to an earlier snapshot before recovery runs."""
        if not self._count("compact_and_crash") or f"crash_{point}" in SKIP:
            return
        self._append(self.table(), region, 2, 2)
        faults.arm(point)
        try:
            self._compact(pick)
        except faults.InjectedCrash:
            FIGURES.crashes[point] += 1
            self.pending_recovery = True
            if roll_back and "race_rollback" not in SKIP and self._roll_back_main(pick or 0) is not None:
                FIGURES.races[f"rollback after crash@{point}"] += 1
        finally:
            faults.disarm()

    @rule(
        kind=st.sampled_from(RACES),
        at=st.sampled_from(RACE_AT),
        region=st.sampled_from(REGIONS),
        pick=st.integers(0, 1000),
    )
    def compact_while_another_engine_commits(self, kind: str, at: str, region: str | None, pick: int) -> None:
        """Two more small files first, so the compaction has work and reaches its commit."""
        if not self._count("compact_raced") or f"race_{kind}" in SKIP:
            return
        self._append(self.table(), region, 2, 2)
        fired: list[str] = []

        def action() -> None:
            fired.append(kind)
            other = self.table()
            if kind == "append":
                self._append(other, REGIONS[pick % len(REGIONS)], 1, 2)
            elif kind.startswith("position_delete"):
                in_flight = [
                    p for a in self.engine.ledger.attempts(statuses=OPEN, table_name=TABLE) for p in a.source_files
                ]
                live = {f.file_path: f for f in self._live_data_files(other)}
                targets = [live[p] for p in in_flight if p in live] or list(live.values())
                if targets:
                    self._position_delete(other, targets[pick % len(targets)], pick)
                if kind.endswith("+append"):
                    self._append(self.table(), REGIONS[pick % len(REGIONS)], 1, 1)
            elif kind == "equality_delete":
                self._equality_delete(other, "cat", pick % 3)
            elif kind == "expire":
                self._expire(other)
            elif kind == "rollback":
                if self._roll_back_main(pick) is None:
                    fired.remove(kind)
            elif kind == "gc":
                self.engine.gc(TABLE)
            elif kind == "spec_change":
                self._evolve_spec(other, pick)
            else:
                self._evolve_schema(other, pick, pick // 4)

        with raced(at, action):
            self._compact(None)
        if fired:
            FIGURES.races[f"{kind}@{at}"] += 1

    @rule()
    def recover(self) -> None:
        if not self._count("recover"):
            return
        report = recover_attempts(self.engine.catalog, self.engine.ledger, 0)  # in-process attempts count as dead
        assert not report.errors, report.errors
        self.pending_recovery = False
        self.assert_no_open_attempts()

    @rule(pick=st.integers(0, 1000), pair=st.booleans())
    def position_delete(self, pick: int, pair: bool) -> None:
        if not self._count("position_delete"):
            return
        table = self.table()
        files = self._live_data_files(table)
        if files:
            self._position_delete(table, files[pick % len(files)], pick, pair)

    @rule(by_id=st.booleans(), value=st.integers(0, 1000))
    def equality_delete(self, by_id: bool, value: int) -> None:
        if not self._count("equality_delete"):
            return
        if by_id:
            ids = sorted(self.oracle.rows)
            if ids:
                self._equality_delete(self.table(), "id", ids[value % len(ids)])
        else:
            self._equality_delete(self.table(), "cat", value % 3)

    @rule(mode=st.sampled_from(sorted(MOR_TUNINGS)))
    def tune_merge_on_read(self, mode: str) -> None:
        """Steer the planner to a merge-on-read kind with the table's own properties (they win over
        compaction.yaml): every file with a delete rewritten, or the cheaper tiers (no size or delete
        trigger), or back to the configured policy."""
        if not self._count(f"tune_{mode}"):
            return
        table = self.table()
        with table.transaction() as txn:
            if props := MOR_TUNINGS[mode]:
                txn.set_properties(props)
            elif tuned := {k for p in [*MOR_TUNINGS.values(), SPLIT_TUNING] for k in p} & set(table.properties):
                txn.remove_properties(*tuned)

    @rule(on=st.booleans())
    def tune_full_optimizing(self, on: bool) -> None:
        """Full optimizing every millisecond (each compaction rewrites every partition not already
        optimal, whole), or off."""
        if not self._count(f"full_optimizing_{'on' if on else 'off'}"):
            return
        table = self.table()
        with table.transaction() as txn:
            if on:
                txn.set_properties({FULL_INTERVAL: "1"})
            elif FULL_INTERVAL in table.properties:
                txn.remove_properties(FULL_INTERVAL)

    @rule(on=st.booleans())
    def tune_max_file_size(self, on: bool) -> None:
        """A max file size (and target) small enough that the table's files are oversized: split
        when no other rewrite is due; or back to the configured sizes."""
        if not self._count(f"max_file_size_{'on' if on else 'off'}"):
            return
        table = self.table()
        with table.transaction() as txn:
            if on:
                txn.set_properties(SPLIT_TUNING)
            elif tuned := set(SPLIT_TUNING) & set(table.properties):
                txn.remove_properties(*tuned)

    @rule(
        race=st.sampled_from(MANIFEST_RACES),
        crash=st.sampled_from([None, "after_prepare", "after_iceberg_commit"]),
        region=st.sampled_from(REGIONS),
        pick=st.integers(0, 1000),
    )
    def rewrite_manifests(self, race: str | None, crash: str | None, region: str | None, pick: int) -> None:
        """Two more appends first (two more small manifests: the rewrite is due). Then our manifest
        rewrite: alone (every live file keeps its sequence numbers and snapshot id), while another
        engine commits at its prepare (an append, a position delete: their manifests are kept; main
        set back to an earlier snapshot: the rewrite backs off and is planned again), with our GC
        inside its commit (its manifest list is pyiceberg's), or crashing before or after its
        Iceberg commit (recovery settles it)."""
        if not self._count("rewrite_manifests") or (race and f"race_{race}" in SKIP):
            return
        for _ in range(2):
            self._append(self.table(), region, 1, 1)
        before = _live_entries(self.table())

        def action() -> None:
            other = self.table()
            if race == "append":
                self._append(other, REGIONS[pick % len(REGIONS)], 1, 1)
            elif race == "position_delete" and (files := self._live_data_files(other)):
                self._position_delete(other, files[pick % len(files)], pick)
            elif race == "rollback" and self._roll_back_main(pick) is None:
                return
            elif race == "gc":
                self.engine.gc(TABLE)
            FIGURES.races[f"{race}@rewrite_manifests"] += 1

        if crash:
            faults.arm(crash)
        elif race and race != "gc":
            faults.arm("after_prepare", action)
        try:
            with raced("in_commit", action) if race == "gc" and not crash else nullcontext():
                report = self.engine.rewrite_manifests(TABLE)
        except faults.InjectedCrash:
            FIGURES.crashes[f"{crash}@rewrite_manifests"] += 1
            self.pending_recovery = True
            return
        finally:
            faults.disarm()
        FIGURES.outcomes[f"rewrite-manifests {report.status}"] += 1
        if report.status == "committed" and not race:
            assert _live_entries(self.table()) == before

    def _set_expiration(self, column: str | None, below: int) -> None:
        """Data expiration on `column` (None: off) with the cutoff `below`: `id` below it, or `at`
        before EPOCH + that many seconds (row n's `at` is about EPOCH + n s)."""
        table = self.table()
        with table.transaction() as txn:
            if column is None:
                if "compaction.expire.field" in table.properties:
                    txn.remove_properties("compaction.expire.field", "compaction.expire.retention-ms")
                self.expiry = None
                return
            cutoff_ms = below if column == "id" else EPOCH_MS + below * 1000
            txn.set_properties(
                {"compaction.expire.field": column, "compaction.expire.retention-ms": str(NOW_MS - cutoff_ms)}
            )
        self.expiry = (ID, below) if column == "id" else (AT, EPOCH + timedelta(seconds=below))

    @initialize(column=st.sampled_from([None, None, *sorted(EXPIRE_FIELDS)]), below=st.integers(0, 40))
    def expiration_from_the_start(self, column: str | None, below: int) -> None:
        """Half the histories start with data expiration on (a cutoff among the first rows' ids and times)."""
        if column is not None and self._count("expiration_from_the_start"):
            self._set_expiration(column, below)

    @rule(column=st.none() | st.sampled_from(sorted(EXPIRE_FIELDS)), pick=st.integers(0, 1000))
    def tune_expiration(self, column: str | None, pick: int) -> None:
        """Data expiration on (a cutoff inside the rows written so far) or off."""
        if self._count("tune_expiration_off" if column is None else "tune_expiration_on"):
            self._set_expiration(column, pick % (self.next_id + 1))

    @precondition(lambda self: self.expiry is not None)
    @rule(pick=st.none() | st.integers(0, 50))
    def expire_rows_now(self, pick: int | None) -> None:
        """`compaction-assets expire`: only the expirations of the plan run (of one partition, or all)."""
        if not self._count("expire_rows_now"):
            return
        self.seen.update((f.file_path, f) for f in self._live_data_files(self.table()))
        plans = [p for p in self.engine.plan(TABLE).to_compact if p.kind == "expire"]
        partition = plans[pick % len(plans)].partition_key if plans and pick is not None else None
        for outcome in self.engine.expire(TABLE, partition=partition):
            assert outcome.kind == "expire" or outcome.status == "skipped", outcome
            if outcome.status == "committed":
                FIGURES.outcomes["committed expire (expire command)"] += 1

    @rule(mode=st.sampled_from(CLUSTERINGS))
    def set_clustering(self, mode: str) -> None:
        """A sort order (pyiceberg's update_sort_order, as another engine's user sets it) or z-order
        columns (the table property), or neither: later majors, fulls and clusters sort by it."""
        if not self._count(f"cluster_{mode.split()[0]}"):
            return
        table = self.table()
        with table.transaction() as txn:
            with txn.update_sort_order() as order:
                if mode == "sort id":
                    order.asc("id", IdentityTransform())
                elif mode == "sort cat desc":
                    order.desc("cat", IdentityTransform())
            # the clustering's 4 KiB target would leave a split tuning's max file size below it (invalid)
            stale = {"compaction.max-file-size-bytes"} if mode != "off" else set()
            if mode.startswith("zorder"):
                txn.set_properties({"compaction.zorder-columns": mode.split()[1], **CLUSTER_PROPERTIES})
            elif mode.startswith("sort"):
                txn.set_properties(CLUSTER_PROPERTIES)
                stale.add("compaction.zorder-columns")
            if present := stale & set(table.properties):
                txn.remove_properties(*present)
            if mode == "off" and (
                present := {"compaction.zorder-columns", *CLUSTER_PROPERTIES} & set(table.properties)
            ):
                # the target goes too (a split tuning set it since): its max file size would be left
                # below the configured target (invalid)
                txn.remove_properties(*present, *({"compaction.max-file-size-bytes"} & set(table.properties)))

    @rule(pick=st.integers(0, 1000))
    def roll_back_main_by_another_engine(self, pick: int) -> None:
        """Main set back to an earlier snapshot at any time: after a crash (an attempt left PREPARED,
        which recovery must then roll back), before plans made later."""
        if not self._count("roll_back_main"):
            return
        if self._roll_back_main(pick) is not None and self.pending_recovery:
            FIGURES.races["rollback after crash, before recovery"] += 1

    @rule(pick=st.integers(0, 1000))
    def drop_data_file_by_another_engine(self, pick: int) -> None:
        """A delete whose filter covers a whole data file (metadata only): the file leaves the table,
        position deletes naming it stay (dangling) until a rewrite drops them."""
        if not self._count("drop_data_file"):
            return
        table = self.table()
        if not (files := self._live_data_files(table)):
            return
        data_file = files[pick % len(files)]
        ids = read_column(table, data_file, ID, "id")
        with table.transaction() as txn, txn.update_snapshot().overwrite() as overwrite:
            overwrite.delete_data_file(data_file)
        self.oracle.delete(ids)

    @rule()
    def expire_snapshots_by_another_engine(self) -> None:
        if not self._count("expire"):
            return
        self._expire(self.table())

    @rule()
    def our_gc(self) -> None:
        if not self._count("gc"):
            return
        self.engine.gc(TABLE)

    @rule()
    def our_gc_crashing(self) -> None:
        if not self._count("gc_crash"):
            return
        faults.arm("gc_after_expire")
        try:
            self.engine.gc(TABLE)
        except faults.InjectedCrash:
            FIGURES.crashes["gc_after_expire"] += 1
        finally:
            faults.disarm()

    @rule(which=st.integers(0, 3), name_pick=st.integers(0, 5))
    def evolve_schema(self, which: int, name_pick: int) -> None:
        if not self._count("schema"):
            return
        self._evolve_schema(self.table(), which, name_pick)

    @rule(which=st.integers(0, 4))
    def evolve_spec(self, which: int) -> None:
        if not self._count("spec"):
            return
        self._evolve_spec(self.table(), which)

    @precondition(lambda self: _identity_only(self.table()))
    @rule(
        region=st.sampled_from([r for r in REGIONS if r is not None]),
        spelling=st.sampled_from(ADD_FILES_SPELLINGS),
    )
    def add_files(self, region: str, spelling: str) -> None:
        if not self._count(f"add_files_{spelling}"):
            return
        self._add_files(self.table(), region, spelling, 3)

    # ----------------------------------------------------------------- invariants

    def _check(self, actual: Counter, expected: Counter, what: str) -> None:
        found = diff(expected, actual)
        FIGURES.record(found, sum(actual.values()))
        assert found.ok, f"{what}: {found} (expected {sum(expected.values())} rows, read {sum(actual.values())})"

    @invariant()
    def rows_equal_the_oracle(self) -> None:
        """The spec reader always; DuckDB and pyiceberg (with filters) where they can read the table:
        pyiceberg refuses equality deletes, DuckDB 1.4.4 loses rows on some (tests/test_lakekit.py)."""
        self._settle_expirations()
        table = self.table()
        schema = table.schema()
        expected = self.oracle.view(schema)
        self._check(Counter(row_key(r) for r in spec_rows(table)), expected, "spec reader")
        if (current := table.current_snapshot()) is not None:
            self.states[current.snapshot_id] = dict(self.oracle.rows)
        if any(f.data_file.content == DataFileContent.EQUALITY_DELETES for f in live_files(table)):
            FIGURES.rules["check_without_duckdb_pyiceberg (equality deletes live)"] += 1
            return
        self._check(Counter(row_key(r) for r in duckdb_rows(table)), expected, "DuckDB full scan")
        self._check(Counter(row_key(r) for r in table.scan().to_arrow().to_pylist()), expected, "pyiceberg scan")
        for region in REGIONS[:3]:
            row_filter = IsNull("region") if region is None else EqualTo("region", region)
            rows = table.scan(row_filter=row_filter).to_arrow().to_pylist()
            want = self.oracle.view(schema, lambda r, v=region: r.get(REGION) == v)
            self._check(Counter(row_key(r) for r in rows), want, f"pyiceberg scan where region={region!r}")
        rows = table.scan(row_filter=EqualTo("cat", 1)).to_arrow().to_pylist()
        self._check(Counter(row_key(r) for r in rows), self.oracle.view(schema, lambda r: r.get(CAT) == 1), "cat=1")

    @invariant()
    def every_referenced_file_exists(self) -> None:
        table = self.table()
        snapshot = table.current_snapshot()
        if snapshot is None:
            return
        paths = [snapshot.manifest_list, *(m.manifest_path for m in snapshot.manifests(table.io))]
        paths += [f.path for f in live_files(table)]
        missing = [p for p in paths if not table.io.new_input(p).exists()]
        assert not missing, f"{len(missing)} file(s) the current snapshot references are gone, e.g. {missing[0]}"

    @invariant()
    def partitions_match_their_rows(self) -> None:
        """Every live data file's rows, under its spec's transforms (pyiceberg's Python ones), give
        its partition tuple (read by field id): identity, bucket and truncate fields alike, so rows an
        old-spec rewrite moved into the current spec are where that spec says."""
        table = self.table()
        for data_file in self._live_data_files(table):
            spec = table.specs()[data_file.spec_id]
            for position, partition_field in enumerate(spec.fields):
                if isinstance(partition_field.transform, VoidTransform):
                    continue
                name = table.schema().find_column_name(partition_field.source_id)
                source_type = table.schema().find_field(partition_field.source_id).field_type
                transform = partition_field.transform.transform(source_type)
                values = {transform(v) for v in read_column(table, data_file, partition_field.source_id, name)}
                expected = data_file.partition[position]
                where = f"{data_file.file_path} (spec {spec.spec_id}, {partition_field.name}={expected!r})"
                assert values <= {expected}, f"{where} holds rows with {partition_field.name} in {values}"

    def assert_no_open_attempts(self) -> None:
        stuck = self.engine.ledger.attempts(statuses=OPEN, table_name=TABLE)
        assert not stuck, f"attempts left open after recovery: {[(a.attempt_id, a.status) for a in stuck]}"

    def teardown(self) -> None:
        try:
            if self.pending_recovery or self.engine.ledger.attempts(statuses=[Status.PREPARED, Status.EXECUTING]):
                recover_attempts(self.engine.catalog, self.engine.ledger, 0)
                self.assert_no_open_attempts()
                self.rows_equal_the_oracle()
        finally:
            faults.disarm()
            self.engine.ledger.dispose()
            self.engine.catalog.engine.dispose()
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.s3 is not None and self.prefix:  # the server keeps objects in memory
                _delete_prefix(self.s3, self.prefix)


def _live_entries(table: Table) -> dict[str, tuple[int | None, int | None, int | None]]:
    """Live file path -> (data sequence number, file sequence number, snapshot id), as readers see them."""
    snapshot = table.current_snapshot()
    manifests = snapshot.manifests(table.io) if snapshot is not None else []
    return {
        e.data_file.file_path: (e.sequence_number, e.file_sequence_number, e.snapshot_id)
        for m in manifests
        for e in live_entries(m, table.io)
    }


def _typed_values(n: int) -> dict[int, Any]:
    """Values of the typed and nested columns for row `n`, NULLs and empty lists among them."""
    return {
        AMOUNT: None if n % 5 == 0 else Decimal(n * 37).scaleb(-2),
        AT: None if n % 6 == 0 else EPOCH + timedelta(microseconds=n * 1_000_003),
        TAGS: None if n % 7 == 0 else [] if n % 7 == 1 else [f"t{n % 3}", None if n % 4 == 0 else f"é{n}"],
        POINT: None if n % 4 == 0 else {"x": n % 10, "label": None if n % 3 == 0 else f"l{n}"},
    }


def _below(value: Any, cutoff: Any) -> bool:
    """Past retention: a value below the cutoff (NULL never is)."""
    return value is not None and value < cutoff


def _identity_only(table: Table) -> bool:
    return all(isinstance(f.transform, IdentityTransform) for f in table.spec().fields)


def _local(uri: str) -> str:
    return uri.removeprefix("file://") if uri.startswith("file://") else uri.removeprefix("file:")


def _reachable(table: Table, snapshots: list) -> set[str]:
    files: set[str] = set()
    for snapshot in snapshots:
        files.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            files.add(manifest.manifest_path)
            files.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    return files


def _delete_prefix(s3: LocalS3, prefix: str) -> None:
    client = s3.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=f"{prefix}/"):
        if keys := [{"Key": o["Key"]} for o in page.get("Contents", [])]:
            client.delete_objects(Bucket=s3.bucket, Delete={"Objects": keys})
