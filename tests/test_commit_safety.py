"""Two-phase commit under concurrency and crashes: nothing lost, nothing duplicated."""

import pytest

from compaction_assets.commit.ledger import StaleAttempt, Status
from compaction_assets.commit.two_phase import TASK_ID_PROPERTY
from compaction_assets.config import load_config
from compaction_assets.engine import Engine
from compaction_assets.lake.digest import rows_digest
from compaction_assets.lake.storage import files_with_prefix
from tests.conftest import batch, create_fragmented, data_files, make_lake, write_config
from tests.lakekit.crash_points import on_crash_point
from tests.lakekit.reads import rows


@pytest.fixture(params=["sqlite", "postgres"])
def lake(request, tmp_path, spark):
    """Every commit, recovery and concurrency test runs on SQLite and on PostgreSQL."""
    with make_lake(tmp_path, spark, request.param) as lake:
        yield lake


def attempt_files(attempt) -> list[str]:
    return [p for d in attempt.output_dirs for p in files_with_prefix(d, attempt.attempt_id)]


def test_append_between_rewrite_and_commit_is_kept(lake, monkeypatch):
    table = create_fragmented(lake, "ns.t", {"eu": 40})
    expected = rows(table) + batch(10_000, 25, "eu").to_pylist()
    on_crash_point(monkeypatch, "after_prepare", lambda: lake.table("ns.t").append(batch(10_000, 25, "eu")))

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed"
    table = lake.table("ns.t")
    assert rows(table) == sorted(expected, key=lambda r: r["id"])
    assert len(data_files(table)) == 2  # the compacted file and the concurrent append


def test_source_replaced_by_concurrent_compaction_backs_off(lake, monkeypatch, spark, tmp_path):
    table = create_fragmented(lake, "ns.t", {"eu": 40})
    before = rows_digest(table)
    other_root = tmp_path / "other-service"
    other_root.mkdir()
    # Another compaction service on the same catalog, with its own ledger.
    config = load_config(write_config(other_root))
    other_config = config.model_copy(update={"catalog": lake.engine.config.catalog})
    other = Engine(other_config, spark=lambda: spark)
    on_crash_point(monkeypatch, "after_prepare", lambda: other.compact("ns.t"))

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "backed_off"
    assert "no longer live" in outcome.reason
    [attempt] = lake.engine.ledger.attempts()
    assert attempt.status == Status.ROLLED_BACK
    assert attempt_files(attempt) == []  # its own result files are deleted
    [winner] = other.ledger.attempts()
    assert winner.status == Status.COMMITTED
    assert rows_digest(lake.table("ns.t")) == before


def test_crash_after_prepared_then_recover_commits_exactly_once(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 30, "us": 30})
    before, snapshot_before = rows_digest(table), table.current_snapshot().snapshot_id

    run = lake.cli("compact", "ns.t", "--partition", "region=eu", crash_at="after_prepare")

    assert run.returncode == 137, run.stderr
    [attempt] = lake.engine.ledger.attempts()
    assert attempt.status == Status.PREPARED
    assert lake.table("ns.t").current_snapshot().snapshot_id == snapshot_before
    assert len(attempt_files(attempt)) == len(attempt.result_files) == 1

    report = lake.engine.recover()

    assert report.recommitted == [attempt.attempt_id]
    table = lake.table("ns.t")
    tagged = [s for s in table.metadata.snapshots if s.summary[TASK_ID_PROPERTY] == attempt.task_id]
    assert len(tagged) == 1
    assert lake.engine.ledger.get(attempt.attempt_id).status == Status.COMMITTED
    assert rows_digest(table) == before
    assert lake.engine.recover().handled == 0  # idempotent


def test_crash_after_iceberg_commit_then_recover_marks_committed_without_new_snapshot(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 30})
    before = rows_digest(table)

    run = lake.cli("compact", "ns.t", crash_at="after_iceberg_commit")

    assert run.returncode == 137, run.stderr
    [attempt] = lake.engine.ledger.attempts()
    assert attempt.status == Status.PREPARED
    snapshots = len(lake.table("ns.t").metadata.snapshots)

    report = lake.engine.recover()

    assert report.confirmed == [attempt.attempt_id]
    table = lake.table("ns.t")
    assert len(table.metadata.snapshots) == snapshots
    committed = lake.engine.ledger.get(attempt.attempt_id)
    assert committed.status == Status.COMMITTED
    assert committed.committed_snapshot_id == table.current_snapshot().snapshot_id
    assert rows_digest(table) == before


def test_crash_mid_attempt_is_abandoned_and_partition_can_compact_again(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 30})
    snapshot_before = table.current_snapshot().snapshot_id

    run = lake.cli("compact", "ns.t", crash_at="after_rewrite")

    assert run.returncode == 137, run.stderr
    [attempt] = lake.engine.ledger.attempts()
    assert attempt.status == Status.EXECUTING
    assert attempt_files(attempt)  # written, never prepared
    assert lake.engine.plan("ns.t").to_compact == []  # its sources are in flight

    report = lake.engine.recover()  # the dead process is noticed at once, not after the timeout

    assert report.abandoned == [attempt.attempt_id]
    failed = lake.engine.ledger.get(attempt.attempt_id)
    assert failed.status == Status.FAILED and "is gone" in failed.reason
    assert attempt_files(attempt) == []
    assert lake.table("ns.t").current_snapshot().snapshot_id == snapshot_before
    assert [p.partition_key for p in lake.engine.plan("ns.t").to_compact] == ["region=eu"]


def test_ledger_rejects_reports_from_stale_attempts(lake):
    ledger = lake.engine.ledger
    args = dict(table_name="ns.t", partition_key="p=1", kind="minor", base_snapshot_id=1, output_dirs=["/x"])
    first = ledger.begin("task-1", source_files=["a"], rows_in=1, bytes_in=1, **args)
    second = ledger.begin("task-1", source_files=["a"], rows_in=1, bytes_in=1, **args)
    assert (first.attempt_number, second.attempt_number) == (1, 2)

    with pytest.raises(StaleAttempt, match="superseded by attempt 2"):
        ledger.prepare(first.attempt_id, [], 1, 1)
    assert ledger.prepare(second.attempt_id, [], 1, 1).status == Status.PREPARED
    with pytest.raises(StaleAttempt):
        ledger.prepare(second.attempt_id, [], 1, 1)  # reported twice
    assert ledger.mark_committed(second.attempt_id, 42).status == Status.COMMITTED
    with pytest.raises(StaleAttempt):
        ledger.mark_rolled_back(second.attempt_id, "too late")
    with pytest.raises(StaleAttempt):
        ledger.mark_committed(first.attempt_id, 43)
    assert ledger.counts() == {"EXECUTING": 1, "COMMITTED": 1}


def test_append_racing_the_commit_does_not_make_compaction_give_up(lake, monkeypatch):
    import compaction_assets.commit.two_phase as two_phase

    table = create_fragmented(lake, "ns.t", {"eu": 30})
    expected = rows(table) + batch(20_000, 10, "eu").to_pylist()
    real_commit, raced = two_phase._commit_once, []

    def append_first(table, attempt, live):  # noqa: ANN001 - the same signature
        if not raced:  # lands after the liveness check, before our catalog commit
            raced.append(1)
            lake.table("ns.t").append(batch(20_000, 10, "eu"))
        real_commit(table, attempt, live)

    monkeypatch.setattr(two_phase, "_commit_once", append_first)

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed", outcome.reason  # pyiceberg's serializable check failed once
    assert rows(lake.table("ns.t")) == sorted(expected, key=lambda r: r["id"])


def test_compacting_one_partition_keeps_the_others_files_in_a_shared_manifest(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 10, "us": 10})
    with table.transaction() as txn:  # merge manifests at once: eu's and us's files end up in one
        txn.set_properties({"commit.manifest.min-count-to-merge": "2"})
    before = rows_digest(lake.table("ns.t"))

    [eu] = lake.engine.compact("ns.t", partition="region=eu")
    table = lake.table("ns.t")
    [manifest] = table.current_snapshot().manifests(table.io)
    assert eu.status == "committed" and len(data_files(table)) == 11
    [us] = lake.engine.compact("ns.t", partition="region=us")  # rewrites that manifest without us's files

    table = lake.table("ns.t")
    assert us.status == "committed"
    assert sorted(f["partition"]["region"] for f in data_files(table)) == ["eu", "us"]
    assert rows_digest(table) == before
