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
import os
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

START_TIMEOUT_S = 300


@dataclass(frozen=True)
class Compacted:
    """One `compact` request's answer: seconds inside the child and each partition's outcome."""

    seconds: float
    outcomes: list[dict] = field(default_factory=list)  # status, reason, phases, engine, peak_worker_rss

    def failed(self) -> list[dict]:
        return [o for o in self.outcomes if o["status"] != "committed"]


class OursProcess:
    """A child process holding our Engine and a warm local Spark session (see the module docstring)."""

    def __init__(self, config_path: Path) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(str(config_path), child), name="bench-ours", daemon=True)
        self.process.start()
        child.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self.close()
            raise RuntimeError(f"bench: our engine's process did not start within {START_TIMEOUT_S} s")
        self.ready: dict = self._answer()

    @property
    def pid(self) -> int:
        return self.process.pid

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


def _serve(config_path: str, conn: Connection) -> None:
    from compaction_assets.bench.contenders import warm_workers
    from compaction_assets.bench.run import NAMESPACE, warm_up
    from compaction_assets.config import load_config
    from compaction_assets.engine import Engine
    from compaction_assets.execution.spark import spark_session

    try:
        config = load_config(Path(config_path))
        spark = spark_session(config.spark)
        spark.sparkContext.setLogLevel("ERROR")
        engine = Engine(config, spark=lambda: spark)
        engine.catalog.create_namespace_if_not_exists(NAMESPACE)
        warm_up(engine, os.cpu_count() or 1, f"warmup_ours_{os.getpid()}")
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
            conn.send({"seconds": seconds, "outcomes": [_outcome(o) for o in outcomes]})
        except Exception as exc:  # noqa: BLE001 - reported to the bench, which raises it
            conn.send({"error": f"{type(exc).__name__}: {exc}"})
    spark.stop()


def _outcome(outcome) -> dict:  # noqa: ANN001 - an engine PartitionOutcome
    return {
        "status": outcome.status,
        "reason": outcome.reason,
        "phases": dict(outcome.phases),
        "engine": outcome.engine,
        "peak_worker_rss": outcome.peak_worker_rss,
    }
