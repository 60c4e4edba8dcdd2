"""Starting `compaction-assets demo` (or `serve`) as a user would, and asking whether it answers:
shared by the demo, serve and quiet-output tests."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

from compaction_assets.execution import connect_server
from compaction_tools.demo_ui import session_members
from tests.conftest import CLI, REPO
from tests.lakekit.waiting import wait_until


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status == 200
    except OSError:
        return False


def start_demo(tmp_path: Path, spark_port: int, ui_port: int) -> tuple[subprocess.Popen, Path, Path]:
    """The demo on free ports (the repository's compaction.yaml, copied with the Spark Connect port
    changed), leading its own session as from a terminal: (process, its log, the config it reads)."""
    config_path = tmp_path / "compaction.yaml"
    config_path.write_text(
        (REPO / "compaction.yaml").read_text().replace("sc://127.0.0.1:15002", f"sc://127.0.0.1:{spark_port}")
    )
    log = tmp_path / "demo.log"
    env = {**os.environ, "COMPACTION_CONFIG": str(config_path)}
    env.pop("DAGSTER_HOME", None)
    demo = subprocess.Popen(
        [*CLI, "demo", "--files-per-partition", "6", "--port", str(ui_port)],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return demo, log, config_path


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
    try:
        wait_until(lambda: not listening(port), seconds, interval=0.5)
    except AssertionError:
        return False
    return True


def wait_for(condition, seconds: float, what: str, log: Path) -> None:  # noqa: ANN001
    wait_until(
        condition,
        seconds,
        interval=1,
        message=lambda: f"{what} within {seconds}s; demo output:\n{log.read_text()[-4000:]}",
    )


def kill_demo(demo: subprocess.Popen, spark) -> None:  # noqa: ANN001
    """Whatever a demo test left running: the demo, the sessions its children lead (dagster dev and
    the run host lead their own), and the Spark server it started."""
    leaders = [demo.pid, *children(demo.pid)]
    if demo.poll() is None:
        demo.kill()
    for pid in [p for leader in leaders for p in session_members(leader)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if connect_server.status(spark).pid:
        connect_server.stop(spark)


def children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(stat.parent.name))
        except OSError:
            continue
    return found


def descendants(root: int) -> list[int]:
    found, todo = [], [root]
    while todo:
        found.append(todo.pop())
        todo += children(found[-1])
    return found


def session_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
