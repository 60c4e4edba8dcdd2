"""Recovery and GC against table histories other engines make: expiry of our snapshot, paths
spelled differently, percent-encoded partition directories; and rule 4: no referenced or claimed
file is ever deleted."""

import math
import os
import shutil
import time
from contextlib import nullcontext
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.parquet as pq
import pytest

from compaction_assets.commit.ledger import Ledger, Status
from compaction_assets.commit.recovery import PARK_AFTER, recover
from compaction_assets.errors import CompactionError
from compaction_assets.iceberg_compat.arrow import dataframe_to_data_files
from compaction_assets.lake.datafile_codec import datafile_from_json, datafile_to_json
from compaction_assets.lake.digest import rows_digest
from compaction_assets.lake.files import live_data_files_by_path
from compaction_assets.lake.storage import (
    Claims,
    PathSet,
    PrefixMismatch,
    delete_unreferenced,
    file_key,
    files_with_prefix,
    table_files,
)
from compaction_assets.maintenance.gc import ORPHAN_SUFFIXES, GcPolicy, collect_garbage
from compaction_tools.demo import append_fragments
from tests.conftest import BY_REGION, SCHEMA, batch, create_fragmented, data_files, postgres_schema

KEEP_ONLY_CURRENT = GcPolicy(max_snapshot_age_ms=0, min_snapshots_to_keep=1, orphan_grace_ms=3600_000)
HOUR_AGO = time.time() - 7200


def local(uri: str) -> Path:
    return Path(urlparse(uri).path)


def prepare_by_hand(lake, name: str, task_id: str, corrupt: bool = False):
    """A PREPARED attempt rewriting every file of `name` into one, built without Spark (pyiceberg
    writes the result file); `corrupt` drops a field from its ledger record, so recommitting raises."""
    table = lake.table(name)
    sources = sorted(live_data_files_by_path(table))
    [result] = dataframe_to_data_files(table.metadata, table.scan().to_arrow(), table.io)
    result.spec_id = table.spec().spec_id  # pyiceberg 0.12 leaves it unset until the file is appended
    doc = datafile_to_json(result)
    if corrupt:
        del doc["record_count"]
    ledger = lake.engine.ledger
    out_dir = result.file_path.rsplit("/", 1)[0]
    rows = result.record_count
    attempt = ledger.begin(
        task_id, name, "region=eu", "minor", table.current_snapshot().snapshot_id, sources, [out_dir], rows, 1
    )
    return ledger.prepare(attempt.attempt_id, [doc], rows, result.file_size_in_bytes)


def test_recovery_after_another_engine_expired_our_snapshot_keeps_the_committed_files(lake):
    """r2: crash after the Iceberg commit, an append, the compaction snapshot expired by another
    engine (pyiceberg), then recover: the attempt is committed, its files stay live and readable."""
    table = create_fragmented(lake, "ns.t", {"eu": 10})
    run = lake.cli("compact", "ns.t", crash_at="after_iceberg_commit")
    assert run.returncode == 137, run.stderr
    [attempt] = lake.engine.ledger.attempts()
    table = lake.table("ns.t")
    compaction = table.current_snapshot().snapshot_id
    table.append(batch(90_000, 5, "eu"))
    before = rows_digest(lake.table("ns.t"))
    lake.table("ns.t").maintenance.expire_snapshots().by_id(compaction).commit()
    assert compaction not in {s.snapshot_id for s in lake.table("ns.t").metadata.snapshots}

    report = lake.engine.recover()

    assert report.confirmed == [attempt.attempt_id] and report.errors == []
    committed = lake.engine.ledger.get(attempt.attempt_id)
    assert committed.status == Status.COMMITTED
    assert committed.committed_snapshot_id == compaction  # the snapshot that added them, though expired
    table = lake.table("ns.t")
    assert all(local(f["file_path"]).exists() for f in data_files(table))
    assert {d["file_path"] for d in attempt.result_files} <= {f["file_path"] for f in data_files(table)}
    assert rows_digest(table) == before


def test_one_attempt_that_raises_does_not_stop_the_others_and_is_parked_at_last(lake):
    """r4 (recovery half): a bad attempt is reported by table and id, the good one is recommitted;
    after PARK_AFTER failed recoveries the bad one is parked, with nothing deleted."""
    create_fragmented(lake, "ns.bad", {"eu": 4})
    create_fragmented(lake, "ns.good", {"eu": 4})
    bad = prepare_by_hand(lake, "ns.bad", "bad-task", corrupt=True)  # first in the ledger
    good = prepare_by_hand(lake, "ns.good", "good-task")
    bad_before, good_before = rows_digest(lake.table("ns.bad")), rows_digest(lake.table("ns.good"))

    report = recover(lake.catalog, lake.engine.ledger, executing_timeout_seconds=0)

    assert report.recommitted == [good.attempt_id]
    [error] = report.errors
    assert error.startswith(f"ns.bad attempt {bad.attempt_id}: KeyError")
    assert lake.engine.ledger.get(bad.attempt_id).status == Status.PREPARED
    assert rows_digest(lake.table("ns.good")) == good_before and len(data_files(lake.table("ns.good"))) == 1

    for _ in range(PARK_AFTER - 1):
        report = recover(lake.catalog, lake.engine.ledger, executing_timeout_seconds=0)
    assert report.parked == [bad.attempt_id] and report.errors == []
    parked = lake.engine.ledger.get(bad.attempt_id)
    assert parked.status == Status.FAILED and "KeyError" in parked.reason
    assert local(bad.result_files[0]["file_path"]).exists()  # parked: nothing deleted
    assert rows_digest(lake.table("ns.bad")) == bad_before
    run = lake.cli("recover")
    assert run.returncode == 0 and "0 parked" in run.stdout, run.stderr


def test_recovery_never_recommits_result_files_that_are_gone(lake):
    create_fragmented(lake, "ns.t", {"eu": 4})
    attempt = prepare_by_hand(lake, "ns.t", "task")
    local(attempt.result_files[0]["file_path"]).unlink()  # e.g. removed by another engine's orphan cleanup
    before = rows_digest(lake.table("ns.t"))

    report = recover(lake.catalog, lake.engine.ledger, executing_timeout_seconds=0)

    assert report.rolled_back == [attempt.attempt_id]
    assert "gone" in lake.engine.ledger.get(attempt.attempt_id).reason
    assert rows_digest(lake.table("ns.t")) == before and len(data_files(lake.table("ns.t"))) == 4


@pytest.mark.parametrize("spelling", ["plain", "file1", "file3"])
def test_gc_keeps_live_files_whatever_the_spelling_of_their_path(lake, spelling):
    """r9: files registered as /abs, file:/abs or file:///abs are one file to GC."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    append_fragments(table, [batch(0, 50, "eu")])
    table = lake.table("ns.t")
    imported = local(table.location()) / "data" / "region=eu" / "imported-0.parquet"
    pq.write_table(batch(5000, 20, "eu"), imported)
    table.add_files([{"plain": str(imported), "file1": f"file:{imported}", "file3": f"file://{imported}"}[spelling]])
    os.utime(imported, (HOUR_AGO, HOUR_AGO))
    before = rows_digest(lake.table("ns.t"))

    report = collect_garbage(lake.table("ns.t"), lake.engine.ledger, KEEP_ONLY_CURRENT)

    assert report.orphan_files == []
    assert imported.exists() and rows_digest(lake.table("ns.t")) == before


def test_gc_stops_on_a_path_it_cannot_match_by_scheme(lake):
    """Java's PrefixMismatchMode.ERROR: a listed file whose path a snapshot references under another
    scheme might be that file; GC names it and expires and deletes nothing."""
    table = create_fragmented(lake, "ns.t", {"eu": 2})
    real = next(iter(live_data_files_by_path(table).values()))
    listed = local(real.file_path).with_name("copied.parquet")
    shutil.copy(local(real.file_path), listed)
    os.utime(listed, (HOUR_AGO, HOUR_AGO))
    crafted = datafile_from_json({**datafile_to_json(real), "file_path": f"hdfs://namenode{listed}"})
    with table.transaction() as txn, txn.update_snapshot().fast_append() as append:
        append.append_data_file(crafted)
    snapshots = len(lake.table("ns.t").metadata.snapshots)

    with pytest.raises(PrefixMismatch, match=str(listed)):
        collect_garbage(lake.table("ns.t"), lake.engine.ledger, KEEP_ONLY_CURRENT)

    assert listed.exists() and len(lake.table("ns.t").metadata.snapshots) == snapshots


def test_paths_compare_as_java_delete_orphan_files_compares_them():
    assert file_key("/a/b") == file_key("file:/a/b") == file_key("file:///a/b")
    assert file_key("s3a://bucket/k") == file_key("s3n://bucket/k") == file_key("s3://bucket/k")
    assert file_key("file:///d/region=a%2Fb/f") != file_key("file:///d/region=a/b/f")  # never decoded
    held = PathSet(["/a/b", "s3://bucket/k"])
    assert "file:///a/b" in held and "file:/a/b" in held and "s3a://bucket/k" in held
    assert "/a/c" not in held
    with pytest.raises(PrefixMismatch, match="s3://other/k"):
        "s3://other/k" in held  # noqa: B015 - same path, another bucket: cannot be decided
    with pytest.raises(PrefixMismatch, match="gs://bucket/k"):
        "gs://bucket/k" in held  # noqa: B015


SPECIAL = ["a/b", "x y", "50%", "é+1", "q?#&=,"]


def test_listing_finds_files_under_percent_encoded_partition_directories(lake):
    """r10: table_files and files_with_prefix list the directories Iceberg percent-encodes, and
    spell each file exactly as the manifests do."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    append_fragments(table, [batch(i * 10, 10, v) for i, v in enumerate(SPECIAL)])
    table = lake.table("ns.t")
    live = [f["file_path"] for f in data_files(table)]
    assert len(live) == len(SPECIAL)

    for path in live:
        directory, name = path.rsplit("/", 1)
        assert files_with_prefix(directory, name[:8]) == [path]
        assert files_with_prefix(directory, name[:8], table.io) == [path]  # through the table's FileIO
    assert set(live) <= set(table_files(table.location(), ORPHAN_SUFFIXES))
    assert set(live) <= set(table_files(table.location(), ORPHAN_SUFFIXES, table.io))


def test_gc_reads_the_table_after_the_open_attempts(lake):
    """GC handed a table read before a recovery recommitted an attempt (whose files were written
    long ago) keeps that attempt's files: it reads open attempts first, then the table."""
    create_fragmented(lake, "ns.t", {"eu": 4})
    attempt = prepare_by_hand(lake, "ns.t", "task")
    result = local(attempt.result_files[0]["file_path"])
    os.utime(result, (HOUR_AGO, HOUR_AGO))
    stale = lake.table("ns.t")
    before = rows_digest(stale)
    assert recover(lake.catalog, lake.engine.ledger, executing_timeout_seconds=0).recommitted == [attempt.attempt_id]

    report = collect_garbage(stale, lake.engine.ledger, KEEP_ONLY_CURRENT)

    assert str(result) not in {str(local(p)) for p in report.orphan_files}
    assert result.exists() and rows_digest(lake.table("ns.t")) == before


def test_gc_counts_files_of_expired_snapshots_once_and_keeps_those_an_open_attempt_reads(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 3})
    replaced = [f["file_path"] for f in data_files(table)]
    table.overwrite(batch(10_000, 20, "eu"))  # another engine replaces every file
    # an attempt still reading one of the replaced files (its process is alive)
    lake.engine.ledger.begin("task", "ns.t", "region=eu", "minor", None, [replaced[0]], ["file:///nowhere"], 1, 1)

    report = collect_garbage(
        lake.table("ns.t"), lake.engine.ledger, KEEP_ONLY_CURRENT, now_ms=int(time.time() * 1000) + 10 * 3600_000
    )

    assert set(report.expired_files).isdisjoint(report.orphan_files)
    assert set(replaced[1:]) <= set(report.expired_files) and replaced[0] not in report.expired_files
    assert report.files_deleted == len(set(report.expired_files) | set(report.orphan_files))
    assert local(replaced[0]).exists() and not any(local(p).exists() for p in replaced[1:])


def test_no_deletion_path_deletes_a_referenced_or_claimed_file(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 3})
    live = sorted(live_data_files_by_path(table))
    unreferenced = local(live[0]).with_name("leftover.parquet")
    shutil.copy(local(live[0]), unreferenced)
    claimed = local(live[0]).with_name("abc123-00000.parquet")
    shutil.copy(local(live[0]), claimed)
    spelled_plain = str(local(live[1]))  # a live file, spelled /abs rather than file:///abs

    deleted = delete_unreferenced(
        table, [live[0], spelled_plain, f"file://{unreferenced}", f"file://{claimed}"], Claims(prefixes=("abc123",))
    )

    assert deleted == 1 and not unreferenced.exists() and claimed.exists()
    assert all(local(p).exists() for p in live)
    assert rows_digest(lake.table("ns.t")).rows == 150


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_ledger_keeps_nan_and_infinite_partition_values(tmp_path, backend):
    with postgres_schema() if backend == "postgres" else nullcontext(f"sqlite:///{tmp_path / 'state.db'}") as uri:
        ledger = Ledger(uri)
        try:
            attempt = ledger.begin("t", "ns.t", "x=NaN", "minor", None, ["a"], ["/d"], 1, 1)
            doc = {"file_path": "/d/f", "partition": [float("nan"), float("inf"), float("-inf"), 1.5, {"date": "x"}]}
            prepared = ledger.prepare(attempt.attempt_id, [doc], 1, 1)
            [back] = ledger.get(prepared.attempt_id).result_files
        finally:
            ledger.dispose()
    nan, inf, ninf, plain, tagged = back["partition"]
    assert math.isnan(nan) and inf == math.inf and ninf == -math.inf and plain == 1.5 and tagged == {"date": "x"}


def test_task_ids_with_a_comma_are_refused(lake):
    """Task ids of attempts committed together are listed comma-separated in the snapshot summary."""
    with pytest.raises(CompactionError, match="comma"):
        lake.engine.ledger.begin("a,b", "ns.t", "", "minor", None, [], ["/d"], 0, 0)
