"""Spark Connect mode end to end: a Connect server started by the fixture, a compaction through it."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest
import yaml

from compaction_assets.lake.digest import rows_digest
from tests.conftest import create_fragmented, free_port

SBIN = Path(pyspark.__file__).parent / "sbin"


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    if not (SBIN / "start-connect-server.sh").exists():
        pytest.skip("this pyspark wheel ships no Spark Connect server")
    work = tmp_path_factory.mktemp("spark-connect")
    port = free_port()
    env = {
        **os.environ,
        "SPARK_HOME": str(SBIN.parent),
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_PID_DIR": str(work / "pids"),
        "PYSPARK_PYTHON": sys.executable,
    }
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
    }
    args = [a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]
    subprocess.run([str(SBIN / "start-connect-server.sh"), "--master", "local[2]", *args], env=env, check=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.5)
    else:
        logs = "".join(p.read_text() for p in (work / "logs").glob("*.out"))
        raise AssertionError(f"Spark Connect server did not start:\n{logs[-3000:]}")
    yield f"sc://127.0.0.1:{port}"
    subprocess.run([str(SBIN / "stop-connect-server.sh")], env=env, check=False)
    shutil.rmtree(work / "pids", ignore_errors=True)


def test_compaction_through_spark_connect(lake, connect_server):
    table = create_fragmented(lake, "ns.t", {"eu": 25, "us": 25})
    before = rows_digest(table)
    doc = yaml.safe_load(lake.config_path.read_text())
    doc["spark"] = {"mode": "connect", "remote": connect_server}
    connect_config = lake.root / "connect.yaml"
    connect_config.write_text(yaml.safe_dump(doc))

    run = lake.cli("compact", "ns.t", config=connect_config)

    assert run.returncode == 0, run.stderr
    assert run.stdout.count("committed minor: 25 -> 1 files") == 2
    assert rows_digest(lake.table("ns.t")) == before
    assert len(lake.table("ns.t").inspect.files()) == 2
