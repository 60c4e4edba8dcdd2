"""The test side of Apache Iceberg Java: start `java_server.py` in the Iceberg venv, send it SQL.

`setup_java.sh` installs that venv (pyspark 3.5.9, Iceberg 1.10.2's Spark runtime, JDBC drivers);
`.ci/run` calls it. One Java process serves a whole test module (it starts in 20-40 s); each test
registers a catalog of its own name on it, over a PostgreSQL schema of its own, that pyiceberg
(and so the project) opens as a SqlCatalog of the same name: both sides see one catalog.
"""

from __future__ import annotations

import datetime
import decimal
import json
import os
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from tests.lakekit.oracle import Row, row_key

HERE = Path(__file__).resolve().parent
DEFAULT_VENV = HERE.parent.parent / ".venv-iceberg-java"
START_TIMEOUT_S = 300
SETUP_HINT = "run `bash tests/interop/setup_java.sh` to install it"


class JavaError(RuntimeError):
    """A statement Iceberg Java refused or failed; the message is Spark's."""


def java_venv() -> Path:
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
    """One Spark 3.5 + Iceberg 1.10.2 driver in its own process."""

    def __init__(self, log_path: Path) -> None:
        venv = java_venv()
        self._log = open(log_path, "ab")  # noqa: SIM115 - kept open for the process's life
        env = {**os.environ, "TZ": "UTC", "PYSPARK_PYTHON": str(venv / "bin" / "python")}
        for name in ("SPARK_HOME", "PYTHONPATH", "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR"):
            env.pop(name, None)
        self.process = subprocess.Popen(
            [str(venv / "bin" / "python"), str(HERE / "java_server.py"), str(venv / "jars.txt")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
            start_new_session=True,
        )
        self._lock = threading.Lock()
        ready = self._read(START_TIMEOUT_S)
        if not ready.get("ready"):
            self.close()
            raise JavaError(f"Iceberg Java did not start: {ready}; see {log_path}")
        self.versions = (ready["spark"], ready["iceberg"])

    def _read(self, timeout_s: float) -> dict:
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not result or not result[0]:
            code = self.process.poll()
            raise JavaError(f"no answer from Iceberg Java within {timeout_s:.0f} s (exit code {code})")
        return json.loads(result[0])

    def _call(self, request: dict, timeout_s: float = 600) -> dict:
        with self._lock:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
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
        self._call({"op": "catalog", "name": name, "properties": properties})

    def sql(self, statement: str) -> list[dict[str, Any]]:
        reply = self._call({"op": "sql", "sql": statement})
        return [dict(zip(reply["columns"], (from_java(v) for v in row), strict=True)) for row in reply["rows"]]

    def remove_orphan_files(self, table: str, older_than_ms: int) -> list[str]:
        """Java's DeleteOrphanFiles action on `catalog.ns.table`; the locations it deleted."""
        return self._call({"op": "remove_orphan_files", "table": table, "older_than_ms": older_than_ms})["deleted"]

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"op": "stop"}) + "\n")
                self.process.stdin.flush()
                self.process.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, 9)
                self.process.wait(10)
        self._log.close()


def from_java(value: Any) -> Any:
    """A value as `java_server.plain` sent it, back in the types pyiceberg's reader gives."""
    if isinstance(value, list):
        return [from_java(v) for v in value]
    if not isinstance(value, dict):
        return value
    ((kind, body),) = value.items()
    if kind == "ts":
        return datetime.datetime.fromisoformat(body)
    if kind == "date":
        return datetime.date.fromisoformat(body)
    if kind == "decimal":
        return decimal.Decimal(body)
    if kind == "binary":
        return bytes.fromhex(body)
    if kind == "float":
        return float(body)
    if kind == "struct":
        return {k: from_java(v) for k, v in body.items()}
    if kind == "map":
        return {from_java(k): from_java(v) for k, v in body}
    raise ValueError(f"unknown value from Java: {value}")


def comparable(row: dict[str, Any]) -> Row:
    """One row as both readers can agree on it: timestamps as naive UTC, NaN as a marker."""
    return row_key({k: _comparable(v) for k, v in row.items()})


def _comparable(value: Any) -> Any:
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.UTC).replace(tzinfo=None)
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def multiset(rows: list[dict[str, Any]]) -> Counter[Row]:
    return Counter(comparable(r) for r in rows)
