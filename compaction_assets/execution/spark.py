"""Spark sessions: `local` (one SparkSession per process) or `connect` (a shared Spark Connect server)."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from compaction_assets.config import SparkConfig

# Defaults suited to compaction jobs; anything in compaction.yaml's spark.conf wins.
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.extraJavaOptions": "-Dderby.system.home=/tmp",
}


def spark_session(cfg: SparkConfig) -> SparkSession:
    """Get or create the session the config describes."""
    if cfg.mode == "connect":
        builder = SparkSession.builder.remote(cfg.remote)
        conf = dict(cfg.conf)
    else:
        # Python workers must run an interpreter with this package installed. pyspark 4 reads
        # only PYSPARK_PYTHON for that (not spark.pyspark.python), falling back to `python3`.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.master(cfg.master)
        conf = {**LOCAL_DEFAULTS, **cfg.conf}
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.appName("compaction-assets").getOrCreate()
