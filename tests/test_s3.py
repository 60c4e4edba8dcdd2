"""The whole flow on an S3-protocol warehouse (moto's server on 127.0.0.1, reached only through the
catalog's s3.* properties or the AWS_* environment): CLI, a Dagster run, recovery after a kill, GC
with paged listings, and credentials that never reach any output."""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from dagster import instance_for_test
from dagster._serdes import serialize_value
from pyiceberg.catalog.sql import SqlCatalog

from compaction_assets.commit.consistency import check_consistency
from compaction_assets.commit.ledger import Status
from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions, table_job
from compaction_assets.defs.naming import op_name
from compaction_assets.lake.digest import row_hashes, rows_digest
from compaction_assets.lake.files import live_files
from compaction_assets.lake.storage import files_with_prefix
from compaction_tools import local_s3
from compaction_tools.reliability import check_invariants
from tests.conftest import CLI, REPO, SCHEMA, batch, create_fragmented, data_files, free_port, write_config
from tests.lakekit.demo_process import FIXED_COST, answers, asset_keys, closed_soon, kill_demo, wait_for
from tests.lakekit.duckdb_reader import duckdb_multiset
from tests.lakekit.oracle import row_key

CREDENTIALS = (local_s3.ACCESS_KEY, local_s3.SECRET_KEY)


def assert_no_credentials(*texts: str) -> None:
    for text in texts:
        for credential in CREDENTIALS:
            assert credential not in text, f"credential leaked in: {text[:300]}"


def keys_under(s3, prefix: str) -> set[str]:
    """Every object key below `prefix` in the bucket (paged: moto answers 1000 keys per page)."""
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def object_key(s3, location: str) -> str:
    assert location.startswith(f"s3://{s3.bucket}/"), location
    return location.removeprefix(f"s3://{s3.bucket}/")


def test_cli_plan_compact_status_check_and_gc_on_s3(s3_lake, s3_server):
    table = create_fragmented(s3_lake, "ns.t", {"eu": 12, "us": 3})
    assert table.location().startswith(f"s3://{s3_server.bucket}/")
    before, replaced = rows_digest(table), {f["file_path"] for f in data_files(table) if "region=eu" in f["file_path"]}

    plan = s3_lake.cli("-v", "plan", "ns.t")
    assert plan.returncode == 0, plan.stderr
    assert re.search(r"region=eu\s+12 ", plan.stdout) and "1 of 2 partition(s) to compact" in plan.stdout

    compact = s3_lake.cli("-v", "compact", "ns.t")
    assert compact.returncode == 0, compact.stderr
    assert "ns.t [region=eu]: committed minor: 12 -> 1 files" in compact.stdout, compact.stdout
    table = s3_lake.table("ns.t")
    assert rows_digest(table) == before
    assert len(data_files(table)) == 1 + 3
    # an independent reader (DuckDB's Iceberg + httpfs extensions, C++) sees the same rows on S3
    assert duckdb_multiset(table) == Counter(row_key(r) for r in table.scan().to_arrow().to_pylist())
    assert sum(duckdb_multiset(table).values()) == before.rows

    status = s3_lake.cli("-v", "status")
    assert status.returncode == 0, status.stderr
    assert re.search(r"ns\.t\s+default\s+4 ", status.stdout), status.stdout

    [attempt] = s3_lake.engine.ledger.attempts(table_name="ns.t")
    assert attempt.status == Status.COMMITTED
    report = check_consistency(table, s3_lake.engine.ledger, "region=eu", attempt.task_id, 60)
    assert report.passed and report.attempts_checked == 1, report.problems

    # GC while the compaction's snapshot is young: the replaced files stay readable through it
    kept = s3_lake.cli("-v", "gc", "ns.t")
    assert kept.returncode == 0, kept.stderr
    assert "expired 0 snapshot(s); deleted 0 file(s)" in kept.stdout, kept.stdout
    objects = keys_under(s3_server, object_key(s3_server, table.location()))
    assert {object_key(s3_server, p) for p in replaced} <= objects
    with table.transaction() as txn:  # expiry now allows it: keep the newest snapshot only
        txn.set_properties({"history.expire.max-snapshot-age-ms": "0", "history.expire.min-snapshots-to-keep": "1"})
    gc = s3_lake.cli("-v", "gc", "ns.t")
    assert gc.returncode == 0, gc.stderr
    deleted = re.search(r"deleted (\d+) file\(s\) of expired snapshots", gc.stdout)
    assert deleted and int(deleted[1]) >= 12, gc.stdout  # the 12 replaced files, their manifests and lists
    objects = keys_under(s3_server, object_key(s3_server, table.location()))
    table = s3_lake.table("ns.t")
    assert not {object_key(s3_server, p) for p in replaced} & objects  # replaced files are gone
    assert {object_key(s3_server, f.path) for f in live_files(table)} <= objects  # live files kept
    assert rows_digest(table) == before
    assert_no_credentials(*(r.stdout + r.stderr for r in (plan, compact, status, kept, gc)))
    assert_no_credentials(dump_tables(s3_lake.root / "state.db"))  # the ledger's rows, every table


@pytest.mark.parametrize("crash_at", ["after_rewrite", "after_prepare"])
def test_recovery_after_a_kill_on_s3(s3_lake, crash_at):
    table = create_fragmented(s3_lake, "ns.t", {"eu": 10})
    oracle = row_hashes(table.scan().to_arrow().to_pylist())

    crashed = s3_lake.cli("compact", "ns.t", crash_at=crash_at)
    assert crashed.returncode == 137, crashed.stderr
    [attempt] = s3_lake.engine.ledger.attempts(table_name="ns.t")
    assert attempt_files(attempt, table), "the kill left no result file on S3"
    s3_lake.engine.recover()

    [attempt] = s3_lake.engine.ledger.attempts(table_name="ns.t")
    table = s3_lake.table("ns.t")
    written = attempt_files(attempt, table)
    live = {f.path for f in live_files(table)}
    if attempt.status == Status.COMMITTED:  # recovery committed the result files, or undid and deleted them
        assert written and written <= live, (attempt.status, written)
    else:
        assert attempt.status in (Status.ROLLED_BACK, Status.FAILED) and not written, (attempt.status, written)

    report = check_invariants(s3_lake.engine, "ns.t", oracle)  # rows, ledger, then GC finds no orphan
    assert report.ok and report.rows_verified == 10 * 50, report
    assert s3_lake.engine.ledger.attempts(statuses=[Status.PREPARED, Status.EXECUTING]) == []


def attempt_files(attempt, table) -> set[str]:  # noqa: ANN001 - a ledger Attempt, a pyiceberg Table
    """The result files the attempt wrote, as listed on the object store."""
    return {p for d in attempt.output_dirs for p in files_with_prefix(d, attempt.attempt_id, table.io)}


def dump_tables(db_path) -> str:
    with sqlite3.connect(db_path) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(repr(row) for name in names for row in conn.execute(f'SELECT * FROM "{name}"'))


def test_dagster_run_on_s3_materialises_passes_its_check_and_leaks_no_credentials(s3_lake):
    table = create_fragmented(s3_lake, "ns.t", {"eu": 12})
    before = rows_digest(table)
    with instance_for_test() as instance:
        defs = build_definitions(load_config(s3_lake.config_path))
        instance.add_dynamic_partitions("lake__ns__t", ["region=eu"])
        job = table_job(defs, "ns.t")
        result = job.execute_in_process(instance=instance, partition_key="region=eu", raise_on_error=False)

        assert result.success
        [check] = result.get_asset_check_evaluations()
        assert check.passed and check.check_name == "precommit_commit_consistency", check.metadata
        [event] = result.asset_materializations_for_node(op_name("default", "ns.t"))
        metadata = {k: v.value for k, v in event.metadata.items()}
        assert metadata["status"] == "committed" and (metadata["data_files_before"], metadata["data_files_after"]) == (
            12,
            1,
        )
        assert rows_digest(s3_lake.table("ns.t")) == before
        run = instance.get_run_by_id(result.run_id)
        logs = [serialize_value(entry) for entry in instance.all_logs(result.run_id)]
        assert any("ASSET_MATERIALIZATION" in line for line in logs)
        assert_no_credentials(repr(run.tags), repr(run.run_config), repr(metadata), *logs)
    assert_no_credentials(dump_tables(s3_lake.root / "state.db"))


def test_gc_pages_through_thousands_of_orphans_and_deletes_nothing_outside_the_table(s3_lake, s3_server):
    table = create_fragmented(s3_lake, "ns.t", {"eu": 3})
    location = object_key(s3_server, table.location())  # <prefix>/ns.db/t
    orphans = {f"{location}/data/region=eu/orphan-{i:05d}.parquet" for i in range(1050)}
    outside = {
        f"{location}_other/data/keep-{i}.parquet"
        for i in range(3)  # a sibling whose name starts the same
    } | {f"{location}-x.parquet", f"elsewhere/{location}/data/keep.parquet", "top-level.parquet"}
    client = s3_server.client()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"x"), orphans | outside))
    live = {object_key(s3_server, f.path) for f in live_files(table)}
    time.sleep(1.1)  # kept: time must pass; moto's LastModified has whole seconds; the grace below is 0 ms
    with table.transaction() as txn:
        txn.set_properties({"compaction.gc.orphan-grace-ms": "0"})

    report = s3_lake.engine.gc("ns.t")

    assert {object_key(s3_server, p) for p in report.orphan_files} == orphans  # > 1000: more than one page
    remaining = keys_under(s3_server, "")
    assert not orphans & remaining
    assert outside <= remaining and live <= remaining
    assert rows_digest(s3_lake.table("ns.t")).rows == 3 * 50


def cli_env(config: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COMPACTION_CONFIG": str(config), **env}
    env.pop("COMPACTION_CRASH_AT", None)
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=300)


def config_with(lake, path: Path, drop: tuple[str, ...] = (), **properties: str) -> Path:
    doc = yaml.safe_load(lake.config_path.read_text())
    props = doc["catalog"]["properties"]
    doc["catalog"]["properties"] = {**{k: v for k, v in props.items() if k not in drop}, **properties}
    path.write_text(yaml.safe_dump(doc))
    return path


def test_credentials_from_the_environment(s3_lake, s3_server):
    table = create_fragmented(s3_lake, "ns.t", {"eu": 8})
    before = rows_digest(table)
    config = config_with(s3_lake, s3_lake.root / "env.yaml", drop=("s3.access-key-id", "s3.secret-access-key"))
    assert "secret" not in config.read_text()
    env = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}

    run = cli_env(config, env, "-v", "compact", "ns.t")

    assert run.returncode == 0, run.stderr
    assert "ns.t [region=eu]: committed minor: 8 -> 1 files" in run.stdout, run.stdout
    assert rows_digest(s3_lake.table("ns.t")) == before
    assert_no_credentials(run.stdout, run.stderr)


def test_unreachable_endpoint_is_one_clear_line_without_the_secret(s3_lake, s3_server):
    create_fragmented(s3_lake, "ns.t", {"eu": 3})
    endpoint = f"http://127.0.0.1:{free_port()}"
    config = config_with(s3_lake, s3_lake.root / "bad.yaml", **{"s3.endpoint": endpoint})

    for args in (["compact", "ns.t"], ["-v", "plan", "ns.t"]):
        run = cli_env(config, {}, *args)
        assert run.returncode == 2, run.stdout + run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert "'ns.t'" in run.stderr and f"s3.endpoint {endpoint}" in run.stderr, run.stderr
        assert_no_credentials(run.stdout, run.stderr)


def demo_config(tmp_path: Path) -> Path:
    """The repository's compaction.yaml (Spark Connect, as a user runs the demo) on a free port."""
    path = tmp_path / "compaction.yaml"
    text = (REPO / "compaction.yaml").read_text().replace("sc://127.0.0.1:15002", f"sc://127.0.0.1:{free_port()}")
    path.write_text(text.replace('master: "local[*]"', 'master: "local[2]"'))
    return path


def test_demo_s3_no_ui_compacts_on_its_own_s3_server_and_stops_it(tmp_path):
    config = demo_config(tmp_path)

    run = cli_env(config, {}, "demo", "--s3", "--no-ui", "--files-per-partition", "6")

    assert run.returncode == 0, run.stdout + run.stderr
    endpoint = re.search(r"local S3 server \(moto\) at (http://127\.0\.0\.1:(\d+))", run.stdout)
    assert endpoint, run.stdout
    generated = yaml.safe_load((tmp_path / "compaction.demo-s3.yaml").read_text())
    properties = generated["catalog"]["properties"]
    assert properties["warehouse"] == "s3://lake/demo" and properties["s3.endpoint"] == endpoint[1]
    assert (tmp_path / ".lake" / "catalog-s3.db.demo-lake").exists()  # its own catalog, marked as the demo's
    assert not (tmp_path / ".lake" / "catalog.db").exists()  # the local demo's catalog is not touched
    for name in ("demo.events", "sales.orders", "demo.metrics", "demo.users"):
        assert re.search(rf"  {name}: \d+ rows, content identical", run.stdout), run.stdout
    total = re.search(
        r"total: 8 partition\(s\) compacted, (\d+) -> 8 files, (\d+) -> (\d+) bytes, .*rewrite path", run.stdout
    )
    assert total and int(total[1]) == 8 * 6 and int(total[3]) < int(total[2]), run.stdout
    assert_no_credentials(run.stdout, run.stderr)
    with socket.socket() as sock:  # the demo's S3 server stopped with it
        assert sock.connect_ex(("127.0.0.1", int(endpoint[2]))) != 0


def test_demo_s3_without_moto_names_the_extra_to_install(tmp_path):
    shadow = tmp_path / "no_moto" / "moto"  # a moto that cannot be imported, first on the path
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('moto is not installed')\n")

    run = cli_env(demo_config(tmp_path), {"PYTHONPATH": str(shadow.parent)}, "demo", "--s3", "--no-ui")

    assert run.returncode == 2, run.stdout + run.stderr
    assert "pip install -e '.[s3]'" in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not (tmp_path / ".lake").exists()  # nothing was created


def test_wrong_secret_key_is_one_clear_line_naming_table_and_endpoint_not_the_secret(tmp_path, s3_with_auth):
    properties = s3_with_auth.catalog_properties(f"sqlite:///{tmp_path / 'catalog.db'}")
    catalog = SqlCatalog("lake", **properties)
    catalog.create_namespace("ns")
    catalog.create_table("ns.t", schema=SCHEMA).append(batch(0, 10, "eu"))
    wrong = {**properties, "s3.secret-access-key": local_s3.SECRET_KEY}  # planted: it must not show
    config = write_config(tmp_path, catalog={"name": "lake", "properties": wrong})

    for args in (["compact", "ns.t"], ["-v", "plan", "ns.t"]):
        run = cli_env(config, {}, *args)
        assert run.returncode == 2, run.stdout + run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert "'ns.t'" in run.stderr and f"s3.endpoint {s3_with_auth.endpoint}" in run.stderr, run.stderr
        assert "ACCESS_DENIED" in run.stderr, run.stderr  # S3 answers a HEAD with a bad signature so
        assert s3_with_auth.secret_key not in run.stderr + run.stdout
        assert_no_credentials(run.stdout, run.stderr)


@pytest.mark.slow
def test_demo_s3_with_the_ui_starts_compacts_through_dagster_and_stops(tmp_path):
    """`demo --s3`: dagster dev's webserver, daemon and runs reach the demo process's S3 server
    through the generated config; SIGTERM stops everything, the S3 server with it."""
    config, ui_port = demo_config(tmp_path), free_port()
    spark = load_config(config).spark
    log = tmp_path / "demo.log"
    env = {**os.environ, "COMPACTION_CONFIG": str(config)}
    env.pop("DAGSTER_HOME", None)
    demo = subprocess.Popen(
        [*CLI, "demo", "--s3", "--files-per-partition", "6", "--port", str(ui_port)],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{ui_port}/server_info"), 300, "the UI did not answer", log)
        graphql = f"http://127.0.0.1:{ui_port}/graphql"
        wait_for(lambda: ["lake", "sales", "orders"] in asset_keys(graphql), 120, "no table assets", log)
        wait_for(lambda: FIXED_COST.search(log.read_text()), 300, "no compaction run on S3 finished", log)
        [s3_port] = re.findall(r"local S3 server \(moto\) at http://127\.0\.0\.1:(\d+)", log.read_text())
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=180) == 0, log.read_text()[-3000:]
        assert closed_soon(int(s3_port)) and closed_soon(ui_port)
        assert_no_credentials(log.read_text())
    finally:
        kill_demo(demo, spark)
