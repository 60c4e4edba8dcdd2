"""Our engine in a process of its own for the bench, as a user's machine runs it.

The bench process also holds delta-rs, the row digests and the datasets it generates; timing and
sampling ours inside it would charge those to ours. `OursProcess` starts a child (spawn) that
loads the bench's compaction.yaml, starts its own local Spark session, warms it up and then
compacts the tables it is sent, one request at a time over a pipe. Its process tree (this child,
its Spark JVM and the JVM's Python workers) is the whole footprint of our compaction, as the
Iceberg Java server's tree is Java's.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

START_TIMEOUT_S = 300


@dataclass(frozen=True)
class Compacted:
    """One `compact` request's answer: seconds inside the child and each partition's outcome."""

    seconds: float
    outcomes: list[dict] = field(default_factory=list)  # status, reason, phases, engine, peak_worker_rss, kind, ...

    def failed(self) -> list[dict]:
        return [o for o in self.outcomes if o["status"] != "committed"]


class OursProcess:
    """A child process holding our Engine and a warm local Spark session (see the module docstring)."""

    def __init__(self, config_path: Path, warmup_table: str | None = None) -> None:
        """`warmup_table`: a table the child compacts once, untimed, after its session starts (the
        caller creates it: data generation stays out of the child's imports and footprint)."""
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        args = (str(config_path), warmup_table, child)
        self.process = context.Process(target=_serve, args=args, name="bench-ours", daemon=True)
        self.process.start()
        child.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self.close()
            raise RuntimeError(f"bench: our engine's process did not start within {START_TIMEOUT_S} s")
        self.ready: dict = self._answer()

    @property
    def pid(self) -> int:
        pid = self.process.pid
        assert pid is not None  # started in __init__
        return pid

    def _answer(self) -> dict:
        try:
            answer = self._conn.recv()
        except EOFError as exc:
            raise RuntimeError(f"bench: our engine's process ended (exit code {self.process.exitcode})") from exc
        if "error" in answer:
            raise RuntimeError(f"bench: our engine's process failed: {answer['error']}")
        return answer

    def compact(self, table_name: str) -> Compacted:
        """Warm the Spark Python workers (untimed), then compact `table_name` (timed in the child)."""
        self._conn.send({"op": "compact", "table": table_name})
        answer = self._answer()
        return Compacted(answer["seconds"], answer["outcomes"])

    def close(self) -> None:
        """Stop the child's Spark session and the child (killed if it does not stop within 30 s)."""
        if self.process.is_alive():
            with contextlib.suppress(OSError):
                self._conn.send({"op": "stop"})
            self.process.join(30)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(10)
        self._conn.close()


def _serve(config_path: str, warmup_table: str | None, conn: Connection) -> None:
    # only what a run host imports: the bench's modules (data generation, digests, delta-rs) would
    # count in ours' footprint
    from compaction_assets.config import load_config
    from compaction_assets.engine.facade import Engine
    from compaction_assets.execution.spark import spark_session

    try:
        config = load_config(Path(config_path))
        spark = spark_session(config.spark)
        spark.sparkContext.setLogLevel("ERROR")
        engine = Engine(config, spark=lambda: spark)
        if warmup_table is not None:
            engine.compact(warmup_table)
    except Exception as exc:  # noqa: BLE001 - reported to the bench, which raises it
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        return
    conn.send({"ready": True})
    while (request := conn.recv())["op"] != "stop":
        try:
            warm_workers(spark)
            started = time.perf_counter()
            outcomes = engine.compact(request["table"])
            seconds = time.perf_counter() - started
            conn.send({"seconds": seconds, "outcomes": [outcome_fields(o) for o in outcomes]})
        except Exception as exc:  # noqa: BLE001 - reported to the bench, which raises it
            conn.send({"error": f"{type(exc).__name__}: {exc}"})
    spark.stop()


def warm_workers(spark) -> None:  # noqa: ANN001 - a local SparkSession
    """Start the session's Python workers again if Spark stopped them, untimed, so that ours is timed on
    a warm session as a busy long-lived one has. Spark stops every idle Python worker once no worker
    was taken or handed back for a minute (PythonWorkerFactory's IDLE_WORKER_TIMEOUT_NS, not a
    setting), and the peers' runs between two of ours can take longer than that: a new worker
    imports pyarrow, pyiceberg and Polars again (2.3 s of ours' 5 s on "small" in a 2-core run).
    One task per core, each holding its worker a moment so that no two share one."""
    from compaction_assets.execution.dispatch import classic_context

    if (context := classic_context(spark)) is not None:
        cores = context.defaultParallelism
        context.parallelize(list(range(cores)), cores).mapPartitions(_import_rewrite_modules).collect()


def _import_rewrite_modules(tasks: Iterable[int]) -> Iterable[int]:
    import polars  # noqa: F401

    import compaction_assets.execution.worker  # noqa: F401

    list(tasks)  # Spark hands a worker back for reuse only if its task read all of its input
    time.sleep(0.3)
    return []


def outcome_fields(outcome) -> dict:  # noqa: ANN001 - an engine PartitionOutcome
    return {
        "status": outcome.status,
        "reason": outcome.reason,
        "phases": dict(outcome.phases),
        "engine": outcome.engine,
        "peak_worker_rss": outcome.peak_worker_rss,
        "kind": outcome.kind,
        "groups": outcome.groups,
        "files_written": outcome.files_written,
        "spill_files": outcome.spill_files,
    }
