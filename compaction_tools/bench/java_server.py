"""Apache Iceberg Java (1.10.2 on Spark 3.5) as a process the bench and the interop tests talk to:
JSON lines in, JSON lines out.

Runs as a script (`python -P java_server.py JARS_LIST`) under the interpreter of the venv
`tests/interop/setup_java.sh` makes (pyspark 3.5.9), never the project's (pyspark 4.x); it imports
nothing of the project. Requests: {"op": "sql", "sql": ...} -> {"ok": true, "columns": [...],
"rows": [[...]], "seconds": S} (S: the statement's run in Spark, measured in this process);
{"op": "catalog", "name": ..., "properties": {...}} registers a Spark catalog;
{"op": "remove_orphan_files", "table": ..., "older_than_ms": ...} -> {"ok": true, "deleted": [...]}; {"op": "stop"}.
Values leave as JSON: timestamps and dates in ISO form, decimals as strings, binary as hex.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import os
import sys
import threading
import time
import traceback


def plain(value):
    """One Spark value as JSON (the tests turn it back, see tests/interop/java.py `from_java`)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return {"float": "NaN" if math.isnan(value) else repr(value)} if not math.isfinite(value) else value
    if isinstance(value, datetime.datetime):
        return {"ts": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"date": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"decimal": str(value)}
    if isinstance(value, bytes | bytearray):
        return {"binary": bytes(value).hex()}
    if isinstance(value, dict):
        return {"map": [[plain(k), plain(v)] for k, v in value.items()]}
    if isinstance(value, list | tuple):
        if hasattr(value, "asDict"):
            return {"struct": {k: plain(v) for k, v in value.asDict().items()}}
        return [plain(v) for v in value]
    return {"repr": repr(value)}


def remove_orphan_files(spark, table: str, older_than_ms: int) -> list[str]:
    """Java's DeleteOrphanFiles action (the SQL procedure refuses an interval under 24 hours)."""
    jvm = spark.sparkContext._jvm
    loaded = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, table)
    action = jvm.org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession).deleteOrphanFiles(loaded)
    result = action.olderThan(older_than_ms).execute()
    return [str(location) for location in result.orphanFileLocations()]


def exit_with_parent() -> None:
    """Exit once the process that started this one is gone (killed, say, in the middle of a long
    CALL): the JVM follows, as PySpark's gateway exits when its driver's pipe closes."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def main() -> None:
    threading.Thread(target=exit_with_parent, daemon=True).start()
    # Responses go to a private copy of stdout; the JVM and Spark's Python side write to stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    from pyspark.sql import SparkSession

    with open(sys.argv[1]) as listing:
        jars = [line.strip() for line in listing if line.strip()]
    builder = (
        SparkSession.builder.master(os.environ.get("ICEBERG_JAVA_MASTER", "local[2]"))
        .appName("iceberg-java")
        .config("spark.jars", ",".join(jars))
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.adaptive.enabled", "true")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("Spark started without a JVM gateway: cannot reach Iceberg's Java classes")
    version = jvm.org.apache.iceberg.IcebergBuild.version()
    out.write(json.dumps({"ready": True, "spark": spark.version, "iceberg": version}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        reply: dict[str, object]
        try:
            if request["op"] == "stop":
                break
            if request["op"] == "catalog":
                prefix = f"spark.sql.catalog.{request['name']}"
                spark.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
                for key, value in request["properties"].items():
                    spark.conf.set(f"{prefix}.{key}", value)
                reply = {"ok": True}
            elif request["op"] == "remove_orphan_files":
                reply = {"ok": True, "deleted": remove_orphan_files(spark, request["table"], request["older_than_ms"])}
            else:
                started = time.perf_counter()
                frame = spark.sql(request["sql"])
                rows = frame.collect()
                seconds = time.perf_counter() - started
                reply = {"ok": True, "columns": frame.columns, "rows": [[plain(v) for v in row] for row in rows]}
                reply["seconds"] = seconds
        except Exception as exc:  # every failure goes back to the test, which raises it there
            error = f"{type(exc).__name__}: {exc}"[:4000]
            reply = {"ok": False, "error": error, "trace": traceback.format_exc()[-4000:]}
        out.write(json.dumps(reply) + "\n")
    spark.stop()


if __name__ == "__main__":
    main()
