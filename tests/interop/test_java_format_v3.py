"""Format version 3 with Iceberg Java 1.10: Java writes a v3 table (many small appends, merge-on-read
DELETE and UPDATE: deletion vectors, row lineage), the project compacts it, and Java reads the same
rows with the same `_row_id` and `_last_updated_sequence_number` for every row; Java's metadata
tables agree with pyiceberg's, the snapshot is a `replace`, Java's next appends get fresh row ids
that collide with none, and Java's maintenance (expire_snapshots, rewrite_manifests,
rewrite_data_files) runs on our output.

Run alone: `.venv/bin/pytest tests/interop/test_java_format_v3.py -q` (after `bash tests/interop/setup_java.sh`)."""

from __future__ import annotations

import datetime

import pytest
from dagster import build_sensor_context, instance_for_test
from pyiceberg.manifest import ManifestContent

from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions, table_job
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.lake.features import V3_TIER_REASON
from compaction_assets.lake.files import live_files
from compaction_assets.lake.format_v3 import read_entries, snapshot_manifests
from compaction_assets.lake.v3_fields import CONTENT_OFFSET, MANIFEST_FIRST_ROW_ID, REFERENCED_DATA_FILE, v3_field
from compaction_assets.planning.model import Kind
from tests.interop.checks import assert_rows, compaction_snapshots
from tests.interop.conftest import SharedLake
from tests.interop.race import RACE_AT, raced
from tests.interop.tables import DELETE_TIER, Writer, compact, create_v3, lineage, seed_for


def delete_and_update(w: Writer) -> None:
    """Merge-on-read DELETE and UPDATE (Java writes deletion vectors), mirrored in the oracle."""
    w.sql("DELETE FROM {t} WHERE id % 7 = 0")
    w.oracle = {i: r for i, r in w.oracle.items() if i % 7}
    w.sql("UPDATE {t} SET payload = concat('u-', payload), amount = amount + 1 WHERE id % 5 = 1")
    for r in w.oracle.values():
        if r["id"] % 5 == 1:
            r["payload"], r["amount"] = "u-" + r["payload"], r["amount"] + 1


def java_dvs(lake: SharedLake, name: str) -> int:
    rows = lake.sql(f"SELECT file_format, content FROM {{c}}.{name}.delete_files")
    assert rows and all(r["file_format"] == "PUFFIN" and r["content"] == 1 for r in rows), rows
    return len(rows)


def assert_lineage_kept(
    lake: SharedLake, name: str, before: dict[int, tuple[int, int]], step: str, only: set[int] | None = None
) -> None:
    """Every row (`only`: of these ids) has the _row_id and _last_updated_sequence_number it had."""
    after = lineage(lake, name)
    if only is not None:
        after = {i: v for i, v in after.items() if i in only}
    changed = {i: (before.get(i), after.get(i)) for i in before.keys() | after.keys() if before.get(i) != after.get(i)}
    assert not changed, f"{step}: {len(changed)} row(s) changed _row_id/_last_updated_sequence_number, e.g. " + str(
        sorted(changed.items())[:5]
    )


def assert_fresh_row_ids(lake: SharedLake, w: Writer, before: dict[int, tuple[int, int]]) -> None:
    """Java appends after our commit: the new rows' ids are >= every id before and all ids stay unique."""
    first_new = w.next_id
    w.append(20)
    after = lineage(lake, w.name)
    new_ids = [after[i][0] for i in range(first_new, first_new + 20)]
    assert min(new_ids) > max(row_id for row_id, _ in before.values())
    assert len({row_id for row_id, _ in after.values()}) == len(after), "two rows share a _row_id"
    metadata = lake.table(w.name).metadata
    assert metadata.next_row_id is not None and metadata.next_row_id > max(row_id for row_id, _ in after.values())


def _paths(value: str | None) -> str | None:
    return None if value is None else value.removeprefix("file://").removeprefix("file:")


def assert_v3_metadata_agrees(lake: SharedLake, name: str) -> None:
    """Java's files / entries / manifests / snapshots metadata tables against the project's reading
    of the table (pyiceberg 0.12's inspect tables fail on deletion vectors and drop the v3 fields):
    each live file with its referenced data file, blob offset and first_row_id (inherited as Java
    does), each entry's status and sequence numbers, each manifest's counts and first_row_id."""
    table = lake.table(name)
    java_files = lake.sql(
        f"SELECT content, file_path, record_count, referenced_data_file, content_offset, first_row_id "
        f"FROM {{c}}.{name}.files"
    )
    ours = [
        (
            int(f.data_file.content),
            _paths(f.data_file.file_path),
            f.record_count,
            _paths(v3_field(f.data_file, REFERENCED_DATA_FILE)),
            v3_field(f.data_file, CONTENT_OFFSET),
            f.first_row_id,
        )
        for f in live_files(table)
    ]
    theirs = [
        (
            f["content"],
            _paths(f["file_path"]),
            f["record_count"],
            _paths(f["referenced_data_file"]),
            f["content_offset"],
            f["first_row_id"],
        )
        for f in java_files
    ]
    assert sorted(ours, key=str) == sorted(theirs, key=str), "files: Java and the project list different live files"

    snapshot = table.current_snapshot()
    manifests = snapshot_manifests(snapshot, table.io, table.format_version)
    ours_entries = sorted(
        (int(e.status), e.sequence_number, e.file_sequence_number, _paths(e.data_file.file_path))
        for m in manifests
        for e in read_entries(m, table.io, discard_deleted=False)
    )
    java_entries = sorted(
        (e["status"], e["sequence_number"], e["file_sequence_number"], _paths(e["data_file"]["file_path"]))
        for e in lake.sql(f"SELECT status, sequence_number, file_sequence_number, data_file FROM {{c}}.{name}.entries")
    )
    assert ours_entries == java_entries, "entries: statuses or sequence numbers differ"

    java_manifests = lake.sql(
        f"SELECT path, content, added_data_files_count, existing_data_files_count, deleted_data_files_count, "
        f"added_delete_files_count, existing_delete_files_count, deleted_delete_files_count FROM {{c}}.{name}.manifests"
    )
    theirs_manifests = sorted(
        (
            _paths(m["path"]),
            m["content"],
            m["added_data_files_count"] + m["added_delete_files_count"],
            m["existing_data_files_count"] + m["existing_delete_files_count"],
            m["deleted_data_files_count"] + m["deleted_delete_files_count"],
        )
        for m in java_manifests
    )
    ours_manifests = sorted(
        (_paths(m.manifest_path), int(m.content), m.added_files_count, m.existing_files_count, m.deleted_files_count)
        for m in manifests
    )
    assert ours_manifests == theirs_manifests, "manifests: paths or file counts differ"
    assert all(v3_field(m, MANIFEST_FIRST_ROW_ID) is not None for m in manifests if m.content == ManifestContent.DATA)

    java_snapshots = {
        s["snapshot_id"]: (s["operation"], s["parent_id"])
        for s in lake.sql(f"SELECT snapshot_id, parent_id, operation FROM {{c}}.{name}.snapshots")
    }
    assert java_snapshots == {
        s.snapshot_id: (s.summary.operation.value, s.parent_snapshot_id) for s in table.snapshots()
    }


def test_v3_compaction_applies_deletion_vectors_and_keeps_row_lineage(shared_lake: SharedLake):
    lake = shared_lake
    # manifests merged on commit (Java's appends and ours): entries written again keep first_row_id
    props = {"compaction.delete-file-threshold": "1", "commit.manifest.min-count-to-merge": "3"}
    w = create_v3(lake, "ns.v3", "days(ts)", props)
    for _ in range(8):
        w.append(30)
    delete_and_update(w)
    dvs = java_dvs(lake, "ns.v3")
    expected = w.expected()
    assert_rows(lake, "ns.v3", expected, "Java's write, before compaction", duckdb=False)
    before = lineage(lake, "ns.v3")
    assert len({row_id for row_id, _ in before.values()}) == len(before)

    tplan = lake.engine.plan("ns.v3")
    assert not tplan.refused
    assert sum(p.stats.deletion_vectors for p in tplan.partitions) == dvs  # one per data file, as Java lists them
    assert sum(p.stats.position_delete_files for p in tplan.partitions) == dvs

    compact(lake, "ns.v3", {Kind.MINOR, Kind.MAJOR})
    assert_rows(lake, "ns.v3", expected, "after our compaction", duckdb=False)
    assert_lineage_kept(lake, "ns.v3", before, "after our compaction")
    assert_v3_metadata_agrees(lake, "ns.v3")
    ours = compaction_snapshots(lake, "ns.v3")
    table = lake.table("ns.v3")
    assert table.format_version == 3
    for snapshot_id in ours:
        snapshot = table.snapshot_by_id(snapshot_id)
        assert snapshot.summary.operation.value == "replace"
        assert snapshot.first_row_id is not None and snapshot.added_rows is not None
    assert lake.sql("SELECT count(*) AS n FROM {c}.ns.v3.delete_files")[0]["n"] < dvs

    compacted = set(before)
    assert_fresh_row_ids(lake, w, before)
    java_maintenance_v3(lake, w, compacted)


def java_maintenance_v3(lake: SharedLake, w: Writer, compacted: set[int]) -> None:
    """Java's expire_snapshots, rewrite_manifests and rewrite_data_files on our output, each read
    back: same rows, same lineage. Iceberg Java 1.10.2's rewrite_manifests itself gives new row ids
    to rows whose files hold no `_row_id` column (seen on a table only Java wrote: the rewritten
    manifests drop the inherited first_row_id), so across it lineage is checked for the rows our
    compaction wrote (`compacted` ids: their ids are in their files)."""
    expected, before = w.expected(), lineage(lake, w.name)
    table = w.name.split(".", 1)[1]
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(seconds=1)
    older = f"TIMESTAMP '{now}'"
    for step, call in [
        ("expire_snapshots", f"expire_snapshots(table => 'ns.{table}', older_than => {older}, retain_last => 1)"),
        ("rewrite_manifests", f"rewrite_manifests('ns.{table}')"),
        ("rewrite_data_files", f"rewrite_data_files(table => 'ns.{table}', options => map('min-input-files', '2'))"),
    ]:
        lake.sql(f"CALL {{c}}.system.{call}")
        assert_rows(lake, w.name, expected, f"after Java's {step}", duckdb=False)
        if step == "rewrite_manifests":
            before = {i: v for i, v in before.items() if i in compacted}
            assert_lineage_kept(lake, w.name, before, f"after Java's {step}", only=compacted)
            before = lineage(lake, w.name)
        else:
            assert_lineage_kept(lake, w.name, before, f"after Java's {step}")
    assert_v3_metadata_agrees(lake, w.name)


def test_the_sensor_compacts_a_v3_table(shared_lake: SharedLake):
    """The Dagster path: the fragmentation sensor asks for a run of the v3 table, the run compacts
    it (deletion vectors applied), and Java reads the same rows with the same lineage."""
    lake = shared_lake
    w = create_v3(lake, "ns.sensed", "days(ts)", {"compaction.delete-file-threshold": "1"})
    for _ in range(6):
        w.append(30)
    delete_and_update(w)
    expected, before = w.expected(), lineage(lake, "ns.sensed")
    config = str(lake.root / "compaction.yaml")
    defs = build_definitions(load_config(config))
    resources = {"compaction": CompactionResource(config_path=config)}
    with instance_for_test() as instance:
        sensor = defs.get_sensor_def("fragmentation_sensor")
        tick = sensor(build_sensor_context(instance=instance, definitions=defs, resources=resources))
        assert tick.run_requests, "the sensor asked for no run of the v3 table"
        for r in tick.dynamic_partitions_requests:  # what the daemon does before it launches the run
            instance.add_dynamic_partitions(r.partitions_def_name, r.partition_keys)
        for request in tick.run_requests:
            assert request.tags["compaction/table"] == "ns.sensed"
            job = table_job(defs, "ns.sensed")
            run = job.execute_in_process(instance=instance, tags=request.tags, partition_key=request.partition_key)
            assert run.success
            checks = run.get_asset_check_evaluations()
            assert checks and all(c.passed for c in checks)
    assert compaction_snapshots(lake, "ns.sensed")
    assert_rows(lake, "ns.sensed", expected, "after the sensor's run", duckdb=False)
    assert_lineage_kept(lake, "ns.sensed", before, "after the sensor's run")
    assert_v3_metadata_agrees(lake, "ns.sensed")


def test_java_commits_racing_our_v3_compactions_keep_rows_and_lineage(shared_lake: SharedLake):
    """Java appends, deletes and updates (merge-on-read: deletion vectors) at each of our race points
    (before our commit's first try, between its checks and the catalog swap): after each compaction
    Java reads the oracle's rows; every row keeps its _row_id (and its sequence number, unless Java
    updated it then), and no two rows share an id (our snapshot's row ids start at the next-row-id of
    the head it lands on, after Java's append)."""
    lake = shared_lake
    w = create_v3(lake, "ns.raced", "days(ts)", {"compaction.min-input-files": "3", "commit.retry.num-retries": "2"})
    for _ in range(6):
        w.append(12)
    updated: set[int] = set()

    def java(op: str, m: int) -> None:
        if op == "append":
            w.append(10)
        elif op == "delete":
            w.sql(f"DELETE FROM {{t}} WHERE id % {m} = 1")
            w.oracle = {i: r for i, r in w.oracle.items() if i % m != 1}
        else:
            w.sql(f"UPDATE {{t}} SET payload = concat('r-', payload) WHERE id % {m} = 2")
            for i, r in w.oracle.items():
                if i % m == 2:
                    r["payload"] = "r-" + r["payload"]
                    updated.add(i)

    outcomes = []
    for step, (at, op) in enumerate((at, op) for at in RACE_AT for op in ("append", "delete", "update")):
        for _ in range(3):
            w.append(6)
        before = lineage(lake, "ns.raced")
        updated.clear()
        with raced(at, lambda op=op, step=step: java(op, 3 + step)):
            outcomes += [o.status for o in lake.engine.compact("ns.raced")]
        assert_rows(lake, "ns.raced", w.expected(), f"after {op} at {at}", duckdb=False)
        after = lineage(lake, "ns.raced")
        kept = {i: v for i, v in before.items() if i in after}
        moved = {
            i: (v, after[i]) for i, v in kept.items() if after[i][0] != v[0] or (after[i] != v and i not in updated)
        }
        assert not moved, f"{op} at {at}: rows changed lineage, e.g. {sorted(moved.items())[:3]}"
        ids = [row_id for row_id, _ in after.values()]
        assert len(set(ids)) == len(ids), f"{op} at {at}: two rows share a _row_id"
        assert lake.table("ns.raced").metadata.next_row_id > max(ids)
    print(f"\nv3 races: {outcomes}")
    assert "committed" in outcomes


# data rewrites other than minor and major on a v3 table, each with the table properties that make it
# the one planned (besides minor/major where listed)
V3_REWRITES = {
    Kind.FULL: {"compaction.full.trigger-interval-ms": "1", "compaction.min-input-files": "100"},
    Kind.SPLIT: {"compaction.max-file-size-bytes": "2000", "compaction.target-file-size-bytes": "1000"},
    Kind.CLUSTER: {"compaction.cluster.min-overlap": "2", "compaction.target-file-size-bytes": "4000"},
    Kind.OLD_SPEC: {},
}


@pytest.mark.parametrize("kind", list(V3_REWRITES), ids=str)
def test_v3_rewrites_keep_row_lineage(shared_lake: SharedLake, kind: Kind):
    lake = shared_lake
    name = f"ns.v3_{kind.value.replace('-', '_')}"
    partitioned_by = {Kind.SPLIT: "", Kind.OLD_SPEC: "bucket(2, id)"}.get(kind, "days(ts)")
    w = create_v3(lake, name, partitioned_by, V3_REWRITES[kind])
    seed_for(w, kind, appends=4)
    if kind == Kind.OLD_SPEC:
        w.sql("ALTER TABLE {t} ADD PARTITION FIELD days(ts)")
        w.append(40)
    if kind not in (Kind.SPLIT, Kind.CLUSTER):  # deletes would make a major rewrite the one planned
        delete_and_update(w)
    expected, before = w.expected(), lineage(lake, name)
    kinds = {kind, Kind.MINOR, Kind.MAJOR} if kind == Kind.OLD_SPEC else {kind, Kind.MAJOR}
    done = compact(lake, name, kinds)
    assert kind in {o.kind for o in done}
    assert_rows(lake, name, expected, f"after our {kind}", duckdb=False)
    assert_lineage_kept(lake, name, before, f"after our {kind}")
    assert_v3_metadata_agrees(lake, name)
    assert_fresh_row_ids(lake, w, before)


def test_v3_delete_tiers_are_refused_and_pause_resume_gc_work(shared_lake: SharedLake):
    lake = shared_lake
    props = {**DELETE_TIER, "write.delete.granularity": "partition", "compaction.position-delete-file-threshold": "2"}
    w = create_v3(lake, "ns.tiers", "days(ts)", props)
    for _ in range(3):
        w.append(40)
    for m in (3, 5, 11):
        w.sql(f"DELETE FROM {{t}} WHERE id % {m} = 0")
    w.oracle = {i: r for i, r in w.oracle.items() if i % 3 and i % 5 and i % 11}
    tplan = lake.engine.plan("ns.tiers")
    assert not tplan.to_compact
    assert all(V3_TIER_REASON in p.reason for p in tplan.partitions), [p.reason for p in tplan.partitions]

    # pause, resume and gc commit v3 metadata Java reads on (pyiceberg 0.12 alone cannot write it)
    expected, before = w.expected(), lineage(lake, "ns.tiers")
    next_row_id = lake.table("ns.tiers").metadata.next_row_id
    lake.engine.set_enabled("ns.tiers", False)
    assert lake.sql("SHOW TBLPROPERTIES {c}.ns.tiers ('compaction.enabled')")[0]["value"] == "false"
    lake.engine.set_enabled("ns.tiers", True)
    lake.engine.gc("ns.tiers")
    assert lake.table("ns.tiers").metadata.next_row_id == next_row_id > max(row_id for row_id, _ in before.values())
    assert_rows(lake, "ns.tiers", expected, "after pause, resume and gc", duckdb=False)
    assert_lineage_kept(lake, "ns.tiers", before, "after pause, resume and gc")
    w.append(10)  # Java commits on the metadata we wrote
    assert len(lineage(lake, "ns.tiers")) == len(before) + 10
