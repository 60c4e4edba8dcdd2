"""Messages off the main path name the cause and the fix in one pass, without secrets: each test
makes the mistake for real (a web server on the Spark Connect port, a broken config, a REST
catalog that is down, a bad partition key) and reads what the CLI prints."""

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import yaml

from compaction_assets import faults
from compaction_assets.config import load_config
from compaction_assets.execution import connect_server
from compaction_assets.execution.connect_server import SBIN
from compaction_assets.reports import print_outcomes
from tests.conftest import CLI, create_fragmented, free_port
from tests.lakekit.waiting import wait_until


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def web_server() -> Iterator[int]:
    """A real HTTP server (not Spark Connect) listening on a free port."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(listening, 20, interval=0.1, message="http.server did not listen")
        yield port
    finally:
        server.terminate()
        server.wait(10)


def connect_config(lake, port: int):  # noqa: ANN001, ANN201
    doc = yaml.safe_load(lake.config_path.read_text())
    doc["spark"] = {"mode": "connect", "remote": f"sc://127.0.0.1:{port}", "server_dir": "srv"}
    path = lake.root / "connect.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_web_server_on_the_spark_connect_port_is_named_at_once(lake, web_server):
    create_fragmented(lake, "ns.t", {"eu": 6})
    started = time.monotonic()

    run = lake.cli("compact", "ns.t", config=connect_config(lake, web_server))

    seconds = time.monotonic() - started
    assert run.returncode == 2
    assert f"port {web_server} answers but is not a Spark Connect server" in run.stderr, run.stderr
    assert "spark.remote" in run.stderr and "spark-server start" in run.stderr
    assert seconds < 20, f"{seconds:.0f}s: the gRPC client's retries were not cut short"
    assert len(lake.table("ns.t").inspect.files()) == 6


def test_spark_server_stop_says_what_it_stopped_or_why_nothing(lake, web_server):
    idle = connect_config(lake, free_port())
    nothing = cli("--config", str(idle), "spark-server", "stop")
    assert nothing.returncode == 0
    assert "nothing to stop: no Spark Connect server runs at sc://127.0.0.1:" in nothing.stdout

    foreign = cli("--config", str(connect_config(lake, web_server)), "spark-server", "stop")
    assert foreign.returncode == 0
    assert f"something else listens at sc://127.0.0.1:{web_server} (left alone" in foreign.stdout


def test_spark_server_stop_names_the_server_it_stopped(lake):
    if not (SBIN / "start-connect-server.sh").exists():
        pytest.skip("this pyspark wheel ships no Spark Connect server")
    config = connect_config(lake, free_port())
    try:
        started = cli("--config", str(config), "spark-server", "start")
        assert started.returncode == 0, started.stdout + started.stderr
        pid = started.stdout.split("(pid ")[1].split(",")[0].split(")")[0]

        stopped = cli("--config", str(config), "spark-server", "stop")

        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "stopped the Spark Connect server at sc://127.0.0.1:" in stopped.stdout
        assert f"(pid {pid})" in stopped.stdout
    finally:  # the daemonised JVM (its own session) if the test ended before its `stop`, by its PID
        spark = load_config(config).spark
        if connect_server.status(spark).pid is not None:
            connect_server.stop(spark)


def test_every_config_mistake_is_reported_in_one_pass(tmp_path):
    config = tmp_path / "compaction.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "catalogue": {},  # unknown key
                "state": {"heartbeat_seconds": 30},  # too slow for the default 60 s timeout
                "queues": [{"name": "high", "capacity": 0}],
                "tables": [{"match": "sales.*", "queue": "hihg"}, {"match": "*", "priority": "top"}],
            }
        )
    )

    run = cli("--config", str(config), "status")

    assert run.returncode == 2
    for problem in (
        "catalogue: unknown key",
        "state.heartbeat_seconds: must be at most a third",
        "queues.0.capacity:",
        "tables.0.queue: queue 'hihg' is not declared under queues (['high'])",
        "tables.1.priority:",
        "tables.1.queue: queue 'default' is not declared",
    ):
        assert problem in run.stderr, run.stderr
    assert run.stderr.count("invalid compaction config") == 1


def test_a_backed_off_partition_is_named_once(lake, capsys):
    create_fragmented(lake, "ns.t", {"eu": 6})
    # another writer deletes every row of the partition between our precommit and commit
    faults.arm("after_prepare", lambda: lake.table("ns.t").delete("region == 'eu'"))
    try:
        outcomes = lake.engine.compact("ns.t")
    finally:
        faults.disarm()

    print_outcomes(outcomes)

    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("ns.t [region=eu]: backed_off: "), line
    assert line.count("ns.t [region=eu]") == 1 and "backed off" not in line, line
    assert "no longer live" in line and "the next run plans it again" in line, line


def test_a_bad_partition_key_shows_a_few_partitions_their_count_and_how_to_list_them(lake):
    regions = [f"r{i:02d}" for i in range(40)]
    create_fragmented(lake, "ns.t", dict.fromkeys(regions, 1), rows=5)

    run = lake.cli("compact", "ns.t", "--partition", "region=r7")

    assert run.returncode == 2
    [line] = run.stderr.splitlines()
    assert "table 'ns.t' has no partition 'region=r7' (it has region=r" in line, line
    assert "(40 in all); `compaction-assets plan ns.t` lists them)" in line, line
    assert sum(f"region={r}" in line for r in regions) == 3, line  # the closest few, not all 40


def test_a_rest_catalog_that_is_down_is_named_without_its_credentials(tmp_path):
    port = free_port()  # nothing listens there: the catalog server is down
    config = tmp_path / "compaction.yaml"
    properties = {"type": "rest", "uri": f"http://admin:s3cr3t-pw@127.0.0.1:{port}/api", "credential": "id:top-secret"}
    config.write_text(
        yaml.safe_dump({"catalog": {"name": "prod", "properties": properties}, "state": {"uri": "sqlite:///s.db"}})
    )

    run = cli("--config", str(config), "plan", "ns.t")

    assert run.returncode == 2
    assert run.stderr == (
        f"error: catalog 'prod' at http://admin:***@127.0.0.1:{port}/api unreachable: Connection refused; "
        "start the catalog server or fix catalog.properties.uri\n"
    )
