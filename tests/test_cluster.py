"""`spark.master: spark://HOST:7077` as a tested mode: a real Spark standalone cluster (one master,
two workers of one core each, on 127.0.0.1, from what the pyspark wheel ships) and compactions
through it from the CLI, from a Dagster run and through a Spark Connect server in front of it;
then a worker killed mid-rewrite.

The executors get our code the way a cluster user on one machine would: their Python workers run
this venv's interpreter (PYSPARK_PYTHON), where the package is installed. Every test proves the
work ran on the cluster's executors from the executors' own logs in the workers' work dirs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow
import pytest
import yaml
from dagster import AssetKey, DagsterInstance, DagsterRunStatus
from dagster._core.instance.ref import InstanceRef

import compaction_assets
from compaction_assets.config import load_config
from compaction_assets.engine import Engine
from compaction_assets.lake.digest import rows_digest
from compaction_tools.demo import append_fragments
from compaction_tools.local_cluster import LocalCluster, local_cluster, running
from tests.conftest import CLI, REPO, SCHEMA, Lake, batch, create_fragmented, free_port, venv_bin, write_config

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="a Spark cluster needs Java 17+")

OPEN = ("EXECUTING", "PREPARED")
# Tests of glue rather than of distribution take one executor: one JVM fewer to start on a busy machine.
ONE_EXECUTOR = {"spark.cores.max": "1"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    root = tmp_path_factory.mktemp("spark-cluster")
    with local_cluster(root, workers=2, python=sys.executable) as cluster:
        pids = cluster.pids()
        yield cluster
    assert running(pids) == [], "cluster processes left behind"


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1 in /proc/net/tcp and tcp6


def listening_addresses(pids: list[int]) -> set[tuple[str, int]]:
    """(hex address, port) of every TCP socket in LISTEN the processes hold, from /proc."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                found.add((address, int(port, 16)))
    return found


def test_the_cluster_listens_on_loopback_only(cluster):
    addresses = listening_addresses(cluster.pids())
    ports = {port for _, port in addresses}
    assert cluster.port in ports and cluster.master.webui_port in ports
    assert all(w.webui_port in ports for w in cluster.workers)
    assert {address for address, _ in addresses} <= LOOPBACK, addresses


def cluster_spark(cluster: LocalCluster, **conf: str) -> dict:
    """compaction.yaml's `spark:` for the cluster: the driver on 127.0.0.1, executors of 512 MiB."""
    return {
        "mode": "local",
        "master": cluster.master_url,
        "conf": {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "512m",
            "spark.sql.shuffle.partitions": "2",
            **conf,
        },
    }


def cluster_lake(root: Path, cluster: LocalCluster, **conf: str) -> Lake:
    """A lake whose compaction.yaml points at the cluster; it is compacted by the CLI or Dagster
    in processes of their own (this process never starts a Spark session)."""
    root.mkdir(parents=True, exist_ok=True)
    config_path = write_config(root, spark=cluster_spark(cluster, **conf))

    def no_session():  # noqa: ANN202
        raise AssertionError("the test process must not start Spark")

    engine = Engine(load_config(config_path), spark=no_session)
    engine.catalog.create_namespace("ns")
    return Lake(root, config_path, engine)


def app_ids(cluster: LocalCluster) -> set[str]:
    state = cluster.state()
    return {a["id"] for a in state["activeapps"] + state["completedapps"]}


def executor_logs(cluster: LocalCluster, app_id: str) -> str:
    """The stderr of every executor the workers ran for `app_id` (Spark's INFO log)."""
    logs = [p for w in cluster.workers for p in cluster.work_dir(w).glob(f"{app_id}/*/stderr")]
    return "\n".join(p.read_text(errors="replace") for p in logs)


def ran_tasks_on_executors(cluster: LocalCluster, app_id: str) -> int:
    """How many tasks the app's executors finished, from their own logs."""
    return len(re.findall(r"Executor: Finished task", executor_logs(cluster, app_id)))


def new_app(cluster: LocalCluster, before: set[str]) -> dict:
    state = cluster.state()
    [app] = [a for a in state["activeapps"] + state["completedapps"] if a["id"] not in before]
    return app


def finished_app(cluster: LocalCluster, before: set[str], seconds: float = 60) -> dict:
    """The application a finished process ran: the master marks it FINISHED once it has processed
    the driver's goodbye, which can come after the process exited (CI once saw it RUNNING)."""
    deadline = time.monotonic() + seconds
    while (app := new_app(cluster, before))["state"] != "FINISHED" and time.monotonic() < deadline:
        time.sleep(0.5)
    return app


def test_cli_compaction_runs_on_the_cluster_executors(cluster, tmp_path):
    lake = cluster_lake(tmp_path, cluster)
    table = create_fragmented(lake, "ns.t", {"eu": 20, "us": 20, "apac": 20})
    before = rows_digest(table)
    apps = app_ids(cluster)

    run = lake.cli("compact", "ns.t")

    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("committed minor: 20 -> 1 files") == 3, run.stdout
    assert rows_digest(lake.table("ns.t")) == before
    assert len(lake.table("ns.t").inspect.files()) == 3
    app = finished_app(cluster, apps)
    assert app["name"] == "compaction-assets" and app["state"] == "FINISHED"
    assert ran_tasks_on_executors(cluster, app["id"]) >= 1  # the rewrite ran on the cluster
    assert lake.engine.ledger.counts() == {"COMMITTED": 3}


def test_dagster_run_compacts_through_the_cluster(cluster, tmp_path):
    lake = cluster_lake(tmp_path, cluster, **ONE_EXECUTOR)
    flat = lake.catalog.create_table("ns.flat", schema=SCHEMA)
    append_fragments(flat, [batch(i * 40, 40, "x") for i in range(12)])
    before = rows_digest(lake.table("ns.flat"))
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "COMPACTION_CONFIG": str(lake.config_path)}
    apps = app_ids(cluster)

    command = [venv_bin("dagster"), "asset", "materialize", "-m", "compaction_assets.definitions"]
    run = subprocess.run(
        [*command, "--select", "lake/ns/flat"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
    [dagster_run] = instance.get_runs()
    assert dagster_run.status == DagsterRunStatus.SUCCESS
    event = instance.get_latest_materialization_event(AssetKey(["lake", "ns", "flat"]))
    meta = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    assert meta["status"] == "committed"
    assert (meta["data_files_before"], meta["data_files_after"]) == (12, 1)
    assert rows_digest(lake.table("ns.flat")) == before
    app = finished_app(cluster, apps)
    assert app["name"] == "compaction-assets" and app["state"] == "FINISHED"
    assert ran_tasks_on_executors(cluster, app["id"]) >= 1
    instance.dispose()


def server_cli(action: str, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "--config", str(config), "spark-server", action], capture_output=True, text=True, timeout=300
    )


def test_spark_connect_server_in_front_of_the_cluster(cluster, tmp_path):
    lake = cluster_lake(tmp_path, cluster)
    table = create_fragmented(lake, "ns.t", {"eu": 15, "us": 15})
    before = rows_digest(table)
    doc = yaml.safe_load(lake.config_path.read_text())
    doc["spark"] = {
        **cluster_spark(cluster),
        "mode": "connect",
        "remote": f"sc://127.0.0.1:{free_port()}",
        "server_dir": "srv",
    }
    connect = tmp_path / "connect.yaml"
    connect.write_text(yaml.safe_dump(doc))
    apps = app_ids(cluster)

    started = server_cli("start", connect)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        server = new_app(cluster, apps)  # the Connect server is the cluster's application
        assert server["state"] == "RUNNING"

        run = lake.cli("compact", "ns.t", config=connect)

        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.count("committed minor: 15 -> 1 files") == 2, run.stdout
        assert rows_digest(lake.table("ns.t")) == before
        assert ran_tasks_on_executors(cluster, server["id"]) >= 1
    finally:
        stopped = server_cli("stop", connect)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert server_cli("status", connect).returncode == 3
    assert all(a["id"] != server["id"] for a in cluster.state()["activeapps"])


def bare_python(folder: Path) -> Path:
    """An interpreter with every dependency but without this package: this venv's Python without
    its site hook (no .pth files, so no editable install), site-packages on PYTHONPATH."""
    site = Path(pyarrow.__file__).parent.parent
    script = folder / "bare-python"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}" exec {sys.executable} -S "$@"\n')
    script.chmod(0o755)
    return script


def test_executors_without_the_package_get_it_from_spark_submit_pyfiles(cluster, tmp_path):
    """The other way to ship the code: the driver ships the package as a zip (spark.submit.pyFiles)
    to executors whose Python has the dependencies but not compaction-assets."""
    python = bare_python(tmp_path)
    lacks = subprocess.run([python, "-c", "import compaction_assets"], capture_output=True, text=True, cwd=tmp_path)
    assert lacks.returncode != 0 and "No module named 'compaction_assets'" in lacks.stderr
    deps = subprocess.run([python, "-c", "import pyarrow, pyiceberg, polars, pyspark"], cwd=tmp_path)
    assert deps.returncode == 0
    package = Path(compaction_assets.__file__).parent
    bundle = tmp_path / "compaction_assets.zip"
    subprocess.run([sys.executable, "-m", "zipfile", "-c", str(bundle), str(package)], check=True)
    lake = cluster_lake(tmp_path / "lake", cluster, **{"spark.submit.pyFiles": str(bundle)}, **ONE_EXECUTOR)
    table = create_fragmented(lake, "ns.t", {"eu": 12, "us": 12})
    before = rows_digest(table)
    env = {**os.environ, "COMPACTION_CONFIG": str(lake.config_path), "PYSPARK_PYTHON": str(python)}
    apps = app_ids(cluster)

    run = subprocess.run([*CLI, "compact", "ns.t"], env=env, capture_output=True, text=True, timeout=300)

    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("committed minor: 12 -> 1 files") == 2, run.stdout
    assert rows_digest(lake.table("ns.t")) == before
    app = new_app(cluster, apps)["id"]
    assert ran_tasks_on_executors(cluster, app) >= 1
    shipped = [p for w in cluster.workers for p in cluster.work_dir(w).glob(f"{app}/*/compaction_assets.zip")]
    assert shipped, "no executor fetched the zip"


def python_workers(pids: list[int]) -> list[int]:
    """Those of `pids` that are pyspark Python workers (daemon or forked worker)."""
    found = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"pyspark" in cmdline and b"java" not in cmdline:
            found.append(pid)
    return found


def test_a_worker_killed_mid_rewrite(cluster, tmp_path):
    """SIGKILL a worker (its JVM, its executor, their Python workers) while its executor is inside
    a rewrite: Spark reruns the lost task on the other executor and the compaction commits with
    the same rows, or the attempt fails cleanly. Then a replacement worker restores the cluster."""
    # Each executor's Python worker pauses 8 s inside its first group (after part of it is written),
    # on the arrow path (a table property Polars cannot honour), where each group is a task of its
    # own; tasks start only once both executors are registered, so both get one.
    conf = {
        "spark.executorEnv.COMPACTION_PAUSE_AT": "worker_mid_group:8",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    }
    lake = cluster_lake(tmp_path, cluster, **conf)
    table = create_fragmented(lake, "ns.t", {"eu": 8, "us": 8, "apac": 8, "emea": 8})
    with table.transaction() as txn:
        txn.set_properties({"write.parquet.page-row-limit": "20000"})
    table = lake.table("ns.t")
    before, files_before = rows_digest(table), {f["file_path"] for f in table.inspect.files().to_pylist()}
    victim = cluster.workers[-1]
    env = {**os.environ, "COMPACTION_CONFIG": str(lake.config_path)}
    apps = app_ids(cluster)

    compaction = subprocess.Popen(
        [*CLI, "compact", "ns.t"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 180
        while not python_workers(cluster.pids_of(victim)):  # its executor started rewriting
            assert compaction.poll() is None, compaction.communicate()
            assert time.monotonic() < deadline, "the victim's executor never ran a Python worker"
            time.sleep(0.2)
        # kept: inside the 8 s pause of its first group; the pause leaves no sign a test can poll for
        time.sleep(2)
        doomed = cluster.pids_of(victim)
        cluster.kill_worker(victim)
        assert running(doomed, wait_seconds=15) == []
        out, err = compaction.communicate(timeout=300)
    finally:
        if compaction.poll() is None:
            compaction.kill()
            compaction.wait()

    assert "Lost executor" in err or "ExecutorLostFailure" in err, err[-3000:]  # the kill hit a running task
    after = lake.table("ns.t")
    assert rows_digest(after) == before
    if compaction.returncode == 0:  # Spark reran the lost task on the surviving executor
        assert re.search(r"Running task \d+\.1 ", executor_logs(cluster, new_app(cluster, apps)["id"]))
        assert out.count("committed minor: 8 -> 1 files") == 4, out
        assert len(after.inspect.files()) == 4
        assert lake.engine.ledger.counts() == {"COMMITTED": 4}
    else:  # the attempt failed cleanly: nothing of it is referenced, nothing left open
        recover = lake.cli("recover")
        assert recover.returncode == 0, recover.stderr
        assert {f["file_path"] for f in after.inspect.files().to_pylist()} == files_before
        assert not set(lake.engine.ledger.counts()) & set(OPEN)

    # nothing the lost task wrote is left behind: every data file on disk is one a snapshot names
    referenced = {
        f["file_path"].removeprefix("file://")
        for snap in after.snapshots()
        for f in after.inspect.files(snapshot_id=snap.snapshot_id).to_pylist()
    }
    on_disk = {str(p) for p in Path(after.location().removeprefix("file://")).rglob("*.parquet")}
    assert on_disk - referenced == set()

    replacement = cluster.add_workers(1)
    assert len(cluster.alive_workers()) == 2 and replacement[0].alive()
