"""Start the run host in a session of its own (its forked runs join it) and wait until it listens."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

from compaction_assets.dagster_host.protocol import default_socket, request


def start(home: Path, env: dict[str, str], log: Path | None = None, timeout_s: float = 180) -> subprocess.Popen:
    """`python -m compaction_assets.dagster_host` for DAGSTER_HOME `home`; its runs' output goes to
    `log`, else to this process's stdout (the demo's terminal, as runs of `dagster dev` do)."""
    socket_path = default_socket(str(home))
    socket_path.unlink(missing_ok=True)
    with contextlib.ExitStack() as files:
        out = files.enter_context(log.open("ab")) if log else None
        host = subprocess.Popen(
            [sys.executable, "-m", "compaction_assets.dagster_host", str(socket_path)],
            env={**env, "DAGSTER_HOME": str(home)},
            cwd=home,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
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
    raise RuntimeError(f"the run host did not listen on {socket_path}; see {log or 'its output above'}")
