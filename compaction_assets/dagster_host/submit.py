"""Launch a compaction run of one table through the instance's run launcher, as a run the
fragmentation sensor requests is launched: Dagster's asset job, subset to the table's asset (there
is no job per table). For the bench, tests and operators (`dagster job launch` takes a job name)."""

from __future__ import annotations

from collections.abc import Mapping

from dagster import DagsterInstance, DagsterRun
from dagster.version import __version__
from dagster_shared.cli import WorkspaceOpts

from compaction_assets.dagster_host.dagster_internals import (
    IMPLICIT_ASSET_JOB_NAME,
    CodeLocation,
    JobSubsetSelector,
    RemoteRepository,
    get_code_location_from_workspace,
    get_remote_repository_from_code_location,
    get_workspace_from_cli_opts,
)
from compaction_assets.defs.naming import PARTITION_TAG, table_key

DEFINITIONS_MODULE = "compaction_assets.definitions"


def launch_table_run(
    instance: DagsterInstance,
    table_name: str,
    partition: str | None = None,
    tags: Mapping[str, str] | None = None,
    module: str = DEFINITIONS_MODULE,
) -> str:
    """Load the code location in a code server (as `dagster job launch` does), create the run and
    submit it to the instance's run coordinator; returns the run id."""
    opts = WorkspaceOpts(module_name=(module,))
    with get_workspace_from_cli_opts(instance, version=__version__, workspace_opts=opts) as workspace:
        location = get_code_location_from_workspace(workspace, None)
        repository = get_remote_repository_from_code_location(location, None)
        run = create_table_run(instance, location, repository, table_name, partition, tags)
        instance.submit_run(run.run_id, workspace)
    return run.run_id


def create_table_run(
    instance: DagsterInstance,
    location: CodeLocation,
    repository: RemoteRepository,
    table_name: str,
    partition: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> DagsterRun:
    """A run (NOT_STARTED) of the table's asset and its check, of `partition` if given."""
    key = table_key(table_name)
    selector = JobSubsetSelector(
        location_name=location.name,
        repository_name=repository.name,
        job_name=IMPLICIT_ASSET_JOB_NAME,
        op_selection=None,
        asset_selection=[key],
    )
    job = location.get_job(selector)
    plan = location.get_execution_plan(job, {}, step_keys_to_execute=None, known_state=None, instance=instance)
    return instance.create_run(
        job_name=job.name,
        run_id=None,
        run_config={},
        resolved_op_selection=None,
        step_keys_to_execute=plan.execution_plan_snapshot.step_keys_to_execute,
        op_selection=None,
        status=None,
        root_run_id=None,
        parent_run_id=None,
        tags={**job.tags, **(tags or {}), **({PARTITION_TAG: partition} if partition else {})},
        job_snapshot=job.job_snapshot,
        execution_plan_snapshot=plan.execution_plan_snapshot,
        parent_job_snapshot=job.parent_job_snapshot,
        remote_job_origin=job.get_remote_origin(),
        job_code_origin=job.get_python_origin(),
        asset_selection=frozenset({key}),
        asset_check_selection=None,
        asset_graph=repository.asset_graph,
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m compaction_assets.dagster_host.submit TABLE [PARTITION]`: prints the run id."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("table")
    parser.add_argument("partition", nargs="?")
    args = parser.parse_args(argv)
    with DagsterInstance.get() as instance:
        print(launch_table_run(instance, args.table, args.partition))


if __name__ == "__main__":
    main()
