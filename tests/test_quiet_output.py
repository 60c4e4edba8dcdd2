"""The demo's log and a local Spark start carry our lines and Dagster's, without the warnings the
project prevents: `dagster dev`'s "use dg dev", the BetaWarning about a sensor's `owners`, the JDK's
incubator-module line; and the UI shows the sensor's target as text, with no sign-up pop-up."""

import json
import os
import signal
import subprocess
import sys
import urllib.request

from compaction_assets.config import load_config
from compaction_assets.defs.sensors import COMPACTED_ASSETS
from tests.conftest import free_port
from tests.lakekit.demo_process import FIXED_COST, answers, kill_demo, start_demo, wait_for

PREVENTED = (
    "SupersessionWarning",
    "Use 'dg dev' instead",
    "BetaWarning",
    "Parameter `owners`",
    "Using incubator modules",
)


def graphql(url: str, query: str) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps({"query": query}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["data"]


SENSORS = """{ workspaceOrError { ... on Workspace { locationEntries { locationOrLoadError {
  ... on RepositoryLocation { repositories { sensors { name assetSelection { assetSelectionString } } } } } } } } }"""


def test_demo_log_has_its_lines_and_none_of_the_prevented_warnings(tmp_path):
    ui_port = free_port()
    demo, log, config_path = start_demo(tmp_path, free_port(), ui_port)
    try:
        base = f"http://127.0.0.1:{ui_port}"
        wait_for(lambda: answers(f"{base}/server_info"), 300, "the UI did not answer", log)
        assert graphql(f"{base}/graphql", "{ shouldShowNux }") == {"shouldShowNux": False}  # nux: enabled: false
        [location] = graphql(f"{base}/graphql", SENSORS)["workspaceOrError"]["locationEntries"]
        sensors = {s["name"]: s for s in location["locationOrLoadError"]["repositories"][0]["sensors"]}
        target = sensors["fragmentation_sensor"]["assetSelection"]["assetSelectionString"]
        assert target == '(key_substring:"lake/" or key:"maintenance") and code_location:"compaction_assets"', target
        # a compaction run went through the run host: its definitions were loaded there too
        wait_for(lambda: FIXED_COST.search(log.read_text()), 300, "no run reported its fixed cost", log)
        os.killpg(demo.pid, signal.SIGINT)
        assert demo.wait(timeout=60) == 0
        output = log.read_text()
        for line in ("Dagster UI:", "fragmentation_sensor - evaluated", "Serving dagster-webserver", "stopped "):
            assert line in output, f"{line!r} missing:\n{output[-3000:]}"
        found = [line for line in output.splitlines() if any(w in line for w in PREVENTED)]
        assert not found, "\n".join(found)
    finally:
        kill_demo(demo, load_config(config_path).spark)


def test_sensor_target_reads_as_a_selection_string():
    assert str(COMPACTED_ASSETS) == 'key_substring:"lake/" or key:"maintenance"'


LOCAL_SPARK = """
from compaction_assets.config import SparkConfig
from compaction_assets.execution.spark import spark_session
spark = spark_session(SparkConfig(master="local[1]"))
jvm = spark.sparkContext._jvm
print("vector module:", jvm.java.lang.ModuleLayer.boot().findModule("jdk.incubator.vector").isPresent())
jvm.java.lang.System.err.println("a line the JVM wrote to stderr")
print("rows:", spark.range(3).count(), flush=True)
"""


def test_local_spark_start_keeps_the_vector_module_and_drops_only_the_incubator_line():
    done = subprocess.run([sys.executable, "-c", LOCAL_SPARK], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "vector module: True" in done.stdout and "rows: 3" in done.stdout
    assert "a line the JVM wrote to stderr" in done.stderr  # the JVM's stderr still reaches ours
    assert "Using incubator modules" not in done.stderr, done.stderr
