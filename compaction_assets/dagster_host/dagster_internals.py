"""Every Dagster private name the project uses, in one place.

Dagster has no public API for what the warm run host does: execute a launched run inside an
already-imported process (what the code server's run process does: `dagster._grpc.impl`), launch a
run of the asset job subset to one table through the instance's run coordinator (what `dagster job
launch` does), and a run launcher that falls back to the default one. The run host, the launcher,
`submit` and the bench reach those through the names here; tests/test_compat_contract.py checks
the installed version against TESTED_DAGSTER (pyproject.toml caps dagster below the next minor),
that every name imports, and that the functions called take the arguments passed.
"""

from __future__ import annotations

from dagster import DagsterInstance, DefaultRunLauncher
from dagster._cli.workspace.cli_target import (
    get_code_location_from_workspace,
    get_remote_repository_from_code_location,
    get_workspace_from_cli_opts,
)
from dagster._core.definitions.assets.job.asset_job import IMPLICIT_ASSET_JOB_NAME
from dagster._core.definitions.selector import JobSubsetSelector
from dagster._core.events import EngineEventData
from dagster._core.instance import InstanceRef
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.origin import JobPythonOrigin
from dagster._core.remote_representation.code_location import CodeLocation
from dagster._core.remote_representation.external import RemoteRepository
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster._grpc.impl import core_execute_run
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import ConfigurableClassData
from dagster._utils.hosted_user_process import recon_job_from_origin
from dagster._utils.interrupts import capture_interrupts

TESTED_DAGSTER = ("1.13",)  # minor versions the contract test has seen
# a dagster.yaml `run_coordinator` that runs submitted runs at once, in the submitting process
SYNC_RUN_COORDINATOR_MODULE = "dagster._core.run_coordinator.sync_in_memory_run_coordinator"

__all__ = [
    "IMPLICIT_ASSET_JOB_NAME",
    "CheckRunHealthResult",
    "CodeLocation",
    "ConfigurableClassData",
    "EngineEventData",
    "ExecuteRunArgs",
    "InstanceRef",
    "JobPythonOrigin",
    "JobSubsetSelector",
    "LaunchRunContext",
    "RemoteRepository",
    "RepositorySnap",
    "WorkerStatus",
    "capture_interrupts",
    "core_execute_run",
    "get_code_location_from_workspace",
    "get_remote_repository_from_code_location",
    "get_workspace_from_cli_opts",
    "launched_run_ids",
    "launcher_instance",
    "recon_job_from_origin",
]


def launcher_instance(launcher: DefaultRunLauncher) -> DagsterInstance:
    """The instance a run launcher was configured for (`_instance`, a weak reference's target)."""
    return launcher._instance


def launched_run_ids(launcher: DefaultRunLauncher) -> set[str]:
    """The runs a DefaultRunLauncher started in this process (its `_run_ids`, which its health
    check and termination consult)."""
    return launcher._run_ids
