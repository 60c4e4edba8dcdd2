"""Named crash points for fault-injection tests and drills.

Setting COMPACTION_CRASH_AT=<point> makes the process die (as with kill -9: no cleanup, no
finally blocks) the moment it reaches that point. Unset, a crash point costs one dict lookup.
COMPACTION_PAUSE_AT=<point>:<seconds> makes it sleep there once instead (a slow rewrite, for drills
that kill an executor mid-task; Spark's executors get it from `spark.executorEnv.*`).
In-process tests `arm` a point instead: reaching it runs an action once (by default raises
InjectedCrash, a BaseException no `except Exception` swallows), e.g. to simulate the process dying
there without killing the test runner, or to land another writer's commit at that moment.
"""

import os
import sys
import time
from collections.abc import Callable

CRASH_ENV = "COMPACTION_CRASH_AT"
PAUSE_ENV = "COMPACTION_PAUSE_AT"
CRASH_EXIT_CODE = 137

POINTS = (
    "worker_mid_group",  # inside a Spark Python worker, after part of a group was written
    "after_plan",
    "after_rewrite",  # result files written, ledger row still EXECUTING
    "after_prepare",  # ledger row PREPARED, Iceberg not yet committed
    "before_commit",  # every partition of the run PREPARED, Iceberg not yet committed
    "after_iceberg_commit",  # snapshot committed, ledger row still PREPARED
    "gc_after_expire",  # snapshots expired, their files not yet deleted
)


_armed: dict[str, Callable[[], None]] = {}
_paused: set[str] = set()  # COMPACTION_PAUSE_AT pauses once per process


class InjectedCrash(BaseException):  # noqa: N818 - it stands for a death, not an error
    """Raised by an armed crash point: the in-process stand-in for the process dying there."""


def arm(name: str, action: Callable[[], None] | None = None) -> None:
    """Run `action` (default: raise InjectedCrash) the next time this process reaches the point."""
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}; known: {', '.join(POINTS)}")

    def crash() -> None:
        raise InjectedCrash(name)

    _armed[name] = action or crash


def disarm() -> None:
    """Forget every armed point (those not reached)."""
    _armed.clear()


def crash_point(name: str) -> None:
    """Die immediately if COMPACTION_CRASH_AT names this point; run its action once if armed."""
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}; known: {', '.join(POINTS)}")
    if action := _armed.pop(name, None):
        action()
    if (pause := os.environ.get(PAUSE_ENV)) and pause.partition(":")[0] == name and name not in _paused:
        _paused.add(name)
        time.sleep(float(pause.partition(":")[2] or 1))
    if os.environ.get(CRASH_ENV) == name:
        sys.stderr.write(f"[fault injection] crashing at {name}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
