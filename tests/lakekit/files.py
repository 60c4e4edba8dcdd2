"""Looking at a test table: its rows through a reader, its live files by content and partition."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from pyiceberg.conversions import from_bytes
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
    """The live data files of partition region=`region`, by their first column's lower bound
    (then path): in the order they were written by the tests' writers, whose ids ascend.

    Not by path alone: paths hold random uuids, so a test that deletes positions of `data_of(...)[0]`
    and ids elsewhere would meet a different file, and sometimes the same rows, on every run."""
    key = f"region={region}"
    first = table.schema().fields[0]

    def order(f: DataFile) -> tuple:
        bound = (f.lower_bounds or {}).get(first.field_id)
        value = from_bytes(first.field_type, bound) if bound is not None else None
        return (value is None, value if value is not None else 0, f.file_path)

    return sorted((f.data_file for f in live_files(table) if f.partition_key == key and not f.is_delete), key=order)
