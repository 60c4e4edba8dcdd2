"""An independent reader: DuckDB's Iceberg extension (C++, shares no code with pyiceberg).

The extension comes from pip (`duckdb-ext-iceberg`, `duckdb-ext-avro` 1.4.4) and is loaded from
the package's extension folder with autoinstall off: no download at test time. Its 1.4.4 build
undercounts `IS NULL` on files without null-count statistics (upstream duckdb-iceberg #782), so
compare full scans and filter in Python, never in DuckDB's SQL. It also fails ("INTERNAL Error:
Comparison on NULL values") on an equality-delete file whose partition value is NULL, and applies
a partition-scoped equality delete to every partition (tests/test_lakekit.py pins both). An internal
error invalidates the DuckDB database: the connection is then dropped and the next scan opens a
fresh one (opening one and loading the extension costs ~0.9 s here, so it is kept otherwise).
"""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import duckdb
from pyiceberg.table import Table

from tests.lakekit.oracle import Row, row_key


@functools.cache
def _extension_directory() -> str:
    import duckdb_ext  # the namespace package the duckdb-ext-* wheels install into

    return str(Path(next(iter(duckdb_ext.__path__))) / "extensions")


@functools.cache
def _connection(s3: tuple[str, ...] = ()) -> duckdb.DuckDBPyConnection:
    """A connection with the Iceberg extension; with `s3` (endpoint, key id, secret, region) also
    httpfs (`duckdb-ext-httpfs`) and a secret for that S3-protocol endpoint (path-style URLs)."""
    con = duckdb.connect()
    con.execute(f"SET extension_directory='{_extension_directory()}'")
    con.execute("SET autoinstall_known_extensions=false")
    con.execute("SET autoload_known_extensions=false")
    for extension in ("httpfs", "avro", "iceberg") if s3 else ("avro", "iceberg"):
        con.execute(f"LOAD {extension}")
    if s3:
        endpoint, key_id, secret, region = (v.replace("'", "''") for v in s3)
        scheme, host = endpoint.split("://", 1) if "://" in endpoint else ("https", endpoint)
        con.execute(
            f"CREATE SECRET (TYPE s3, KEY_ID '{key_id}', SECRET '{secret}', REGION '{region}', "
            f"ENDPOINT '{host}', URL_STYLE 'path', USE_SSL {str(scheme == 'https').lower()})"
        )
    return con


def _s3_settings(table: Table) -> tuple[str, ...]:
    """The S3 endpoint and credentials of the table's FileIO (pyiceberg's s3.* properties), or ()."""
    if not table.metadata_location.startswith(("s3://", "s3a://")):
        return ()
    keys = ("s3.endpoint", "s3.access-key-id", "s3.secret-access-key", "s3.region")
    return tuple(table.io.properties.get(k, "") for k in keys)


def metadata_path(table: Table) -> str:
    """The table's current metadata.json as a local path (DuckDB's file:// handling varies)."""
    location = table.metadata_location
    return urlparse(location).path if location.startswith("file:") else location


def duckdb_rows(table: Table) -> list[dict[str, Any]]:
    """Every row of the table's current snapshot as DuckDB's Iceberg scan reads it."""
    s3 = _s3_settings(table)
    cursor = _connection(s3).cursor()
    try:
        relation = cursor.execute("SELECT * FROM iceberg_scan(?)", [metadata_path(table)])
        names = [d[0] for d in relation.description]
        return [dict(zip(names, values, strict=True)) for values in relation.fetchall()]
    except (duckdb.InternalException, duckdb.FatalException):
        _connection(s3).close()
        _connection.cache_clear()
        raise
    finally:
        cursor.close()


def duckdb_multiset(table: Table) -> Counter[Row]:
    return Counter(row_key(r) for r in duckdb_rows(table))
