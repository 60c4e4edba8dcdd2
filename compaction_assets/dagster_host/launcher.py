"""A run launcher that hands runs to the warm run host, else launches them the default way.

dagster.yaml:
    run_launcher:
      module: compaction_assets.dagster_host.launcher
      class: WarmRunLauncher
      config: {socket: /path/run-host.sock}   # optional; default $DAGSTER_HOME/run-host.sock
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, DagsterRun, DefaultRunLauncher, Field, StringSource, serialize_value

from compaction_assets.dagster_host.dagster_internals import (
    CheckRunHealthResult,
    ConfigurableClassData,
    LaunchRunContext,
    WorkerStatus,
    launched_run_ids,
    launcher_instance,
)
from compaction_assets.dagster_host.protocol import default_socket, request

HOST_PID_TAG = "compaction/run_host_pid"


class WarmRunLauncher(DefaultRunLauncher):
    """DefaultRunLauncher, except a run goes to the run host (a forked, already-warm process) when it listens."""

    def __init__(self, inst_data: ConfigurableClassData | None = None, socket: str | None = None):
        super().__init__(inst_data=inst_data)
        self._socket = socket

    @classmethod
    def config_type(cls) -> dict:
        return {"socket": Field(StringSource, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> WarmRunLauncher:
        return cls(inst_data=inst_data, socket=config_value.get("socket"))

    @property
    def instance(self) -> DagsterInstance:
        return launcher_instance(self)

    @property
    def socket_path(self) -> Path:
        if self._socket:
            return Path(self._socket)
        return default_socket(self.instance.root_directory if self.has_instance else None)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        if run.job_code_origin is None:
            self._fall_back(context, "the run has no code origin to load in the run host")
            return
        try:
            answer = request(
                self.socket_path,
                {
                    "op": "launch",
                    "run_id": run.run_id,
                    "origin": serialize_value(run.job_code_origin),
                    "instance_ref": serialize_value(self.instance.get_ref()),
                },
            )
        except OSError as exc:
            self._fall_back(context, f"no warm run host at {self.socket_path} ({type(exc).__name__})")
            return
        self.instance.add_run_tags(run.run_id, {HOST_PID_TAG: str(answer["pid"])})
        launched_run_ids(self).add(run.run_id)

    def _fall_back(self, context: LaunchRunContext, why: str) -> None:
        self.instance.report_engine_event(
            f"{why}: launching through the code server (a new Python process per run)",
            context.dagster_run,
            cls=self.__class__,
        )
        super().launch_run(context)

    def terminate(self, run_id: str) -> bool:
        run = self.instance.get_run_by_id(run_id) if self.has_instance else None
        if run is None or HOST_PID_TAG not in run.tags:
            return super().terminate(run_id)
        if run.is_finished:
            return False
        self.instance.report_run_canceling(run)
        try:
            return bool(request(self.socket_path, {"op": "terminate", "pid": int(run.tags[HOST_PID_TAG])})["sent"])
        except (OSError, RuntimeError) as exc:
            self.instance.report_engine_event(f"could not terminate the run: {exc}", run, cls=self.__class__)
            return False

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        if HOST_PID_TAG not in run.tags:
            # launched through the code server, which DefaultRunLauncher does not check either
            return CheckRunHealthResult(WorkerStatus.RUNNING, "launched through the code server: not checked")
        pid = int(run.tags[HOST_PID_TAG])
        try:
            answer = request(self.socket_path, {"op": "status", "pid": pid})
        except (OSError, RuntimeError):
            return _by_pid(pid)
        if answer["running"]:
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        if answer["exitcode"] == 0:
            return CheckRunHealthResult(WorkerStatus.SUCCESS)
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run process {pid} exited with code {answer['exitcode']}")


def _by_pid(pid: int) -> CheckRunHealthResult:
    """The host is gone (its children live on, reparented): is the run's process still there?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run process {pid} is gone and so is the run host")
    except PermissionError:
        pass
    return CheckRunHealthResult(WorkerStatus.RUNNING, f"run host down; run process {pid} still exists")
