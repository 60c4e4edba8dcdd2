"""The recovery sensor heals crashes: of compaction attempts (a recovery run), and of the warm Spark
Connect server in connect mode (a restart run)."""

import datetime as dt
import time

from dagster import (
    DefaultSensorStatus,
    JobDefinition,
    OpExecutionContext,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    graph,
    op,
    sensor,
)

from compaction_assets.commit.ledger import OPEN
from compaction_assets.commit.recovery import orphaned_because
from compaction_assets.config import CompactionConfig
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.defs.sensors import IN_PROGRESS
from compaction_assets.errors import CompactionError
from compaction_assets.execution import connect_server
from compaction_assets.redact import redact


@op(description="Finish or undo every compaction attempt whose process is gone (compaction-assets recover).")
def recover_orphaned_attempts(context: OpExecutionContext, compaction: CompactionResource) -> None:
    report = compaction.engine().recover()
    context.log.info(
        f"recovered {report.handled}: confirmed {report.confirmed}, recommitted {report.recommitted}, "
        f"rolled back {report.rolled_back}, abandoned {report.abandoned}"
    )
    if report.errors:
        raise CompactionError(redact("could not recover: " + "; ".join(report.errors)))


RECOVER_JOB = "recover_compaction_tasks"


@graph
def recover_graph() -> None:
    recover_orphaned_attempts()


RESTART_JOB = "restart_spark_server"
# Back-off for a server that keeps dying: the n-th restart within the window waits
# RESTART_BACKOFF_S * 2**(n-1) (at most RESTART_BACKOFF_MAX_S) after the one before it.
RESTART_WINDOW_S = 3600
RESTART_BACKOFF_S = 60
RESTART_BACKOFF_MAX_S = 900


@op(description="Start the warm Spark Connect server again after it died; runs then join its new session.")
def start_spark_server(context: OpExecutionContext, compaction: CompactionResource) -> None:
    cfg = compaction.load().spark
    before = connect_server.status(cfg)
    if before.running:
        context.log.info(f"nothing to do: {before.describe()}")
        return
    context.log.info(f"{before.describe()}; starting it")
    began = time.monotonic()
    state = connect_server.start(cfg)
    context.log.info(f"restarted in {time.monotonic() - began:.1f} s with a new shared session: {state.describe()}")


@graph
def restart_spark_server_graph() -> None:
    start_spark_server()


def recovery_jobs(compaction: CompactionResource) -> list[JobDefinition]:
    """The recovery sensor's jobs, `compaction` bound here: a job left to take it from the
    Definitions makes Dagster copy the sensor, and that copy warns (BetaWarning about the sensor's
    `owners`) in every process that loads the code location."""
    resources = {"compaction": compaction}
    return [
        recover_graph.to_job(name=RECOVER_JOB, tags={"compaction/maintenance": "recovery"}, resource_defs=resources),
        restart_spark_server_graph.to_job(
            name=RESTART_JOB, tags={"compaction/maintenance": "spark-server"}, resource_defs=resources
        ),
    ]


def server_restart_request(context: SensorEvaluationContext, config: CompactionConfig) -> RunRequest | None:
    """Connect mode: a run of `restart_spark_server` when the server started from `spark.server_dir`
    died (its pid file is left, its process is gone, nothing listens). One restart at a time; a
    server that keeps dying is restarted less and less often, and the tick log says so."""
    if config.spark.mode != "connect":
        return None
    try:
        current = connect_server.status(config.spark)
    except CompactionError:  # spark.remote on another machine: not ours to supervise
        return None
    if current.state != "died":
        return None
    now = time.time()
    records = context.instance.get_run_records(
        RunsFilter(job_name=RESTART_JOB, created_after=dt.datetime.fromtimestamp(now - RESTART_WINDOW_S, dt.UTC))
    )
    if busy := [r.dagster_run.run_id for r in records if r.dagster_run.status in IN_PROGRESS]:
        context.log.info(f"{current.describe()}; already being restarted by run {busy[0]}")
        return None
    if records:
        wait = min(RESTART_BACKOFF_S * 2 ** (len(records) - 1), RESTART_BACKOFF_MAX_S)
        last = max(r.create_timestamp.timestamp() for r in records)
        if now - last < wait:
            at = dt.datetime.fromtimestamp(last + wait, dt.UTC).strftime("%H:%M:%S UTC")
            context.log.warning(
                f"{current.describe()}. It died again after {len(records)} restart(s) in the last "
                f"{RESTART_WINDOW_S // 60} min: backing off, next restart not before {at} "
                f"(read its log; `compaction-assets spark-server stop` ends the supervision)"
            )
            return None
    context.log.warning(f"{current.describe()}: requesting a {RESTART_JOB} run")
    return RunRequest(run_key=f"spark-server|{current.dead_pid}|{len(records)}", job_name=RESTART_JOB)


def recovery_sensor(interval_seconds: int, jobs: list[JobDefinition]) -> SensorDefinition:
    """Requests `jobs` (recovery_jobs) when attempts are orphaned or the warm Spark died."""

    @sensor(
        name="recovery_sensor",
        jobs=jobs,
        minimum_interval_seconds=interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description="Requests a recovery run when a compaction attempt is left open by a dead process, and "
        "(spark.mode: connect) a restart of the warm Spark Connect server when the one we started died.",
    )
    def _sensor(context: SensorEvaluationContext, compaction: CompactionResource):  # noqa: ANN202
        engine = compaction.engine()
        config = engine.config
        requests = []
        if restart := server_restart_request(context, config):
            requests.append(restart)
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=config.state.executing_timeout_seconds)
        orphaned = [a for a in engine.ledger.attempts(statuses=OPEN) if orphaned_because(a, cutoff)]
        for attempt in orphaned:
            context.log.info(f"orphaned {attempt.status} attempt {attempt.attempt_id} of {attempt.table_name}")
        if orphaned:
            key = ",".join(sorted(a.attempt_id for a in orphaned))
            requests.append(RunRequest(run_key=key, job_name=RECOVER_JOB))
        if not requests:
            return SkipReason("no orphaned compaction attempts")
        return requests[0] if len(requests) == 1 else SensorResult(run_requests=requests)

    return _sensor
