"""Fixtures of the interop tests: one Iceberg Java process for the test run (it starts in 20-40 s),
and per test a lake whose catalog both Java (JdbcCatalog) and the project (pyiceberg SqlCatalog) open, over PostgreSQL.

PostgreSQL, not SQLite: once Spark 3.5 has loaded a table through sqlite-jdbc, every pyiceberg commit
on that file fails with `database is locked` for as long as the Java session lives.
Where Java cannot start the tests skip with the reason; with COMPACTION_REQUIRE_JAVA=1 (CI) they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyiceberg.table import Table

from compaction_assets.config import load_config
from compaction_assets.engine import Engine
from tests.conftest import postgres_schema, write_config
from tests.interop.java import JavaError, JavaIceberg, multiset, unavailable


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("COMPACTION_REQUIRE_JAVA") == "1":
        pytest.fail(f"Iceberg Java is required here (COMPACTION_REQUIRE_JAVA=1): {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def java(tmp_path_factory) -> Iterator[JavaIceberg]:
    if reason := unavailable():
        _skip_or_fail(reason)
    log = tmp_path_factory.mktemp("java") / "iceberg-java.log"
    try:
        session = JavaIceberg(log)
    except (JavaError, OSError) as exc:
        _skip_or_fail(f"Iceberg Java could not start: {exc}")
    try:  # the Java driver and its JVM (their own session: Ctrl-C does not reach them) stopped at teardown
        yield session
    finally:
        session.close()


@dataclass
class SharedLake:
    """One catalog, two engines: `java.sql` (Iceberg Java) and `engine` (the project, pyiceberg)."""

    root: Path
    name: str  # the catalog's name on both sides
    java: JavaIceberg
    engine: Engine

    def sql(self, statement: str) -> list[dict]:
        """Java SQL; `{c}` stands for this lake's catalog name."""
        return self.java.sql(statement.replace("{c}", self.name))

    def table(self, name: str) -> Table:
        return self.engine.catalog.load_table(name)

    def java_rows(self, name: str, columns: str = "*") -> list[dict]:
        return self.sql(f"SELECT {columns} FROM {{c}}.{name}")

    def java_multiset(self, name: str):
        return multiset(self.java_rows(name))

    def ours_multiset(self, name: str):
        return multiset(self.table(name).scan().to_arrow().to_pylist())


@pytest.fixture
def shared_lake(tmp_path: Path, java: JavaIceberg, spark) -> Iterator[SharedLake]:
    name = f"lake_{uuid.uuid4().hex[:8]}"
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    with postgres_schema() as url:
        schema = url.rsplit("%3D", 1)[1]
        properties = {"type": "sql", "uri": url, "warehouse": f"file://{warehouse}"}
        config_path = write_config(tmp_path, catalog={"name": name, "properties": properties})
        engine = Engine(load_config(config_path), spark=lambda: spark)
        engine.catalog.create_namespace("ns")  # creates pyiceberg's tables (the V0 schema) first
        jdbc = f"jdbc:postgresql://127.0.0.1:5432/test?currentSchema={schema}&user=postgres"
        java.register_catalog(name, jdbc, f"file://{warehouse}")
        try:
            yield SharedLake(tmp_path, name, java, engine)
        finally:
            engine.ledger.dispose()
            if hasattr(engine.catalog, "engine"):
                engine.catalog.engine.dispose()
