"""Another engine moves the table's numbering between our commit's checks and the catalog swap,
without moving main: a commit to another branch (last-sequence-number, and next-row-id on format
version 3, move on) or a format upgrade. Our snapshot is numbered again from the refreshed table
on the next try, never committed with a stale sequence number or first-row-id (found by the
outside attack on issue 34: the table's last-sequence-number went backwards and Java could no
longer load it), and a rewrite the new format does not allow backs off with its reason, instead
of ending "outcome unknown" with the attempt left PREPARED."""

from __future__ import annotations

import pytest

from compaction_assets import faults
from compaction_assets.commit.ledger import OPEN, Status
from compaction_assets.commit.recovery import recover
from compaction_assets.lake.features import V3_MANIFEST_REASON
from tests.interop.checks import assert_rows
from tests.interop.conftest import SharedLake
from tests.interop.tables import Writer, create, create_v3, lineage
from tests.lakekit.races import in_commit


def assert_numbering_consistent(lake: SharedLake, name: str) -> None:
    """Every snapshot has a sequence number of its own, they grow along every parent chain, and
    last-sequence-number is the largest; on v3, the row id ranges of snapshots (those since the
    upgrade) do not overlap and lie below next-row-id."""
    metadata = lake.table(name).metadata
    snapshots = {s.snapshot_id: s for s in metadata.snapshots}
    numbers = [s.sequence_number for s in snapshots.values()]
    assert metadata.last_sequence_number == max(numbers)
    assert len(set(numbers)) == len(numbers), f"two snapshots share a sequence number: {sorted(numbers)}"
    for snapshot in snapshots.values():
        parent = snapshots.get(snapshot.parent_snapshot_id)
        assert parent is None or parent.sequence_number < snapshot.sequence_number, (parent, snapshot)
    if metadata.format_version >= 3:
        numbered = [s for s in snapshots.values() if s.first_row_id is not None]
        ranges = sorted((s.first_row_id, s.first_row_id + (s.added_rows or 0)) for s in numbered)
        assert all(end <= start for (_, end), (start, _) in zip(ranges, ranges[1:], strict=False)), ranges
        assert not ranges or ranges[-1][1] <= metadata.next_row_id


def no_open_attempts(lake: SharedLake, name: str) -> None:
    left = lake.engine.ledger.attempts(statuses=OPEN, table_name=name)
    assert not left, [(a.kind, a.status, a.attempt_id) for a in left]


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("on_branch", ["delete", "insert"])
def test_a_commit_to_another_branch_inside_ours_renumbers_our_snapshot(
    shared_lake: SharedLake, version: int, on_branch: str
):
    lake, name = shared_lake, f"ns.branch_{on_branch}_v{version}"
    w: Writer = (create_v3 if version == 3 else create)(
        lake, name, "days(ts)", {"compaction.min-input-files": "3", "write.delete.mode": "merge-on-read"}
    )
    for _ in range(4):
        w.append(10)
    w.sql("ALTER TABLE {t} CREATE BRANCH b")
    for _ in range(3):
        w.append(10)
    on_b = {  # two commits to b, so a stale sequence number would also be below last-sequence-number
        "delete": ["DELETE FROM {t}.branch_b WHERE id % 3 = 0", "DELETE FROM {t}.branch_b WHERE id % 3 = 1"],
        "insert": ["INSERT INTO {t}.branch_b SELECT * FROM {t}"] * 2,
    }
    on_branch_b = len(lake.sql(f"SELECT id FROM {{c}}.{name}.branch_b"))  # 40
    expected_b = {"delete": on_branch_b // 3, "insert": on_branch_b + 2 * 70}[on_branch]
    expected, before = w.expected(), lineage(lake, name) if version == 3 else {}

    with in_commit(lambda: [w.sql(statement) for statement in on_b[on_branch]], must_fire=True):
        outcomes = lake.engine.compact(name)
    assert [o.status for o in outcomes] == ["committed"] * len(outcomes), [(o.status, o.reason) for o in outcomes]
    assert_numbering_consistent(lake, name)
    assert_rows(lake, name, expected, f"main after a {on_branch} on branch b inside our commit", duckdb=False)
    assert len(lake.sql(f"SELECT id FROM {{c}}.{name}.branch_b")) == expected_b
    if version == 3:
        after = lineage(lake, name)
        assert after == before, "rows changed _row_id / _last_updated_sequence_number"
    no_open_attempts(lake, name)


def test_a_format_upgrade_inside_a_manifest_rewrite_backs_it_off(shared_lake: SharedLake):
    """The rewrite rolls back with the v3 reason, plans again on the v3 table and skips it."""
    lake, name = shared_lake, "ns.upgraded"
    w = create(lake, name, "days(ts)", {"compaction.rewrite-manifests.min-count": "3"})
    for _ in range(8):
        w.append(10)
    with in_commit(lambda: w.sql("ALTER TABLE {t} SET TBLPROPERTIES ('format-version'='3')"), must_fire=True):
        report = lake.engine.rewrite_manifests(name)
    rolled_back = lake.engine.ledger.attempts(statuses=(Status.ROLLED_BACK,), table_name=name)
    assert [V3_MANIFEST_REASON in (a.reason or "") for a in rolled_back] == [True], rolled_back
    assert report.status == "skipped" and V3_MANIFEST_REASON in report.reason, report  # planned again on v3
    assert lake.table(name).format_version == 3
    assert_numbering_consistent(lake, name)
    assert_rows(lake, name, w.expected(), "after the backed-off manifest rewrite", duckdb=False)
    no_open_attempts(lake, name)


def test_recovery_after_java_commits_to_main_and_a_branch_renumbers_the_v3_snapshot(shared_lake: SharedLake):
    """A run dies after precommit; Java appends to main and commits twice to branch b (rows added,
    a deletion vector); recovery recommits on the head Java left, numbered from it: rows, lineage
    and numbering hold, and Java's next append gets fresh ids (kept from the second outside attack
    on issue 34, which held)."""
    lake, name = shared_lake, "ns.recovered"
    w = create_v3(lake, name, "days(ts)", {"compaction.min-input-files": "3"})
    for _ in range(5):
        w.append(10)
    w.sql("ALTER TABLE {t} CREATE BRANCH b")
    faults.arm("after_prepare")
    with pytest.raises(faults.InjectedCrash):
        lake.engine.compact(name)
    faults.disarm()
    w.append(10)
    w.sql("INSERT INTO {t}.branch_b SELECT * FROM {t}")
    w.sql("DELETE FROM {t}.branch_b WHERE id % 2 = 0")
    before = lineage(lake, name)

    # this process is the dead run's stand-in: timeout 0 takes its attempt for orphaned
    report = recover(lake.engine.catalog, lake.engine.ledger, executing_timeout_seconds=0)

    assert report.recommitted, report
    assert_rows(lake, name, w.expected(), "after recovery", duckdb=False)
    assert lineage(lake, name) == before
    assert_numbering_consistent(lake, name)
    no_open_attempts(lake, name)
    w.append(5)
    ids = [row_id for row_id, _ in lineage(lake, name).values()]
    assert len(set(ids)) == len(ids) and max(ids) < lake.table(name).metadata.next_row_id
