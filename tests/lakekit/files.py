"""Looking at a test table: its rows through a reader, its live files by content and partition."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table

from compaction_assets.lake.files import live_files
from tests.lakekit.oracle import row_key


def rows(reader: Callable[[Table], list[dict[str, Any]]], table: Table) -> Counter:
    """The multiset of rows `reader` (spec_rows, duckdb_rows, ...) reads from the table."""
    return Counter(row_key(r) for r in reader(table))


def kinds(table: Table) -> Counter:
    """Live files by content: DATA, POSITION_DELETES, EQUALITY_DELETES."""
    return Counter(DataFileContent(f.data_file.content).name for f in live_files(table))


def data_of(table: Table, region: str) -> list[DataFile]:
    """The live data files of partition region=`region`, by path."""
    key = f"region={region}"
    return sorted(
        (f.data_file for f in live_files(table) if f.partition_key == key and not f.is_delete),
        key=lambda f: f.file_path,
    )
