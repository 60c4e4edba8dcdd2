"""`compaction-assets demo` as a user runs it: runs on the warm Spark it started, report their
fixed cost, a new table appears in the UI without a manual reload, and SIGINT or SIGTERM to the
demo's PID stops every process of it (Spark JVM and workers included) within 10 s."""

import os
import signal
import time

import pyarrow as pa
import pytest

from compaction_assets.config import load_config
from compaction_assets.execution import connect_server
from compaction_assets.lake.catalog import open_catalog
from compaction_tools.demo_ui import session_members
from tests.conftest import free_port
from tests.lakekit.demo_process import (
    FIXED_COST,
    alive,
    answers,
    asset_keys,
    children,
    closed_soon,
    cmdline,
    descendants,
    kill_demo,
    listening,
    session_of,
    start_demo,
    wait_for,
)


@pytest.mark.parametrize(
    ("signum", "to_group"), [(signal.SIGTERM, False), (signal.SIGINT, True)], ids=["kill-TERM-pid", "ctrl-c"]
)
def test_demo_runs_on_warm_spark_and_a_signal_stops_everything(tmp_path, signum, to_group):
    """SIGTERM to the demo's PID; SIGINT to its whole process group, as Ctrl-C in a terminal sends it."""
    spark_port, ui_port = free_port(), free_port()
    demo, log, config_path = start_demo(tmp_path, spark_port, ui_port)
    spark = load_config(config_path).spark
    try:  # from the start on: kill_demo stops the demo's processes and its Spark JVM however this ends
        assert spark.mode == "connect"  # the default deployment runs on the warm Spark
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
        leaders = [p for p in children(demo.pid) if session_members(p)[:1] == [p]]  # each leads its session
        [run_host] = [p for p in leaders if b"compaction_assets.dagster_host" in cmdline(p)]  # the warm run host
        [dagster_dev] = [p for p in leaders if p != run_host]
        before = session_members(demo.pid) + session_members(dagster_dev) + session_members(run_host)
        assert len(before) > 3  # demo, dagster dev, webserver, daemon, code server, run host, Spark, ...

        if to_group:  # Ctrl-C with a compaction run in flight (a fork of the run host)
            wait_for(lambda: len(descendants(run_host)) > 1, 240, "no run started", log)
        every = {*before, *session_members(session_of(server_pid)), *descendants(demo.pid)}  # Spark JVM, workers too

        began = time.monotonic()
        if to_group:
            os.killpg(demo.pid, signum)
        else:
            demo.send_signal(signum)
        while any(alive(p) for p in every) and time.monotonic() - began < 60:
            demo.poll()
            time.sleep(0.05)
        seconds = time.monotonic() - began
        print(f"demo stop took {seconds:.1f}s for {len(every)} processes, load average {os.getloadavg()}")
        left = {p: cmdline(p)[:100] for p in every if alive(p)}
        assert seconds <= 10 and not left, f"{seconds:.1f}s, left behind: {left}\n{log.read_text()[-3000:]}"
        assert demo.wait(timeout=5) == 0
        assert not session_members(dagster_dev) + session_members(run_host) + session_members(demo.pid)
        assert not answers(url) and not listening(ui_port) and closed_soon(spark_port)
        output = log.read_text()
        assert "will not be used" not in output  # Dagster's warning about a dagster.yaml in the cwd
        assert "Setting default log level" not in output and " WARN " not in output
    finally:
        kill_demo(demo, spark)
