"""Which file groups share a Spark task.

A group Polars rewrites (small source files, see polars_rewrite) already uses every core of its
worker, so two of them in two concurrent tasks on one machine only contend: on 2 cores, four
groups of a 460 MB partition took 2.4 s as four tasks and 1.8 s as one task rewriting them one
after the other. Such groups are packed into tasks of up to `task_bytes` input bytes each,
largest group first into the least loaded task (LPT), so a big backlog still spreads over the
cluster. Every other group keeps a task of its own: pyarrow groups (one core), and Polars groups
on object storage, which wait on requests and uploads more than they use cores, so several in
flight overlap one's reads with another's upload (on the bench's "s3" dataset, four groups run one
after the other took 14.3 s of rewrite; see README). And Polars groups with delete files:
working out which rows their deletes take (polars_deletes: the key index, its lookups) runs on
one core, so two such groups in two tasks overlap it (the bench's "cdc", two groups with 1M
equality keys: rewrite 4.18 s packed, 2.72 s apart).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence


def pack_tasks(sizes: Sequence[int], packable: Sequence[bool], task_bytes: int) -> list[list[int]]:
    """Group indices per Spark task, biggest tasks first (Spark starts tasks in index order).

    `sizes[i]` is group i's input bytes; `packable[i]` whether it may share a task."""
    packed = sorted((i for i, ok in enumerate(packable) if ok), key=lambda i: -sizes[i])
    count = min(len(packed), max(1, math.ceil(sum(sizes[i] for i in packed) / task_bytes))) if packed else 0
    bins: list[tuple[int, int, list[int]]] = [(0, k, []) for k in range(count)]
    for index in packed:
        load, k, members = heapq.heappop(bins)
        members.append(index)
        heapq.heappush(bins, (load + sizes[index], k, members))
    tasks = [(load, sorted(members)) for load, _, members in bins]
    tasks += [(sizes[i], [i]) for i, ok in enumerate(packable) if not ok]
    return [members for _, members in sorted(tasks, key=lambda t: (-t[0], t[1]))]
