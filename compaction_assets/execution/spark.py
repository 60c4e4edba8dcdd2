"""Spark sessions: `local` (one SparkSession per process) or `connect` (a shared Spark Connect server).

`spark_conf` is the one description of the session, used both here (CLI) and by the Dagster
layer's LazyPySparkResource: `spark.master` for local mode, `spark.remote` for Spark Connect.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from compaction_assets.config import SparkConfig

# Defaults suited to compaction jobs in local mode; anything in compaction.yaml's spark.conf wins.
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.extraJavaOptions": "-Dderby.system.home=/tmp",
}


def spark_conf(cfg: SparkConfig) -> dict[str, str]:
    if cfg.mode == "connect":
        return {"spark.remote": cfg.remote, **cfg.conf}
    return {"spark.master": cfg.master, "spark.app.name": "compaction-assets", **LOCAL_DEFAULTS, **cfg.conf}


def ensure_worker_python() -> None:
    """Spark's Python workers must run an interpreter with this package installed.

    pyspark 4 reads only PYSPARK_PYTHON for that (not spark.pyspark.python) and falls back to
    `python3` on the PATH; point it at the running interpreter unless the user chose one.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def spark_session(cfg: SparkConfig) -> SparkSession:
    """Get or create the session the config describes."""
    ensure_worker_python()
    builder = SparkSession.builder
    for key, value in spark_conf(cfg).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
