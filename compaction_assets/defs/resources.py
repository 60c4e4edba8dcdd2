"""Resources: where compaction.yaml is, and the Spark session (dagster-pyspark)."""

from dagster import ConfigurableResource, DagsterInstance, InitResourceContext
from dagster_pyspark import LazyPySparkResource
from pydantic import PrivateAttr

from compaction_assets.config import CompactionConfig, load_config
from compaction_assets.engine.facade import Engine
from compaction_assets.errors import CompactionError
from compaction_assets.execution.spark import (
    bounded_retries,
    ensure_worker_python,
    require_server,
    spark_conf,
    spark_session,
    stale_connect_session,
    start_local_jvm,
)

RETRY_ON_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"  # read by run retries when the run fails


class CompactionResource(ConfigurableResource):
    """compaction.yaml, read fresh for every run, so policy changes apply without a restart."""

    config_path: str | None = None
    _run: tuple[DagsterInstance, str] | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        if context.instance is not None and context.run is not None:
            self._run = (context.instance, context.run.run_id)

    def _fail_without_retry(self) -> None:
        """The Spark Connect server is down: retrying the run before someone (or the recovery
        sensor) starts it would only fail again, so this run is not re-executed by run retries."""
        if self._run is not None:
            instance, run_id = self._run
            instance.add_run_tags(run_id, {RETRY_ON_FAILURE_TAG: "false"})

    def load(self) -> CompactionConfig:
        return load_config(self.config_path)

    def engine(self, spark: LazyPySparkResource | None = None) -> Engine:
        config = self.load()
        if spark is None:
            return Engine(config)

        def session():  # noqa: ANN202 - a SparkSession, local or Connect
            try:
                require_server(config.spark)  # connect mode: fails at once, naming `spark-server start`
            except CompactionError:
                self._fail_without_retry()
                raise
            ensure_worker_python()
            if config.spark.mode == "connect":
                # The resource's remote names the shared session of the server that ran when the
                # definitions were loaded; a server restarted since has a new one.
                current = spark_conf(config.spark)["spark.remote"]
                if spark.spark_config.get("spark.remote") != current or stale_connect_session(current):
                    return spark_session(config.spark)
                return bounded_retries(spark.spark_session, current)
            start_local_jvm(spark.spark_config)  # the JVM's stderr without the incubator-module line
            return spark.spark_session

        return Engine(config, spark=session)


def pyspark_resource(config: CompactionConfig) -> LazyPySparkResource:
    """A session only when a run needs one; `spark.remote` in the conf selects Spark Connect."""
    return LazyPySparkResource(spark_config=spark_conf(config.spark))
