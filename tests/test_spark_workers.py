"""Spark's Python workers get as many Arrow threads as a local master has cores."""

from __future__ import annotations

import os

import pytest

from compaction_assets.config import SparkConfig
from compaction_assets.execution.spark import (
    JVM_FOOTPRINT,
    LOCAL_DEFAULTS,
    OMP_THREADS_CONF,
    spark_conf,
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
