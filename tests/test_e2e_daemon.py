"""End to end: a real dagster-daemon with the project's dagster.yaml over a fragmented lake.

The sensor requests a run per table (its fragmented partitions in one range), runs carry the queue
and priority tags, queue limits hold at every sampled moment, partitions end up compacted with
identical rows, and every partition's check passes.
"""

import os
import shutil
import signal
import subprocess
import time
from collections import Counter

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.instance.ref import InstanceRef

from compaction_assets.lake.digest import rows_digest
from tests.conftest import QUEUES, REPO, venv_bin

RUNNING = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
LIMITS = {q["name"]: q["max_concurrent_runs"] for q in QUEUES}
TABLES = ("sales.orders", "ns.events", "ns.flat")
EXPECTED_RUNS = 3  # a run per table: orders' 3 partitions in one, events' 2 in one, the unpartitioned table
DEADLINE_S = 420


def test_daemon_compacts_the_lake_within_queue_limits(queued_lake, tmp_path):
    before = {name: rows_digest(queued_lake.table(name)) for name in TABLES}
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "COMPACTION_CONFIG": str(queued_lake.config_path)}
    daemon = subprocess.Popen(
        [venv_bin("dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "daemon.log", "w"),  # noqa: SIM115 - lives as long as the daemon
        start_new_session=True,
    )
    try:
        instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
        peak: Counter = Counter()
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            running = instance.get_runs(RunsFilter(statuses=RUNNING))
            now = Counter(r.tags.get("compaction/queue") for r in running)
            for queue, count in now.items():
                assert count <= LIMITS[queue], f"{count} runs of queue {queue} at once (limit {LIMITS[queue]})"
                peak[queue] = max(peak[queue], count)
            compactions = [r for r in instance.get_runs() if "compaction/table" in r.tags]
            done = [r for r in compactions if r.status == DagsterRunStatus.SUCCESS]
            failed = [r for r in compactions if r.status == DagsterRunStatus.FAILURE]
            assert not failed, f"run {failed[0].run_id} failed; see {tmp_path / 'daemon.log'}"
            if len(done) >= EXPECTED_RUNS and all(not queued_lake.engine.plan(t).to_compact for t in TABLES):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"not compacted within {DEADLINE_S}s; see {tmp_path / 'daemon.log'}")

        for run in compactions:
            assert run.tags["compaction/queue"] == (
                "high" if run.tags["compaction/table"] == "sales.orders" else "default"
            )
            assert int(run.tags["dagster/priority"]) >= (1000 if run.tags["compaction/queue"] == "high" else 0)
            checks = instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
            materialised = instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
            partitions = {e.dagster_event.event_specific_data.partition for e in checks}
            assert all(e.dagster_event.event_specific_data.passed for e in checks) and len(partitions) == len(checks)
            assert {e.dagster_event.partition for e in materialised} == partitions  # one of each per partition
        for name in TABLES:
            table = queued_lake.table(name)
            assert rows_digest(table) == before[name]
            partitions = {f["partition"].get("region") for f in table.inspect.files().to_pylist()}
            assert len(table.inspect.files()) == len(partitions)  # one file per partition
        assert peak["high"] >= 1 and peak["default"] >= 1
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=60)
