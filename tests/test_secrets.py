"""Credentials never reach a message: config errors, CLI errors, logs, Dagster metadata, the ledger."""

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from compaction_assets.commit.ledger import Ledger
from compaction_assets.config import load_config
from compaction_assets.defs.assets import _metadata
from compaction_assets.engine import PartitionOutcome
from compaction_assets.errors import ConfigError
from compaction_assets.redact import RedactingFilter
from tests.conftest import CLI, REPO, free_port

PASSWORD = "Planted-S3cret-pw"
DEPLOY_ENV = {
    "LAKE_PG_USER": "lake",
    "LAKE_PG_PASSWORD": PASSWORD,
    "LAKE_PG_HOST": "127.0.0.1",
    "LAKE_PG_DB": "lake",
    "LAKE_WAREHOUSE": "file:///tmp/nowhere",
}


@pytest.fixture
def deploy_config(tmp_path, monkeypatch) -> Path:
    """deploy/compaction.yaml with a planted password, pointing at a port nothing listens on."""
    for key, value in {**DEPLOY_ENV, "LAKE_PG_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    path = tmp_path / "compaction.yaml"
    shutil.copy(REPO / "deploy" / "compaction.yaml", path)
    return path


def with_change(path: Path, **changes) -> Path:
    doc = yaml.safe_load(path.read_text())
    doc.update(changes)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_undeclared_queue_names_key_and_file_not_the_password(deploy_config):
    with_change(deploy_config, tables=[{"match": "*", "queue": "nope"}])
    with pytest.raises(ConfigError) as err:
        load_config(deploy_config)
    message = str(err.value)
    assert str(deploy_config) in message and "tables.0.queue" in message and "'nope'" in message
    assert PASSWORD not in message and "LAKE_PG" not in message


def test_field_error_in_a_section_with_credentials_shows_no_value(deploy_config):
    doc = yaml.safe_load(deploy_config.read_text())
    doc["state"]["executing_timeout_seconds"] = "soon"
    doc["catalog"]["properties"]["s3.secret-access-key"] = 12345678  # wrong type, and a credential
    deploy_config.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as err:
        load_config(deploy_config)
    message = str(err.value)
    assert "state.executing_timeout_seconds" in message and "'soon'" in message  # a plain value is shown
    assert "catalog.properties.s3.secret-access-key" in message and "12345678" not in message
    assert PASSWORD not in message


def cli(config: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COMPACTION_CONFIG": str(config)}
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120)


def test_cli_errors_mask_the_password(deploy_config):
    with_change(deploy_config, tables=[{"match": "*", "queue": "nope"}])
    run = cli(deploy_config, "plan", "sales.orders")
    assert run.returncode == 2 and "tables.0.queue" in run.stderr
    assert PASSWORD not in run.stderr + run.stdout

    with_change(deploy_config, tables=[{"match": "*", "queue": "default"}])
    for args in (["plan", "sales.orders"], ["-v", "status"]):
        run = cli(deploy_config, *args)
        assert run.returncode == 2, run.stderr
        assert "catalog 'lake'" in run.stderr and "127.0.0.1" in run.stderr
        assert PASSWORD not in run.stderr + run.stdout
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_logs_metadata_and_ledger_mask_the_password(deploy_config, tmp_path, caplog):
    config = load_config(deploy_config)  # registers the password
    uri = config.catalog.properties["uri"]
    assert PASSWORD in uri

    logger = logging.getLogger("compaction_assets.test_secrets")
    caplog.handler.addFilter(RedactingFilter())
    logger.warning("cannot reach %s", uri)
    assert PASSWORD not in caplog.text and "127.0.0.1" in caplog.text

    outcome = PartitionOutcome(table_name="t", partition_key="", status="failed", reason=f"could not open {uri}")
    assert PASSWORD not in repr(_metadata(outcome, "default"))

    ledger = Ledger(f"sqlite:///{tmp_path / 'state.db'}")
    attempt = ledger.begin("task", "t", "", "minor", 1, ["file:///a.parquet"], ["file:///out"], 10, 100)
    ledger.mark_failed(attempt.attempt_id, f"{PASSWORD} leaked via a driver message")
    assert PASSWORD not in (ledger.get(attempt.attempt_id).reason or "")
