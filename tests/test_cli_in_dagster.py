"""Work done with the CLI appears in the configured Dagster instance as the materialisations a
run would record: the table's asset partitions (and the maintenance asset's table partition)."""

from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from compaction_assets.defs.naming import MAINTENANCE_KEY, partitions_name, table_key
from tests.conftest import create_fragmented


@pytest.fixture
def dagster_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # the CLI's processes inherit it
    return home


def latest(home: Path, key: AssetKey, partition: str | None) -> dict:
    """The metadata of the instance's latest materialisation of the asset partition."""
    with DagsterInstance.from_config(str(home)) as instance:
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None), limit=1
        ).records
        assert records, f"{key.to_user_string()} [{partition}] never materialized"
        materialization = records[0].asset_materialization
        assert materialization.partition == partition
        return {k: v.value for k, v in materialization.metadata.items()}


def test_compact_from_the_cli_is_the_partitions_materialisation_in_dagster(lake, dagster_home):
    create_fragmented(lake, "ns.t", {"eu": 6, "us": 1})
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        assert instance.get_latest_materialization_event(table_key("ns.t")) is None  # "Never materialized"

    run = lake.cli("compact", "ns.t")

    assert run.returncode == 0, run.stderr
    assert f"reported 1 materialisation(s) to the Dagster instance in {dagster_home}" in run.stdout
    metadata = latest(dagster_home, table_key("ns.t"), "region=eu")
    [attempt] = lake.engine.ledger.attempts()
    assert metadata["status"] == "committed" and metadata["kind"] == "minor"
    assert (metadata["data_files_before"], metadata["data_files_after"], metadata["rows"]) == (6, 1, 300)
    assert metadata["snapshot_id"] == str(lake.table("ns.t").current_snapshot().snapshot_id)
    assert metadata["task_id"] == attempt.task_id and metadata["queue"] == "default"
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        assert instance.get_dynamic_partitions(partitions_name("ns.t")) == ["region=eu"]
        assert instance.get_materialized_partitions(table_key("ns.t")) == {"region=eu"}


def test_recover_and_rewrite_manifests_from_the_cli_are_materialisations_in_dagster(lake, dagster_home):
    create_fragmented(lake, "ns.t", {"eu": 6})
    assert lake.cli("compact", "ns.t", crash_at="after_prepare").returncode != 0
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        assert instance.get_latest_materialization_event(table_key("ns.t")) is None

    recovered = lake.cli("recover")

    assert recovered.returncode == 0, recovered.stderr
    assert "1 recommitted" in recovered.stdout
    metadata = latest(dagster_home, table_key("ns.t"), "region=eu")
    assert metadata["status"] == "committed" and "recommitted by `compaction-assets recover`" in metadata["reason"]
    assert (metadata["data_files_before"], metadata["data_files_after"]) == (6, 1)
    assert metadata["snapshot_id"] == str(lake.table("ns.t").current_snapshot().snapshot_id)

    rewritten = lake.cli("rewrite-manifests", "ns.t")

    assert rewritten.returncode == 0, rewritten.stderr
    maintenance = latest(dagster_home, MAINTENANCE_KEY, "ns.t")
    assert maintenance["kind"] == "rewrite-manifests" and maintenance["table"] == "ns.t"
    assert maintenance["status"] in ("committed", "skipped")
