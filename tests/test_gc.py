"""GC: expired snapshots' files and old orphans go; retained, in-flight and fresh files stay."""

import json
import os
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from compaction_assets.config import GcConfig
from compaction_assets.lake.datafile_codec import datafile_from_json, datafile_to_json
from compaction_assets.lake.digest import rows_digest
from compaction_assets.lake.files import live_data_files_by_path
from compaction_assets.lake.storage import OutsideTableLocation
from compaction_assets.maintenance.gc import GcPolicy, collect_garbage
from compaction_tools.demo import append_fragments
from tests.conftest import batch, create_fragmented, data_files

KEEP_ONLY_CURRENT = GcPolicy(max_snapshot_age_ms=0, min_snapshots_to_keep=1, orphan_grace_ms=3600_000)


def local(uri: str) -> Path:
    return Path(urlparse(uri).path)


def compacted_table(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 20, "us": 20})
    small = [f["file_path"] for f in data_files(table)]
    [*_] = lake.engine.compact("ns.t")
    return lake.table("ns.t"), small


def test_gc_deletes_replaced_files_and_keeps_the_current_snapshot(lake):
    table, small = compacted_table(lake)
    before = rows_digest(table)
    current = [f["file_path"] for f in data_files(table)]

    report = collect_garbage(table, lake.engine.ledger, KEEP_ONLY_CURRENT)

    table = lake.table("ns.t")
    assert [s.snapshot_id for s in table.metadata.snapshots] == [table.current_snapshot().snapshot_id]
    assert len(report.snapshots_expired) == 1  # the fragments' append (both partitions commit together)
    assert set(small) <= set(report.expired_files)
    assert not any(local(p).exists() for p in small)
    assert all(local(p).exists() for p in current)
    assert report.bytes_reclaimed > 0
    assert rows_digest(table) == before


def test_files_of_retained_snapshots_survive(lake):
    table, small = compacted_table(lake)
    everything = GcPolicy(max_snapshot_age_ms=0, min_snapshots_to_keep=3, orphan_grace_ms=3600_000)

    report = collect_garbage(table, lake.engine.ledger, everything)

    assert report.snapshots_expired == [] and report.expired_files == []
    assert all(local(p).exists() for p in small)
    oldest = lake.table("ns.t").metadata.snapshots[0].snapshot_id
    assert rows_digest(lake.table("ns.t"), snapshot_id=oldest).rows == 40 * 50  # time travel still works


def test_orphans_past_grace_go_but_fresh_and_in_flight_files_stay(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 6})
    data_dir = local(table.location()) / "data" / "region=eu"
    attempt = lake.engine.ledger.begin(
        "task", "ns.t", "region=eu", "minor", None, [], [f"file://{data_dir}"], 0, 0
    )  # EXECUTING, owned by this live process
    old = time.time() - 7200
    owned = data_dir / f"{attempt.attempt_id}-00000-00000.parquet"
    orphan, fresh = data_dir / "crashed-writer-00000.parquet", data_dir / "writer-in-progress.parquet"
    for path in (owned, orphan, fresh):
        path.write_bytes(b"x" * 100)
    os.utime(owned, (old, old))
    os.utime(orphan, (old, old))

    report = collect_garbage(table, lake.engine.ledger, KEEP_ONLY_CURRENT)

    assert report.orphan_files == [f"file://{orphan}"]
    assert not orphan.exists() and owned.exists() and fresh.exists()
    assert len(live_data_files_by_path(lake.table("ns.t"))) == 6 and rows_digest(lake.table("ns.t")).rows == 300


def test_dry_run_changes_nothing(lake):
    table, small = compacted_table(lake)
    snapshots = len(table.metadata.snapshots)

    report = collect_garbage(table, lake.engine.ledger, KEEP_ONLY_CURRENT, dry_run=True)

    assert report.dry_run and set(small) <= set(report.expired_files)
    assert len(lake.table("ns.t").metadata.snapshots) == snapshots
    assert all(local(p).exists() for p in small)
    run = lake.cli("gc", "ns.t", "--dry-run")
    assert run.returncode == 0 and "would expire" in run.stdout
    assert all(local(p).exists() for p in small)


def test_a_path_outside_the_table_location_is_refused(lake, tmp_path):
    table = create_fragmented(lake, "ns.t", {"eu": 2})
    # A crafted manifest entry: a data file outside the table's location, added then removed.
    real = next(iter(live_data_files_by_path(table).values()))
    outside = tmp_path / "elsewhere" / "victim.parquet"
    outside.parent.mkdir()
    outside.write_bytes(local(real.file_path).read_bytes())
    crafted = datafile_from_json({**datafile_to_json(real), "file_path": f"file://{outside}"})
    with table.transaction() as txn, txn.update_snapshot().fast_append() as append:
        append.append_data_file(crafted)
    with table.transaction() as txn, txn.update_snapshot().overwrite() as overwrite:
        overwrite.delete_data_file(crafted)
    append_fragments(table, [batch(9_000, 5, "eu")])
    snapshots = len(lake.table("ns.t").metadata.snapshots)

    with pytest.raises(OutsideTableLocation, match=str(outside)):
        collect_garbage(lake.table("ns.t"), lake.engine.ledger, KEEP_ONLY_CURRENT)

    assert outside.exists()
    assert len(lake.table("ns.t").metadata.snapshots) == snapshots  # nothing expired either


def test_paused_table_is_left_alone_and_policy_comes_from_table_properties(lake):
    table, small = compacted_table(lake)
    run = lake.cli("pause", "ns.t")
    assert run.returncode == 0 and "paused" in run.stdout
    assert lake.table("ns.t").properties["compaction.enabled"] == "false"
    assert lake.engine.gc("ns.t").paused
    assert all(local(p).exists() for p in small)
    assert "paused" in lake.engine.plan("ns.t").partitions[0].reason

    lake.engine.set_enabled("ns.t", True)
    with lake.table("ns.t").transaction() as txn:
        txn.set_properties({"history.expire.max-snapshot-age-ms": "0"})
    policy = GcPolicy.resolve("ns.t", GcConfig(), lake.table("ns.t").properties)
    assert policy.max_snapshot_age_ms == 0 and policy.min_snapshots_to_keep == 1
    report = lake.engine.gc("ns.t")
    assert set(small) <= set(report.expired_files)


def test_status_shows_a_paused_table_as_paused(lake):
    create_fragmented(lake, "ns.t", {"eu": 6})
    assert lake.cli("pause", "ns.t").returncode == 0

    run = lake.cli("status")

    assert run.returncode == 0, run.stderr
    [line] = [x for x in run.stdout.splitlines() if x.startswith("ns.t ")]
    assert "PAUSED" in line
    doc = json.loads(lake.cli("status", "--json").stdout)
    assert doc["tables"][0]["paused"] is True and doc["tables"][0]["fragments"] == 6
