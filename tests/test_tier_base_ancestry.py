"""Every attempt commits only on a head that descends from the snapshot it was planned on
(commit/two_phase.base_history), whatever it replaces: data files, delete files (the merge-on-read
tiers), manifests. Review finding r11: a `rewrite-position-deletes` planned on S2 drops the entries
naming a data file S2 no longer has; main is rolled back to S1, which has that file; committing on
S1 anyway removes the only delete files that hid its deleted rows, and they come back. Here main is
rolled back at each moment it can be: after prepare, inside the commit (pyiceberg's own retry sees
it), and between a crash and recovery. Real SQLite catalog, real Spark, readers: pyiceberg, DuckDB
and the spec reader."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pyiceberg.exceptions import ValidationException
from pyiceberg.table import Table

from compaction_assets import faults
from compaction_assets.commit.ledger import Status
from compaction_assets.commit.recovery import recover
from compaction_assets.commit.two_phase import base_history
from compaction_assets.lake.delete_files import commit_delete_files, position_delete_rows, read_column
from compaction_assets.lake.files import live_files
from compaction_tools.demo import append_fragments
from tests.conftest import BY_REGION, SCHEMA, Lake, batch
from tests.lakekit import races
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.files import rows
from tests.lakekit.spec_reader import spec_rows

TIERS = {  # only the position-delete tier is due (as the review's reproduction tunes it)
    "compaction.target-file-size-bytes": str(64 * 1024),
    "compaction.position-delete-file-threshold": "2",
    "compaction.delete-file-threshold": "100",
    "compaction.delete-ratio-threshold": "0.9",
    "compaction.min-input-files": "100",
}


def ids(table: Table) -> list[int]:
    return sorted(r["id"] for r in table.scan().to_arrow().to_pylist())


def rolled_back_history(lake: Lake) -> tuple[Table, int, list[int]]:
    """r11's table: data files D and E, two position-delete files each naming rows of both (S1);
    then another engine drops D (S2). Returns the table, S1 and the ids S1 reads."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION, properties=TIERS)
    table.append(batch(0, 20, "eu"))
    table.append(batch(100, 20, "eu"))
    table.refresh()
    d, e = sorted((f.data_file for f in live_files(table)), key=lambda f: min(read_column(table, f, 1, "id")))
    deletes = [position_delete_rows(table, d.spec_id, d.partition, [d.file_path, e.file_path], [p, p]) for p in (0, 1)]
    commit_delete_files(table, deletes)
    s1 = table.current_snapshot().snapshot_id
    s1_ids = ids(table)
    assert s1_ids == [*range(2, 20), *range(102, 120)]
    with table.transaction() as txn, txn.update_snapshot().overwrite() as overwrite:
        overwrite.delete_data_file(d)  # S2
    table = lake.table("ns.t")
    [plan] = lake.engine.plan("ns.t").to_compact
    assert plan.kind == "rewrite-position-deletes"
    return table, s1, s1_ids


def roll_back_to(lake: Lake, snapshot_id: int) -> Callable[[], None]:
    def roll_back() -> None:  # another engine's user: CALL system.rollback_to_snapshot
        lake.table("ns.t").manage_snapshots().rollback_to_snapshot(snapshot_id).commit()

    return roll_back


def in_commit(action: Callable[[], None]):
    return races.in_commit(action, must_fire=True)


def assert_reads(lake: Lake, expected_ids: list[int]) -> None:
    table = lake.table("ns.t")
    assert ids(table) == expected_ids, "rows deleted in the rolled-back-to snapshot came back"
    assert sorted(r["id"] for r in duckdb_rows(table)) == expected_ids
    assert sorted(r["id"] for r in spec_rows(table)) == expected_ids


def assert_attempt_files_gone_but_live_files_kept(lake: Lake, attempt_id: str) -> None:
    table = lake.table("ns.t")
    assert all(table.io.new_input(f.path).exists() for f in live_files(table))
    [attempt] = [a for a in lake.engine.ledger.attempts(table_name="ns.t") if a.attempt_id == attempt_id]
    assert attempt.result_files and not any(table.io.new_input(d["file_path"]).exists() for d in attempt.result_files)


@pytest.mark.parametrize("when", ["after_prepare", "in_commit"])
def test_position_delete_rewrite_backs_off_when_main_is_rolled_back_before_its_commit(lake: Lake, when: str):
    _, s1, s1_ids = rolled_back_history(lake)
    if when == "after_prepare":
        faults.arm("after_prepare", roll_back_to(lake, s1))
        try:
            [outcome] = lake.engine.compact("ns.t")
        finally:
            faults.disarm()
    else:
        with in_commit(roll_back_to(lake, s1)):
            [outcome] = lake.engine.compact("ns.t")

    assert (outcome.kind, outcome.status) == ("rewrite-position-deletes", "backed_off"), outcome
    assert "no ancestor" in outcome.reason
    assert lake.table("ns.t").current_snapshot().snapshot_id == s1
    assert_reads(lake, s1_ids)
    [attempt] = lake.engine.ledger.attempts(table_name="ns.t")
    assert attempt.status == Status.ROLLED_BACK and "no ancestor" in (attempt.reason or "")
    assert_attempt_files_gone_but_live_files_kept(lake, attempt.attempt_id)


def test_recovery_rolls_back_a_prepared_tier_attempt_whose_base_main_no_longer_descends_from(lake: Lake):
    """The process dies after PREPARED; main is rolled back; recovery must not recommit."""
    _, s1, s1_ids = rolled_back_history(lake)
    faults.arm("after_prepare")
    try:
        with pytest.raises(faults.InjectedCrash):
            lake.engine.compact("ns.t")
    finally:
        faults.disarm()
    roll_back_to(lake, s1)()

    report = recover(lake.catalog, lake.engine.ledger, 0)  # this process's attempt counts as dead

    [attempt] = lake.engine.ledger.attempts(table_name="ns.t")
    assert report.rolled_back == [attempt.attempt_id] and not report.recommitted and not report.errors
    assert attempt.status == Status.ROLLED_BACK and "no ancestor" in (attempt.reason or "")
    assert lake.table("ns.t").current_snapshot().snapshot_id == s1
    assert_reads(lake, s1_ids)
    assert_attempt_files_gone_but_live_files_kept(lake, attempt.attempt_id)


def test_manifest_rewrite_planned_before_a_rollback_backs_off_and_plans_again(lake: Lake):
    """S1: four appends (four small data manifests); S2: twenty files in one append (a manifest over
    the target size, not rewritten). Planned on S2, the rewrite replaces S1's four manifests; main
    goes back to S1, which has them all: the attempt backs off all the same, and the rewrite is
    planned again on S1."""
    properties = {"compaction.rewrite-manifests.min-count": "2", "commit.manifest.target-size-bytes": "8000"}
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION, properties=properties)
    for i in range(4):
        table.append(batch(i * 10, 10, "eu"))
    table.refresh()
    s1 = table.current_snapshot().snapshot_id
    expected = rows(spec_rows, table)
    append_fragments(table, [batch(1000 + i * 10, 10, "eu") for i in range(20)])
    table.refresh()
    assert len([m for m in table.current_snapshot().manifests(table.io) if m.manifest_length >= 8000]) == 1
    faults.arm("after_prepare", roll_back_to(lake, s1))
    try:
        report = lake.engine.rewrite_manifests("ns.t")
    finally:
        faults.disarm()

    first, second = sorted(lake.engine.ledger.attempts(table_name="ns.t"), key=lambda a: a.created_at)
    assert first.status == Status.ROLLED_BACK and "no ancestor" in (first.reason or ""), first
    assert second.status == Status.COMMITTED and second.base_snapshot_id == s1
    assert report.status == "committed"
    table = lake.table("ns.t")
    assert table.current_snapshot().parent_snapshot_id == s1
    assert rows(spec_rows, table) == expected and rows(duckdb_rows, table) == expected


def test_base_history_is_the_heads_line_back_to_the_base(lake: Lake):
    """Unit: ancestors between base and head; a rolled-back-from base, a missing link and no base raise."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    for i in range(3):
        table.append(batch(i, 1, "eu"))
    table.refresh()
    s1, s2, s3 = [s.snapshot_id for s in table.metadata.snapshots]
    metadata = table.metadata
    assert [s.snapshot_id for s in base_history(metadata, s1, s3)] == [s3, s2]
    assert base_history(metadata, s3, s3) == []
    with pytest.raises(ValidationException, match="no ancestor"):
        base_history(metadata, s3, s1)  # main rolled back from s3 to s1
    with pytest.raises(ValidationException, match="no base snapshot"):
        base_history(metadata, None, s3)
    java_expired = metadata.model_copy(update={"snapshots": [s for s in metadata.snapshots if s.snapshot_id != s2]})
    with pytest.raises(ValidationException, match="snapshot .* is missing"):
        base_history(java_expired, s1, s3)  # Java's expiry leaves s3's parent id naming s2
    table.maintenance.expire_snapshots().by_id(s1).commit()  # pyiceberg clears s2's parent id
    table.refresh()
    assert [s.snapshot_id for s in base_history(table.metadata, s2, s3)] == [s3]
    with pytest.raises(ValidationException, match="no ancestor"):
        base_history(table.metadata, s1, s3)  # cannot be told any more: as good as none
