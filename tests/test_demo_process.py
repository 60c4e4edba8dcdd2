"""`compaction-assets demo` as a user runs it: runs on the warm Spark it started, report their
fixed cost, a new table appears in the UI without a manual reload, and SIGINT or SIGTERM to the
demo's PID stops every process of it (Spark JVM and workers included) within 10 s."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest

from compaction_assets.config import load_config
from compaction_assets.execution import connect_server
from compaction_assets.lake.catalog import open_catalog
from compaction_tools.demo_ui import session_members
from tests.conftest import free_port
from tests.lakekit.demo_process import answers, start_demo

FIXED_COST = re.compile(r"dagster_run_fixed_cost_s=([0-9.]+) \(.*spark connect\)")


def asset_keys(graphql: str) -> list[list[str]]:
    body = json.dumps({"query": "{ assetNodes { assetKey { path } } }"}).encode()
    request = urllib.request.Request(graphql, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return [n["assetKey"]["path"] for n in json.load(response)["data"]["assetNodes"]]
    except (OSError, KeyError, TypeError):
        return []


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def closed_soon(port: int, seconds: float = 15) -> bool:
    """Nothing listens on `port`, checked until `seconds` pass: one probe of a free port in the
    ephemeral range can connect to itself (TCP simultaneous open), and a JVM whose pid is gone may
    still be closing its sockets. CI once saw one probe answer after the server was gone."""
    deadline = time.monotonic() + seconds
    while listening(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def wait_for(condition, seconds: float, what: str, log: Path) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {seconds}s; demo output:\n{log.read_text()[-4000:]}")
        time.sleep(1)


@pytest.mark.parametrize(
    ("signum", "to_group"), [(signal.SIGTERM, False), (signal.SIGINT, True)], ids=["kill-TERM-pid", "ctrl-c"]
)
def test_demo_runs_on_warm_spark_and_a_signal_stops_everything(tmp_path, signum, to_group):
    """SIGTERM to the demo's PID; SIGINT to its whole process group, as Ctrl-C in a terminal sends it."""
    spark_port, ui_port = free_port(), free_port()
    demo, log, config_path = start_demo(tmp_path, spark_port, ui_port)
    spark = load_config(config_path).spark
    assert spark.mode == "connect"  # the default deployment runs on the warm Spark
    try:
        url = f"http://127.0.0.1:{ui_port}/server_info"
        wait_for(lambda: answers(url), 300, "the UI did not answer", log)
        server_pid = connect_server.status(spark).pid
        assert server_pid is not None and listening(spark_port)
        if signum == signal.SIGTERM:  # a compaction run on the warm Spark reports its fixed cost
            wait_for(lambda: FIXED_COST.search(log.read_text()), 300, "no run reported its fixed cost", log)
            print("fixed costs:", FIXED_COST.findall(log.read_text()))
            # a table created now shows up in the UI without a manual reload
            catalog = open_catalog(load_config(config_path).catalog)
            catalog.create_table("demo.fresh", schema=pa.schema([("id", pa.int64())]))
            graphql = f"http://127.0.0.1:{ui_port}/graphql"
            wait_for(lambda: ["lake", "demo", "fresh"] in asset_keys(graphql), 240, "demo.fresh not in the UI", log)
            assert "tables changed (new: demo.fresh): reloading code location 'compaction_assets'" in log.read_text()
        leaders = [p for p in _children(demo.pid) if session_members(p)[:1] == [p]]  # each leads its session
        [run_host] = [p for p in leaders if b"compaction_assets.dagster_host" in _cmdline(p)]  # the warm run host
        [dagster_dev] = [p for p in leaders if p != run_host]
        before = session_members(demo.pid) + session_members(dagster_dev) + session_members(run_host)
        assert len(before) > 3  # demo, dagster dev, webserver, daemon, code server, run host, Spark, ...

        if to_group:  # Ctrl-C with a compaction run in flight (a fork of the run host)
            wait_for(lambda: len(_descendants(run_host)) > 1, 240, "no run started", log)
        every = {*before, *session_members(_session(server_pid)), *_descendants(demo.pid)}  # Spark JVM, workers too

        began = time.monotonic()
        if to_group:
            os.killpg(demo.pid, signum)
        else:
            demo.send_signal(signum)
        while any(_alive(p) for p in every) and time.monotonic() - began < 60:
            demo.poll()
            time.sleep(0.05)
        seconds = time.monotonic() - began
        print(f"demo stop took {seconds:.1f}s for {len(every)} processes, load average {os.getloadavg()}")
        left = {p: _cmdline(p)[:100] for p in every if _alive(p)}
        assert seconds <= 10 and not left, f"{seconds:.1f}s, left behind: {left}\n{log.read_text()[-3000:]}"
        assert demo.wait(timeout=5) == 0
        assert not session_members(dagster_dev) + session_members(run_host) + session_members(demo.pid)
        assert not answers(url) and not listening(ui_port) and closed_soon(spark_port)
        output = log.read_text()
        assert "will not be used" not in output  # Dagster's warning about a dagster.yaml in the cwd
        assert "Setting default log level" not in output and " WARN " not in output
    finally:
        kill_demo(demo, spark)


def kill_demo(demo: subprocess.Popen, spark) -> None:  # noqa: ANN001
    """Whatever a demo test left running: the demo, the sessions its children lead (dagster dev and
    the run host lead their own), and the Spark server it started."""
    leaders = [demo.pid, *_children(demo.pid)]
    if demo.poll() is None:
        demo.kill()
    for pid in [p for leader in leaders for p in session_members(leader)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if connect_server.status(spark).pid:
        connect_server.stop(spark)


def _children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(stat.parent.name))
        except OSError:
            continue
    return found


def _descendants(root: int) -> list[int]:
    found, todo = [], [root]
    while todo:
        found.append(todo.pop())
        todo += _children(found[-1])
    return found


def _session(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
