"""Many tables: the code location's load and a run's start at 1,000 and 10,000 managed tables.

The catalog (SQLite, half the tables partitioned) is made once per size and kept under the temp
folder, so reruns start at once: two tables are created with pyiceberg, every other table gets a
copy of one of their metadata files (its own location and uuid) and a row in the catalog, in one
transaction. Each figure is taken in a fresh child process:
- definitions: from the import of the code location to `Definitions` resolved (import, one catalog query,
  the details cache, Dagster's objects); `cold`: with an empty details cache (the first load);
- code server: a real code server loaded and its snapshot received (`dagster job launch` does it);
- run start: `dagster api execute_run` (what a launched run's process runs) from its start to its
  first step's start; `scoped`: as the run host's child, with the run's table in $COMPACTION_DEFS_TABLES.
Wall seconds on a shared machine follow its load; the CPU seconds beside them much less so.
`python -m compaction_tools.bench.many_tables [REPEATS [SIZES...]]`
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import yaml
from dagster import DagsterEventType, DagsterInstance
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from sqlalchemy import delete, insert
from sqlalchemy.orm import Session

from compaction_assets.config import load_config
from compaction_assets.defs.naming import TABLES_ENV
from compaction_assets.lake.catalog import open_catalog
from compaction_tools.bench.planning_scale import SCHEMA, SPEC

NAMESPACE = "scale"

_DEFINITIONS = """
import time, sys
began = time.perf_counter()
import compaction_assets.definitions as d
repository = d.defs.get_repository_def()
wall, cpu = time.perf_counter() - began, time.process_time()
from dagster import serialize_value
from compaction_assets.dagster_host.dagster_internals import RepositorySnap
serialize_value(RepositorySnap.from_def(repository))  # what a code server sends
print("RESULT", wall, cpu, time.process_time())
"""

_CODE_SERVER = """
import time
from dagster import DagsterInstance
from compaction_assets.dagster_host import dagster_internals as internals
from dagster.version import __version__
from dagster_shared.cli import WorkspaceOpts
with DagsterInstance.get() as instance:
    began = time.perf_counter()
    opts = WorkspaceOpts(module_name=("compaction_assets.definitions",))
    with internals.get_workspace_from_cli_opts(instance, version=__version__, workspace_opts=opts) as workspace:
        location = internals.get_code_location_from_workspace(workspace, None)
        assets = sum(len(r.get_asset_node_snaps()) for r in location.get_repositories().values())
        print("RESULT", time.perf_counter() - began, assets)
"""


def table_names(tables: int) -> list[str]:
    return [f"{NAMESPACE}.t{i:05d}" for i in range(tables)]


def make_lake(tables: int, root: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """A SQLite catalog of `tables` empty tables (every other one partitioned); its config path."""
    root = root or Path(tempfile.gettempdir()) / f"compaction-bench-tables-{tables}"
    config_path = root / "compaction.yaml"
    if (root / "ready").exists():
        return config_path
    root.mkdir(parents=True, exist_ok=True)
    doc = {
        "catalog": {
            "name": "bench",
            "properties": {"type": "sql", "uri": "sqlite:///catalog.db", "warehouse": f"file://{root}/warehouse"},
        },
        "state": {"uri": "sqlite:///state.db"},
        "spark": {"mode": "local", "master": "local[1]"},
        "tables": [{"match": "*"}],
    }
    config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    started = time.perf_counter()
    catalog = open_catalog(load_config(config_path).catalog)
    if not isinstance(catalog, SqlCatalog):  # its rows are inserted into the catalog's database below
        raise RuntimeError(f"bench: expected a SQL catalog, got {type(catalog).__name__}")
    catalog.create_namespace_if_not_exists(NAMESPACE)
    names = table_names(tables)
    templates = [
        catalog.create_table(names[0], schema=SCHEMA, partition_spec=SPEC),
        catalog.create_table(names[1], schema=SCHEMA),
    ]
    docs = [json.loads(Path(t.metadata_location.removeprefix("file://")).read_text()) for t in templates]
    rows = []
    for i, name in enumerate(names[2:], start=2):
        doc = dict(docs[i % 2])
        location = f"{root}/warehouse/{NAMESPACE}/{name.split('.')[1]}"
        doc |= {"location": f"file://{location}", "table-uuid": str(uuid.uuid4())}
        metadata = Path(location) / "metadata" / f"00000-{uuid.uuid4()}.metadata.json"
        metadata.parent.mkdir(parents=True, exist_ok=True)
        metadata.write_text(json.dumps(doc))
        rows.append(
            {
                "catalog_name": catalog.name,
                "table_namespace": NAMESPACE,
                "table_name": name.split(".")[1],
                "metadata_location": f"file://{metadata}",
                "previous_metadata_location": None,
            }
        )
    with Session(catalog.engine) as session, session.begin():
        session.execute(insert(IcebergTables), rows)
    (root / "ready").write_text(f"{time.perf_counter() - started:.1f}\n")
    log(f"[tables] {tables} tables generated in {time.perf_counter() - started:.1f}s in {root}")
    return config_path


def _home(config_path: Path) -> dict[str, str]:
    """The bench's Dagster instance (SQLite storage beside the catalog) and config, as env vars."""
    home = config_path.parent / "dagster-home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry: {enabled: false}\n")
    return {"COMPACTION_CONFIG": str(config_path), "DAGSTER_HOME": str(home)}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _child(script: str, config_path: Path) -> list[str]:
    full_env = {**os.environ, **_home(config_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=full_env, cwd=config_path.parent, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench: child process failed:\n{done.stderr[-3000:]}")
    [result] = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return result


def definitions_load(config_path: Path, cold: bool = False) -> tuple[float, float, float]:
    """(wall, CPU) seconds of a fresh process from its start to the code location's Definitions
    resolved, and its CPU seconds once the snapshot a code server sends is serialised too;
    `cold`: with the details cache emptied first."""
    if cold:
        from compaction_assets.lake.table_details import DetailsCache, _DetailsRow

        cache = DetailsCache(load_config(config_path).state_uri)
        with Session(cache._engine) as session, session.begin():  # noqa: SLF001 - the bench's own reset
            session.execute(delete(_DetailsRow))
        cache.dispose()
    inner, cpu, snapshot_cpu = (float(x) for x in _child(_DEFINITIONS, config_path))
    return inner, cpu, snapshot_cpu


def code_server_load(config_path: Path) -> float:
    """Seconds until a real code server has loaded the location and sent its snapshot."""
    seconds, _ = _child(_CODE_SERVER, config_path)
    return float(seconds)


def run_start(config_path: Path, table: str, scoped: bool) -> tuple[float, float]:
    """Seconds from `dagster api execute_run`'s start to its first step's start, for a run of
    `table` created through a code server (as a launched run is), and the CPU seconds of the
    worker process, start to exit (its step compacts an empty table: nothing to do)."""
    from dagster import serialize_value
    from dagster.version import __version__
    from dagster_shared.cli import WorkspaceOpts

    from compaction_assets.dagster_host.dagster_internals import (
        ExecuteRunArgs,
        get_code_location_from_workspace,
        get_workspace_from_cli_opts,
    )
    from compaction_assets.dagster_host.submit import create_table_run

    env = _home(config_path)
    os.environ.update(env)  # the code server this process starts reads them
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        opts = WorkspaceOpts(module_name=("compaction_assets.definitions",))
        with get_workspace_from_cli_opts(instance, version=__version__, workspace_opts=opts) as workspace:
            location = get_code_location_from_workspace(workspace, None)
            [repository] = location.get_repositories().values()
            run = create_table_run(instance, location, repository, table)
        if run.job_code_origin is None:
            raise RuntimeError(f"bench: run {run.run_id} of {table} has no job code origin to execute")
        args = ExecuteRunArgs(job_origin=run.job_code_origin, run_id=run.run_id, instance_ref=instance.get_ref())
        command = [str(Path(sys.executable).parent / "dagster"), "api", "execute_run", serialize_value(args)]
        scope = {TABLES_ENV: json.dumps([table])} if scoped else {}
        started, cpu = time.time(), _children_cpu()
        done = subprocess.run(
            command, env={**os.environ, **scope}, cwd=config_path.parent, capture_output=True, text=True
        )
        steps = instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START)
        if not steps:
            raise RuntimeError(f"bench: the run of {table} never started a step:\n{done.stdout[-3000:]}")
        return steps[0].timestamp - started, _children_cpu() - cpu


def measure(sizes: tuple[int, ...] = (1000, 10000), repeats: int = 3, log: Callable[[str], None] = print) -> dict:
    """Medians of `repeats` interleaved measurements per size (a shared machine is noisy)."""
    lakes = {n: make_lake(n, log=log) for n in sizes}
    figures: dict[str, list[float]] = {}
    for k in range(repeats):
        for n, config_path in lakes.items():
            table = table_names(n)[n // 2]
            cold, warm = definitions_load(config_path, cold=True), definitions_load(config_path)
            server, unscoped, scoped = (
                code_server_load(config_path),
                run_start(config_path, table, scoped=False),
                run_start(config_path, table, scoped=True),
            )
            sample = {
                f"definitions_{n}_cold_s": cold[0],
                f"definitions_{n}_s": warm[0],
                f"definitions_{n}_cpu_s": warm[1],
                f"code_server_{n}_s": server,
                f"code_server_{n}_cpu_s": warm[2],
                f"run_start_{n}_s": unscoped[0],
                f"run_worker_{n}_cpu_s": unscoped[1],
                f"run_start_{n}_scoped_s": scoped[0],
                f"run_worker_{n}_scoped_cpu_s": scoped[1],
            }
            for key, value in sample.items():
                figures.setdefault(key, []).append(value)
            log(
                f"[tables] {n} tables, round {k + 1}/{repeats}: " + ", ".join(f"{a} {b:.2f}" for a, b in sample.items())
            )
    return {key: statistics.median(values) for key, values in figures.items()} | {"sizes": list(sizes)}


def report_lines(result: dict) -> list[str]:
    lines = []
    for n in result["sizes"]:
        label = f"{n // 1000}k" if n % 1000 == 0 else str(n)
        lines.append(
            f"definitions_{label}_tables_s={result[f'definitions_{n}_s']:.2f} "
            f"(cpu {result[f'definitions_{n}_cpu_s']:.2f}s; first load, cold details cache "
            f"{result[f'definitions_{n}_cold_s']:.2f}s; a real code server loaded in "
            f"{result[f'code_server_{n}_s']:.2f}s; "
            f"cpu with the snapshot it sends serialised {result[f'code_server_{n}_cpu_s']:.2f}s)"
        )
        lines.append(
            f"run_start_{label}_tables_s={result[f'run_start_{n}_scoped_s']:.2f} "
            f"(worker cpu {result[f'run_worker_{n}_scoped_cpu_s']:.2f}s; the run host's worker defines its run's "
            f"table; `dagster api execute_run` defining all: {result[f'run_start_{n}_s']:.2f}s, "
            f"cpu {result[f'run_worker_{n}_cpu_s']:.2f}s)"
        )
    return lines


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    outcome = measure(tuple(args[1:]) or (1000, 10000), repeats=args[0]) if args else measure()
    print("\n".join(report_lines(outcome)))
