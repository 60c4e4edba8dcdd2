"""The fixed cost of a run: `compaction-assets compact` of a trivial partition, in a new process,
cold (local mode: a JVM per run) against warm (connect mode: the shared Spark Connect server);
and the same for a Dagster run (`dagster job execute`: what a launched run's process does), whose
fixed cost is its wall time less the compaction's own seconds (`dagster_run_fixed_cost_s`); and a
Dagster run launched by WarmRunLauncher into the warm run host (a forked child, no new Python):
its fixed cost is what the run logs, from its RUN_STARTING event to its result less compaction."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml
from dagster import DagsterEventType, DagsterInstance, DagsterRun

from compaction_assets.config import load_config
from compaction_assets.dagster_host import process as run_host
from compaction_assets.dagster_host.dagster_internals import SYNC_RUN_COORDINATOR_MODULE
from compaction_assets.defs.naming import table_key
from compaction_assets.execution import connect_server
from compaction_assets.lake.catalog import open_catalog
from compaction_tools.bench.datasets import rows
from compaction_tools.demo import append_fragments


def trivial_table(config_path: Path, name: str) -> None:
    """Six files of ten rows: the least a compaction can do."""
    catalog = open_catalog(load_config(config_path).catalog)
    batches = [rows(i * 10, 10, i) for i in range(6)]
    table = catalog.create_table(name, schema=batches[0].schema)
    append_fragments(table, batches)


def timed_compact(config_path: Path, name: str) -> float:
    command = [str(Path(sys.executable).parent / "compaction-assets"), "--config", str(config_path), "compact", name]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0 or "committed" not in done.stdout:
        raise RuntimeError(f"bench: compact {name} failed:\n{done.stdout}{done.stderr}")
    return seconds


def asset_path(name: str) -> str:
    """The table's asset key as `dagster asset materialize --select` takes it."""
    return table_key(name).to_user_string()


_COMPACTION_S = re.compile(r"dagster_run_fixed_cost_s=[0-9.]+ \(run launch to result, less ([0-9.]+)s of compaction")


def timed_dagster_run(config_path: Path, name: str) -> tuple[float, float]:
    """Wall seconds of a Dagster run compacting table `name` in a new process, and its fixed cost."""
    home = config_path.parent / "dagster-home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "COMPACTION_CONFIG": str(config_path), "DAGSTER_HOME": str(home)}
    dagster = str(Path(sys.executable).parent / "dagster")
    command = [dagster, "asset", "materialize", "-m", "compaction_assets.definitions", "--select", asset_path(name)]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=home, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    found = _COMPACTION_S.search(done.stdout + done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"bench: dagster run of {name} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return seconds, seconds - float(found.group(1))


_HOST_YAML = f"""telemetry: {{enabled: false}}
run_launcher: {{module: compaction_assets.dagster_host.launcher, class: WarmRunLauncher}}
run_coordinator:
  module: {SYNC_RUN_COORDINATOR_MODULE}
  class: SyncInMemoryRunCoordinator
"""


def _reloaded(instance: DagsterInstance, run_id: str) -> DagsterRun:
    """The run as the instance has it now."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        raise RuntimeError(f"bench: run {run_id} is gone from the Dagster instance")
    return run


def timed_host_runs(config_path: Path, names: list[str], log=print) -> list[tuple[float, float]]:  # noqa: ANN001
    """(RUN_STARTING to RUN_SUCCESS seconds, logged fixed cost) of runs launched into the run host.

    The launch (dagster_host.submit) loads the code location in a code server of its own first (a deployment
    has it loaded already), so the clock starts at the run's RUN_STARTING event, as the run's own does.
    """
    home = config_path.parent / "dagster-host-home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text(_HOST_YAML)
    env = {**os.environ, "COMPACTION_CONFIG": str(config_path), "DAGSTER_HOME": str(home)}
    started = time.perf_counter()
    host = run_host.start(home, env, log=home / "run-host.log")
    log(f"[fixed cost] run host ready in {time.perf_counter() - started:.1f}s")
    results = []
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            for name in names:
                command = [sys.executable, "-m", "compaction_assets.dagster_host.submit", name]
                done = subprocess.run(command, env=env, cwd=home, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"bench: launching a run of {name} failed:\n{done.stderr[-3000:]}")
                [run] = instance.get_runs(limit=1)
                while not (run := _reloaded(instance, run.run_id)).is_finished:
                    time.sleep(0.2)
                events = instance.all_logs(run.run_id)
                text = "\n".join(e.message or "" for e in events)
                found = re.search(r"dagster_run_fixed_cost_s=([0-9.]+)", text)
                if not found or "forked from the warm run host" not in text:
                    raise RuntimeError(f"bench: host run of {name} ({run.status}) failed:\n{text[-3000:]}")
                stamp = {e.dagster_event_type: e.timestamp for e in events if e.dagster_event_type}
                seconds = stamp[DagsterEventType.RUN_SUCCESS] - stamp[DagsterEventType.RUN_STARTING]
                results.append((seconds, float(found.group(1))))
                log(f"[fixed cost] Dagster run in the run host: {results[-1][0]:.2f}s, fixed {results[-1][1]:.2f}s")
    finally:
        host.terminate()
        host.wait(30)
    return results


def measure(config_path: Path, port: int, runs: int = 3, log=print) -> dict[str, float]:  # noqa: ANN001
    """Median seconds of `runs` cold and `runs` warm runs (after one warm-up run on the server)."""
    doc = yaml.safe_load(config_path.read_text())
    doc["spark"] = {**doc["spark"], "mode": "connect", "remote": f"sc://127.0.0.1:{port}", "server_dir": "spark-server"}
    connect_path = config_path.with_name("connect.yaml")
    connect_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for i in range(5 * runs + 1):
        trivial_table(config_path, f"bench.trivial{i}")
    cold = []
    for i in range(runs):
        cold.append(timed_compact(config_path, f"bench.trivial{i}"))
        log(f"[fixed cost] cold local run {i + 1}: {cold[-1]:.2f}s")
    dagster_cold = []
    for i in range(runs):
        dagster_cold.append(timed_dagster_run(config_path, f"bench.trivial{2 * runs + 1 + i}"))
        log(
            f"[fixed cost] Dagster run, local Spark {i + 1}: {dagster_cold[-1][0]:.2f}s, "
            f"fixed {dagster_cold[-1][1]:.2f}s"
        )
    spark = load_config(connect_path).spark
    started = time.perf_counter()
    connect_server.start(spark)
    server_start = time.perf_counter() - started
    try:
        warmup = timed_compact(connect_path, f"bench.trivial{runs}")
        log(f"[fixed cost] server started in {server_start:.1f}s; first run on it {warmup:.2f}s")
        warm = []
        for i in range(runs):
            warm.append(timed_compact(connect_path, f"bench.trivial{runs + 1 + i}"))
            log(f"[fixed cost] warm connect run {i + 1}: {warm[-1]:.2f}s")
        dagster_warm = []
        for i in range(runs):
            dagster_warm.append(timed_dagster_run(connect_path, f"bench.trivial{3 * runs + 1 + i}"))
            log(
                f"[fixed cost] Dagster run, warm Spark {i + 1}: {dagster_warm[-1][0]:.2f}s, "
                f"fixed {dagster_warm[-1][1]:.2f}s"
            )
        hosted = timed_host_runs(connect_path, [f"bench.trivial{4 * runs + 1 + i}" for i in range(runs)], log)
    finally:
        connect_server.stop(spark)
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    dagster_cold_s = statistics.median(s for s, _ in dagster_cold)
    dagster_warm_s = statistics.median(s for s, _ in dagster_warm)
    return {
        "cold_local_s": cold_s,
        "warm_connect_s": warm_s,
        "server_start_s": server_start,
        "first_run_on_server_s": warmup,
        "warm_over_cold": warm_s / cold_s,
        "dagster_run_local_s": dagster_cold_s,
        "dagster_run_warm_s": dagster_warm_s,
        "dagster_run_fixed_cost_s": statistics.median(f for _, f in dagster_warm),
        "dagster_run_fixed_cost_local_s": statistics.median(f for _, f in dagster_cold),
        "dagster_warm_over_local": dagster_warm_s / dagster_cold_s,
        "dagster_host_run_s": statistics.median(s for s, _ in hosted),
        "dagster_host_run_fixed_cost_s": statistics.median(f for _, f in hosted),
        "dagster_host_over_local": statistics.median(s for s, _ in hosted) / dagster_cold_s,
    }
