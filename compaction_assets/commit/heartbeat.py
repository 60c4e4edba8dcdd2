"""A background heartbeat for the attempts a process has open, so their liveness is visible
from any host: recovery treats an open attempt silent for longer than the timeout as dead."""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from compaction_assets.commit.ledger import Ledger

log = logging.getLogger("compaction_assets")


class Heartbeat:
    """`with Heartbeat(ledger, every_s) as beat: beat.track(attempt_id) ...`"""

    def __init__(self, ledger: Ledger, every_seconds: float) -> None:
        self._ledger = ledger
        self._every = every_seconds
        self._ids: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="compaction-heartbeat", daemon=True)

    def track(self, attempt_id: str) -> None:
        self._ids.append(attempt_id)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._ledger.heartbeat(list(self._ids))
            except Exception as exc:  # a missed beat is not fatal; a long outage makes recovery step in
                log.warning("heartbeat failed: %s", exc)
