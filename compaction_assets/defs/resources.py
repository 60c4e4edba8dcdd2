"""Resources: where compaction.yaml is, and the Spark session (dagster-pyspark)."""

from dagster import ConfigurableResource
from dagster_pyspark import LazyPySparkResource

from compaction_assets.config import CompactionConfig, load_config
from compaction_assets.engine import Engine
from compaction_assets.execution.spark import (
    ensure_worker_python,
    require_server,
    spark_conf,
    spark_session,
    stale_connect_session,
)


class CompactionResource(ConfigurableResource):
    """compaction.yaml, read fresh for every run, so policy changes apply without a restart."""

    config_path: str | None = None

    def load(self) -> CompactionConfig:
        return load_config(self.config_path)

    def engine(self, spark: LazyPySparkResource | None = None) -> Engine:
        config = self.load()
        if spark is None:
            return Engine(config)

        def session():  # noqa: ANN202 - a SparkSession, local or Connect
            require_server(config.spark)  # connect mode: fails at once, naming `spark-server start`
            ensure_worker_python()
            if config.spark.mode == "connect":
                # The resource's remote names the shared session of the server that ran when the
                # definitions were loaded; a server restarted since has a new one.
                current = spark_conf(config.spark)["spark.remote"]
                if spark.spark_config.get("spark.remote") != current or stale_connect_session(current):
                    return spark_session(config.spark)
            return spark.spark_session

        return Engine(config, spark=session)


def pyspark_resource(config: CompactionConfig) -> LazyPySparkResource:
    """A session only when a run needs one; `spark.remote` in the conf selects Spark Connect."""
    return LazyPySparkResource(spark_config=spark_conf(config.spark))
