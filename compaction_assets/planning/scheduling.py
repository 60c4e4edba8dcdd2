"""Which partitions to request this tick, and with what priority. Pure functions, no I/O.

Priority = table priority first (100 points a level), then the partition's benefit (0-99),
raised by ageing: every minute a partition waits adds `ageing_points_per_minute`, so a
low-priority partition overtakes newer high-priority work instead of starving.
Back-pressure: a queue whose queued + running runs reach its capacity gets no more requests.
One in-flight run per (table, partition).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    table_name: str
    partition_key: str
    queue: str
    table_priority: int
    benefit: float
    waiting_since: float  # epoch seconds when first seen worth compacting
    snapshot_id: int | None


@dataclass(frozen=True)
class Decision:
    candidate: Candidate
    priority: int
    requested: bool
    reason: str


def benefit_points(benefit: float) -> int:
    """Map a plan's benefit (0..inf: files removed per MiB read, plus the reads-saved term for
    deletes; planner._benefit) onto 0..99, logarithmically."""
    return min(99, int(15 * math.log2(1 + max(benefit, 0.0))))


def run_priority(candidate: Candidate, now: float, ageing_points_per_minute: float) -> int:
    waited_minutes = max(0.0, now - candidate.waiting_since) / 60
    ageing = int(waited_minutes * ageing_points_per_minute)
    return candidate.table_priority * 100 + benefit_points(candidate.benefit) + ageing


def decide(
    candidates: Iterable[Candidate],
    queue_load: Mapping[str, int],
    capacities: Mapping[str, int],
    in_flight: set[tuple[str, str]],
    now: float,
    ageing_points_per_minute: float,
) -> list[Decision]:
    """Highest priority first; request while the queue has room and the partition is idle."""
    ranked = sorted(
        ((run_priority(c, now, ageing_points_per_minute), c) for c in candidates),
        key=lambda pc: (-pc[0], pc[1].table_name, pc[1].partition_key),
    )
    load = dict(queue_load)
    decisions = []
    for priority, c in ranked:
        if (c.table_name, c.partition_key) in in_flight:
            decisions.append(Decision(c, priority, False, "a run for this partition is already queued or running"))
        elif load.get(c.queue, 0) >= capacities[c.queue]:
            decisions.append(Decision(c, priority, False, f"queue '{c.queue}' is at capacity {capacities[c.queue]}"))
        else:
            load[c.queue] = load.get(c.queue, 0) + 1
            decisions.append(Decision(c, priority, True, "requested"))
    return decisions
