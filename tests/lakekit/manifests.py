"""A table read below pyiceberg's scan: DuckDB's ids, the spec's rules over the manifests, raw entries."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFileContent, ManifestEntryStatus

from compaction_assets.lake.files import live_files

DUCKDB_EXTENSIONS = Path(sysconfig.get_paths()["purelib"]) / "duckdb_ext" / "extensions"


def duckdb_ids(table) -> list[int]:
    """The table's ids as DuckDB's Iceberg extension (C++, no code shared with pyiceberg) reads them."""
    con = duckdb.connect()
    try:
        con.execute(f"SET extension_directory='{DUCKDB_EXTENSIONS}'")
        con.execute("SET autoinstall_known_extensions=false")
        con.execute("LOAD iceberg")
        metadata = table.metadata_location.removeprefix("file://")
        return sorted(r[0] for r in con.execute(f"SELECT id FROM iceberg_scan('{metadata}')").fetchall())
    finally:
        con.close()


def spec_ids(table) -> list[int]:
    """The table's ids read by the spec's rules straight from the manifests: an equality delete
    (on `id`) applies to a data file of its partition, or any when global, whose data sequence
    number is strictly lower (position deletes are not needed here)."""
    live = [e for _, e in entries(table) if e.status != ManifestEntryStatus.DELETED]
    deletes = [e for e in live if e.data_file.content == DataFileContent.EQUALITY_DELETES]
    ids = []
    for entry in live:
        if entry.data_file.content != DataFileContent.DATA:
            continue
        deleted = {
            i
            for d in deletes
            if d.sequence_number > entry.sequence_number
            and (len(d.data_file.partition) == 0 or d.data_file.partition == entry.data_file.partition)
            for i in pq.read_table(d.data_file.file_path.removeprefix("file://"))["id"].to_pylist()
        }
        file_ids = pq.read_table(entry.data_file.file_path.removeprefix("file://"), columns=["id"])["id"].to_pylist()
        ids.extend(i for i in file_ids if i not in deleted)
    return sorted(ids)


def entries(table, snapshot=None):
    """(manifest, entry) for every entry, DELETED included, of the snapshot's manifests."""
    snapshot = snapshot or table.current_snapshot()
    return [
        (m, e) for m in snapshot.manifests(table.io) for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
    ]


def region_files(table, region: str = "eu"):
    key = f"region={region}"
    return sorted((f.data_file for f in live_files(table) if f.partition_key == key), key=lambda f: f.file_path)
