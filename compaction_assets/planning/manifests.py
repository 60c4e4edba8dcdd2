"""Planning a manifest rewrite (Iceberg's `rewrite_manifests`): a pure function of the current
snapshot's manifest list; no manifest is opened, so the sensor plans it at the cost of one read.

A streaming writer's every commit adds a small manifest (pyiceberg's fast append does not merge
them), and a scan opens every manifest whose partition summaries it cannot rule out: planning a
read of a table with thousands of small manifests costs thousands of small reads. The rewrite
merges the small manifests (data and delete manifests smaller than Iceberg's
`commit.manifest.target-size-bytes`, default 8 MiB) into manifests of about that size, their
entries clustered by partition (commit/manifest_rewrite.py). It is due when at least
`compaction.rewrite-manifests.min-count` (default 100, as Iceberg's
`commit.manifest.min-count-to-merge`) manifests are small and merging them leaves fewer.

Benefit: MANIFEST_WEIGHT (0.1) x manifests removed per MiB of manifests read (at least 1 MiB:
below that a run's fixed cost dominates). A data compaction's benefit counts data files removed
per MiB read; a manifest removed saves a scan one small read at planning time where a data file
removed saves a file open and a footer read, so it counts a tenth. 100 small manifests merged
into one rank like a data compaction that removes 10 files per MiB; the sensor asks for it only
when no partition of the table is due for a compaction (planning/scheduling.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pyiceberg.manifest import ManifestFile

from compaction_assets.planning.model import Kind
from compaction_assets.planning.policy import MiB, Policy

MANIFEST_WEIGHT = 0.1  # a manifest removed, against a data file removed (see the module doc)


@dataclass(frozen=True)
class ManifestPlan:
    """Whether the table's manifests are worth rewriting, and which."""

    manifests: int  # data and delete manifests of the current snapshot
    small: int  # of them, smaller than the target
    entries: int  # live entries (added and existing files) of the small ones
    small_bytes: int
    expected_outputs: int  # manifests the small ones become, about (per content and spec)
    due: bool
    reason: str
    benefit: float = 0.0
    paths: tuple[str, ...] = ()  # the small manifests, rewritten together when due

    kind = Kind.REWRITE_MANIFESTS

    @property
    def avg_entries(self) -> float:
        return self.entries / self.small if self.small else 0.0


def plan_manifests(manifests: Sequence[ManifestFile], policy: Policy, refused: str = "") -> ManifestPlan:
    """Plan the rewrite of the small manifests of a snapshot's manifest list (see the module doc)."""
    target = policy.manifest_target_size_bytes
    small = [m for m in manifests if m.manifest_length < target]
    entries = sum(_live(m) for m in small)
    small_bytes = sum(m.manifest_length for m in small)
    groups: Counter[tuple[int, int]] = Counter()  # bytes per (content, spec): each is written apart
    for m in small:
        groups[(int(m.content), m.partition_spec_id)] += m.manifest_length
    expected = sum(max(1, math.ceil(size / target)) for size in groups.values())
    counts = (
        f"{len(manifests)} manifest(s), {len(small)} small (< commit.manifest.target-size-bytes={target}), "
        f"avg {entries / len(small) if small else 0:.1f} entries per small manifest"
    )

    def nothing(why: str) -> ManifestPlan:
        return ManifestPlan(len(manifests), len(small), entries, small_bytes, expected, False, f"{why}; {counts}")

    if refused:
        return nothing(refused)
    if not policy.enabled:
        return nothing("compaction is paused for this table (compaction.enabled=false)")
    if len(small) < policy.rewrite_manifests_min_count:
        return nothing(
            f"manifests not due: fewer small manifests than "
            f"compaction.rewrite-manifests.min-count={policy.rewrite_manifests_min_count}"
        )
    if expected >= len(small):
        return nothing("manifests not due: merging the small manifests would not leave fewer")
    removed = len(small) - expected
    benefit = MANIFEST_WEIGHT * removed / max(small_bytes / MiB, 1.0)
    return ManifestPlan(
        len(manifests),
        len(small),
        entries,
        small_bytes,
        expected,
        True,
        f"{Kind.REWRITE_MANIFESTS}: {len(small)} small manifest(s) >= "
        f"compaction.rewrite-manifests.min-count={policy.rewrite_manifests_min_count}, merged into ~{expected} "
        f"clustered by partition; {counts}",
        benefit,
        tuple(sorted(m.manifest_path for m in small)),
    )


def _live(manifest: ManifestFile) -> int:
    return (manifest.added_files_count or 0) + (manifest.existing_files_count or 0)
