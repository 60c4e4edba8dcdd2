"""Starting `compaction-assets demo` (or `serve`) as a user would, and asking whether it answers:
shared by the demo, serve and quiet-output tests."""

from __future__ import annotations

import os
import subprocess
import urllib.request
from pathlib import Path

from tests.conftest import CLI, REPO


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
