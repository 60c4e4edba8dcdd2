"""The warm Spark Connect server, supervised: its health in `status`, runs that find it down fail
at once, and a server that died is restarted by the recovery sensor with a new shared session.

One real server (pyspark's own JVM on 127.0.0.1, a free port) serves the module; the tests run in
file order and the last one kills it. Dagster runs go through a real (temporary) instance."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterRunStatus, RunRequest, build_sensor_context, instance_for_test
from dagster._core.test_utils import create_run_for_test

from compaction_assets.config import CompactionConfig, load_config
from compaction_assets.defs.build import build_definitions, table_job
from compaction_assets.defs.recovery import RESTART_JOB
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.engine import Engine
from compaction_assets.execution import connect_server
from compaction_assets.execution.spark import SESSION_ID_FILE, forget_connect_session, spark_session
from tests.conftest import CLI, Lake, create_fragmented, free_port, write_config
from tests.lakekit.sensor_ticks import Collect
from tests.lakekit.waiting import wait_until

START = "compaction-assets spark-server start"
FAST_S = 30  # "at once", on a machine shared with other test runs


@dataclass
class Served:
    lake: Lake
    config: CompactionConfig

    @property
    def session_file(self) -> Path:
        return Path(self.config.spark.server_dir) / SESSION_ID_FILE

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "COMPACTION_CONFIG": str(self.lake.config_path)}
        return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=300)


def connect_lake(root: Path, port: int) -> Lake:
    spark = {
        "mode": "connect",
        "master": "local[2]",
        "remote": f"sc://127.0.0.1:{port}",
        "server_dir": "srv",
        "conf": {"spark.sql.shuffle.partitions": "2"},
    }
    config_path = write_config(root, spark=spark)
    engine = Engine(load_config(config_path))  # its Spark (if asked) is the Connect server's
    engine.catalog.create_namespace("ns")
    return Lake(root, config_path, engine)


def port_closed(port: int, seconds: float = 30) -> bool:
    def closed() -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", port)) != 0

    try:
        wait_until(closed, seconds, interval=0.2)
    except AssertionError:
        return False
    return True


def server_jvms(config: CompactionConfig) -> list[int]:
    """Pids of the JVMs started for this config's port (one, or the starts fought)."""
    flag = f"spark.connect.grpc.binding.port={connect_server.host_port(config.spark)[1]}".encode()
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if flag in (proc / "cmdline").read_bytes() and b"java" in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if not (connect_server.SBIN / "start-connect-server.sh").exists():
        pytest.skip("this pyspark wheel ships no Spark Connect server")
    lake = connect_lake(tmp_path_factory.mktemp("supervised"), free_port())
    config = lake.engine.config
    # Two starts at once (an operator and a supervised restart): they take turns, one JVM.
    env = {**os.environ, "COMPACTION_CONFIG": str(lake.config_path)}
    try:  # from the first start on: the server is stopped even if the starts fail or Ctrl-C comes meanwhile
        starts = [
            subprocess.Popen([*CLI, "spark-server", "start"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=300) for p in starts]
        started = connect_server.health(config.spark)
        assert [p.returncode for p in starts] == [0, 0], outs
        assert started.running and started.answering, started.describe()
        assert all(f"(pid {started.pid}" in out.decode() for out, _ in outs), outs
        assert server_jvms(config) == [started.pid]
        yield Served(lake, config)
    finally:
        pid = connect_server.status(config.spark).pid
        connect_server.stop(config.spark)
        if pid is not None and connect_server.status(config.spark).pid == pid:
            os.kill(pid, signal.SIGKILL)  # by pid: only the JVM this module started
        lake.engine.ledger.dispose()
        assert port_closed(connect_server.host_port(config.spark)[1])


@pytest.fixture(scope="module", autouse=True)
def connect_mode_left_behind():
    """This module makes Connect sessions in the test process, and pyspark then marks the process
    as Connect-only (environment variables): undone afterwards, so later modules' local Spark works.
    pyspark refuses a Connect session in a process with a classic one (the suite's `spark`
    fixture, made by an earlier module): that one is set aside meanwhile and put back after.
    A real process of ours only ever has one kind."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    names = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
    before = {n: os.environ.get(n) for n in names}
    classic = SparkContext._active_spark_context, SparkSession._instantiatedSession, SparkSession._activeSession
    SparkContext._active_spark_context = SparkSession._instantiatedSession = SparkSession._activeSession = None
    yield
    forget_connect_session()
    SparkContext._active_spark_context, SparkSession._instantiatedSession, SparkSession._activeSession = classic
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def instance():
    # Run retries as in the project's dagster.yaml: a failed run would be re-executed twice.
    with instance_for_test(overrides={"run_retries": {"enabled": True, "max_retries": 2}}) as instance:
        yield instance


def test_status_reports_a_running_server_that_answers(served):
    began = time.monotonic()
    as_json = served.cli("status", "--json")
    text = served.cli("status")
    assert time.monotonic() - began < 2 * FAST_S

    assert as_json.returncode == 0, as_json.stderr
    server = json.loads(as_json.stdout)["spark_server"]
    assert server["state"] == "running" and server["running"] and server["answering"]
    assert server["pid"] == int(next((Path(served.config.spark.server_dir) / "pids").glob("*.pid")).read_text())
    assert server["detail"].startswith("4.")  # the Spark version it answered with
    assert text.returncode == 0, text.stderr
    assert f"Spark Connect server running at {served.config.spark.remote} (pid {server['pid']}, Spark 4." in text.stdout


def test_status_tells_a_frozen_server_from_a_running_one_and_does_not_hang(served):
    """A JVM that listens but answers nothing (SIGSTOP: the kernel still accepts connections)."""
    pid = connect_server.status(served.config.spark).pid
    os.kill(pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        frozen = served.cli("status", "--json")
        seconds = time.monotonic() - began
        plain = served.cli("spark-server", "status")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert frozen.returncode == 0, frozen.stderr
    server = json.loads(frozen.stdout)["spark_server"]
    assert (server["state"], server["pid"], server["answering"]) == ("not-answering", pid, False)
    assert server["detail"] == "no answer within 3 s"
    assert seconds < FAST_S
    print(f"status of a frozen server: {seconds:.1f} s")
    assert plain.returncode == 3 and f"(pid {pid}) listens at" in plain.stdout and "does not answer" in plain.stdout
    assert connect_server.health(served.config.spark).state == "running"  # thawed: answers again


def test_status_of_no_server_and_of_something_else_listening(tmp_path):
    lake = connect_lake(tmp_path, free_port())
    try:
        env = {**os.environ, "COMPACTION_CONFIG": str(lake.config_path)}
        down = subprocess.run([*CLI, "status", "--json"], env=env, capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        assert json.loads(down.stdout)["spark_server"] | {"detail": None} == {
            "remote": lake.engine.config.spark.remote,
            "pid": None,
            "listening": False,
            "log_dir": str(Path(lake.engine.config.spark.server_dir) / "logs"),
            "dead_pid": None,
            "answering": None,
            "detail": None,
            "state": "stopped",
            "running": False,
        }
        text = subprocess.run([*CLI, "status"], env=env, capture_output=True, text=True, timeout=120)
        assert f"Spark Connect server not running ({lake.engine.config.spark.remote}): `{START}`" in text.stdout

        with socket.create_server(("127.0.0.1", 0)) as other:  # listens, speaks no gRPC, never answers
            cfg = lake.engine.config.spark.model_copy(update={"remote": f"sc://127.0.0.1:{other.getsockname()[1]}"})
            began = time.monotonic()
            foreign = connect_server.health(cfg, timeout_s=1.0)
            assert time.monotonic() - began < FAST_S
        assert (foreign.state, foreign.pid, foreign.answering) == ("foreign", None, False)
        assert "something else is listening" in foreign.describe()
    finally:
        lake.engine.ledger.dispose()


def test_runs_that_find_no_server_fail_at_once_and_are_not_retried(tmp_path, instance):
    lake = connect_lake(tmp_path, free_port())  # nothing listens there
    try:
        create_fragmented(lake, "ns.t", {"eu": 6})
        began = time.monotonic()
        run = lake.cli("compact", "ns.t")
        cli_seconds = time.monotonic() - began
        assert run.returncode != 0
        assert (run.stdout + run.stderr).count(START) == 1, run.stdout + run.stderr  # one failure, one message
        assert cli_seconds < FAST_S

        defs = build_definitions(load_config(lake.config_path))
        instance.add_dynamic_partitions("lake__ns__t", ["region=eu"])
        began = time.monotonic()
        result = table_job(defs, "ns.t").execute_in_process(
            instance=instance, partition_key="region=eu", raise_on_error=False
        )
        dagster_seconds = time.monotonic() - began
        assert not result.success
        failures = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
        assert len(failures) == 1
        assert START in failures[0].step_failure_data.error.to_string()
        assert not [e for e in result.all_events if e.event_type == DagsterEventType.STEP_UP_FOR_RETRY]
        assert dagster_seconds < FAST_S
        tags = instance.get_run_by_id(result.run_id).tags
        assert tags["dagster/will_retry"] == "false"  # run retries (max 2) leave it alone
        assert lake.table("ns.t").inspect.files().num_rows == 6  # untouched
        print(f"fail fast: CLI {cli_seconds:.1f} s, Dagster run {dagster_seconds:.1f} s")
    finally:
        lake.engine.ledger.dispose()


def recovery_tick(served: Served, instance):  # noqa: ANN201
    defs = build_definitions(load_config(served.lake.config_path))
    context = build_sensor_context(
        instance=instance,
        definitions=defs,
        resources={"compaction": CompactionResource(config_path=str(served.lake.config_path))},
    )
    collect = Collect()
    context.log.addHandler(collect)
    return defs.get_sensor_def("recovery_sensor")(context), "\n".join(collect.lines)


def kill_server(served: Served) -> tuple[int, float]:
    pid = connect_server.status(served.config.spark).pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    assert port_closed(connect_server.host_port(served.config.spark)[1])
    return pid, killed


def test_a_server_that_died_is_restarted_by_the_recovery_sensor_with_a_new_session(served, instance):
    spark = served.config.spark
    old_session = served.session_file.read_text().strip()
    create_fragmented(served.lake, "ns.after", {"eu": 8, "us": 8})
    loaded_before = build_definitions(load_config(served.lake.config_path))  # its Spark resource names old_session
    client = spark_session(spark)  # a client this process caches, in the shared session
    assert (client.session_id, client.range(3).count()) == (old_session, 3)

    pid, killed = kill_server(served)

    status = served.cli("spark-server", "status")
    assert status.returncode == 3 and f"died (pid {pid} is gone" in status.stdout and START in status.stdout
    result, log = recovery_tick(served, instance)
    detected = time.monotonic() - killed
    assert isinstance(result, RunRequest) and result.job_name == RESTART_JOB
    assert f"died (pid {pid} is gone" in log and f"requesting a {RESTART_JOB} run" in log
    restart = loaded_before.resolve_job_def(RESTART_JOB).execute_in_process(instance=instance, tags=result.tags)
    assert restart.success
    restarted = time.monotonic() - killed

    health = connect_server.health(spark)
    assert health.running and health.answering and health.pid not in (None, pid)
    new_session = served.session_file.read_text().strip()
    assert new_session != old_session
    again = spark_session(spark)  # the cached client of the old session is replaced by one in the new session
    assert client.is_stopped  # closed without a request (its atexit cleanup would retry a dead server)
    assert (again.session_id, again.range(4).count()) == (new_session, 4)
    again_tick, _ = recovery_tick(served, instance)
    assert not isinstance(again_tick, RunRequest)  # healthy: nothing requested

    # A Dagster run with definitions loaded before the restart, and a CLI run: both through it.
    instance.add_dynamic_partitions("lake__ns__after", ["region=eu"])
    run = table_job(loaded_before, "ns.after").execute_in_process(
        instance=instance, partition_key="region=eu", raise_on_error=False
    )
    assert run.success
    cli = served.cli("compact", "ns.after", "--partition", "region=us")
    assert cli.returncode == 0, cli.stderr
    assert "committed" in cli.stdout
    assert served.lake.table("ns.after").inspect.files().num_rows == 2
    print(f"killed -> detected {detected:.1f} s, -> restarted and answering {restarted:.1f} s")


def test_a_server_that_keeps_dying_is_restarted_with_back_off_and_one_at_a_time(served, instance):
    """Three restarts in the last hour: the next waits 4 (or 8) minutes after the last one."""
    # A client process with a cached session when the server dies: its next session fails at
    # once, and it exits at once (no retries of the dead server at exit).
    # Another, whose server dies while it uses the session (mid-run): it gives up after bounded
    # retries (not pyspark's ~10 min) and exits without retrying the dead server again.
    code = (
        "import sys; from compaction_assets.config import load_config; "
        "from compaction_assets.execution.spark import spark_session; "
        "cfg = load_config(sys.argv[1]).spark; s = spark_session(cfg); print(s.range(2).count(), flush=True); "
        "sys.stdin.readline(); spark_session(cfg) if sys.argv[2] == 'new' else s.range(3).count()"
    )
    clients = {
        how: subprocess.Popen(
            [sys.executable, "-c", code, str(served.lake.config_path), how],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for how in ("new", "cached")
    }
    assert [c.stdout.readline().strip() for c in clients.values()] == ["2", "2"]
    pid, _ = kill_server(served)
    began = time.monotonic()
    for client in clients.values():
        client.stdin.write("go\n")
        client.stdin.flush()
    seconds, errors = {}, {}
    try:
        for how, client in clients.items():
            errors[how] = client.communicate(timeout=300)[1]
            seconds[how] = time.monotonic() - began
    finally:
        for client in clients.values():
            if client.poll() is None:
                client.kill()
    print(f"client exits after its server died: {seconds}")
    assert seconds["new"] < FAST_S
    assert clients["new"].returncode != 0 and errors["new"].count(START) == 1, errors["new"]
    assert seconds["cached"] < 2 * FAST_S
    assert clients["cached"].returncode != 0 and "UNAVAILABLE" in errors["cached"], errors["cached"]

    for _ in range(3):  # restarts just now (the test above's may be minutes old on a busy machine)
        create_run_for_test(instance, job_name=RESTART_JOB, status=DagsterRunStatus.SUCCESS)
    result, log = recovery_tick(served, instance)
    assert not isinstance(result, RunRequest)
    assert f"died (pid {pid} is gone" in log
    assert "restart(s) in the last 60 min: backing off, next restart not before" in log

    create_run_for_test(instance, job_name=RESTART_JOB, status=DagsterRunStatus.STARTED)
    result, log = recovery_tick(served, instance)
    assert not isinstance(result, RunRequest)
    assert "already being restarted by run" in log

    stopped = served.cli("spark-server", "stop")  # stopped on purpose: no longer "died", not restarted
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert connect_server.status(served.config.spark).state == "stopped"
    with instance_for_test() as fresh:  # no back-off history: only the state decides
        result, log = recovery_tick(served, fresh)
    assert not isinstance(result, RunRequest) and "requesting" not in log
