"""Attacks on recovery and GC: histories other engines make that once broke rule 4 (a referenced
file deleted) or left attempts open."""

import os
import time
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.table.statistics import PartitionStatisticsFile
from pyiceberg.table.update import SetPartitionStatisticsUpdate

from compaction_assets.errors import CompactionError
from compaction_assets.lake.digest import rows_digest
from compaction_assets.lake.storage import file_key, is_inside
from compaction_assets.maintenance import gc
from compaction_assets.maintenance.gc import GcPolicy, collect_garbage
from tests.conftest import batch, create_fragmented

KEEP_ONLY_CURRENT = GcPolicy(max_snapshot_age_ms=0, min_snapshots_to_keep=1, orphan_grace_ms=3600_000)
HOUR_AGO = time.time() - 7200


def local(uri: str) -> Path:
    return Path(urlparse(uri).path)


def test_gc_keeps_the_partition_statistics_file_the_table_metadata_references(lake):
    """Java Iceberg's compute_partition_stats writes metadata/partition-stats-<snapshot>-<uuid>.parquet
    and registers it in the table metadata (`partition-statistics`). GC took that .parquet file,
    named by no manifest, for an orphan and deleted it once past the grace period."""
    table = create_fragmented(lake, "ns.t", {"eu": 3})
    snapshot_id = table.current_snapshot().snapshot_id
    stats_path = f"{table.location()}/metadata/partition-stats-{snapshot_id}-0001.parquet"
    pq.write_table(pa.table({"partition": ["eu"], "data_record_count": [150]}), local(stats_path))
    os.utime(local(stats_path), (HOUR_AGO, HOUR_AGO))
    stats = PartitionStatisticsFile(
        snapshot_id=snapshot_id, statistics_path=stats_path, file_size_in_bytes=local(stats_path).stat().st_size
    )
    lake.catalog.commit_table(table, (), (SetPartitionStatisticsUpdate(partition_statistics=stats),))
    table = lake.table("ns.t")
    assert [s.statistics_path for s in table.metadata.partition_statistics] == [stats_path]
    before = rows_digest(table)

    report = collect_garbage(table, lake.engine.ledger, KEEP_ONLY_CURRENT)

    assert stats_path not in report.orphan_files
    assert local(stats_path).exists()
    assert rows_digest(lake.table("ns.t")) == before


def test_gc_does_not_expire_a_snapshot_another_engine_made_current_meanwhile(lake, monkeypatch):
    """GC decides what to expire from the table as read at its start, then lists the table location
    (seconds on an object store). Another engine rolled main back to an old snapshot meanwhile;
    pyiceberg's expire_snapshots has no requirement, so the expiry removed that snapshot and with it
    the main ref: the table read empty. The rollback is run from inside the listing (the real
    listing still runs) to pin the interleaving."""
    table = create_fragmented(lake, "ns.t", {"eu": 1})
    first = table.current_snapshot().snapshot_id
    rows_then = rows_digest(table, snapshot_id=first)
    table.append(batch(10_000, 50, "eu"))
    table.append(batch(20_000, 50, "eu"))
    real_listing = gc.table_files

    def listing_while_another_engine_rolls_back(*args, **kwargs):
        lake.table("ns.t").manage_snapshots().rollback_to_snapshot(first).commit()
        return real_listing(*args, **kwargs)

    monkeypatch.setattr(gc, "table_files", listing_while_another_engine_rolls_back)
    with pytest.raises(CompactionError, match="became a branch or tag head"):  # the next run decides afresh
        collect_garbage(lake.table("ns.t"), lake.engine.ledger, KEEP_ONLY_CURRENT)

    table = lake.table("ns.t")
    assert table.current_snapshot() is not None and table.current_snapshot().snapshot_id == first
    assert rows_digest(table) == rows_then


def test_gc_still_expires_when_another_engine_appends_meanwhile(lake, monkeypatch):
    """The guard above must not starve GC on a table that is appended to all the time."""
    table = create_fragmented(lake, "ns.t", {"eu": 1})
    first = table.current_snapshot().snapshot_id
    table.append(batch(10_000, 50, "eu"))
    real_listing = gc.table_files

    def listing_while_another_engine_appends(*args, **kwargs):
        lake.table("ns.t").append(batch(20_000, 50, "eu"))
        return real_listing(*args, **kwargs)

    monkeypatch.setattr(gc, "table_files", listing_while_another_engine_appends)
    report = collect_garbage(lake.table("ns.t"), lake.engine.ledger, KEEP_ONLY_CURRENT)

    table = lake.table("ns.t")
    assert report.snapshots_expired == [first]
    assert first not in {s.snapshot_id for s in table.metadata.snapshots}
    assert rows_digest(table).rows == 150


def test_gc_with_no_grace_keeps_the_files_of_a_compaction_that_began_while_gc_started(lake):
    """Orphan grace 0 (allowed): GC read the open attempts, then a compaction began and wrote its
    first result file while GC re-read the table, then GC took the time its grace counts from: the
    file was older than that, claimed by no attempt GC knew of, and deleted under the compaction."""
    table = create_fragmented(lake, "ns.t", {"eu": 2})
    ledger = lake.engine.ledger
    out_dir = f"{table.location()}/data/region=eu"
    written = []
    real_refresh = table.refresh

    def refresh_while_a_compaction_begins():
        attempt = ledger.begin("task-1", "ns.t", "region=eu", "minor", None, [], [out_dir], 0, 0)
        path = f"{out_dir}/{attempt.attempt_id}-00000-00000.parquet"
        pq.write_table(pa.table({"id": [1]}), local(path))
        written.append(path)
        time.sleep(0.01)  # kept: the file must be older than the time GC takes next
        return real_refresh()

    table.refresh = refresh_while_a_compaction_begins
    no_grace = GcPolicy(max_snapshot_age_ms=0, min_snapshots_to_keep=1, orphan_grace_ms=0)

    report = collect_garbage(table, ledger, no_grace)

    assert written[0] not in report.orphan_files
    assert local(written[0]).exists()


def test_gc_keeps_a_live_file_the_manifest_spells_with_a_double_slash(lake):
    """Another engine added a data file spelled `.../data//region=eu/x.parquet` (a user-given
    path; the local filesystem and pyiceberg read it as `.../data/region=eu/x.parquet`). The
    listing spells it with one slash, the comparison did not match the two, and GC deleted a live
    file: the table became unreadable. Java's DeleteOrphanFiles compares Hadoop-normalised paths."""
    table = create_fragmented(lake, "ns.t", {"eu": 1})
    real = local(f"{table.location()}/data/region=eu/added-by-hand.parquet")
    pq.write_table(batch(50_000, 10, "eu"), real)
    os.utime(real, (HOUR_AGO, HOUR_AGO))
    spelled = f"{table.location()}/data//region=eu/added-by-hand.parquet"
    table.add_files([spelled])
    before = rows_digest(lake.table("ns.t"))

    report = collect_garbage(lake.table("ns.t"), lake.engine.ledger, KEEP_ONLY_CURRENT)

    assert report.orphan_files == []
    assert real.exists()
    assert rows_digest(lake.table("ns.t")) == before


def test_dot_segments_cannot_take_a_path_outside_the_table_location():
    """`/w/t/data/../../t2/x.parquet` is the file /w/t2/x.parquet, outside table /w/t."""
    assert not is_inside("/w/t/data/../../t2/x.parquet", "/w/t")
    assert not is_inside("file:///w/t/../t2/x.parquet", "file:/w/t/")
    assert is_inside("/w/t/data/./x.parquet", "/w/t")
    assert file_key("/w/t/data//x.parquet") == file_key("file:///w/t/data/x.parquet")
