"""The fragmentation sensor on a real Dagster instance, evaluated with build_sensor_context."""

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import yaml
from dagster import (
    AssetKey,
    DagsterRunStatus,
    build_sensor_context,
)
from dagster._core.test_utils import create_run_for_test

from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions
from compaction_assets.defs.resources import CompactionResource
from tests.conftest import batch
from tests.lakekit.sensor_ticks import Collect, requested, set_scheduling, tick

ORDERS = {"region=eu", "region=us", "region=apac"}


def test_requests_carry_queue_table_and_priority_tags_and_sync_partitions(queued_lake, instance):
    result = tick(queued_lake, instance)

    runs = requested(result, instance)
    # A run per table: its fragmented partitions in one range (capacity: high 3, default 2).
    assert set(runs) == {("sales.orders", p) for p in ORDERS} | {
        ("ns.events", "region=eu"),
        ("ns.events", "region=us"),
        ("ns.flat", ""),
    }
    assert len(result.run_requests) == 3
    for (table, partition), run in runs.items():
        assert run.tags["compaction/queue"] == ("high" if table == "sales.orders" else "default")
        assert run.asset_selection == [AssetKey(["lake", *table.split(".")])] and run.job_name is None
        assert run.run_key.startswith(f"{table}|{partition}|" if table == "ns.flat" else f"{table}|region=")
    orders = runs[("sales.orders", "region=eu")]
    assert (orders.tags["dagster/asset_partition_range_start"], orders.tags["dagster/asset_partition_range_end"]) == (
        "region=apac",
        "region=us",
    )
    assert orders.partition_key is None and "dagster/partition" not in orders.tags
    high = min(int(r.tags["dagster/priority"]) for k, r in runs.items() if k[0] == "sales.orders")
    low = max(int(r.tags["dagster/priority"]) for k, r in runs.items() if k[0] != "sales.orders")
    assert high > low  # table priority 10 beats 0
    added = {
        (req.partitions_def_name, key)
        for req in result.dynamic_partitions_requests
        for key in getattr(req, "partition_keys", [])
    }
    assert {("lake__sales__orders", p) for p in ORDERS} <= added
    assert ("lake__ns__events", "region=eu") in added
    limits = {p.name: p.limit for p in instance.event_log_storage.get_pool_limits()}
    assert limits["compaction-high"] == 2 and limits["compaction-default"] == 1  # from compaction.yaml
    observed = {
        (e.asset_key.to_user_string(), e.partition): {k: v.value for k, v in e.metadata.items()}
        for e in result.asset_events
    }
    eu = observed[("lake/sales/orders", "region=eu")]
    assert eu["data_files"] == 12 and eu["fragments"] == 12 and eu["avg_file_bytes"] > 0
    assert observed[("lake/ns/flat", None)]["data_files"] == 8  # numeric: plotted by the UI over time


def test_unchanged_table_is_not_replanned_and_run_keys_are_stable(queued_lake, instance):
    set_scheduling(queued_lake, max_partitions_per_run=1)  # a run per partition: the default queue defers one
    first = tick(queued_lake, instance)
    cursor = json.loads(first.cursor)
    assert cursor["waiting"] == {"ns.flat|": pytest.approx(time.time(), abs=60)}  # deferred: queue full

    cursor["waiting"] = {}  # say ns.flat was handled: nothing waits, no snapshot changed
    again = tick(queued_lake, instance, cursor=json.dumps(cursor))
    assert again.run_requests == []
    assert "0 planned, 3 unchanged" in again.skip_reason.skip_message
    replay = tick(queued_lake, instance)  # a fresh cursor, same snapshots: same run keys, so Dagster dedupes
    assert {r.run_key for r in replay.run_requests} == {r.run_key for r in first.run_requests}

    queued_lake.table("ns.events").append(batch(99_000, 5, "eu"))
    changed = tick(queued_lake, instance, cursor=first.cursor)
    events = [r for r in changed.run_requests if r.tags["compaction/table"] == "ns.events"]
    assert events and all(r.run_key not in {x.run_key for x in first.run_requests} for r in events)


def test_deferred_partition_of_an_unchanged_table_is_requested_without_replanning(queued_lake, instance):
    set_scheduling(queued_lake, max_partitions_per_run=1)  # a run per partition fills the default queue
    first = tick(queued_lake, instance)
    assert ("ns.flat", "") not in requested(first)  # deferred: the default queue was full

    again = tick(queued_lake, instance, cursor=first.cursor)  # nothing changed; the queue has room now

    assert set(requested(again)) == {("ns.flat", "")}
    snapshot_id = queued_lake.table("ns.flat").current_snapshot().snapshot_id
    assert requested(again)[("ns.flat", "")].run_key == f"ns.flat||{snapshot_id}"
    assert again.asset_events == []  # no table was planned again
    assert json.loads(again.cursor)["waiting"] == {}


def test_full_queue_gets_no_new_requests(queued_lake, instance):
    for status in (DagsterRunStatus.STARTED, DagsterRunStatus.STARTING):  # the default queue's capacity: 2
        create_run_for_test(instance, job_name="x", status=status, tags={"compaction/queue": "default"})

    result = tick(queued_lake, instance)

    assert {k[0] for k in requested(result)} == {"sales.orders"}


def test_a_partition_already_in_flight_is_not_requested_again(queued_lake, instance):
    tags = {"compaction/queue": "high", "compaction/table": "sales.orders", "dagster/partition": "region=eu"}
    create_run_for_test(instance, job_name="compact__sales__orders", status=DagsterRunStatus.STARTED, tags=tags)

    result = tick(queued_lake, instance)

    orders = {p for t, p in requested(result, instance) if t == "sales.orders"}
    assert orders == ORDERS - {"region=eu"}
    # region=eu lies between apac and us in the partition order: no range may cover it, so two runs.
    assert sum(r.tags["compaction/table"] == "sales.orders" for r in result.run_requests) == 2


def test_long_waiting_low_priority_partition_is_eventually_requested(queued_lake, instance):
    # A run per partition; the default queue holds 2; ns.flat (priority 0) waits behind ns.events' partitions.
    set_scheduling(queued_lake, max_partitions_per_run=1)
    first = tick(queued_lake, instance)
    assert ("ns.flat", "") not in requested(first)
    cursor = json.loads(first.cursor)
    # New fragments keep ns.events busy, but ns.flat has now waited for 3 hours.
    queued_lake.table("ns.events").append(batch(50_000, 5, "eu"))
    cursor["waiting"]["ns.flat|"] = time.time() - 3 * 3600
    later = tick(queued_lake, instance, cursor=json.dumps(cursor))
    assert ("ns.flat", "") in requested(later)


def test_changed_queue_limit_applies_on_the_next_tick(queued_lake, instance):
    tick(queued_lake, instance)
    doc = yaml.safe_load(queued_lake.config_path.read_text())
    doc["queues"][0]["max_concurrent_runs"] = 5
    queued_lake.config_path.write_text(yaml.safe_dump(doc))

    tick(queued_lake, instance)

    limits = {p.name: p.limit for p in instance.event_log_storage.get_pool_limits()}
    assert limits["compaction-high"] == 5


def test_paused_table_gets_no_requests(queued_lake, instance):
    queued_lake.engine.set_enabled("sales.orders", False)  # what `compaction-assets pause` does

    result = tick(queued_lake, instance)

    assert {t for t, _ in requested(result)} == {"ns.events", "ns.flat"}


def test_policy_change_replans_every_table_on_the_next_tick(queued_lake, instance):
    first = tick(queued_lake, instance)
    cursor = json.loads(first.cursor)
    cursor["waiting"] = {}
    assert set(cursor["versions"]) == {"ns.events", "ns.flat", "sales.orders"}  # metadata files seen
    quiet = tick(queued_lake, instance, cursor=json.dumps(cursor))
    assert "0 planned, 3 unchanged" in quiet.skip_reason.skip_message

    doc = yaml.safe_load(queued_lake.config_path.read_text())
    doc["tables"][-1]["policy"] = {"min_input_files": 1000}  # nothing under "*" is worth it any more
    queued_lake.config_path.write_text(yaml.safe_dump(doc))
    replanned = tick(queued_lake, instance, cursor=json.dumps(cursor))

    after = json.loads(replanned.cursor)
    assert after["config"] != cursor["config"]
    assert set(after["snapshots"]) == {"ns.events", "ns.flat", "sales.orders"}  # all planned again
    assert {r.tags["compaction/table"] for r in replanned.run_requests} <= {"sales.orders"}
    observed = {e.asset_key.path[-1] for e in replanned.asset_events}
    assert {"events", "flat"} <= observed  # fresh fragmentation observations for the re-planned tables


def logged_tick(lake, instance, defs=None):  # noqa: ANN001, ANN201
    defs = defs or build_definitions(load_config(lake.config_path))
    context = build_sensor_context(
        instance=instance,
        definitions=defs,
        resources={"compaction": CompactionResource(config_path=str(lake.config_path))},
    )
    collect = Collect()
    context.log.addHandler(collect)
    result = defs.get_sensor_def("fragmentation_sensor")(context)
    return result, "\n".join(collect.lines)


def test_skip_names_the_run_in_progress_and_a_paused_table_is_logged(queued_lake, instance):
    tags = {"compaction/queue": "high", "compaction/table": "sales.orders", "dagster/partition": "region=eu"}
    run = create_run_for_test(instance, job_name="compact__sales__orders", status=DagsterRunStatus.STARTED, tags=tags)
    queued_lake.engine.set_enabled("ns.flat", False)

    _, logs = logged_tick(queued_lake, instance)

    assert "sales.orders [region=eu] (queue high, priority" in logs
    assert f"already in progress (run {run.run_id})" in logs
    assert "ns.flat: paused (compaction.enabled=false)" in logs


def test_new_and_dropped_tables_ask_for_a_code_location_reload(queued_lake, instance, monkeypatch):
    monkeypatch.delenv("COMPACTION_DAGSTER_URL", raising=False)
    defs = build_definitions(load_config(queued_lake.config_path))  # loaded before the catalog changes
    queued_lake.catalog.create_table("ns.fresh", schema=queued_lake.table("ns.flat").schema())
    queued_lake.catalog.drop_table("ns.flat")
    result, logs = logged_tick(queued_lake, instance, defs)

    assert "tables changed (new: ns.fresh; dropped: ns.flat): reload code location" in logs
    assert "COMPACTION_DAGSTER_URL" in logs
    assert "ns.flat: cannot plan" not in logs  # a dropped table is not planned
    assert ("ns.flat", "") not in requested(result)


@contextmanager
def speaks_http2(port: int) -> Iterator[None]:
    """A listener on `port` that answers each connection's HTTP/2 preface with an empty SETTINGS
    frame, as a gRPC server (Spark Connect) does: what spark.require_server probes for."""
    server = socket.create_server(("127.0.0.1", port))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(64)
                conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        server.close()


def test_no_requests_while_the_connect_server_is_down_and_the_partitions_wait(queued_lake, instance):
    """Connect mode with nothing answering at spark.remote: every run would fail at once and its run
    key (one per snapshot) would never be requested again, so the sensor requests nothing, says why,
    and plans the same partitions on the next tick; once a server listens, they are requested."""
    from tests.conftest import free_port

    port = free_port()
    doc = yaml.safe_load(queued_lake.config_path.read_text())
    doc["spark"] = {**doc["spark"], "mode": "connect", "remote": f"sc://127.0.0.1:{port}", "server_dir": "srv"}
    queued_lake.config_path.write_text(yaml.safe_dump(doc))

    down = tick(queued_lake, instance)
    assert down.run_requests == []
    assert "spark-server start" in down.skip_reason.skip_message
    assert {k.split("|")[0] for k in json.loads(down.cursor)["waiting"]} == {"sales.orders", "ns.events", "ns.flat"}

    again = tick(queued_lake, instance, cursor=down.cursor)  # tables unchanged, still planned
    assert again.run_requests == [] and "worth compacting wait" in again.skip_reason.skip_message

    with speaks_http2(port):  # a server answering as gRPC servers do listens at spark.remote now
        up = tick(queued_lake, instance, cursor=again.cursor)
    assert {k for k in requested(up, instance) if k[0] == "sales.orders"} == {("sales.orders", p) for p in ORDERS}
