"""What every interop test asserts after we touched a table Java wrote: both readers return the
oracle's rows, Java's metadata tables agree with pyiceberg's, and Java's own maintenance runs on
our output (each step read back)."""

from __future__ import annotations

import datetime
import time
from collections import Counter

from tests.interop.conftest import SharedLake
from tests.interop.java import comparable
from tests.lakekit.duckdb_reader import duckdb_multiset
from tests.lakekit.oracle import Row, diff


def assert_rows(lake: SharedLake, name: str, expected: Counter[Row], step: str, duckdb: bool = True) -> None:
    """Java, pyiceberg (unless the table has equality deletes, which pyiceberg 0.12 cannot read) and
    DuckDB (unless told not to) each read exactly `expected`."""
    readers = {"java": lake.java_multiset(name)}
    snapshot = lake.table(name).current_snapshot()
    if snapshot is None or snapshot.summary.get("total-equality-deletes", "0") == "0":
        readers["pyiceberg"] = lake.ours_multiset(name)
    if duckdb:
        readers["duckdb"] = Counter(comparable(dict(r)) for r in duckdb_multiset(lake.table(name)).elements())
    for reader, actual in readers.items():
        d = diff(expected, actual)
        assert d.ok, f"{step}: {reader} read {d} against the oracle ({sum(actual.values())} rows)"


def _paths(value: str) -> str:
    return value.removeprefix("file://").removeprefix("file:")


def assert_metadata_agrees(lake: SharedLake, name: str, expired: bool = False) -> None:
    """Java's files / entries / manifests / snapshots metadata tables against pyiceberg's
    (`expired`: our snapshots are data expirations, which are not `replace`)."""
    table = lake.table(name)
    ours_files = table.inspect.files().to_pylist()
    java_files = lake.sql(f"SELECT content, file_path, record_count FROM {{c}}.{name}.files")
    assert sorted((f["content"], _paths(f["file_path"]), f["record_count"]) for f in ours_files) == sorted(
        (f["content"], _paths(f["file_path"]), f["record_count"]) for f in java_files
    ), "files: Java and pyiceberg list different live files or record counts"

    def entry_key(status, seq, file_seq, path) -> tuple:
        return (status, seq, file_seq, _paths(path))

    ours_entries = sorted(
        entry_key(e["status"], e["sequence_number"], e["file_sequence_number"], e["data_file"]["file_path"])
        for e in table.inspect.entries().to_pylist()
    )
    java_entries = sorted(
        entry_key(e["status"], e["sequence_number"], e["file_sequence_number"], e["data_file"]["file_path"])
        for e in lake.sql(f"SELECT status, sequence_number, file_sequence_number, data_file FROM {{c}}.{name}.entries")
    )
    assert ours_entries == java_entries, "entries: statuses or sequence numbers differ"

    java_manifests = lake.sql(
        f"SELECT path, added_data_files_count, existing_data_files_count, deleted_data_files_count, "
        f"added_delete_files_count, existing_delete_files_count, deleted_delete_files_count FROM {{c}}.{name}.manifests"
    )
    ours_manifests = table.inspect.manifests().to_pylist()
    columns = [c for c in java_manifests[0] if c != "path"] if java_manifests else []
    assert sorted((_paths(m["path"]), *(m[c] for c in columns)) for m in java_manifests) == sorted(
        (_paths(m["path"]), *(m[c] for c in columns)) for m in ours_manifests
    ), "manifests: paths or file counts differ"

    java_snapshots = {
        s["snapshot_id"]: (s["operation"], s["parent_id"])
        for s in lake.sql(f"SELECT snapshot_id, parent_id, operation FROM {{c}}.{name}.snapshots")
    }
    ours = {s.snapshot_id: (s.summary.operation.value, s.parent_snapshot_id) for s in table.snapshots()}
    assert java_snapshots == ours, "snapshots: ids, parents or operations differ"
    for s in table.snapshots():  # ours: `replace` (streaming readers skip it), but an expiration drops rows
        if "compaction.task-id" in s.summary.additional_properties:
            operation = java_snapshots[s.snapshot_id][0]
            assert (operation == "replace") != expired, f"compaction snapshot {s.snapshot_id} is `{operation}` to Java"


def compaction_snapshots(lake: SharedLake, name: str) -> list[int]:
    rows = lake.sql(f"SELECT snapshot_id, summary FROM {{c}}.{name}.snapshots ORDER BY committed_at")
    return [r["snapshot_id"] for r in rows if "compaction.task-id" in r["summary"]]


def java_maintenance(
    lake: SharedLake, name: str, expected: Counter[Row], before_ours: int, at_before: Counter[Row] | None = None
) -> None:
    """Java's rewrite_manifests, rollback_to_snapshot (to `before_ours`, our first compaction's
    parent) and back to the head (set_current_snapshot), expire_snapshots and remove_orphan_files on our
    output, each read back by Java and pyiceberg (`at_before`: the rows at `before_ours`, if not `expected`)."""
    table = f"ns.{name.split('.', 1)[1]}"
    lake.sql(f"CALL {{c}}.system.rewrite_manifests('{table}')")
    assert_rows(lake, name, expected, "after Java's rewrite_manifests", duckdb=False)
    head = lake.table(name).current_snapshot().snapshot_id
    lake.sql(f"CALL {{c}}.system.rollback_to_snapshot('{table}', {before_ours})")
    assert_rows(lake, name, expected if at_before is None else at_before, "after Java's rollback", duckdb=False)
    lake.sql(f"CALL {{c}}.system.set_current_snapshot('{table}', {head})")
    now = f"TIMESTAMP '{datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(seconds=1)}'"
    lake.sql(f"CALL {{c}}.system.expire_snapshots(table => '{table}', older_than => {now}, retain_last => 1)")
    assert_rows(lake, name, expected, "after Java's expire_snapshots", duckdb=False)
    lake.java.remove_orphan_files(f"{lake.name}.{table}", int(time.time() * 1000) + 1000)
    assert_rows(lake, name, expected, "after Java's remove_orphan_files")
    assert_metadata_agrees(lake, name, expired=at_before is not None)
