"""Reading a table back to compare it: rows by id, row multisets, live data files, and the
invariants (rows kept, files consistent) against an oracle of acknowledged rows."""

from __future__ import annotations

from collections import Counter
from urllib.parse import urlparse

from compaction_assets.lake.digest import row_hashes
from compaction_assets.lake.files import live_files
from compaction_tools.reliability import check_invariants
from tests.lakekit.duckdb_reader import duckdb_multiset
from tests.lakekit.oracle import row_key


def rows(table) -> list[dict]:
    return sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])


def local(path: str) -> str:
    return urlparse(path).path


def assert_duckdb_reads_what_pyiceberg_reads(table) -> None:
    """Rule 6: an independent implementation (DuckDB's Iceberg scan) sees the same rows."""
    pyiceberg_rows = Counter(row_key(r) for r in table.scan().to_arrow().to_pylist())
    assert duckdb_multiset(table) == pyiceberg_rows


def multiset(table) -> Counter:
    return Counter(row_key(r) for r in table.scan().to_arrow().to_pylist())


def data_file_list(table) -> list:
    return [f.data_file for f in live_files(table) if not f.is_delete]


def oracle_of(table) -> Counter:
    return row_hashes(table.scan().to_arrow().to_pylist())


def assert_invariants(lake, table_name: str, oracle: Counter) -> None:
    report = check_invariants(lake.engine, table_name, oracle)
    assert report.ok, report
    assert report.rows_verified == sum(oracle.values())
