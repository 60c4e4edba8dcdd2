"""Spark Connect mode end to end: the server started by `compaction-assets spark-server start`,
a compaction through it, and the server stopped again."""

import subprocess
import sys

import pytest
import yaml

from compaction_assets.config import load_config
from compaction_assets.execution import connect_server
from compaction_assets.execution.connect_server import SBIN
from compaction_assets.lake.digest import rows_digest
from tests.conftest import CLI, create_fragmented, free_port


def server_cli(action: str, config) -> subprocess.CompletedProcess:  # noqa: ANN001
    return subprocess.run([*CLI, "--config", str(config), "spark-server", action], capture_output=True, text=True)


@pytest.fixture(scope="module")
def server_config(tmp_path_factory):
    """A compaction.yaml in connect mode whose server the CLI starts (and stops after the module)."""
    if not (SBIN / "start-connect-server.sh").exists():
        pytest.skip("this pyspark wheel ships no Spark Connect server")
    root = tmp_path_factory.mktemp("spark-connect")
    config = root / "server.yaml"
    spark = {"mode": "connect", "master": "local[2]", "remote": f"sc://127.0.0.1:{free_port()}", "server_dir": "srv"}
    config.write_text(yaml.safe_dump({"spark": spark}))
    assert server_cli("status", config).returncode == 3
    try:  # from the start on: stopped even if the start fails or Ctrl-C comes meanwhile
        started = server_cli("start", config)
        assert started.returncode == 0, started.stdout + started.stderr
        assert "running at" in started.stdout
        yield config
        stopped = server_cli("stop", config)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert server_cli("status", config).returncode == 3
    finally:  # the daemonised JVM (its own session) by its pid file's PID, if `stop` did not run or failed
        spark = load_config(config).spark
        if connect_server.status(spark).pid is not None:
            connect_server.stop(spark)


def test_compaction_through_spark_connect(lake, server_config):
    status = server_cli("status", server_config)
    assert status.returncode == 0 and "running at" in status.stdout
    table = create_fragmented(lake, "ns.t", {"eu": 25, "us": 25})
    before = rows_digest(table)
    doc = yaml.safe_load(lake.config_path.read_text())
    doc["spark"] = yaml.safe_load(server_config.read_text())["spark"]
    connect_config = lake.root / "connect.yaml"
    connect_config.write_text(yaml.safe_dump(doc))

    run = lake.cli("compact", "ns.t", config=connect_config)

    assert run.returncode == 0, run.stderr
    assert run.stdout.count("committed minor: 25 -> 1 files") == 2
    assert rows_digest(lake.table("ns.t")) == before
    assert len(lake.table("ns.t").inspect.files()) == 2


def test_a_second_start_reuses_the_running_server(server_config):
    again = server_cli("start", server_config)
    assert again.returncode == 0 and "running at" in again.stdout


def test_runs_join_the_servers_shared_session(server_config):
    """Every client process attaches to the session the server was started with, so runs find
    its Python workers warm instead of starting and importing new ones."""
    code = (
        "import sys; from compaction_assets.config import load_config; "
        "from compaction_assets.execution.spark import spark_session; "
        "s = spark_session(load_config(sys.argv[1]).spark); "
        "print(s.session_id, s.range(3).count())"
    )
    shared = (server_config.parent / "srv" / "session-id").read_text().strip()
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", code, str(server_config)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == [shared, "3"]
