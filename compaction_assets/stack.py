"""The production stack as one command (`compaction-assets serve`): the warm Spark Connect server,
the run host, the Dagster webserver and the Dagster daemon, started for the configured catalog
and stopped together (the demo runs on the same `Stack`).

Each part runs in a session of its own, so it and whatever it starts (code servers, forked runs,
Python workers) go together: SIGINT or SIGTERM to `serve` signals every part at once and kills
what is left after a grace (process_groups.stop_sessions), all within 10 s.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from compaction_assets.config import SPARK_REMOTE_ENV, CompactionConfig
from compaction_assets.dagster_host import process as run_host
from compaction_assets.defs.naming import LOCATION_NAME, WEBSERVER_ENV
from compaction_assets.errors import CompactionError
from compaction_assets.execution import connect_server
from compaction_assets.process_groups import Stop, session_of, signals_raise, stop_sessions
from compaction_assets.redact import redact

PROJECT_DAGSTER_YAML = Path(__file__).resolve().parent.parent / "dagster.yaml"
WORKSPACE_NAME = "compaction-workspace.yaml"
READY_TIMEOUT_S = 300


def spark_remote_with_port(remote: str, port: int) -> str:
    """`spark.remote` on 127.0.0.1:`port`, its `/;param=...` part kept (`--spark-port`)."""
    rest = re.sub(r"^sc://[^/;]*", "", remote)
    return f"sc://127.0.0.1:{port}{rest}"


def dagster_home(config: CompactionConfig) -> Path:
    """$DAGSTER_HOME if set (a deployment's instance), else `.dagster_home` beside the config (the
    demo's, and what `status` finds); the project's dagster.yaml is copied in only if it has none."""
    home = Path(os.environ.get("DAGSTER_HOME") or Path(config.source).parent / ".dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copy(PROJECT_DAGSTER_YAML, home / "dagster.yaml")
    return home


def write_workspace(home: Path, config: CompactionConfig, name: str = WORKSPACE_NAME) -> Path:
    """A workspace file in `home` loading the code location from the config's folder."""
    workspace = home / name
    location = {
        "module_name": "compaction_assets.definitions",
        "location_name": LOCATION_NAME,
        "working_directory": str(Path(config.source).parent),
    }
    workspace.write_text(yaml.safe_dump({"load_from": [{"python_module": location}]}))
    return workspace


class Stack:
    """Long-lived parts, each in a session of its own, stopped together by `stop`."""

    def __init__(self, config: CompactionConfig) -> None:
        self.config = config
        self.parts: dict[str, subprocess.Popen] = {}
        self.spark_started = False  # a server that already ran is not ours to stop

    def start_spark(self) -> None:
        """In connect mode, the warm Spark Connect server at `spark.remote`, unless one runs."""
        if self.config.spark.mode != "connect" or connect_server.status(self.config.spark).running:
            return
        print(f"starting the warm Spark (Spark Connect at {connect_server.safe_remote(self.config.spark.remote)}) ...")
        self.spark_started = True  # before it starts: a signal during the start still stops it
        connect_server.start(self.config.spark)

    def start_run_host(self, home: Path, env: dict[str, str]) -> None:
        """The run host WarmRunLauncher hands runs to (a fork per run instead of a new Python)."""
        print("starting the warm run host (dagster and the compaction code imported once) ...", flush=True)
        self.parts["run host"] = run_host.start(home, env)

    def spawn(self, name: str, command: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
        process = subprocess.Popen(command, env=env, cwd=cwd, start_new_session=True)
        self.parts[name] = process
        return process

    def exited(self) -> str | None:
        """A part that exited on its own (name and exit code), if any."""
        return next(
            (f"{name} (exit code {p.returncode})" for name, p in self.parts.items() if p.poll() is not None), None
        )

    def stop(self) -> float:
        """SIGINT (Dagster's graceful interrupt) to every part's session and SIGTERM to the Spark
        server's (only if started here) at once, SIGKILL what is left after the grace; returns the
        seconds it took."""
        spark_pid = connect_server.status(self.config.spark).pid if self.spark_started else None
        sessions = [(p.pid, signal.SIGINT) for p in self.parts.values()]
        seconds, left = stop_sessions([*sessions, (session_of(spark_pid) if spark_pid else None, signal.SIGTERM)])
        for process in self.parts.values():
            process.poll()  # reap
        if self.spark_started:
            connect_server.stop(self.config.spark)  # its pid file goes: stopped on purpose, not "died"
        print(
            f"stopped {', '.join([*self.parts, *(['Spark Connect'] if self.spark_started else [])])} "
            f"in {seconds:.1f}s" + (f"; still alive after SIGKILL: {left}" if left else ""),
            flush=True,
        )
        return seconds


def serve(config: CompactionConfig, port: int) -> int:
    """Start Spark Connect (connect mode), the run host, the Dagster webserver (127.0.0.1:`port`)
    and the daemon; print a readiness line once the UI answers; run until SIGINT/SIGTERM (exit 0)
    or until a part exits on its own (the others are stopped; exit 1)."""
    home = dagster_home(config)
    workspace = write_workspace(home, config)
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "COMPACTION_CONFIG": config.source,
        WEBSERVER_ENV: url,  # the sensor reloads the code location through it when tables come or go
        SPARK_REMOTE_ENV: config.spark.remote,  # --spark-port reaches the code servers and runs
    }
    bin_dir = Path(sys.executable).parent
    require_ui(bin_dir)
    stack = Stack(config)
    with signals_raise():
        try:
            stack.start_spark()
            stack.start_run_host(home, env)
            # cwd is DAGSTER_HOME: Dagster warns about a dagster.yaml in any other working folder
            webserver = [str(bin_dir / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port), "-w", str(workspace)]
            stack.spawn("webserver", webserver, env, home)
            stack.spawn("daemon", [str(bin_dir / "dagster-daemon"), "run", "-w", str(workspace)], env, home)
            _wait_ready(stack, f"{url}/server_info")
            print(_ready_line(config, url, home), flush=True)
            while (gone := stack.exited()) is None:
                time.sleep(0.5)
            print(f"serve: the {gone} stopped on its own: stopping the rest", file=sys.stderr, flush=True)
            return 1
        except Stop:
            return 0
        finally:
            stack.stop()


def _wait_ready(stack: Stack, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if gone := stack.exited():
            raise CompactionError(f"serve: the {gone} stopped while starting (its output is above)")
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise CompactionError(f"serve: the Dagster webserver did not answer at {url} within {READY_TIMEOUT_S} s")


def _ready_line(config: CompactionConfig, url: str, home: Path) -> str:
    spark = (
        f"Spark Connect at {connect_server.safe_remote(config.spark.remote)}"
        if config.spark.mode == "connect"
        else f"Spark {config.spark.master} per run"
    )
    where = redact(config.catalog.properties.get("uri", config.catalog.properties.get("type", "")))
    return (
        f"\nready: Dagster UI at {url} (catalog '{config.catalog.name}' {where}; {spark}; DAGSTER_HOME={home})\n"
        f"  other commands on this stack: COMPACTION_CONFIG={config.source} "
        f"{SPARK_REMOTE_ENV}={connect_server.safe_remote(config.spark.remote)} compaction-assets status\n"
        f"Ctrl-C (or kill -INT/-TERM {os.getpid()}) stops everything."
    )


UI_EXTRA = "pip install 'compaction-assets[ui]'"


def require_ui(bin_dir: Path) -> None:
    """Fail at once, saying what to install, when the Dagster webserver is not installed beside us."""
    if not (bin_dir / "dagster-webserver").exists():
        raise CompactionError(f"the Dagster UI (dagster-webserver) is not installed in {bin_dir}: {UI_EXTRA}")
