"""Named crash points for fault-injection tests and drills.

Setting COMPACTION_CRASH_AT=<point> makes the process die (as with kill -9: no cleanup, no
finally blocks) the moment it reaches that point. Unset, a crash point costs one dict lookup.
"""

import os
import sys

CRASH_ENV = "COMPACTION_CRASH_AT"
CRASH_EXIT_CODE = 137

POINTS = (
    "worker_mid_group",  # inside a Spark Python worker, after part of a group was written
    "after_plan",
    "after_rewrite",  # result files written, ledger row still EXECUTING
    "after_prepare",  # ledger row PREPARED, Iceberg not yet committed
    "after_iceberg_commit",  # snapshot committed, ledger row still PREPARED
    "gc_after_expire",  # snapshots expired, their files not yet deleted
)


def crash_point(name: str) -> None:
    """Die immediately if COMPACTION_CRASH_AT names this point."""
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}; known: {', '.join(POINTS)}")
    if os.environ.get(CRASH_ENV) == name:
        sys.stderr.write(f"[fault injection] crashing at {name}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
