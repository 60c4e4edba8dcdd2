"""The manifest rewrite (commit/manifest_rewrite.py) on real tables: many appends leave many small
manifests; the rewrite leaves few, clustered by partition, with the same live files, sequence
numbers and statistics, and the same rows in the spec reader and DuckDB, deletes included. No
Spark: the rewrite is metadata only."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import DagsterRunStatus, SensorResult, build_sensor_context, instance_for_test
from dagster._core.test_utils import create_run_for_test
from pyiceberg.expressions import EqualTo
from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from compaction_assets import faults
from compaction_assets.commit import manifest_rewrite
from compaction_assets.commit.ledger import StaleAttempt, Status
from compaction_assets.commit.manifest_rewrite import MANIFESTS_REPLACED, ManifestRewriteReport
from compaction_assets.commit.recovery import recover
from compaction_assets.config import PolicyConfig, load_config
from compaction_assets.defs.build import build_definitions
from compaction_assets.defs.gc_assets import MAINTENANCE_KEY, MAINTENANCE_PARTITIONS
from compaction_assets.defs.naming import table_key
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.errors import ConfigError
from compaction_assets.lake.delete_files import commit_delete_files, equality_delete_file, position_delete_file
from compaction_assets.lake.manifest_cache import live_entries
from compaction_assets.maintenance.gc import GcPolicy, collect_garbage
from compaction_assets.planning.model import Kind
from compaction_assets.planning.policy import resolve_policy
from tests.conftest import BY_REGION, SCHEMA, Lake, batch, make_lake
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.files import data_of, rows
from tests.lakekit.oracle import row_key
from tests.lakekit.spec_reader import spec_rows

REGIONS = ("a", "b", "c", "d")
ROWS = 10


@pytest.fixture
def lake(tmp_path: Path) -> Iterator[Lake]:
    with make_lake(tmp_path, None) as lake:  # no Spark: nothing here rewrites data
        yield lake


def streamed(lake: Lake, appends: int = 24, **properties: str) -> tuple[Table, Counter]:
    """A table appended to `appends` times (one small manifest each), round robin over REGIONS;
    returns it and the rows appended."""
    props = {"compaction.rewrite-manifests.min-count": "10", **properties}
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION, properties=props)
    expected: Counter = Counter()
    for i in range(appends):
        data = batch(i * ROWS, ROWS, REGIONS[i % len(REGIONS)])
        table.append(data)
        expected.update(row_key(r) for r in data.to_pylist())
    table.refresh()
    return table, expected


def manifests(table: Table, content: ManifestContent | None = None) -> list:
    table.refresh()
    found = table.current_snapshot().manifests(table.io)
    return [m for m in found if content is None or m.content == content]


def rewrite_while(lake: Lake, other_commit: Callable[[], None]) -> ManifestRewriteReport:
    """Rewrite ns.t's manifests; `other_commit` lands once its manifests are written and prepared."""
    faults.arm("after_prepare", other_commit)
    try:
        return lake.engine.rewrite_manifests("ns.t")
    finally:
        faults.disarm()


def entries(table: Table) -> list[dict]:
    """What readers see of each live file (pyiceberg's entries table), without the entry status."""
    table.refresh()
    found = table.inspect.entries().drop_columns(["status"]).to_pylist()
    return sorted(found, key=lambda e: e["data_file"]["file_path"])


def test_many_small_manifests_become_few_clustered_by_partition_with_the_same_files_and_rows(lake: Lake):
    table, expected = streamed(lake, **{"commit.manifest.target-size-bytes": "8000"})
    before = entries(table)
    assert len(manifests(table)) == 24
    tplan = lake.engine.plan("ns.t")
    assert tplan.manifests.due and tplan.manifests.kind == Kind.REWRITE_MANIFESTS
    assert "24 small manifest(s) >= compaction.rewrite-manifests.min-count=10" in tplan.manifests.reason
    assert "avg 1.0 entries per small manifest" in tplan.manifests.reason
    assert tplan.manifests.benefit > 0
    assert not tplan.rewrite_manifests_due  # every partition has 6 fragments: compactions come first
    parent = table.current_snapshot()

    report = lake.engine.rewrite_manifests("ns.t", task_id="t1")

    assert report.status == "committed", report.reason
    after = manifests(table)
    assert 1 < len(after) <= len(REGIONS), [m.manifest_length for m in after]  # clustered, not one
    assert all(m.manifest_length <= 8000 for m in after)  # about the target, not above it
    regions_in = defaultdict(set)
    for i, m in enumerate(after):
        found = live_entries(m, table.io)
        keys = [(e.data_file.partition[0], e.data_file.file_path) for e in found]
        assert keys == sorted(keys)  # sorted by partition, then path
        assert {e.status for e in found} == {ManifestEntryStatus.EXISTING}
        for e in found:
            regions_in[e.data_file.partition[0]].add(i)
    assert all(len(v) == 1 for v in regions_in.values()), regions_in  # each partition in one manifest
    assert entries(table) == before  # same files, snapshot ids, sequence numbers, statistics
    assert rows(spec_rows, table) == expected
    assert rows(duckdb_rows, table) == expected
    assert Counter(row_key(r) for r in table.scan().to_arrow().to_pylist()) == expected
    snapshot = table.current_snapshot()
    summary = snapshot.summary
    assert summary.operation == Operation.REPLACE and snapshot.parent_snapshot_id == parent.snapshot_id
    assert summary["compaction.task-id"] == "t1" and summary["compaction.attempt-id"] == report.attempt_id
    assert summary[MANIFESTS_REPLACED] == "24"
    for total in ("total-data-files", "total-records", "total-files-size", "total-delete-files"):
        assert summary[total] == parent.summary[total]
    [attempt] = lake.engine.ledger.attempts(table_name="ns.t")
    assert attempt.status == Status.COMMITTED and attempt.kind == "rewrite-manifests"
    assert attempt.committed_snapshot_id == snapshot.snapshot_id
    again = lake.engine.plan("ns.t").manifests
    assert not again.due and "manifests not due" in again.reason


def test_deletes_still_apply_exactly_as_before(lake: Lake):
    """Position and equality deletes in their own small manifests; an equality delete older than a
    later append of the same id must not apply to it (data sequence numbers kept)."""
    table, expected = streamed(lake, appends=8, **{"compaction.rewrite-manifests.min-count": "5"})
    a = data_of(table, "a")
    commit_delete_files(table, [position_delete_file(table, a[0], [0, 3])])
    table.refresh()
    b = data_of(table, "b")
    for ids in ([10, 11], [50]):  # rows of region b's files
        commit_delete_files(table, [equality_delete_file(table, 0, b[0].partition, ["id"], [{"id": i} for i in ids])])
        table.refresh()
    again = batch(10, 1, "b")  # id 10 appended again, after the equality delete that removed the first
    table.append(again)
    table.refresh()
    expected = rows(spec_rows, table)
    assert sum(expected.values()) == 8 * ROWS - 2 - 3 + 1 and expected[row_key(again.to_pylist()[0])] == 1
    assert rows(duckdb_rows, table) == expected
    before = entries(table)
    assert len(manifests(table, ManifestContent.DELETES)) == 3

    report = lake.engine.rewrite_manifests("ns.t")

    assert report.status == "committed", report.reason
    assert len(manifests(table, ManifestContent.DELETES)) == 1 and len(manifests(table, ManifestContent.DATA)) == 1
    assert entries(table) == before
    assert rows(spec_rows, table) == expected
    assert rows(duckdb_rows, table) == expected


def test_an_append_during_the_rewrite_is_kept(lake: Lake):
    table, expected = streamed(lake)
    late = batch(10_000, 5, "e")

    def append_meanwhile() -> None:
        other = lake.catalog.load_table("ns.t")
        other.append(late)

    report = rewrite_while(lake, append_meanwhile)

    assert report.status == "committed", report.reason
    expected.update(row_key(r) for r in late.to_pylist())
    assert len(manifests(table)) == 2  # the rewritten one and the concurrent append's
    assert rows(spec_rows, table) == expected
    assert rows(duckdb_rows, table) == expected
    assert lake.engine.ledger.attempts(table_name="ns.t")[0].status == Status.COMMITTED


def test_a_concurrent_commit_that_rewrote_a_manifest_makes_it_plan_again(lake: Lake):
    """A copy-on-write delete rewrites the manifest of the file it touches: the attempt rolls back
    (its manifests deleted) and the rewrite is planned again on the new head."""
    table, expected = streamed(lake)

    def delete_meanwhile() -> None:
        lake.catalog.load_table("ns.t").delete(EqualTo("id", 5))

    report = rewrite_while(lake, delete_meanwhile)

    assert report.status == "committed", report.reason
    first, second = sorted(lake.engine.ledger.attempts(table_name="ns.t"), key=lambda a: a.created_at)
    assert first.status == Status.ROLLED_BACK and "no longer in the table's current snapshot" in first.reason
    assert second.status == Status.COMMITTED
    metadata_dir = Path(table.location().removeprefix("file://")) / "metadata"
    assert not list(metadata_dir.glob(f"{first.attempt_id}*"))  # the rolled-back attempt's manifests went
    expected -= Counter(row_key(r) for r in batch(5, 1, "a").to_pylist())
    table.refresh()
    assert rows(spec_rows, table) == expected
    assert rows(duckdb_rows, table) == expected


def test_dry_run_changes_nothing_and_a_paused_table_is_left_alone(lake: Lake):
    table, _ = streamed(lake)
    snapshot = table.current_snapshot().snapshot_id

    dry = lake.engine.rewrite_manifests("ns.t", dry_run=True)

    assert dry.status == "dry_run" and dry.manifests_replaced == 24 and dry.manifests_after == 1
    assert manifests(table) and table.current_snapshot().snapshot_id == snapshot
    assert lake.engine.ledger.attempts(table_name="ns.t") == []
    lake.engine.set_enabled("ns.t", False)
    paused = lake.engine.rewrite_manifests("ns.t")
    assert paused.status == "skipped" and "paused" in paused.reason
    assert len(manifests(table)) == 24


def test_a_crash_before_the_commit_is_rolled_back_and_one_after_it_confirmed(lake: Lake):
    """The process dies (kill -9) with the attempt PREPARED, before and after the Iceberg commit."""
    table, expected = streamed(lake)
    for point, status, count in (
        ("after_prepare", Status.ROLLED_BACK, 24),
        ("after_iceberg_commit", Status.COMMITTED, 1),
    ):
        killed = lake.cli("rewrite-manifests", "ns.t", "--task-id", point, crash_at=point)
        assert killed.returncode == 137, killed.stderr
        [attempt] = lake.engine.ledger.attempts(task_id=point)
        assert attempt.status == Status.PREPARED

        report = lake.engine.recover()

        assert lake.engine.ledger.get(attempt.attempt_id).status == status, report
        assert len(manifests(table)) == count
        assert rows(spec_rows, table) == expected
    metadata_dir = Path(table.location().removeprefix("file://")) / "metadata"
    [rolled_back, committed] = [a.attempt_id for a in sorted(lake.engine.ledger.attempts(), key=lambda a: a.created_at)]
    # Recovery deletes none of a rolled-back rewrite's manifests (a stalled process may still commit
    # them): GC's orphan cleanup does, past its grace period, and keeps the committed ones.
    left = list(metadata_dir.glob(f"{rolled_back}*"))
    assert left and list(metadata_dir.glob(f"{committed}*"))
    orphans_only = GcPolicy(max_snapshot_age_ms=86_400_000, min_snapshots_to_keep=100, orphan_grace_ms=0)
    gc = collect_garbage(lake.table("ns.t"), lake.engine.ledger, orphans_only)
    assert {p.rsplit("/", 1)[-1] for p in gc.orphan_files} >= {p.name for p in left}
    assert not list(metadata_dir.glob(f"{rolled_back}*")) and list(metadata_dir.glob(f"{committed}*"))
    assert rows(spec_rows, lake.table("ns.t")) == expected


def _stall_until_recovered(lake: Lake) -> Callable[[], None]:
    """An after_prepare action: the process stalls past the timeout and another one's recovery,
    taking it for dead, rolls its attempt back."""

    def stall() -> None:
        time.sleep(1.5)  # kept: the stall past the 1 s timeout is what is tested
        assert recover(lake.catalog, lake.engine.ledger, executing_timeout_seconds=1).rolled_back

    return stall


def test_a_stalled_rewrite_that_recovery_rolled_back_does_not_commit(lake: Lake):
    """The process re-checks its attempt right before the commit: ROLLED_BACK, so no snapshot."""
    table, expected = streamed(lake)
    snapshot = table.current_snapshot().snapshot_id
    faults.arm("after_prepare", _stall_until_recovered(lake))
    try:
        with pytest.raises(StaleAttempt, match="found ROLLED_BACK"):
            lake.engine.rewrite_manifests("ns.t")
    finally:
        faults.disarm()
    assert lake.table("ns.t").current_snapshot().snapshot_id == snapshot
    assert lake.engine.rewrite_manifests("ns.t").status == "committed"  # the next run redoes it
    assert len(manifests(table)) == 1 and rows(spec_rows, lake.table("ns.t")) == expected


def test_a_commit_landing_after_recovery_rolled_it_back_lists_only_manifests_that_exist(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
):
    """Recovery steps in between the process's re-check and its commit (the re-check passing
    stands for that window): the commit lands. Recovery deleted none of its manifests, and GC
    (grace 0) deletes none a snapshot references: the table reads the same throughout."""
    table, expected = streamed(lake)
    monkeypatch.setattr(manifest_rewrite, "_still_prepared", lambda ledger, attempt: None)
    faults.arm("after_prepare", _stall_until_recovered(lake))
    try:
        with pytest.raises(StaleAttempt, match="found ROLLED_BACK"):  # confirm_committed, after the commit
            lake.engine.rewrite_manifests("ns.t")
    finally:
        faults.disarm()
    [attempt] = lake.engine.ledger.attempts(table_name="ns.t")
    assert attempt.status == Status.ROLLED_BACK and len(manifests(table)) < 24  # the commit landed

    def check() -> None:
        current = lake.table("ns.t")
        listed = [m.manifest_path for m in current.current_snapshot().manifests(current.io)]
        assert all(current.io.new_input(p).exists() for p in listed)
        assert rows(spec_rows, current) == expected and rows(duckdb_rows, current) == expected

    check()
    orphans_only = GcPolicy(max_snapshot_age_ms=86_400_000, min_snapshots_to_keep=100, orphan_grace_ms=0)
    collect_garbage(lake.table("ns.t"), lake.engine.ledger, orphans_only)
    check()


def test_cli_plan_shows_the_table_level_plan_and_rewrite_manifests_runs_it(lake: Lake):
    streamed(lake, **{"compaction.min-input-files": "100"})  # no compaction due

    plan = lake.cli("plan", "ns.t")
    dry = lake.cli("rewrite-manifests", "ns.t", "--dry-run")
    run = lake.cli("rewrite-manifests", "ns.t")
    again = lake.cli("plan", "ns.t")

    assert plan.returncode == 0, plan.stderr
    assert "table: rewrite-manifests, benefit" in plan.stdout and "24 small manifest(s)" in plan.stdout
    assert dry.returncode == 0 and "would rewrite 24 small manifest(s)" in dry.stdout, dry.stdout + dry.stderr
    assert run.returncode == 0 and "24 -> 1 manifest(s)" in run.stdout, run.stdout + run.stderr
    assert "table: nothing: manifests not due" in again.stdout


def test_an_unpartitioned_table_and_appended_rows_in_one_manifest_each(lake: Lake):
    table = lake.catalog.create_table(
        "ns.flat", schema=SCHEMA, properties={"compaction.rewrite-manifests.min-count": "3"}
    )
    expected: Counter = Counter()
    for i in range(4):
        data = pa.Table.from_pylist(batch(i * 3, 3, "x").to_pylist(), schema=SCHEMA.as_arrow())
        table.append(data)
        expected.update(row_key(r) for r in data.to_pylist())
    before = entries(table)

    report = lake.engine.rewrite_manifests("ns.flat")

    assert report.status == "committed" and report.manifests_after == 1, report
    assert entries(table) == before
    assert rows(spec_rows, table) == expected
    assert rows(duckdb_rows, table) == expected


def test_the_sensor_requests_it_and_the_run_materialises_the_tables_maintenance_asset(lake: Lake):
    """On a real Dagster instance: due and no partition to compact -> a run of the table's
    maintenance asset tagged rewrite-manifests; not again while it is in flight; the run's
    materialisation has kind rewrite-manifests; the next tick finds nothing due."""
    table, expected = streamed(lake, **{"compaction.min-input-files": "100"})
    props = {"compaction.rewrite-manifests.min-count": "10"}
    busy = lake.catalog.create_table("ns.busy", schema=SCHEMA, partition_spec=BY_REGION, properties=props)
    for i in range(12):  # as many small manifests, and fragments worth compacting: compaction first
        busy.append(batch(1000 + i * ROWS, ROWS, "a"))
    defs = build_definitions(load_config(lake.config_path))
    resources = {"compaction": CompactionResource(config_path=str(lake.config_path))}
    sensor = defs.get_sensor_def("fragmentation_sensor")
    with instance_for_test() as instance:

        def evaluate() -> SensorResult:
            return sensor(build_sensor_context(instance=instance, definitions=defs, resources=resources))

        def tick() -> list:
            return evaluate().run_requests

        first = evaluate()
        requests = {r.tags["compaction/table"]: r for r in first.run_requests}

        maintenance = requests["ns.t"]
        tags = dict(maintenance.tags)
        assert maintenance.asset_selection == [MAINTENANCE_KEY] and maintenance.partition_key == "ns.t"
        [added] = [r for r in first.dynamic_partitions_requests if r.partitions_def_name == MAINTENANCE_PARTITIONS.name]
        assert list(added.partition_keys) == ["ns.t"]  # the table becomes a partition of the maintenance asset
        instance.add_dynamic_partitions(MAINTENANCE_PARTITIONS.name, ["ns.t"])
        assert maintenance.tags["compaction/maintenance"] == "rewrite-manifests"
        assert maintenance.tags["compaction/queue"] == "default" and "dagster/priority" in maintenance.tags
        assert requests["ns.busy"].asset_selection == [table_key("ns.busy")]  # a partition compaction
        queued = create_run_for_test(instance, job_name="__ASSET_JOB", status=DagsterRunStatus.STARTING, tags=tags)
        assert "ns.t" not in {r.tags["compaction/table"] for r in tick()}  # in flight
        instance.delete_run(queued.run_id)
        job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection={MAINTENANCE_KEY})

        result = job.execute_in_process(instance=instance, tags=maintenance.tags, partition_key="ns.t")

        assert result.success
        [event] = result.asset_materializations_for_node("maintenance")
        meta = {k: v.value for k, v in event.metadata.items()}
        assert event.asset_key == MAINTENANCE_KEY and event.partition == "ns.t" and meta["table"] == "ns.t"
        assert meta["kind"] == "rewrite-manifests" and meta["status"] == "committed", meta
        assert meta["manifests_before"] == 24 and meta["manifests_after"] == 1
        assert int(meta["snapshot_id"]) == lake.table("ns.t").current_snapshot().snapshot_id
        assert "ns.t" not in {r.tags["compaction/table"] for r in tick()}  # not due any more
    assert rows(spec_rows, lake.table("ns.t")) == expected


def test_policy_keys_come_from_the_table_then_the_file_and_are_validated():
    configured = PolicyConfig(rewrite_manifests_min_count=50)
    assert resolve_policy("ns.t", PolicyConfig(), {}).rewrite_manifests_min_count == 100
    assert resolve_policy("ns.t", PolicyConfig(), {}).manifest_target_size_bytes == 8 * 1024 * 1024
    assert resolve_policy("ns.t", configured, {}).rewrite_manifests_min_count == 50
    tuned = resolve_policy(
        "ns.t", configured, {"compaction.rewrite-manifests.min-count": "7", "commit.manifest.target-size-bytes": "1024"}
    )
    assert (tuned.rewrite_manifests_min_count, tuned.manifest_target_size_bytes) == (7, 1024)
    with pytest.raises(ConfigError, match="rewrite_manifests_min_count must be at least 2"):
        resolve_policy("ns.t", PolicyConfig(), {"compaction.rewrite-manifests.min-count": "1"})
    with pytest.raises(ConfigError, match="commit.manifest.target-size-bytes='8M' is invalid"):
        resolve_policy("ns.t", PolicyConfig(), {"commit.manifest.target-size-bytes": "8M"})


def test_a_format_version_1_table_is_left_as_it_is(lake: Lake):
    """The rewrite writes the format-version-2 entry layout: a v1 table's manifests are not due."""
    props = {"format-version": "1", "compaction.rewrite-manifests.min-count": "3"}
    table = lake.catalog.create_table("ns.v1", schema=SCHEMA, partition_spec=BY_REGION, properties=props)
    for i in range(4):
        table.append(batch(i * ROWS, ROWS, "a"))
    snapshot = lake.table("ns.v1").current_snapshot().snapshot_id

    report = lake.engine.rewrite_manifests("ns.v1")

    assert report.status == "skipped" and "format-version-1 table" in report.reason, report
    assert not lake.engine.plan("ns.v1").manifests.due
    assert lake.table("ns.v1").current_snapshot().snapshot_id == snapshot
    assert lake.engine.ledger.attempts(table_name="ns.v1") == []


def test_an_upgraded_v1_tables_manifests_are_merged_into_the_v2_layout_with_their_sequence_numbers(lake: Lake):
    """12 appends under format version 1, the upgrade, 3 appends: all 15 manifests merge into one
    v2 manifest, the v1 entries with their inherited sequence number 0, the others with their own;
    DuckDB, which refuses the v1-layout manifests of an upgraded table, reads it after."""
    props = {"format-version": "1", "compaction.rewrite-manifests.min-count": "10"}
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION, properties=props)
    for i in range(15):
        if i == 12:
            with table.transaction() as txn:
                txn.upgrade_table_version(2)
        table.append(batch(i * ROWS, ROWS, REGIONS[i % 2]))
    table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    sequence = sequence_numbers(table)
    assert sorted(s for s, _ in sequence.values()) == [0] * 12 + [1, 2, 3]

    report = lake.engine.rewrite_manifests("ns.t")

    assert report.status == "committed" and len(manifests(table)) == 1, report
    table = lake.table("ns.t")
    assert sequence_numbers(table) == sequence
    assert rows(spec_rows, table) == expected and rows(duckdb_rows, table) == expected


def sequence_numbers(table: Table) -> dict[str, tuple[int | None, int | None]]:
    """Data and file sequence numbers of each live file of the current snapshot."""
    entries = [e for m in manifests(table) for e in m.fetch_manifest_entry(table.io, discard_deleted=True)]
    return {e.data_file.file_path: (e.sequence_number, e.file_sequence_number) for e in entries}
