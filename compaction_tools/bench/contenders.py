"""The contenders, each timed on the same files and checked by content afterwards.

delta-rs and the pyarrow copy run in a child process of their own, so their peak RSS is theirs
alone; ours and the Spark DataFrame rewrite run on the bench's warm Spark session; Iceberg Java's
`rewrite_data_files` runs in its own Spark 3.5 session (bench/iceberg_java.py), on a copy of the
table in a catalog of its own. `tree_peak_rss` is the whole footprint (bench/footprint.py).
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import pyarrow_to_schema
from pyiceberg.schema import index_by_name
from pyspark.sql import SparkSession

from compaction_assets.execution.worker import peak_rss
from compaction_assets.lake.catalog import load_table
from compaction_assets.lake.digest import RowsDigest, batches_digest, rows_digest
from compaction_assets.lake.storage import filesystem_of
from compaction_tools.bench import footprint
from compaction_tools.bench.datasets import CODEC, DELTA_CODEC
from compaction_tools.bench.iceberg_java import JavaIceberg, RunCatalog, rewrite_data_files
from compaction_tools.bench.ours_process import OursProcess

ICEBERG_JAVA = "iceberg-java"


@dataclass
class Result:
    contender: str
    seconds: float
    bytes_in: int
    files_before: int
    files_after: int
    peak_rss: int  # bytes
    rss_of: str
    rows_identical: bool
    runs: list[float] = field(default_factory=list)  # every run's seconds, when repeated
    phases: dict[str, float] = field(default_factory=dict)  # ours: seconds per phase (engine.describe_phases)
    path: str = ""  # ours: the rewrite paths (engines) that ran, e.g. polars, arrow, polars+arrow
    bytes_after: int = 0  # the data files' bytes after the run
    # peak resident bytes summed over every process doing the contender's work (0: not measured)
    tree_peak_rss: int = 0
    tree_peak_pss: int = 0  # the same, PSS summed (shared pages split among their sharers; 0: not measured)

    @property
    def mb_per_s(self) -> float:
        return self.bytes_in / 1e6 / self.seconds if self.seconds else 0.0


def ours(
    process: OursProcess,
    catalog: Catalog,
    table_name: str,
    expected: RowsDigest,
    bytes_in: int,
    files: int,
) -> Result:
    """Our engine in its own process (bench/ours_process.py): plan, one Spark job over the groups,
    two-phase commit; timed in that process, its whole process tree sampled."""
    with footprint.TreePeak([process.pid]) as tree:
        compacted = process.compact(table_name)
    if compacted.failed() or not compacted.outcomes:
        raise RuntimeError(
            f"bench: our compaction of {table_name} did not commit: {compacted.failed() or 'nothing planned'}"
        )
    outcomes = compacted.outcomes
    table = load_table(catalog, table_name)
    after, bytes_after = data_files(table)
    return Result(
        "ours",
        compacted.seconds,
        bytes_in,
        files,
        after,
        max(o["peak_worker_rss"] for o in outcomes),
        "spark python worker",
        table_digest(table) == expected,
        phases=outcomes[0]["phases"],
        path=engines(outcomes),
        bytes_after=bytes_after,
        tree_peak_rss=tree.peak,
        tree_peak_pss=tree.peak_pss,
    )


def table_digest(table) -> RowsDigest:  # noqa: ANN001 - a pyiceberg Table
    """The rows of a contender's result table (lake.digest): its data files scanned at once by a
    pyarrow dataset, on Arrow's threads, on the filesystem the table's FileIO reaches them by (local
    or S3), where they share one, no delete file applies and every file holds the table's columns
    under their field ids (a bench table has no schema evolution); else through pyiceberg's scan, a
    file at a time (small's 10M rows: 3 s instead of 1.3 s, twice a run)."""
    tasks = list(table.scan().plan_files())
    if not tasks or any(t.delete_files for t in tasks):
        return rows_digest(table)
    located = [filesystem_of(t.file.file_path, table.io) for t in tasks]
    filesystem = located[0][0]
    if not all(filesystem.equals(fs) for fs, _ in located):
        return rows_digest(table)
    files = ds.dataset([path for _, path in located], format="parquet", filesystem=filesystem)
    wanted = index_by_name(table.schema())
    for fragment in files.get_fragments():  # readers match columns by field id: every file's ids by name
        try:
            if index_by_name(pyarrow_to_schema(fragment.physical_schema)) != wanted:
                return rows_digest(table)
        except ValueError:  # a file without field ids
            return rows_digest(table)
    return batches_digest(files.to_batches())


def peer_expected(expected: RowsDigest, run: int) -> RowsDigest | int:
    """What a peer's result is checked against in a pass's `run` (from 0): the digest on the first,
    the row count after (reading its result back took 1.5 s a peer and run on small, 3-4 minutes of
    the full bench; ours is checked by content on every run)."""
    return expected if run == 0 else expected.rows


def rows_match(expected: RowsDigest | int, rows: ds.Dataset) -> bool:
    """A peer's result files against `expected`: by content (the digest of their rows), or given a
    row count (a peer's runs after its first in a pass: run.compare) by the rows their footers hold."""
    if isinstance(expected, int):
        return rows.count_rows() == expected
    return batches_digest(rows.to_batches()) == expected


def table_rows_match(table, expected: RowsDigest | int) -> bool:  # noqa: ANN001 - a pyiceberg Table
    """`rows_match` for an Iceberg table: its digest (table_digest), or its live rows' count."""
    if isinstance(expected, int):
        return table.scan().count() == expected
    return table_digest(table) == expected


def jvm_pid(spark: SparkSession) -> int:
    """The local Spark JVM's pid."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("the Spark session has no JVM gateway (a Spark Connect session?): no local JVM pid")
    return jvm.java.lang.ProcessHandle.current().pid()


def data_files(table) -> tuple[int, int]:  # noqa: ANN001 - a pyiceberg Table
    """The table's live data files (no delete files): how many, and their bytes."""
    sizes = table.inspect.data_files().column("file_size_in_bytes").to_pylist()
    return len(sizes), sum(sizes)


def iceberg_java(
    java: JavaIceberg,
    run: RunCatalog,
    table_name: str,
    expected: RowsDigest | int,
    bytes_in: int,
    files: int,
    options: dict[str, str],
    args: dict[str, str],
) -> Result:
    """Iceberg's own procedure, `CALL <catalog>.system.rewrite_data_files(...)`, on Spark 3.5
    `local[2]` (a warm session): timed inside Spark, the whole server process tree sampled."""
    with footprint.TreePeak([java.pid]) as tree:
        seconds = rewrite_data_files(java, run.name, table_name, options, **args)
    table = run.catalog.load_table(table_name)
    after, bytes_after = data_files(table)
    identical = table_rows_match(table, expected)
    return Result(
        ICEBERG_JAVA,
        seconds,
        bytes_in,
        files,
        after,
        tree.peak,
        "JVM + its driver",
        identical,
        bytes_after=bytes_after,
        tree_peak_rss=tree.peak,
        tree_peak_pss=tree.peak_pss,
    )


def engines(outcomes: list[dict]) -> str:
    """The rewrite paths that ran over `outcomes` (their `engine`), joined with '+'."""
    return "+".join(sorted({e for o in outcomes for e in o["engine"].split("+") if e}, reverse=True))


def deltars(uri: str, target_bytes: int, expected: RowsDigest | int, bytes_in: int, files: int) -> Result:
    """delta-rs `DeltaTable.optimize.compact()`, Snappy, as it writes by default."""
    seconds, rss = in_child(_deltars_compact, uri, target_bytes)
    from deltalake import DeltaTable

    table = DeltaTable(uri)
    identical = rows_match(expected, table.to_pyarrow_dataset())
    uris = table.file_uris()
    size = sum(Path(u.removeprefix("file://")).stat().st_size for u in uris)
    return Result(
        "delta-rs", seconds, bytes_in, files, len(uris), rss, "process", identical, bytes_after=size, tree_peak_rss=rss
    )


def pyarrow_copy(
    sources: list[Path], out: Path, target_bytes: int, expected: RowsDigest | int, bytes_in: int
) -> Result:
    """The limit: one thread streaming every file's record batches into target-size files."""
    seconds, rss = in_child(_pyarrow_copy, [str(p) for p in sources], str(out), target_bytes)
    return pyarrow_result(seconds, rss, len(sources), out, expected, bytes_in)


def pyarrow_result(
    seconds: float, rss: int, files: int, out: Path, expected: RowsDigest | int, bytes_in: int
) -> Result:
    """A one-thread pyarrow contender's result from the files it wrote to `out` (in a child process:
    its peak RSS is the whole footprint)."""
    written = sorted(out.glob("*.parquet"))
    identical = rows_match(expected, ds.dataset(written))
    size = sum(p.stat().st_size for p in written)
    return Result(
        "pyarrow 1 thread",
        seconds,
        bytes_in,
        files,
        len(written),
        rss,
        "process",
        identical,
        bytes_after=size,
        tree_peak_rss=rss,
    )


def spark_dataframe(
    spark: SparkSession, sources: list[Path], out: Path, target_bytes: int, expected: RowsDigest, bytes_in: int
) -> Result:
    """What a Spark user would write: read.parquet(...).coalesce(n).write.parquet(...)."""
    n = max(1, math.ceil(bytes_in / target_bytes))
    started = time.perf_counter()
    spark.read.parquet(*[f"file://{p}" for p in sources]).coalesce(n).write.mode("overwrite").option(
        "compression", CODEC
    ).parquet(f"file://{out}")
    seconds = time.perf_counter() - started
    written = sorted(out.glob("*.parquet"))
    identical = batches_digest(ds.dataset(written).to_batches()) == expected
    size = sum(p.stat().st_size for p in written)
    return Result(
        "spark dataframe",
        seconds,
        bytes_in,
        len(sources),
        len(written),
        jvm_peak_rss(spark),
        "JVM",
        identical,
        bytes_after=size,
    )


def jvm_peak_rss(spark: SparkSession) -> int:
    """The local Spark JVM's lifetime peak RSS."""
    return peak_rss(Path(f"/proc/{jvm_pid(spark)}/status"))


def in_child(function, *args) -> tuple[float, int]:  # noqa: ANN001
    """Run `function(*args)` in a fresh process; its seconds (measured inside) and peak RSS."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(_timed, (function, *args))


def _timed(function, *args) -> tuple[float, int]:  # noqa: ANN001
    started = time.perf_counter()
    function(*args)
    seconds = time.perf_counter() - started
    return seconds, peak_rss()


def _deltars_compact(uri: str, target_bytes: int) -> None:
    from deltalake import DeltaTable, WriterProperties

    DeltaTable(uri).optimize.compact(
        target_size=target_bytes, writer_properties=WriterProperties(compression=DELTA_CODEC)
    )


def _pyarrow_copy(sources: list[str], out: str, target_bytes: int) -> None:
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    write_rolling(
        (
            batch
            for source in sources
            for batch in pq.ParquetFile(source).iter_batches(batch_size=65_536, use_threads=False)
        ),
        out,
        target_bytes,
    )


def write_rolling(
    chunks: Iterable[pa.RecordBatch | pa.Table],
    out: str,
    target_bytes: int,
    open_output: Callable[[str], pa.NativeFile] | None = None,
) -> None:
    """Write `chunks` into Parquet files in `out`, starting a new file once one passes the target;
    files are opened with `open_output` (default: local files, `out` made if missing)."""
    if open_output is None:
        Path(out).mkdir(parents=True, exist_ok=True)
        open_output = partial(pa.OSFile, mode="wb")
    current: tuple[pa.NativeFile, pq.ParquetWriter] | None = None  # the open file and its writer
    index = 0
    for chunk in chunks:
        if current is None:
            sink = open_output(f"{out}/part-{index:05d}.parquet")
            current = sink, pq.ParquetWriter(sink, chunk.schema, compression=CODEC)
            index += 1
        sink, writer = current
        writer.write(chunk)
        if sink.tell() >= target_bytes:
            writer.close()
            sink.close()
            current = None
    if current is not None:
        sink, writer = current
        writer.close()
        sink.close()
