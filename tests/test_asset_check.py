"""Materialising a table partition compacts it; the blocking consistency check follows it."""

from pathlib import Path
from urllib.parse import urlparse

import pytest
from dagster import (
    AssetKey,
    DagsterRunStatus,
    RunRequest,
    build_schedule_context,
    build_sensor_context,
)
from dagster._core.test_utils import create_run_for_test

from compaction_assets.commit.ledger import Status
from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions, table_job
from compaction_assets.defs.naming import op_name
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.lake.digest import batches_digest, rows_digest
from tests.conftest import create_fragmented, data_files
from tests.lakekit.dagster_runs import materialization_metadata, run_partition

KEY = AssetKey(["lake", "ns", "t"])
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


@pytest.mark.filterwarnings("error::DeprecationWarning:compaction_assets.*")  # e.g. AssetExecutionContext.run_id
def test_materialising_a_partition_compacts_it_and_the_check_passes(lake, instance):
    table = create_fragmented(lake, "ns.t", {"eu": 30, "tiny": 3})
    before = rows_digest(table)

    result, check = run_partition(lake, instance, "region=eu")

    assert result.success
    meta = materialization_metadata(result)
    assert meta["status"] == "committed" and meta["kind"] == "minor"
    assert (meta["data_files_before"], meta["data_files_after"]) == (30, 1)
    assert meta["rows"] == 30 * 50 and meta["groups"] == 1 and meta["queue"] == "default"
    assert meta["task_id"] == result.run_id
    assert 0 <= meta["dagster_run_fixed_cost_s"] < 600
    assert int(meta["snapshot_id"]) == lake.table("ns.t").current_snapshot().snapshot_id
    assert check.passed and check.check_name == "precommit_commit_consistency"
    assert rows_digest(lake.table("ns.t")) == before

    quiet, quiet_check = run_partition(lake, instance, "region=tiny")
    assert quiet.success and quiet_check.passed
    meta = materialization_metadata(quiet)
    assert meta["status"] == "skipped" and "min_input_files" in meta["reason"]

    # GC, the daily schedule's run over every table's maintenance partition: the 30 replaced files
    # go once their snapshots expire.
    with lake.table("ns.t").transaction() as txn:
        txn.set_properties({"history.expire.max-snapshot-age-ms": "0"})
    defs = build_definitions(load_config(lake.config_path))
    [daily] = defs.schedules
    request = daily(build_schedule_context(instance=instance))
    assert isinstance(request, RunRequest)
    assert list(instance.get_dynamic_partitions("maintenance_tables")) == ["ns.t"]  # added by the schedule
    gc = defs.resolve_job_def("gc_all_tables").execute_in_process(instance=instance, tags=request.tags)
    [event] = gc.asset_materializations_for_node("maintenance")
    assert event.partition == "ns.t" and event.metadata["kind"].value == "gc"
    assert event.metadata["files_deleted"].value >= 30 and event.metadata["bytes_reclaimed"].value > 0
    assert rows_digest(lake.table("ns.t")) == before


def test_check_fails_and_blocks_on_a_task_left_prepared_until_recovered(lake, instance):
    """An attempt left PREPARED by a live process (here: this one, as a run stuck in its commit)
    holds the partition: the run skips it and the blocking check fails naming the attempt and
    `recover`. One left by a dead process is recovered: by the recovery sensor's run (below), or by
    the partition's next run itself (tests/test_open_attempts.py)."""
    table = create_fragmented(lake, "ns.t", {"eu": 30})
    before = rows_digest(table)
    eu = [f["file_path"] for f in table.inspect.files().to_pylist()]
    stuck = lake.engine.ledger.begin(
        "stuck-task", "ns.t", "region=eu", "minor", table.current_snapshot().snapshot_id, eu, ["/nowhere"], 1500, 1
    )
    lake.engine.ledger.prepare(stuck.attempt_id, [], rows_out=1500, bytes_out=1)

    result, check = run_partition(lake, instance, "region=eu")

    assert not result.success  # blocking: the run fails
    assert not check.passed
    problems = check.metadata["problems"].value
    assert f"attempt {stuck.attempt_id} of task stuck-task is left PREPARED" in problems
    assert "compaction-assets recover" in check.metadata["fix"].value
    lake.engine.ledger.mark_rolled_back(stuck.attempt_id, "test: the stuck run gave up")

    crashed = lake.cli("compact", "ns.t", crash_at="after_prepare")  # a run that died after precommit
    assert crashed.returncode == 137, crashed.stderr

    # The automatic path: the recovery sensor notices the dead attempt and requests a recovery run.
    defs = build_definitions(load_config(lake.config_path))
    resources = {"compaction": CompactionResource(config_path=str(lake.config_path))}
    context = build_sensor_context(instance=instance, definitions=defs, resources=resources)
    request = defs.get_sensor_def("recovery_sensor")(context)
    assert isinstance(request, RunRequest)
    assert defs.resolve_job_def("recover_compaction_tasks").execute_in_process(instance=instance).success
    assert lake.engine.ledger.counts() == {"COMMITTED": 1, "ROLLED_BACK": 1}
    healed, healed_check = run_partition(lake, instance, "region=eu")
    assert healed.success and healed_check.passed
    assert rows_digest(lake.table("ns.t")) == before
    assert len(lake.table("ns.t").inspect.files()) == 1


def test_a_run_over_a_range_of_partitions_reports_each_and_a_failing_one_alone(lake, instance):
    """The sensor asks one run for a table's 30 fragmented partitions; the run compacts them in one
    commit, reports a materialisation and a check result per partition, and fails naming the one
    partition whose file is corrupt, the 29 others committed. A neighbour in the same op, with
    partitions of its own (nothing worth compacting), is left alone."""
    regions = [f"r{i:02d}" for i in range(30)]
    table = create_fragmented(lake, "ns.t", dict.fromkeys(regions, 6), rows=10)
    assert op_name("default", "ns.t77") == op_name("default", "ns.t")
    create_fragmented(lake, "ns.t77", {"eu": 1, "r00": 1})
    healthy = "region != 'r07'"
    before = batches_digest(table.scan(row_filter=healthy).to_arrow_batch_reader())
    snapshots = len(table.metadata.snapshots)
    defs = build_definitions(load_config(lake.config_path))
    resources = {"compaction": CompactionResource(config_path=str(lake.config_path))}
    sensor = defs.get_sensor_def("fragmentation_sensor")
    tick = sensor(build_sensor_context(instance=instance, definitions=defs, resources=resources))
    [request] = tick.run_requests
    assert (request.tags[RANGE_START], request.tags[RANGE_END]) == ("region=r00", "region=r29")
    for r in tick.dynamic_partitions_requests:  # what the daemon does before it launches the run
        instance.add_dynamic_partitions(r.partitions_def_name, r.partition_keys)
    starting = DagsterRunStatus.STARTING
    assert request.asset_selection == [KEY] and request.job_name is None
    queued = create_run_for_test(instance, job_name="__ASSET_JOB", status=starting, tags=request.tags)
    again = sensor(build_sensor_context(instance=instance, definitions=defs, resources=resources))
    assert again.run_requests == []  # every partition of the range is in flight
    instance.delete_run(queued.run_id)
    [corrupt] = [f["file_path"] for f in data_files(table) if f["partition"]["region"] == "r07"][:1]
    Path(urlparse(corrupt).path).write_bytes(b"PAR1 this is not a parquet file PAR1")

    result = table_job(defs, "ns.t").execute_in_process(instance=instance, tags=request.tags, raise_on_error=False)

    assert not result.success  # r07 failed
    events = result.asset_materializations_for_node(op_name("default", "ns.t"))
    meta = {e.partition: {k: v.value for k, v in e.metadata.items()} for e in events}
    assert sorted(meta) == [f"region={r}" for r in regions if r != "r07"]
    assert {e.asset_key for e in events} == {KEY}  # ns.t77, in the same op, is not selected
    assert all(m["status"] == "committed" and m["data_files_after"] == 1 and m["rows"] == 60 for m in meta.values())
    assert {m["partitions_in_run"] for m in meta.values()} == {30}
    checks = {c.partition: c for c in result.get_asset_check_evaluations()}
    assert sorted(checks) == [f"region={r}" for r in regions]  # every partition of the run, r07 included
    assert {c.asset_key for c in checks.values()} == {KEY}
    assert all(c.passed for c in checks.values())  # r07's failed attempt left nothing behind
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "1 of 30 partition(s) failed" in failure.event_specific_data.error.message
    assert corrupt in str(failure.event_specific_data.user_failure_data.metadata["failed_partitions"].value)
    attempts = lake.engine.ledger.attempts(table_name="ns.t")
    assert sorted((a.partition_key, a.status) for a in attempts) == sorted(
        (f"region={r}", Status.FAILED if r == "r07" else Status.COMMITTED) for r in regions
    )
    assert {a.task_id for a in attempts} == {f"{result.run_id}:region={r}" for r in regions}
    table = lake.table("ns.t")
    assert len(table.metadata.snapshots) == snapshots + 1  # one commit for the 29
    assert batches_digest(table.scan(row_filter=healthy).to_arrow_batch_reader()) == before
