"""Materialising a table partition compacts it; the blocking consistency check follows it."""

import pytest
from dagster import AssetKey, RunRequest, build_sensor_context, instance_for_test

from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions, table_job
from compaction_assets.defs.naming import op_name
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.lake.digest import rows_digest
from tests.conftest import create_fragmented

KEY = AssetKey(["lake", "ns", "t"])


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        yield instance


def run_partition(lake, instance, partition: str):
    defs = build_definitions(load_config(lake.config_path))
    instance.add_dynamic_partitions("lake__ns__t", [partition])
    job = table_job(defs, "ns.t")
    result = job.execute_in_process(instance=instance, partition_key=partition, raise_on_error=False)
    [check] = result.get_asset_check_evaluations() or [None]
    return result, check


def materialization_metadata(result) -> dict:
    [event] = result.asset_materializations_for_node(op_name("default", "ns.t"))
    return {k: v.value for k, v in event.metadata.items()}


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

    # GC, downstream of the table: the 30 replaced files go once their snapshots expire.
    with lake.table("ns.t").transaction() as txn:
        txn.set_properties({"history.expire.max-snapshot-age-ms": "0"})
    defs = build_definitions(load_config(lake.config_path))
    gc = defs.resolve_job_def("gc_all_tables").execute_in_process(instance=instance)
    [event] = gc.asset_materializations_for_node("gc_tables")
    assert event.metadata["files_deleted"].value >= 30 and event.metadata["bytes_reclaimed"].value > 0
    assert rows_digest(lake.table("ns.t")) == before


def test_check_fails_and_blocks_on_a_task_left_prepared_until_recovered(lake, instance):
    table = create_fragmented(lake, "ns.t", {"eu": 30})
    before = rows_digest(table)
    crashed = lake.cli("compact", "ns.t", crash_at="after_prepare")  # the run stopped after precommit
    assert crashed.returncode == 137, crashed.stderr

    result, check = run_partition(lake, instance, "region=eu")

    assert not result.success  # blocking: the run fails
    assert not check.passed
    problems = check.metadata["problems"].value
    assert "left PREPARED" in problems
    assert "compaction-assets recover" in check.metadata["fix"].value

    # The automatic path: the recovery sensor notices the dead attempt and requests a recovery run.
    defs = build_definitions(load_config(lake.config_path))
    resources = {"compaction": CompactionResource(config_path=str(lake.config_path))}
    context = build_sensor_context(instance=instance, definitions=defs, resources=resources)
    request = defs.get_sensor_def("recovery_sensor")(context)
    assert isinstance(request, RunRequest)
    assert defs.resolve_job_def("recover_compaction_tasks").execute_in_process(instance=instance).success
    assert lake.engine.ledger.counts() == {"COMMITTED": 1}
    healed, healed_check = run_partition(lake, instance, "region=eu")
    assert healed.success and healed_check.passed
    assert rows_digest(lake.table("ns.t")) == before
    assert len(lake.table("ns.t").inspect.files()) == 1
