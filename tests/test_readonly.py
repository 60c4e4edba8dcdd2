"""A mistyped SQLite uri: read-only commands create no catalog and no ledger, and say which uri."""

import os
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog import load_catalog

from tests.conftest import CLI, REPO, write_config

READ_ONLY = (["plan", "ns.t"], ["status"], ["gc", "--dry-run", "ns.t"])


def cli(config: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COMPACTION_CONFIG": str(config)}
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=300)


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def test_a_mistyped_catalog_uri_creates_nothing_and_is_named(tmp_path):
    props = {"type": "sql", "uri": "sqlite:///nonexistent/dir/catalog.db", "warehouse": "file://warehouse"}
    config = write_config(tmp_path, catalog={"name": "lake", "properties": props}, state={})
    before = files_under(tmp_path)
    for args in (*READ_ONLY, ["compact", "ns.t"]):
        run = cli(config, *args)
        assert run.returncode == 2, (args, run.stdout, run.stderr)
        [line] = run.stderr.strip().splitlines()
        assert "catalog 'lake' not found" in line and f"sqlite:///{tmp_path}/nonexistent/dir/catalog.db" in line
        assert files_under(tmp_path) == before, args


def test_read_only_commands_create_no_ledger(tmp_path):
    (tmp_path / "warehouse").mkdir()
    writer = load_catalog(
        "lake", type="sql", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse"
    )
    writer.create_namespace("ns")
    table = writer.create_table("ns.t", schema=pa.schema([("id", pa.int64())]))
    for i in range(6):
        table.append(pa.table({"id": [i]}))
    config = write_config(tmp_path)
    for args in READ_ONLY:
        run = cli(config, *args)
        assert run.returncode == 0, (args, run.stderr)
    assert "ns.t" in cli(config, "status").stdout
    assert not (tmp_path / "state.db").exists()
    run = cli(config, "plan", "ns.nope")
    assert run.returncode == 2
    assert "table 'ns.nope' not found" in run.stderr and f"sqlite:///{tmp_path}/catalog.db" in run.stderr


def test_status_finds_the_demo_instance_or_says_how(tmp_path, monkeypatch):
    (tmp_path / "warehouse").mkdir()
    writer = load_catalog(
        "lake", type="sql", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse"
    )
    writer.create_namespace("ns")
    writer.create_table("ns.t", schema=pa.schema([("id", pa.int64())]))
    config = write_config(tmp_path)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    run = cli(config, "status")
    assert run.returncode == 0 and "set DAGSTER_HOME" in run.stdout
    (tmp_path / ".dagster_home").mkdir()
    shutil.copy(REPO / "dagster.yaml", tmp_path / ".dagster_home" / "dagster.yaml")
    run = cli(config, "status")
    assert run.returncode == 0, run.stderr
    assert f"runs from the Dagster instance in {tmp_path / '.dagster_home'}" in run.stdout
    [default] = [line for line in run.stdout.splitlines() if line.startswith("default ")]
    assert default.split()[1:3] == ["0", "0"]  # running, queued: read from the instance, not "-"

    run = cli(config, "compact", "ns.t", "--partition", "region=eu")
    assert run.returncode == 2
    assert "has no partition 'region=eu' (it is unpartitioned: leave out --partition)" in run.stderr
