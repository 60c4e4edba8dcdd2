"""Bad input ends in an error that names the file, table or key, and leaves the table unchanged."""

from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

from compaction_assets.commit.ledger import Status
from compaction_assets.errors import worker_error
from compaction_assets.lake.storage import files_with_prefix
from tests.conftest import create_fragmented, data_files


def eu_files(table) -> list[str]:
    return sorted(f["file_path"] for f in data_files(table) if f["partition"]["region"] == "eu")


def assert_failed_cleanly(lake, bad_path: str, snapshot_before: int) -> None:
    [outcome] = [o for o in lake.engine.compact("ns.t") if o.partition_key == "region=eu"]
    assert outcome.status == "failed"
    assert bad_path in outcome.reason
    assert lake.table("ns.t").current_snapshot().snapshot_id == snapshot_before
    [attempt] = lake.engine.ledger.attempts()
    assert attempt.status == Status.FAILED and bad_path in attempt.reason
    assert [p for d in attempt.output_dirs for p in files_with_prefix(d, attempt.attempt_id)] == []


def test_corrupt_parquet_fails_the_task_naming_the_file(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 20})
    corrupt = eu_files(table)[7]
    Path(urlparse(corrupt).path).write_bytes(b"PAR1 this is not a parquet file PAR1")
    assert_failed_cleanly(lake, corrupt, table.current_snapshot().snapshot_id)


def test_truncated_parquet_fails_the_task_naming_the_file(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 20})
    truncated = Path(urlparse(eu_files(table)[3]).path)
    truncated.write_bytes(truncated.read_bytes()[:-40])
    assert_failed_cleanly(lake, eu_files(table)[3], table.current_snapshot().snapshot_id)


def test_missing_data_file_fails_the_task_naming_the_file(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 20})
    missing = eu_files(table)[0]
    Path(urlparse(missing).path).unlink()
    assert_failed_cleanly(lake, missing, table.current_snapshot().snapshot_id)


def test_invalid_config_fails_the_cli_naming_the_key(tmp_path, lake):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"tables": [{"match": "*", "policy": {"target_file_size": 10}}]}))
    run = lake.cli("plan", "ns.t", config=bad)
    assert run.returncode == 2
    assert "tables.0.policy.target_file_size: unknown key" in run.stderr
    assert str(bad) in run.stderr


def test_unknown_table_is_named(lake):
    run = lake.cli("plan", "ns.nope")
    assert run.returncode == 2
    assert "table 'ns.nope' not found in catalog 'lake'" in run.stderr


def test_a_worker_error_names_the_exception_but_never_the_rows_arrow_prints():
    """Arrow's errors go on to print the batch (a table's rows): a group's reported error keeps the
    type and the first line only, cut short."""
    rows = pa.table({"secret_value": ["card-4111111111111111"] * 3})
    with pytest.raises(pa.ArrowInvalid) as caught:
        pc.sort_indices(rows, sort_keys=[("missing", "ascending")])
    assert "4111111111111111" in str(caught.value)  # Arrow prints the rows
    reported = worker_error(caught.value)
    assert reported.startswith("ArrowInvalid: ") and "4111111111111111" not in reported
    assert len(worker_error(ValueError("x" * 1000))) == 300
