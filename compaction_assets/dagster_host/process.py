"""Start the run host in a session of its own (its forked runs join it) and wait until it listens."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from compaction_assets.dagster_host.protocol import default_socket, request


def start(home: Path, env: dict[str, str], timeout_s: float = 180) -> subprocess.Popen:
    """`python -m compaction_assets.dagster_host` for DAGSTER_HOME `home`; output to home/run-host.log."""
    socket_path = default_socket(str(home))
    socket_path.unlink(missing_ok=True)
    with (home / "run-host.log").open("ab") as log:
        host = subprocess.Popen(
            [sys.executable, "-m", "compaction_assets.dagster_host", str(socket_path)],
            env={**env, "DAGSTER_HOME": str(home)},
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while host.poll() is None and time.monotonic() < deadline:
        try:
            request(socket_path, {"op": "ping"}, timeout_s=5)
            return host
        except OSError:
            time.sleep(0.2)
    host.kill()
    raise RuntimeError(f"the run host did not listen on {socket_path}; see {home / 'run-host.log'}")
