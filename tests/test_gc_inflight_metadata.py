"""GC never deletes what a commit of ours in flight references (maintenance/gc.py). Review finding
r12: GC with orphan grace 0 ran while our commit was between writing its manifests and manifest
list (named by pyiceberg, not after the attempt) and swapping the catalog pointer: it took them for
orphans and deleted them; the ledger said COMMITTED and no reader could read the table.

GC runs here at that moment (tests/stateful's in-commit race hook) for every kind of commit we
make: a data rewrite, a delete-file tier, a manifest rewrite, a recovery's recommit; and in the
other race order, having read the ledger before the attempt began. Real SQLite catalog, real
Spark, readers: pyiceberg, DuckDB and the spec reader."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyiceberg.table import Table

from compaction_assets import faults
from compaction_assets.commit.ledger import Ledger, Status
from compaction_assets.commit.recovery import recover
from compaction_assets.lake.delete_files import commit_delete_files, position_delete_rows
from compaction_assets.lake.files import live_files
from compaction_assets.lake.storage import Claims, reachable
from compaction_assets.maintenance.gc import IN_FLIGHT_SKEW_MS, GcPolicy, GcReport, collect_garbage
from compaction_tools.demo import append_fragments
from tests.conftest import BY_REGION, SCHEMA, Lake, batch
from tests.lakekit import races
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.files import rows
from tests.lakekit.spec_reader import spec_rows

NO_GRACE = GcPolicy(max_snapshot_age_ms=0, min_snapshots_to_keep=1, orphan_grace_ms=0)
TIERS = {  # only the position-delete tier is due
    "compaction.target-file-size-bytes": str(64 * 1024),
    "compaction.position-delete-file-threshold": "2",
    "compaction.delete-file-threshold": "100",
    "compaction.delete-ratio-threshold": "0.9",
    "compaction.min-input-files": "100",
}


def in_commit(action: Callable[[], None]):
    return races.in_commit(action, must_fire=True)


def gc_into(lake: Lake, reports: list[GcReport], ledger: Ledger | None = None, now_ms: int | None = None):
    def gc() -> None:
        reports.append(collect_garbage(lake.table("ns.t"), ledger or lake.engine.ledger, NO_GRACE, now_ms=now_ms))

    return gc


def assert_readable(lake: Lake, expected, reports: list[GcReport]) -> None:
    """Every file the current snapshot references exists, none was reported deleted, and every
    reader reads the rows."""
    table = lake.table("ns.t")
    referenced = reachable(table.io, [table.current_snapshot()])
    missing = sorted(p for p in referenced if not table.io.new_input(p).exists())
    assert not missing, f"{len(missing)} file(s) the current snapshot references are gone, e.g. {missing[0]}"
    deleted = {p for r in reports for p in [*r.orphan_files, *r.expired_files]}
    assert not deleted & referenced
    assert rows(spec_rows, table) == expected
    assert rows(duckdb_rows, table) == expected
    assert rows(lambda t: t.scan().to_arrow().to_pylist(), table) == expected


def fragmented(lake: Lake, **properties: str) -> Table:
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION, properties=properties)
    append_fragments(table, [batch(i * 10, 10, "eu") for i in range(6)])
    table.refresh()
    return table


def with_position_deletes(lake: Lake) -> Table:
    """Two data files and two position-delete files naming rows of both: the position-delete tier is due."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION, properties=TIERS)
    table.append(batch(0, 20, "eu"))
    table.append(batch(100, 20, "eu"))
    table.refresh()
    d, e = [f.data_file for f in live_files(table)]
    commit_delete_files(
        table, [position_delete_rows(table, d.spec_id, d.partition, [d.file_path, e.file_path], [p, p]) for p in (0, 1)]
    )
    [plan] = lake.engine.plan("ns.t").to_compact
    assert plan.kind == "rewrite-position-deletes"
    return table


@pytest.mark.parametrize("kind", ["minor", "rewrite-position-deletes"])
def test_gc_inside_our_commit_deletes_none_of_its_metadata(lake: Lake, kind: str):
    table = fragmented(lake) if kind == "minor" else with_position_deletes(lake)
    expected, reports = rows(spec_rows, table), []

    with in_commit(gc_into(lake, reports)):
        [outcome] = lake.engine.compact("ns.t")

    assert (outcome.kind, outcome.status) == (kind, "committed"), outcome
    [attempt] = lake.engine.ledger.attempts(table_name="ns.t")
    assert attempt.status == Status.COMMITTED
    assert lake.table("ns.t").current_snapshot().snapshot_id == attempt.committed_snapshot_id
    assert_readable(lake, expected, reports)


def test_gc_inside_a_recovery_recommit_deletes_none_of_its_metadata(lake: Lake):
    table = fragmented(lake)
    expected, reports = rows(spec_rows, table), []
    faults.arm("after_prepare")
    try:
        with pytest.raises(faults.InjectedCrash):
            lake.engine.compact("ns.t")
    finally:
        faults.disarm()

    with in_commit(gc_into(lake, reports)):
        report = recover(lake.catalog, lake.engine.ledger, 0)  # this process's attempt counts as dead

    [attempt] = lake.engine.ledger.attempts(table_name="ns.t")
    assert report.recommitted == [attempt.attempt_id] and attempt.status == Status.COMMITTED
    assert_readable(lake, expected, reports)


def test_gc_inside_a_manifest_rewrite_commit_keeps_its_manifest_list(lake: Lake):
    """Its manifests are named after the attempt; its manifest list is pyiceberg's."""
    table = lake.catalog.create_table(
        "ns.t", schema=SCHEMA, partition_spec=BY_REGION, properties={"compaction.rewrite-manifests.min-count": "2"}
    )
    for i in range(4):
        table.append(batch(i * 10, 10, "eu"))
    expected, reports = rows(spec_rows, lake.table("ns.t")), []

    with in_commit(gc_into(lake, reports)):
        report = lake.engine.rewrite_manifests("ns.t")

    assert report.status == "committed", report
    assert len(lake.table("ns.t").current_snapshot().manifests(table.io)) == 1
    assert_readable(lake, expected, reports)


class _LedgerReadBeforeTheAttempt:
    """The ledger as a GC that read it before our attempt began sees it at first: no open attempt."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.reads = 0

    def open_claims(self, table_name: str) -> Claims:
        self.reads += 1
        return Claims() if self.reads == 1 else self._ledger.open_claims(table_name)


def test_gc_that_read_the_ledger_before_our_attempt_began_deletes_nothing_of_it(lake: Lake):
    """The other race order: GC reads the ledger (no attempt open yet), our attempt begins, writes
    its results, manifests and manifest list, then GC lists the table's files and judges them. Its
    clock is a minute ahead of the files' modification times (coarse mtimes, or skew): age alone
    would call every one of them an orphan."""
    table = fragmented(lake)
    expected, reports = rows(spec_rows, table), []
    ledger = _LedgerReadBeforeTheAttempt(lake.engine.ledger)
    gc = gc_into(lake, reports, ledger=ledger, now_ms=int(time.time() * 1000) + 60_000)  # type: ignore[arg-type]

    with in_commit(gc):
        [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed", outcome
    assert_readable(lake, expected, reports)
    assert ledger.reads == 2  # read again after the listing


def test_orphans_older_than_every_open_attempt_still_go(lake: Lake):
    """While an attempt is open, GC keeps files younger than its start (less IN_FLIGHT_SKEW_MS),
    whatever their names, and still deletes older orphans: Java's DeleteOrphanFiles `olderThan`,
    moved back to what is in flight."""
    table = fragmented(lake)
    expected = rows(spec_rows, table)
    metadata = Path(table.location().removeprefix("file://")) / "metadata"
    lake.engine.ledger.begin("task", "ns.t", "region=eu", "minor", None, [], [], 0, 0)  # EXECUTING, this process
    old, fresh = metadata / "0f0e-crashed-writer-m0.avro", metadata / "snap-1-0-a-commit-in-flight.avro"
    for path in (old, fresh):
        path.write_bytes(b"x" * 100)
    long_ago = time.time() - 2 * IN_FLIGHT_SKEW_MS / 1000
    os.utime(old, (long_ago, long_ago))

    report = collect_garbage(lake.table("ns.t"), lake.engine.ledger, NO_GRACE)

    assert report.orphan_files == [f"file://{old}"]
    assert not old.exists() and fresh.exists()
    assert rows(spec_rows, lake.table("ns.t")) == expected
