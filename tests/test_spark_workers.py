"""Spark's Python workers get as many Arrow threads as a local master has cores."""

from __future__ import annotations

import functools
import os

import pytest

from compaction_assets.config import SparkConfig
from compaction_assets.execution.spark import (
    DAEMON_CONF,
    JVM_FOOTPRINT,
    LOCAL_DEFAULTS,
    OMP_THREADS_CONF,
    spark_conf,
    worker_daemon,
    worker_threads,
)


@pytest.mark.parametrize(
    ("master", "threads"),
    [
        ("local", "1"),
        ("local[2]", "2"),
        ("local[ 3 ]", "3"),
        ("local[4,2]", "4"),
        ("local[*]", str(os.cpu_count() or 1)),
        ("local[*,3]", str(os.cpu_count() or 1)),
        ("spark://127.0.0.1:7077", None),
        ("local-cluster[2,1,1024]", None),
    ],
)
def test_worker_threads_follow_a_local_masters_cores(master: str, threads: str | None) -> None:
    assert worker_threads(master).get(OMP_THREADS_CONF) == threads


def _arrow_threads(_rows):  # noqa: ANN001, ANN202 - runs in a Spark Python worker
    import pyarrow as pa

    yield os.environ.get("OMP_NUM_THREADS"), pa.cpu_count()


def test_python_workers_of_a_local_session_use_its_cores(spark) -> None:  # noqa: ANN001 - the conftest session
    # Spark alone would set OMP_NUM_THREADS=1 in local mode: one Arrow thread per worker.
    seen = set(spark.sparkContext.parallelize(range(2), 2).mapPartitions(_arrow_threads).collect())
    assert seen == {("2", 2)}


def test_a_local_sessions_jvm_runs_with_the_small_footprint_options(spark) -> None:  # noqa: ANN001
    arguments = list(
        spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    )
    assert set(JVM_FOOTPRINT.split()) <= set(arguments), arguments
    connect = SparkConfig(mode="connect", remote="sc://127.0.0.1:1")
    assert JVM_FOOTPRINT not in str(spark_conf(connect)) and "XX" not in LOCAL_DEFAULTS["spark.driver.extraJavaOptions"]


def _pandas_in_worker(_rows):  # noqa: ANN001, ANN202 - runs in a Spark Python worker
    import sys

    import pyarrow as pa
    import pyarrow.dataset  # noqa: F401 - pyarrow's pandas shim imports pandas here when it can

    import compaction_assets.execution.worker  # noqa: F401

    try:
        import pandas  # noqa: F401

        importable = True
    except ModuleNotFoundError:
        importable = False
    yield "pandas" in sys.modules, importable, tuple(pa.array([1, 2]).to_pylist())


def test_python_workers_of_a_local_session_leave_pandas_out(spark) -> None:  # noqa: ANN001
    # 52 MiB in every worker that nothing there uses (execution/spark_daemon.py)
    seen = set(spark.sparkContext.parallelize(range(2), 2).mapPartitions(_pandas_in_worker).collect())
    assert seen == {(False, False, (1, 2))}
    assert worker_daemon("local[2]") == {DAEMON_CONF: "compaction_assets.execution.spark_daemon"}
    # a cluster's executors may get the package only from spark.submit.pyFiles, after their daemon starts
    assert worker_daemon("spark://127.0.0.1:7077") == worker_daemon("local-cluster[2,1,1024]") == {}


def _nanoseconds_in_worker(folder: str, _rows):  # noqa: ANN001, ANN202 - runs in a Spark Python worker
    import pyarrow as pa
    from pyiceberg.conversions import from_bytes
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import LongType, NestedField, TimestampNanoType

    from compaction_assets.execution.parquet_encoding import ArrowPathWriter
    from compaction_assets.execution.partitioning import split_by_partition

    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "at", TimestampNanoType()))
    at = pa.array([1_700_000_000_000_000_000, 1_700_000_000_000_001_001], pa.timestamp("ns"))
    batch = pa.record_batch({"id": pa.array([1, 2], pa.int64()), "at": at})
    writer = ArrowPathWriter(PyArrowFileIO().new_output(f"{folder}/ns.parquet"), schema, {})
    writer.write(pa.Table.from_batches([batch]))
    upper = writer.close().to_serialized_dict()["upper_bounds"][2]
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="at"))
    keys = sorted(record[0] for record, _ in split_by_partition(batch, spec, schema))
    yield from_bytes(TimestampNanoType(), upper), tuple(keys)


def test_nanosecond_timestamps_need_no_pandas_in_the_workers(spark, tmp_path) -> None:  # noqa: ANN001
    # pyarrow turns nanoseconds into Python values only through pandas: the Arrow path's statistics
    # and an old-spec split read them as integers (found by an outside attack on the daemon)
    task = functools.partial(_nanoseconds_in_worker, str(tmp_path))
    [(upper, keys)] = spark.sparkContext.parallelize(range(1), 1).mapPartitions(task).collect()
    assert upper == 1_700_000_000_000_001_001
    assert keys == (1_700_000_000_000_000_000, 1_700_000_000_000_001_001)


def _resident_mib() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_a_finished_group_gives_its_freed_pages_back():
    # Arrow's allocator keeps freed pages for reuse; a reused worker kept its last group's peak
    import pyarrow as pa
    import pyarrow.compute as pc

    from compaction_assets.execution.worker import release_memory

    if pa.default_memory_pool().backend_name != "mimalloc":  # ARROW_DEFAULT_MEMORY_POOL chose another
        pytest.skip("pyarrow's jemalloc and system pools keep what this frees (measured: ~1 MiB given back)")
    doubled = pc.multiply(pa.array(range(5_000_000), pa.int64()), 2)  # 40 MB in Arrow's pool, twice
    more = pc.add(doubled, 1)
    del doubled, more
    held = _resident_mib()
    release_memory()
    assert _resident_mib() < held - 30
