"""Apache Iceberg Java (1.10.2 on Spark 3.5) beside the project, for the bench and the interop tests.

`tests/interop/setup_java.sh` installs a venv of its own (pyspark 3.5.9, Iceberg's Spark runtime,
JDBC drivers; it writes `<venv>/jars.txt`, the spark.jars list). `JavaIceberg` starts
`java_server.py` (beside this module) under that venv's interpreter, one Spark 3.5 driver for its
whole life (it starts in 20-40 s), and sends it SQL as JSON lines. Never used by the product.

The bench's contender (`rewrite_data_files`) runs Iceberg's own procedure on a copy of the
fragmented table in a catalog of its own per run: a pyiceberg SqlCatalog over a new SQLite file
that Java opens as a JdbcCatalog of the same name (schema V0: pyiceberg's has no iceberg_type).
A file per run because once Spark 3.5 has loaded a table through sqlite-jdbc, writers to that
file get `database is locked` for as long as the session lives; readers are unaffected.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pyiceberg.catalog.sql import SqlCatalog

SERVER = Path(__file__).resolve().parent / "java_server.py"
DEFAULT_VENV = Path(__file__).resolve().parent.parent.parent / ".venv-iceberg-java"
START_TIMEOUT_S = 300
SETUP_HINT = "run `bash tests/interop/setup_java.sh` to install it"


class JavaError(RuntimeError):
    """A statement Iceberg Java refused or failed; the message is Spark's."""


def java_venv() -> Path:
    """The Iceberg Java venv: $COMPACTION_JAVA_VENV, else `.venv-iceberg-java` beside the project."""
    return Path(os.environ.get("COMPACTION_JAVA_VENV", DEFAULT_VENV))


def unavailable() -> str | None:
    """Why Iceberg Java cannot start here, or None."""
    venv = java_venv()
    if not (venv / "bin" / "python").exists() or not (venv / "jars.txt").exists():
        return f"Apache Iceberg Java is not installed at {venv}: {SETUP_HINT}"
    missing = [j for j in (venv / "jars.txt").read_text().split() if not Path(j).exists()]
    if missing:
        return f"Iceberg Java jars missing ({', '.join(missing)}): {SETUP_HINT}"
    return None


class JavaIceberg:
    """One Spark 3.5 + Iceberg 1.10.2 driver in its own process (session), stderr to `log_path`."""

    def __init__(self, log_path: Path) -> None:
        venv = java_venv()
        self._log = open(log_path, "ab")  # noqa: SIM115 - kept open for the process's life
        env = {**os.environ, "TZ": "UTC", "PYSPARK_PYTHON": str(venv / "bin" / "python")}
        for name in ("SPARK_HOME", "PYTHONPATH", "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR", "SPARK_REMOTE"):
            env.pop(name, None)
        self.process = subprocess.Popen(
            # -P: the script's folder (this package) is not put on the server's sys.path
            [str(venv / "bin" / "python"), "-P", str(SERVER), str(venv / "jars.txt")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
            start_new_session=True,
        )
        # Popen opens both as pipes (PIPE above), so neither is None
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin: IO[str] = self.process.stdin
        self._stdout: IO[str] = self.process.stdout
        self._lock = threading.Lock()
        ready = self._read(START_TIMEOUT_S)
        if not ready.get("ready"):
            self.close()
            raise JavaError(f"Iceberg Java did not start: {ready}; see {log_path}")
        self.versions: tuple[str, str] = (ready["spark"], ready["iceberg"])

    @property
    def pid(self) -> int:
        """The server's pid: its process tree is the Python driver and the JVM."""
        return self.process.pid

    def _read(self, timeout_s: float) -> dict:
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self._stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not result or not result[0]:
            code = self.process.poll()
            raise JavaError(f"no answer from Iceberg Java within {timeout_s:.0f} s (exit code {code})")
        return json.loads(result[0])

    def call(self, request: dict, timeout_s: float = 3600) -> dict:
        """Send one request; its reply (JavaError if Java failed it)."""
        with self._lock:
            self._stdin.write(json.dumps(request) + "\n")
            self._stdin.flush()
            reply = self._read(timeout_s)
        if not reply["ok"]:
            raise JavaError(reply["error"])
        return reply

    def register_catalog(self, name: str, jdbc_uri: str, warehouse: str) -> None:
        """A JdbcCatalog `name` over the schema pyiceberg's SqlCatalog uses (schema V0: no iceberg_type)."""
        properties = {
            "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            "uri": jdbc_uri,
            "warehouse": warehouse,
            "jdbc.schema-version": "V0",
            "cache-enabled": "false",
        }
        self.call({"op": "catalog", "name": name, "properties": properties})

    def sql_timed(self, statement: str) -> tuple[list[dict[str, Any]], float]:
        """The statement's rows as JSON values (java_server.plain) and its seconds inside Spark."""
        reply = self.call({"op": "sql", "sql": statement})
        return [dict(zip(reply["columns"], row, strict=True)) for row in reply["rows"]], reply["seconds"]

    def remove_orphan_files(self, table: str, older_than_ms: int) -> list[str]:
        """Java's DeleteOrphanFiles action on `catalog.ns.table`; the locations it deleted."""
        return self.call({"op": "remove_orphan_files", "table": table, "older_than_ms": older_than_ms})["deleted"]

    def close(self) -> None:
        """Stop the session (SIGKILL to its process group if it does not stop within 30 s)."""
        if self.process.poll() is None:
            try:
                self._stdin.write(json.dumps({"op": "stop"}) + "\n")
                self._stdin.flush()
                self.process.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, 9)
                self.process.wait(10)
        self._log.close()


@dataclass(frozen=True)
class RunCatalog:
    """One run's catalog, open on both sides under one name: pyiceberg (`catalog`) and Java."""

    name: str
    catalog: SqlCatalog

    def dispose(self) -> None:
        self.catalog.engine.dispose()


def run_catalog(java: JavaIceberg, root: Path, name: str) -> RunCatalog:
    """A new SQLite catalog `name` under `root` (warehouse `root/name`) that Java knows too."""
    db, warehouse = root / f"{name}.db", root / name
    warehouse.mkdir(parents=True)
    catalog = SqlCatalog(name, uri=f"sqlite:///{db}", warehouse=f"file://{warehouse}")
    catalog.create_namespace_if_not_exists("bench")  # pyiceberg's tables first (the V0 schema)
    java.register_catalog(name, f"jdbc:sqlite:{db}", f"file://{warehouse}")
    return RunCatalog(name, catalog)


def rewrite_data_files(java: JavaIceberg, catalog: str, table: str, options: dict[str, str], **args: str) -> float:
    """`CALL <catalog>.system.rewrite_data_files(table => ..., <args>, options => map(...))`;
    the seconds it took inside Spark (the procedure's own run, no client round trip)."""
    named = "".join(f", {key} => '{value}'" for key, value in args.items())
    pairs = ", ".join(f"'{k}', '{v}'" for k, v in options.items())
    statement = f"CALL {catalog}.system.rewrite_data_files(table => '{table}'{named}, options => map({pairs}))"
    return java.sql_timed(statement)[1]
