"""Fault matrix: real processes killed at every stage, concurrent services, schema changes and
drops mid-flight. After each: recovery as production runs it (Engine.recover, what the recovery
sensor's run calls), then the invariants against an oracle of acknowledged rows."""

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time

from pyiceberg.types import StringType

import compaction_assets.engine.run as engine_module
from compaction_assets.commit.ledger import Status
from compaction_assets.config import load_config
from compaction_assets.engine import Engine
from compaction_assets.lake.digest import row_hashes
from tests.conftest import CLI, create_fragmented, data_files, write_config
from tests.lakekit.reads import assert_invariants, oracle_of
from tests.lakekit.waiting import wait_until


def test_kill_during_planning(lake):
    oracle = oracle_of(create_fragmented(lake, "ns.t", {"eu": 10}))
    assert lake.cli("compact", "ns.t", crash_at="after_plan").returncode == 137
    assert lake.engine.ledger.attempts() == []  # nothing was started
    lake.engine.recover()
    assert_invariants(lake, "ns.t", oracle)


def test_kill_minus_9_mid_rewrite_is_recovered_at_once(lake):
    oracle = oracle_of(create_fragmented(lake, "ns.t", {"eu": 20, "us": 20}))
    env = {**os.environ, "COMPACTION_CONFIG": str(lake.config_path)}
    process = subprocess.Popen([*CLI, "compact", "ns.t"], env=env, start_new_session=True)

    def both_begun() -> bool:
        assert process.poll() is None, "the compaction never started"
        return len(lake.engine.ledger.attempts(statuses=[Status.EXECUTING])) >= 2

    try:
        # mid-run: both partitions' attempts begun (they are begun one after the other: killing at the
        # first left one to abandon, a race a slow machine lost)
        wait_until(both_begun, 120, interval=0.2, message="the compaction never started")
    finally:  # also when the wait fails or is interrupted: its own session, Ctrl-C does not reach it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the run process and its JVM
        process.wait()

    started = time.monotonic()
    report = lake.engine.recover()
    assert len(report.abandoned) == 2 and time.monotonic() - started < 60
    assert [p.partition_key for p in lake.engine.plan("ns.t").to_compact] == ["region=eu", "region=us"]
    assert_invariants(lake, "ns.t", oracle)


def test_kill_during_gc_leaves_nothing_behind_after_the_next_gc(lake):
    create_fragmented(lake, "ns.t", {"eu": 12})
    lake.engine.compact("ns.t")
    oracle = oracle_of(lake.table("ns.t"))
    with lake.table("ns.t").transaction() as txn:
        txn.set_properties({"history.expire.max-snapshot-age-ms": "0", "compaction.gc.orphan-grace-ms": "0"})
    assert lake.cli("gc", "ns.t", crash_at="gc_after_expire").returncode == 137
    assert len(lake.table("ns.t").metadata.snapshots) == 1  # expired, files not yet deleted
    lake.engine.recover()
    assert_invariants(lake, "ns.t", oracle)  # its GC removes what the killed one left


def test_processes_compacting_different_partitions_at_once_all_commit(lake):
    regions = {"eu": 15, "us": 15, "apac": 15}
    oracle = oracle_of(create_fragmented(lake, "ns.t", regions))
    env = {**os.environ, "COMPACTION_CONFIG": str(lake.config_path)}
    processes = [
        subprocess.Popen([*CLI, "compact", "ns.t", "--partition", f"region={r}"], env=env, stdout=subprocess.PIPE)
        for r in regions
    ]
    assert [p.wait(timeout=300) for p in processes] == [0, 0, 0]
    assert lake.engine.ledger.counts() == {"COMMITTED": 3}  # conflicts were retried, not lost
    assert len(data_files(lake.table("ns.t"))) == 3
    assert_invariants(lake, "ns.t", oracle)


def test_two_services_compacting_the_same_partition_one_backs_off(lake, tmp_path):
    oracle = oracle_of(create_fragmented(lake, "ns.t", {"eu": 30}))
    # A second service: same catalog, its own ledger, so neither sees the other's in-flight files.
    other_root = tmp_path / "other"
    other_root.mkdir()
    doc = json.loads(json.dumps(load_config(lake.config_path).model_dump(exclude={"source"})))
    other_path = write_config(other_root, catalog=doc["catalog"], state={"uri": f"sqlite:///{other_root}/state.db"})
    env = lambda path: {**os.environ, "COMPACTION_CONFIG": str(path)}  # noqa: E731
    both = [
        subprocess.Popen([*CLI, "compact", "ns.t"], env=env(path), stdout=subprocess.PIPE, text=True)
        for path in (lake.config_path, other_path)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in both]
    assert [p.returncode for p in both] == [0, 0], outputs
    other = Engine(load_config(other_path))
    statuses = sorted(
        [*(a.status for a in lake.engine.ledger.attempts()), *(a.status for a in other.ledger.attempts())]
    )
    assert statuses in (["COMMITTED", "ROLLED_BACK"], ["COMMITTED"])  # one wins; a late starter may find nothing
    assert len(data_files(lake.table("ns.t"))) == 1
    assert_invariants(lake, "ns.t", oracle)


def test_schema_change_between_planning_and_commit(lake, monkeypatch):
    oracle_rows = create_fragmented(lake, "ns.t", {"eu": 10}).scan().to_arrow().to_pylist()

    def add_column(name: str) -> None:
        if name == "after_prepare":
            with lake.table("ns.t").update_schema() as update:
                update.add_column("note", StringType())

    monkeypatch.setattr(engine_module, "crash_point", add_column)
    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed"
    assert_invariants(lake, "ns.t", row_hashes([{**r, "note": None} for r in oracle_rows]))


def test_table_dropped_while_committing_fails_the_partition_and_names_the_table(lake, monkeypatch):
    create_fragmented(lake, "ns.t", {"eu": 10})

    def drop(name: str) -> None:
        if name == "after_prepare":
            lake.catalog.drop_table("ns.t")

    monkeypatch.setattr(engine_module, "crash_point", drop)
    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "failed" and "ns.t" in outcome.reason and "recovery" in outcome.reason
    assert [a.status for a in lake.engine.ledger.attempts()] == [Status.PREPARED]  # left for recovery


def test_table_dropped_after_precommit_is_rolled_back_by_recovery(lake):
    create_fragmented(lake, "ns.t", {"eu": 10})
    assert lake.cli("compact", "ns.t", crash_at="after_prepare").returncode == 137
    lake.catalog.drop_table("ns.t")

    report = lake.engine.recover()

    [attempt] = lake.engine.ledger.attempts()
    assert report.rolled_back == [attempt.attempt_id]
    assert attempt.status == Status.ROLLED_BACK and "dropped" in attempt.reason


def test_spark_worker_dying_mid_group_fails_cleanly_and_the_retry_commits(lake):
    oracle = oracle_of(create_fragmented(lake, "ns.t", {"eu": 20}))

    died = lake.cli("compact", "ns.t", crash_at="worker_mid_group")  # the Python worker dies, not the driver

    assert died.returncode == 2 and "rewrite job failed" in died.stderr
    [attempt] = lake.engine.ledger.attempts()
    assert attempt.status == Status.FAILED  # its partial files were deleted
    retried = lake.cli("compact", "ns.t")  # what Dagster's run retry does
    assert retried.returncode == 0, retried.stderr
    assert lake.engine.ledger.counts() == {"FAILED": 1, "COMMITTED": 1}
    assert_invariants(lake, "ns.t", oracle)


def test_catalog_locked_at_commit_time(lake):
    oracle = oracle_of(create_fragmented(lake, "ns.t", {"eu": 20}))
    catalog_db = lake.root / "catalog.db"
    lock = sqlite3.connect(catalog_db, timeout=0)
    lock.execute("BEGIN IMMEDIATE")  # readers go on (planning works); every catalog write waits, then fails
    try:
        run = lake.cli("compact", "ns.t")
    finally:
        lock.rollback()
        lock.close()

    assert "committed" not in run.stdout
    [attempt] = lake.engine.ledger.attempts()
    assert attempt.status in (Status.PREPARED, Status.ROLLED_BACK), attempt
    lake.engine.recover()  # the process is gone: a PREPARED attempt is recommitted now
    assert lake.engine.ledger.attempts(statuses=[Status.PREPARED, Status.EXECUTING]) == []
    assert_invariants(lake, "ns.t", oracle)
