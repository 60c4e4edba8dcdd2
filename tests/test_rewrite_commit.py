"""A compaction commits as Java's RewriteFiles does: a `replace` snapshot with a correct summary,
validated on every commit try against the attempt's base snapshot, results with the base's data
sequence number, one manifest per partition spec. Delete files come from another engine
(tests/foreign_deletes.py); DuckDB's Iceberg reader reads what pyiceberg 0.12 cannot."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import EqualTo
from pyiceberg.manifest import DataFileContent, ManifestEntryStatus
from pyiceberg.table.snapshots import Operation

import compaction_assets.commit.two_phase as two_phase
from compaction_assets.lake.files import live_files
from compaction_tools.demo import append_fragments
from tests.conftest import SCHEMA, batch, create_fragmented
from tests.foreign_deletes import commit_deletes, equality_delete, position_delete
from tests.lakekit.crash_points import on_crash_point
from tests.lakekit.manifests import duckdb_ids, entries, region_files, spec_ids
from tests.lakekit.reads import rows


def first_ids(data_file, n: int) -> list[int]:
    return pq.read_table(data_file.file_path.removeprefix("file://"), columns=["id"])["id"].to_pylist()[:n]


def test_position_delete_and_append_landing_inside_the_commit_make_it_back_off(lake, monkeypatch):
    """r1: the delete lands after the pre-commit check; pyiceberg's retry must still see it,
    although the head it retries on (an append) carries no delete file of its own."""
    table = create_fragmented(lake, "ns.t", {"eu": 10, "us": 1})
    victim = region_files(table)[0]
    deleted = set(first_ids(victim, 3))
    expected = [r for r in rows(table) if r["id"] not in deleted] + batch(20_000, 5, "us").to_pylist()
    real, raced = two_phase._commit_once, []

    def racing(table_, attempts, live):
        if not raced:
            raced.append(True)
            other = lake.table("ns.t")
            commit_deletes(other, [position_delete(other, victim, [0, 1, 2])])
            lake.table("ns.t").append(batch(20_000, 5, "us"))
        real(table_, attempts, live)

    monkeypatch.setattr(two_phase, "_commit_once", racing)

    [outcome] = [o for o in lake.engine.compact("ns.t") if o.partition_key == "region=eu"]

    assert raced
    assert outcome.status == "backed_off", outcome.reason
    assert "position delete file" in outcome.reason and "added after the base snapshot" in outcome.reason
    table = lake.table("ns.t")
    assert rows(table) == sorted(expected, key=lambda r: r["id"])
    assert duckdb_ids(table) == sorted(r["id"] for r in expected)


def test_equality_delete_committed_after_the_base_still_applies_to_the_rewritten_rows(lake, monkeypatch):
    table = create_fragmented(lake, "ns.t", {"eu": 10, "us": 6})
    base = table.current_snapshot()
    all_ids = [r["id"] for r in rows(table)]
    eu_partition = region_files(table)[0].partition
    # eu rows only: DuckDB 1.4.4 applies a partition-scoped equality delete to every partition
    # (duckdb-iceberg #1240, fixed after 1.4.4); spec_ids below checks the scoping
    doomed = [0, 1, 2, 260]

    def delete() -> None:
        other = lake.table("ns.t")
        commit_deletes(other, [equality_delete(other, doomed, spec_id=0, partition=eu_partition)])

    on_crash_point(monkeypatch, "after_prepare", delete)

    outcomes = lake.engine.compact("ns.t")

    assert [o.status for o in outcomes] == ["committed", "committed"], [o.reason for o in outcomes]
    table = lake.table("ns.t")
    snapshot = table.current_snapshot()
    assert snapshot.snapshot_id == outcomes[0].snapshot_id
    added = [e for _, e in entries(table) if e.status == ManifestEntryStatus.ADDED]
    added = [e for e in added if e.snapshot_id == snapshot.snapshot_id]
    assert [e.data_file.content for e in added] == [DataFileContent.DATA] * 2
    # the base's data sequence number, this snapshot's file sequence number (Java's RewriteFiles)
    assert {(e.sequence_number, e.file_sequence_number) for e in added} == {
        (base.sequence_number, snapshot.sequence_number)
    }
    assert base.sequence_number < snapshot.sequence_number - 1  # the delete's number lies between
    for manifest in snapshot.manifests(table.io):
        live = [e for e in manifest.fetch_manifest_entry(table.io) if e.status != ManifestEntryStatus.DELETED]
        if live:
            assert manifest.min_sequence_number == min(e.sequence_number for e in live)
    expected = sorted(i for i in all_ids if i not in doomed)
    assert spec_ids(table) == expected
    assert duckdb_ids(table) == expected


@pytest.mark.parametrize("change", ["replace", "add"])
def test_partition_spec_change_between_prepare_and_commit(lake, monkeypatch, change):
    """r4: the results keep the spec they were written for and go into a manifest of that spec."""
    table = create_fragmented(lake, "ns.t", {"eu": 10})
    expected = rows(table)

    def evolve() -> None:
        with lake.table("ns.t").update_spec() as update:
            if change == "replace":
                update.remove_field("region")
            update.add_identity("payload")

    on_crash_point(monkeypatch, "after_prepare", evolve)

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed", outcome.reason
    table = lake.table("ns.t")
    assert table.spec().spec_id == 1
    [(manifest, _)] = [(m, e) for m, e in entries(table) if e.status == ManifestEntryStatus.ADDED]
    assert manifest.partition_spec_id == 0
    for manifest, entry in entries(table):
        assert len(entry.data_file.partition) == len(table.specs()[manifest.partition_spec_id].fields)
    assert rows(table) == expected
    assert len(table.scan(row_filter=EqualTo("region", "eu")).to_arrow()) == 500
    assert len(table.scan(row_filter=EqualTo("payload", expected[0]["payload"])).to_arrow()) == 1
    assert duckdb_ids(table) == [r["id"] for r in expected]


TOTALS = (
    "total-data-files",
    "total-delete-files",
    "total-records",
    "total-files-size",
    "total-position-deletes",
    "total-equality-deletes",
)


def fresh_totals(table) -> dict[str, str]:
    """The summary totals counted from the current snapshot's live manifest entries."""
    live = [e.data_file for _, e in entries(table) if e.status != ManifestEntryStatus.DELETED]
    data = [f for f in live if f.content == DataFileContent.DATA]
    counts = {
        "total-data-files": len(data),
        "total-delete-files": len(live) - len(data),
        "total-records": sum(f.record_count for f in data),
        "total-files-size": sum(f.file_size_in_bytes for f in live),
        "total-position-deletes": sum(f.record_count for f in live if f.content == DataFileContent.POSITION_DELETES),
        "total-equality-deletes": sum(f.record_count for f in live if f.content == DataFileContent.EQUALITY_DELETES),
    }
    return {k: str(v) for k, v in counts.items()}


def test_compaction_commits_replace_with_a_rewrite_summary(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 10, "us": 8, "asia": 2})
    asia = sorted(
        (f.data_file for f in live_files(table) if f.partition_key == "region=asia"), key=lambda f: f.file_path
    )
    commit_deletes(table, [position_delete(table, asia[0], [0, 1])])  # carried in the totals, untouched
    table = lake.table("ns.t")
    parent = table.current_snapshot()
    before = {f.path: f.data_file for f in live_files(table)}

    outcomes = [o for o in lake.engine.compact("ns.t") if o.status == "committed"]

    assert sorted(o.partition_key for o in outcomes) == ["region=eu", "region=us"]
    table = lake.table("ns.t")
    snapshot = table.current_snapshot()
    assert snapshot.parent_snapshot_id == parent.snapshot_id
    summary = snapshot.summary
    assert summary.operation == Operation.REPLACE
    after = {f.path: f.data_file for f in live_files(table)}
    added = [f for p, f in after.items() if p not in before]
    removed = [f for p, f in before.items() if p not in after]
    assert summary["added-data-files"] == "2" and summary["deleted-data-files"] == "18"
    assert summary["added-records"] == summary["deleted-records"] == "900"
    assert summary["added-files-size"] == str(sum(f.file_size_in_bytes for f in added))
    assert summary["removed-files-size"] == str(sum(f.file_size_in_bytes for f in removed))
    assert summary["changed-partition-count"] == "2"
    assert {k: summary[k] for k in TOTALS} == fresh_totals(table)
    assert summary["total-position-deletes"] == "2" and summary["total-delete-files"] == "1"
    assert set(summary["compaction.task-id"].split(",")) == {o.task_id for o in outcomes}
    assert set(summary["compaction.attempt-id"].split(",")) == {o.attempt_id for o in outcomes}


def test_an_attempt_another_process_ended_is_an_outcome_not_an_exception(lake, monkeypatch):
    """Recovery took the attempt for dead during the rewrite: compact() reports, never raises."""
    table = create_fragmented(lake, "ns.t", {"eu": 10})
    expected = rows(table)

    def recovery_ends_it() -> None:
        [attempt] = lake.engine.ledger.attempts()
        lake.engine.ledger.mark_failed(attempt.attempt_id, "abandoned: no heartbeat")

    on_crash_point(monkeypatch, "after_rewrite", recovery_ends_it)

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "failed"
    assert "expected EXECUTING, found FAILED" in outcome.reason
    assert rows(lake.table("ns.t")) == expected


def test_an_unpartitioned_compaction_counts_its_one_partition_as_java_does(lake):
    table = lake.catalog.create_table("ns.t", schema=SCHEMA)
    append_fragments(table, [batch(i * 50, 50, "eu") for i in range(10)])

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed", outcome.reason
    table = lake.table("ns.t")
    summary = table.current_snapshot().summary
    assert summary.operation == Operation.REPLACE
    assert summary["changed-partition-count"] == "1"
    assert {k: summary[k] for k in TOTALS} == fresh_totals(table)
    assert duckdb_ids(table) == list(range(500))


def test_attempts_of_different_bases_commit_together_each_with_its_own_base_sequence_number(lake):
    """Two PREPARED attempts planned on different snapshots (two crashed runs), committed in one
    snapshot: each result carries its own base's data sequence number, and an equality delete
    committed between the two bases still applies to the older attempt's rewritten rows."""
    table = create_fragmented(lake, "ns.t", {"eu": 10, "us": 10})
    first_base = table.current_snapshot()
    assert lake.cli("compact", "ns.t", "--partition", "region=eu", crash_at="after_prepare").returncode == 137
    table = lake.table("ns.t")
    commit_deletes(table, [equality_delete(table, [0, 7], spec_id=0, partition=region_files(table)[0].partition)])
    second_base = lake.table("ns.t").current_snapshot()
    assert lake.cli("compact", "ns.t", "--partition", "region=us", crash_at="after_prepare").returncode == 137
    eu, us = sorted(lake.engine.ledger.attempts(), key=lambda a: a.partition_key)
    assert (eu.base_snapshot_id, us.base_snapshot_id) == (first_base.snapshot_id, second_base.snapshot_id)
    results: dict = {}

    two_phase.commit_together(lake.table("ns.t"), lake.engine.ledger, [eu, us], results)

    assert {r.committed_snapshot_id for r in results.values()} == {lake.table("ns.t").current_snapshot().snapshot_id}
    table = lake.table("ns.t")
    snapshot = table.current_snapshot()
    added = {
        e.data_file.partition[0]: e.sequence_number
        for _, e in entries(table)
        if e.status == ManifestEntryStatus.ADDED and e.snapshot_id == snapshot.snapshot_id
    }
    assert added == {"eu": first_base.sequence_number, "us": second_base.sequence_number}
    expected = [i for i in range(1000) if i not in (0, 7)]
    assert spec_ids(table) == expected
    assert duckdb_ids(table) == expected
