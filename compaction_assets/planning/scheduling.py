"""Which partitions to request this tick, and with what priority. Pure functions, no I/O.

Priority = table priority first (100 points a level), then the partition's benefit (0-99),
raised by ageing: every minute a partition waits adds `ageing_points_per_minute`, so a
low-priority partition overtakes newer high-priority work instead of starving.
Back-pressure: a queue whose queued + running runs reach its capacity gets no more requests.
One in-flight run per (table, partition).
Batches: a run covers a range of up to `max_partitions_per_run` consecutive partitions of one table
(in the asset's partition order) that no other run covers; its due partitions ride in it, and it
takes one capacity slot.
Table-level maintenance (a manifest rewrite) is a candidate keyed MANIFESTS_KEY, a run of its own;
the sensor makes it one only when no partition of the table is due (engine.TablePlan).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# The candidate key of a table's manifest rewrite: no partition key (those are `name=value` paths,
# or "" for an unpartitioned table) can be it, so it is never in a table's partition order.
MANIFESTS_KEY = "(manifests)"


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
    batch: int | None = None  # index of the requested run (`Batch`) it rides in


@dataclass(frozen=True)
class Batch:
    """One run: due partitions of one table, in partition order, within a range of the order."""

    members: tuple[Candidate, ...]
    priority: int  # the highest of its members'

    @property
    def table_name(self) -> str:
        return self.members[0].table_name

    @property
    def queue(self) -> str:
        return self.members[0].queue

    @property
    def first(self) -> str:
        return self.members[0].partition_key

    @property
    def last(self) -> str:
        return self.members[-1].partition_key


def benefit_points(benefit: float) -> int:
    """Map a plan's benefit (0..inf: files removed per MiB read, plus the reads-saved term for
    deletes; planning/benefit.py) onto 0..99, logarithmically."""
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
    max_partitions_per_run: int = 1,
    order: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[Decision], list[Batch]]:
    """Batch each table's idle candidates into runs, then request the runs highest priority first
    while their queue has room. Returns a decision per candidate (highest priority first) and the
    requested runs, which the requested decisions index.

    `order`: a table's partition keys in the asset's partition order (a run covers a range of it,
    at most `max_partitions_per_run` keys long); keys not in it sort after it, by key."""
    priorities = {c: run_priority(c, now, ageing_points_per_minute) for c in candidates}
    decisions: dict[Candidate, Decision] = {}
    idle: dict[str, list[Candidate]] = defaultdict(list)
    for c in priorities:
        if (c.table_name, c.partition_key) in in_flight:
            reason = "a run for this partition is already queued or running"
            decisions[c] = Decision(c, priorities[c], False, reason)
        else:
            idle[c.table_name].append(c)
    busy: dict[str, set[str]] = defaultdict(set)
    for table, key in in_flight:
        busy[table].add(key)
    windows = [
        w
        for table, cs in idle.items()
        for w in _windows(cs, (order or {}).get(table, ()), max_partitions_per_run, busy[table])
    ]
    ranked = sorted(
        (Batch(tuple(w), max(priorities[c] for c in w)) for w in windows),
        key=lambda b: (-b.priority, b.table_name, b.first),
    )
    load = dict(queue_load)
    batches: list[Batch] = []
    for batch in ranked:
        if load.get(batch.queue, 0) >= capacities[batch.queue]:
            reason = f"queue '{batch.queue}' is at capacity {capacities[batch.queue]}"
            decisions.update((c, Decision(c, priorities[c], False, reason)) for c in batch.members)
            continue
        load[batch.queue] = load.get(batch.queue, 0) + 1
        decisions.update((c, Decision(c, priorities[c], True, "requested", len(batches))) for c in batch.members)
        batches.append(batch)
    ranked_decisions = sorted(
        decisions.values(), key=lambda d: (-d.priority, d.candidate.table_name, d.candidate.partition_key)
    )
    return ranked_decisions, batches


def _windows(candidates: list[Candidate], order: Sequence[str], size: int, busy: set[str]) -> list[list[Candidate]]:
    """Candidates grouped into ranges of `order` at most `size` keys long that hold no `busy` key
    (one another run covers); a candidate whose key is not in `order` (an unpartitioned table's,
    or one not synced yet) is a run of its own."""
    position = {key: i for i, key in enumerate(order)}
    blocked = sorted(position[k] for k in busy if k in position)
    known = sorted((c for c in candidates if c.partition_key in position), key=lambda c: position[c.partition_key])
    windows: list[list[Candidate]] = []
    for c in known:
        pos = position[c.partition_key]
        if windows:
            start, last = position[windows[-1][0].partition_key], position[windows[-1][-1].partition_key]
            if pos - start < size and bisect.bisect(blocked, last) == bisect.bisect(blocked, pos):
                windows[-1].append(c)
                continue
        windows.append([c])
    unknown = sorted((c for c in candidates if c.partition_key not in position), key=lambda c: c.partition_key)
    return windows + [[c] for c in unknown]
