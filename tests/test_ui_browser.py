"""The Dagster UI in a real browser: `dagster dev` on the demo lake, driven by headless Chromium.

Screenshots go to a temporary folder; set COMPACTION_SCREENSHOTS_DIR=docs to refresh README's.
"""

import os
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions, table_job
from compaction_assets.engine import Engine
from compaction_tools.demo import claim_demo_catalog, create_demo_lake
from tests.conftest import REPO, free_port, venv_bin
from tests.lakekit.waiting import wait_until

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Without the background-networking flags Chromium keeps dialling out on this closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ORDERS_PARTITIONS = ["region=apac", "region=eu", "region=us"]


@pytest.fixture(scope="module")
def demo_ui(tmp_path_factory, spark):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); .ci/run installs it")
    pytest.importorskip("playwright.sync_api")
    root = tmp_path_factory.mktemp("demo-ui")
    home = root / ".dagster_home"
    home.mkdir()
    doc = yaml.safe_load((REPO / "compaction.yaml").read_text())
    doc["spark"]["mode"] = "local"  # the runs below execute in this process, on the test session's Spark
    (root / "compaction.yaml").write_text(yaml.safe_dump(doc))
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    config = load_config(root / "compaction.yaml")
    claim_demo_catalog(config.catalog)
    engine = Engine(config, spark=lambda: spark)
    create_demo_lake(engine.catalog, files_per_partition=8)
    for table in ("demo.events", "demo.metrics", "demo.users"):
        engine.set_enabled(table, False)  # paused: the page under test stays still
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
    instance.add_dynamic_partitions("lake__sales__orders", ORDERS_PARTITIONS)
    job = table_job(build_definitions(config), "sales.orders")
    for partition in ORDERS_PARTITIONS:
        assert job.execute_in_process(instance=instance, partition_key=partition).success
    instance.dispose()

    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "COMPACTION_CONFIG": str(root / "compaction.yaml")}
    server = subprocess.Popen(
        [venv_bin("dagster"), "dev", "-h", "127.0.0.1", "-p", str(port), "-w", str(REPO / "workspace.yaml")],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(root / "dagster-dev.log", "w"),  # noqa: SIM115 - lives as long as the server
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    try:  # stopped however the wait ends (not up, Ctrl-C): its own session, Ctrl-C does not reach it
        wait_until(up, 180, interval=1, message=f"dagster dev did not come up; see {root / 'dagster-dev.log'}")
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
            raise  # a server that outlived SIGTERM is still an error, as before


def screenshot_dirs(tmp_path: Path) -> list[Path]:
    extra = os.environ.get("COMPACTION_SCREENSHOTS_DIR")
    return [tmp_path, *([REPO / extra] if extra else [])]


def test_asset_graph_and_table_page_show_compaction(demo_ui, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})

        def visit(path: str, expect: list[str], shot: str | None = None) -> str:
            page.goto(f"{demo_ui}{path}", wait_until="networkidle", timeout=120_000)
            skip = page.get_by_role("button", name="Skip")  # the first-visit newsletter dialog
            if skip.count():
                skip.first.click()
            for text in expect:
                page.get_by_text(text, exact=False).first.wait_for(timeout=120_000)
            if shot:
                for folder in screenshot_dirs(tmp_path):
                    folder.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(folder / shot))
            return page.inner_text("body")

        catalog = visit("/assets", ["lake / sales / orders"], "ui-catalog.png")
        for table in ("lake / demo / events", "lake / demo / metrics", "lake / demo / users"):
            assert table in catalog
        visit("/assets/lake/sales/orders?view=lineage", ["orders_stream"], "ui-lineage.png")
        # GC and manifest rewrites: one asset, a partition per managed table (no edge from each table)
        visit("/assets/maintenance", ["Maintenance of the managed tables"])
        partitions = visit("/assets/lake/sales/orders?view=partitions", ORDERS_PARTITIONS)
        assert "Materialized (3)" in partitions
        overview = visit(
            "/assets/lake/sales/orders", ["data_files_after", "Latest check results"], "ui-table-asset.png"
        )
        for key in (
            "data_files_before",
            "bytes_after",
            "snapshot_id",
            "task_id",
            "committed",
            "dagster_run_fixed_cost_s",
        ):
            assert key in overview
        # README: the plots are a toggle in Overview > Metadata; there is no Plots tab
        assert "Metadata" in overview
        assert page.get_by_role("tab", name="Plots").count() == 0
        assert page.get_by_role("tab", name="Overview").count() == 1
        checks = visit(
            "/assets/lake/sales/orders?view=checks", ["precommit_commit_consistency", "Passed"], "ui-checks.png"
        )
        assert "This is a blocking asset check" in checks
        browser.close()
