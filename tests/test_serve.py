"""`compaction-assets init` and `serve` as a user runs them on their own lake: init writes a config
for an existing catalog, serve starts the production stack on it (real Spark Connect, run host,
Dagster webserver and daemon) and SIGINT or SIGTERM stops every process within 10 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy
from pyiceberg.catalog.sql import SqlCatalog

from compaction_assets.config import load_config
from compaction_assets.execution import connect_server
from compaction_assets.process_groups import alive, descendants
from tests.conftest import CLI, free_port, postgres_schema
from tests.lakekit.demo_process import answers
from tests.lakekit.waiting import wait_until

STOP_BOUND_S = 10.0
PASSWORD = "pw-s3cret-value"


def make_catalog(root: Path, name: str = "prod", uri: str | None = None) -> SqlCatalog:
    """A user's SQL catalog: sales.orders in 12 small files, ops.big in 2, raw.empty in none."""
    (root / "wh").mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog(name, uri=uri or f"sqlite:///{root / 'cat.db'}", warehouse=f"file://{root / 'wh'}")
    for namespace in ("sales", "ops", "raw"):
        catalog.create_namespace(namespace)
    orders = catalog.create_table("sales.orders", schema=pa.schema([("id", pa.int64()), ("region", pa.string())]))
    for i in range(12):
        orders.append(pa.table({"id": pa.array([i], pa.int64()), "region": ["eu"]}))
    big = catalog.create_table("ops.big", schema=pa.schema([("id", pa.int64())]))
    for _ in range(2):
        big.append(pa.table({"id": pa.array(range(1000), pa.int64())}))
    catalog.create_table("raw.empty", schema=pa.schema([("id", pa.int64())]))
    return catalog


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {**os.environ, **(env or {})}
    environment.pop("COMPACTION_CONFIG", None)
    return subprocess.run([*CLI, *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=300)


def test_init_writes_a_commented_config_for_an_existing_sqlite_catalog(tmp_path):
    make_catalog(tmp_path)
    out = tmp_path / "conf" / "compaction.yaml"

    done = run_cli("init", "--catalog-uri", "sqlite:///cat.db", "-o", str(out), cwd=tmp_path)  # relative to cwd

    assert done.returncode == 0, done.stderr
    assert "catalog 'prod': 3 table(s)" in done.stdout and "sales.orders: 12 data files" in done.stdout
    config = load_config(out)
    assert config.catalog.name == "prod"  # the name the tables were written under, read from the catalog
    assert config.catalog.properties["uri"] == f"sqlite:///{tmp_path / 'cat.db'}"
    assert config.rule_for("sales.orders").queue == "high"  # 12 files averaging < 1 KiB: fragmented
    assert config.rule_for("ops.big").queue == config.rule_for("raw.empty").queue == "default"
    text = out.read_text()
    assert "#   sales.orders  12 data files" in text and "#   raw.empty     no data files" in text
    status = run_cli("--config", str(out), "status", "--json", cwd=tmp_path)  # other commands read it
    assert status.returncode == 0, status.stderr
    assert {t["table"] for t in json.loads(status.stdout)["tables"]} == {"sales.orders", "ops.big", "raw.empty"}

    out.write_text("# mine\n")
    again = run_cli("init", "--catalog-uri", "sqlite:///cat.db", "-o", str(out), cwd=tmp_path)
    assert again.returncode == 2 and "exists: not overwritten (pass --force" in again.stderr
    assert out.read_text() == "# mine\n"
    forced = run_cli("init", "--catalog-uri", "sqlite:///cat.db", "-o", str(out), "--force", cwd=tmp_path)
    assert forced.returncode == 0 and load_config(out).catalog.name == "prod"


def test_init_names_what_is_wrong_with_the_catalog(tmp_path):
    make_catalog(tmp_path)
    missing = run_cli("init", "--catalog-uri", "sqlite:///nope.db", cwd=tmp_path)
    assert missing.returncode == 2 and "no SQLite catalog file at sqlite:///nope.db" in missing.stderr
    assert not (tmp_path / "nope.db").exists() and not (tmp_path / "compaction.yaml").exists()

    wrong_name = run_cli("init", "--catalog-uri", "sqlite:///cat.db", "--name", "lake", cwd=tmp_path)
    assert wrong_name.returncode == 2 and "has no catalog named 'lake'; it holds prod" in wrong_name.stderr

    port = free_port()  # nothing listens: the error names the catalog, never its password
    down = run_cli("init", "--catalog-uri", f"postgresql+psycopg://me:{PASSWORD}@127.0.0.1:{port}/db", cwd=tmp_path)
    assert down.returncode == 2 and f"catalog at postgresql+psycopg://me:***@127.0.0.1:{port}/db: cannot connect" in (
        down.stderr
    )
    assert PASSWORD not in down.stdout + down.stderr


def test_init_on_postgresql_keeps_the_password_out_of_the_file(tmp_path):
    with postgres_schema() as url:
        parsed = sqlalchemy.engine.make_url(url)
        if parsed.password:
            pytest.skip("the test PostgreSQL URL has a password of its own")
        with_password = url.replace(f"{parsed.username}@", f"{parsed.username}:{PASSWORD}@", 1)
        make_catalog(tmp_path, name="pg", uri=url)  # trust auth: the password is not checked
        out = tmp_path / "compaction.yaml"

        done = run_cli("init", "--catalog-uri", with_password, "-o", str(out), cwd=tmp_path)

        assert done.returncode == 0, done.stderr
        assert PASSWORD not in out.read_text() + done.stdout + done.stderr
        assert "${COMPACTION_CATALOG_PASSWORD}" in out.read_text() and "COMPACTION_CATALOG_PASSWORD" in done.stdout
        env = {"COMPACTION_CATALOG_PASSWORD": PASSWORD}
        status = run_cli("--config", str(out), "status", "--json", cwd=tmp_path, env=env)
        assert status.returncode == 0, status.stderr
        assert {t["table"] for t in json.loads(status.stdout)["tables"]} == {"sales.orders", "ops.big", "raw.empty"}
        assert {t["queue"] for t in json.loads(status.stdout)["tables"] if t["table"] == "sales.orders"} == {"high"}


def process_tree(root: int) -> set[int]:
    """`root` and its live descendants, by parent pid (/proc), whatever session they lead."""
    return set(descendants(root))


def asset_keys(ui: str) -> list[list[str]]:
    body = json.dumps({"query": "{ assetNodes { assetKey { path } } }"}).encode()
    request = urllib.request.Request(f"{ui}/graphql", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return [n["assetKey"]["path"] for n in json.load(response)["data"]["assetNodes"]]
    except (OSError, KeyError, TypeError):
        return []


def wait_for(condition, seconds: float, what: str, log: Path) -> None:  # noqa: ANN001
    wait_until(
        condition,
        seconds,
        interval=0.5,
        message=lambda: f"{what} within {seconds}s; output:\n{log.read_text()[-4000:]}",
    )


def stop_and_time(process: subprocess.Popen, pids: set[int], signum: int, to_group: bool) -> float:
    """Send the signal (to the process group, as Ctrl-C does, or to the PID, as `kill` does) and
    return the seconds until every pid in `pids` is gone (at most 60)."""
    began = time.monotonic()
    if to_group:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    while time.monotonic() - began < 60:
        process.poll()
        if not any(alive(pid) for pid in pids):
            break
        time.sleep(0.05)
    return time.monotonic() - began


def kill_all(pids: set[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("signum", "to_group"), [(signal.SIGINT, True), (signal.SIGTERM, False)], ids=["ctrl-c", "kill-TERM-pid"]
)
def test_serve_runs_the_stack_on_your_own_lake_and_a_signal_stops_it_within_10s(tmp_path, signum, to_group):
    make_catalog(tmp_path)
    config_path = tmp_path / "compaction.yaml"
    assert run_cli("init", "--catalog-uri", "sqlite:///cat.db", cwd=tmp_path).returncode == 0
    ui_port, spark_port = free_port(), free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "COMPACTION_CONFIG": str(config_path)}
    env.pop("DAGSTER_HOME", None)
    serve = subprocess.Popen(
        [*CLI, "serve", "--port", str(ui_port), "--spark-port", str(spark_port)],
        cwd=tmp_path,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # as a terminal would: serve leads its own session
    )
    pids: set[int] = set()
    spark = load_config(config_path).spark.model_copy(update={"remote": f"sc://127.0.0.1:{spark_port}"})
    try:
        ui = f"http://127.0.0.1:{ui_port}"
        wait_for(lambda: f"ready: Dagster UI at {ui} " in log.read_text(), 300, "no readiness line", log)
        assert answers(f"{ui}/server_info")
        assert f"Spark Connect at sc://127.0.0.1:{spark_port}" in log.read_text()  # --spark-port, not 15002
        server = connect_server.health(spark)
        assert server.running and server.answering, server.describe()
        wait_for(lambda: ["lake", "sales", "orders"] in asset_keys(ui), 120, "sales.orders not in the UI", log)
        # every process of the stack: serve's tree (webserver, daemon, code servers, run host) + the Spark JVM
        pids = process_tree(serve.pid) | process_tree(server.pid)
        commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids if alive(pid)}
        for part in (b"dagster-webserver", b"dagster-daemon", b"compaction_assets.dagster_host", b"SparkConnectServer"):
            assert any(part in command for command in commands.values()), f"{part} not running"

        if signum == signal.SIGTERM:  # stop with a compaction run in flight: a fork of the run host
            [host] = [
                pid
                for pid, command in commands.items()
                if b"compaction_assets.dagster_host" in command
                and (
                    Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(serve.pid)  # not a fork
                )
            ]
            wait_for(lambda: len(process_tree(host)) > 1, 240, "no run started", log)
            pids |= process_tree(host)

        seconds = stop_and_time(serve, pids, signum, to_group)

        print(f"stop took {seconds:.1f}s for {len(pids)} processes, load average {os.getloadavg()}")
        left = {pid: commands.get(pid, b"")[:100] for pid in pids if alive(pid)}
        assert seconds <= STOP_BOUND_S and not left, f"{seconds:.1f}s, left: {left}\n{log.read_text()[-3000:]}"
        assert serve.wait(timeout=5) == 0
        assert not answers(f"{ui}/server_info") and not connect_server.status(spark).listening
        assert connect_server.status(spark).dead_pid is None  # stopped on purpose: not reported as died
    finally:
        # also when interrupted (Ctrl-C) before the stack's pids were known: serve's tree, and the
        # Spark Connect JVM it started (daemonised, its own session), stopped by its pid file's PID
        pids |= process_tree(serve.pid)
        if serve.poll() is None:
            serve.kill()
        kill_all(pids)
        if connect_server.status(spark).pid is not None:
            connect_server.stop(spark)
