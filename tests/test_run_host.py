"""The warm run launcher: a real Dagster instance launches real runs of the project's jobs through
the run host (a forked child of a process that imported everything once), terminates one, and
falls back to the code server's new process per run when the host is down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.launcher import WorkerStatus

from compaction_assets.config import load_config
from compaction_assets.dagster_host.launcher import HOST_PID_TAG
from compaction_assets.dagster_host.protocol import SOCKET_NAME
from compaction_assets.lake.catalog import open_catalog
from compaction_tools.bench.fixed_cost import trivial_table
from tests.conftest import REPO, write_config
from tests.lakekit.waiting import wait_until

DAGSTER_YAML = """telemetry: {enabled: false}
run_launcher:
  module: compaction_assets.dagster_host.launcher
  class: WarmRunLauncher
run_coordinator:
  module: dagster._core.run_coordinator.sync_in_memory_run_coordinator
  class: SyncInMemoryRunCoordinator
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = write_config(tmp_path)
    open_catalog(load_config(config).catalog).create_namespace("ns")
    for name in ("ns.t1", "ns.t2", "ns.t3", "ns.t4"):
        trivial_table(config, name)
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("COMPACTION_CONFIG", str(config))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return home


def start_host(home: Path) -> subprocess.Popen:
    log = (home / "host.log").open("w")
    host = subprocess.Popen(
        [sys.executable, "-m", "compaction_assets.dagster_host"], cwd=home, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait(lambda: (home / SOCKET_NAME).exists() or host.poll() is not None, 120, "the run host to listen")
        assert host.poll() is None, (home / "host.log").read_text()
    except BaseException:  # a host that never listened (or Ctrl-C meanwhile) is not left running
        host.kill()
        host.wait(30)
        raise
    return host


def launch(home: Path, table: str) -> str:
    """As `dagster job launch`: the instance's run launcher launches it; returns the run id."""
    before = {r.run_id for r in DagsterInstance.get().get_runs()}
    command = [sys.executable, "-m", "compaction_assets.dagster_host.submit", table]
    done = subprocess.run(command, cwd=home, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    [run_id] = {r.run_id for r in DagsterInstance.get().get_runs()} - before
    return run_id


def wait(condition, seconds: float, what: str) -> None:  # noqa: ANN001
    wait_until(condition, seconds, interval=0.5, message=f"timed out waiting for {what}")


def finished(run_id: str, seconds: float = 300):  # noqa: ANN201
    instance = DagsterInstance.get()
    wait(lambda: instance.get_run_by_id(run_id).is_finished, seconds, f"run {run_id} to finish")
    return instance.get_run_by_id(run_id)


def working_in(folder: Path) -> list[int]:
    """Live processes whose working directory is `folder` (Linux /proc)."""
    found = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            if cwd.readlink() == folder and "Z" not in (cwd.parent / "stat").read_text().rsplit(")", 1)[1][:3]:
                found.append(int(cwd.parent.name))
        except OSError:
            continue
    return found


def messages(run_id: str) -> str:
    return "\n".join(e.message or "" for e in DagsterInstance.get().all_logs(run_id))


def test_runs_fork_from_the_warm_host_terminate_and_fall_back(home: Path):
    host = start_host(home)
    try:
        run = finished(launch(home, "ns.t1"))
        logs = messages(run.run_id)
        assert run.status == DagsterRunStatus.SUCCESS, logs
        assert "forked from the warm run host" in logs
        assert "dagster_run_fixed_cost_s=" in logs
        instance = DagsterInstance.get()
        assert instance.run_launcher.check_run_worker_health(run).status == WorkerStatus.SUCCESS

        run_id = launch(home, "ns.t2")
        wait(lambda: instance.get_run_by_id(run_id).status == DagsterRunStatus.STARTED, 120, "run start")
        assert instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run_id)).status == (
            WorkerStatus.RUNNING
        )
        assert instance.run_launcher.terminate(run_id)
        run = finished(run_id, 120)
        assert run.status == DagsterRunStatus.CANCELED, messages(run_id)
        health = instance.run_launcher.check_run_worker_health
        wait(lambda: health(run).status != WorkerStatus.RUNNING, 60, "the canceled run's process to exit")

        # a run process that dies (OOM killer, kill -9) is FAILED to run monitoring
        run_id = launch(home, "ns.t3")
        wait(lambda: instance.get_run_by_id(run_id).status == DagsterRunStatus.STARTED, 120, "run start")
        os.kill(int(instance.get_run_by_id(run_id).tags[HOST_PID_TAG]), signal.SIGKILL)
        wait(lambda: health(instance.get_run_by_id(run_id)).status == WorkerStatus.FAILED, 30, "FAILED health")
    finally:
        host.send_signal(signal.SIGTERM)
        try:
            host.wait(30)
        except subprocess.TimeoutExpired:
            host.kill()
            raise
    assert not (home / SOCKET_NAME).exists()
    # nothing the runs started outlives them (a local JVM interrupted before its driver connected did)
    wait(lambda: not working_in(home), 30, f"processes working in {home} to exit: {working_in(home)}")

    run = finished(launch(home, "ns.t4"))
    logs = messages(run.run_id)
    assert run.status == DagsterRunStatus.SUCCESS, logs
    assert HOST_PID_TAG not in run.tags
    assert "no warm run host" in logs and "launching through the code server" in logs
