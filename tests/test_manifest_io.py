"""Manifest entries restated from the bytes read must be exactly what pyiceberg's writer writes."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import ManifestEntry, ManifestEntryStatus, ManifestFile, write_manifest
from pyiceberg.table import Table

from compaction_assets.lake.datafile_codec import datafile_to_json
from compaction_assets.lake.manifest_io import read_manifest, restated, write_restated
from tests.conftest import BY_REGION, SCHEMA, batch

NEW_SNAPSHOT = 7_000_000_000_000_000_001
MANIFEST_FIELDS = (
    "partition_spec_id",
    "content",
    "sequence_number",
    "min_sequence_number",
    "added_snapshot_id",
    "added_files_count",
    "existing_files_count",
    "deleted_files_count",
    "added_rows_count",
    "existing_rows_count",
    "deleted_rows_count",
    "partitions",
    "key_metadata",
)


def make_table(tmp_path, version: str) -> Table:
    """Three appends of files in two regions (three manifests of two entries each), then a
    row-level delete that rewrites one file: manifests with ADDED, EXISTING and DELETED entries."""
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", SCHEMA, partition_spec=BY_REGION, properties={"format-version": version})
    for i in range(3):
        table.append(pa.concat_tables([batch(i * 100, 40, "eu"), batch(i * 100 + 50, 40, "us")]))
    table.delete("id = 5")
    return table


def entry_doc(entry: ManifestEntry) -> tuple:
    data_file = datafile_to_json(entry.data_file)
    return entry.status, entry.snapshot_id, entry.sequence_number, entry.file_sequence_number, data_file


def manifest_doc(manifest: ManifestFile) -> dict:
    return {name: getattr(manifest, name) for name in MANIFEST_FIELDS}


def test_read_keeps_the_live_entries_pyiceberg_reads(tmp_path):
    table = make_table(tmp_path, "2")
    manifests = table.current_snapshot().manifests(table.io)
    statuses = set()
    for manifest in manifests:
        everything = manifest.fetch_manifest_entry(table.io, discard_deleted=False)
        statuses |= {e.status for e in everything}
        contents = read_manifest(manifest, table.io)
        expected = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        assert [entry_doc(e) for e in contents.entries] == [entry_doc(e) for e in expected]
        assert contents.restatable and len(contents.data_file_bytes) == len(contents.entries)
    assert statuses == set(ManifestEntryStatus), "the table must have entries of every status"


@pytest.mark.parametrize("status", [ManifestEntryStatus.DELETED, ManifestEntryStatus.EXISTING])
def test_restated_manifest_is_what_pyiceberg_writes(tmp_path, status):
    table = make_table(tmp_path, "2")
    parts = []
    for manifest in table.current_snapshot().manifests(table.io):
        contents = read_manifest(manifest, table.io)
        if contents.entries:
            parts.append((contents, list(range(len(contents.entries)))[::2] or [0]))
    assert sum(len(p) for _, p in parts) >= 3

    ours = write_restated(
        table.io.new_output(f"{table.location()}/metadata/ours.avro"),
        parts,
        status,
        NEW_SNAPSHOT,
        table.spec(),
        table.schema(),
    )
    output = table.io.new_output(f"{table.location()}/metadata/pyiceberg.avro")
    with write_manifest(2, table.spec(), table.schema(), output, NEW_SNAPSHOT, "deflate") as writer:
        for contents, positions in parts:
            for i in positions:
                entry = contents.entries[i]
                snapshot_id = NEW_SNAPSHOT if status == ManifestEntryStatus.DELETED else entry.snapshot_id
                writer.add_entry(restated(entry, status, snapshot_id))
    theirs = writer.to_manifest_file()

    assert manifest_doc(ours) == manifest_doc(theirs)
    assert ours.manifest_length > 0
    read_back = [entry_doc(e) for e in ours.fetch_manifest_entry(table.io, discard_deleted=False)]
    assert read_back == [entry_doc(e) for e in theirs.fetch_manifest_entry(table.io, discard_deleted=False)]
    assert {doc[0] for doc in read_back} == {status}


def test_restating_refuses_manifests_of_different_entry_layouts(tmp_path):
    v2 = make_table(tmp_path, "2")
    table = v2.catalog.create_table("ns.u", SCHEMA)  # unpartitioned: another Avro schema
    table.append(batch(0, 10, "eu"))
    a = read_manifest(v2.current_snapshot().manifests(v2.io)[0], v2.io)
    b = read_manifest(table.current_snapshot().manifests(table.io)[0], table.io)
    with pytest.raises(ValueError, match="one entry layout"):
        write_restated(
            v2.io.new_output(f"{tmp_path}/x.avro"),
            [(a, [0]), (b, [0])],
            ManifestEntryStatus.DELETED,
            1,
            v2.spec(),
            v2.schema(),
        )


def test_format_version_1_manifests_are_not_restated(tmp_path):
    table = make_table(tmp_path, "1")
    for manifest in table.current_snapshot().manifests(table.io):
        contents = read_manifest(manifest, table.io)
        assert not contents.restatable and contents.data_file_bytes == ()
        expected = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        assert [entry_doc(e) for e in contents.entries] == [entry_doc(e) for e in expected]
