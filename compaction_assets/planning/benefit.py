"""Benefit (plans are ranked by it; the sensor maps it onto run priority, planning/scheduling.py):
files removed per MiB read (data files: inputs - expected outputs; delete files that will apply
to nothing any more) + READS_SAVED_WEIGHT (10) x the drop in read amplification the plan brings.
So a partition whose readers decode three rows per live row (half its rows deleted) outranks one
whose rewrite merges a few 1 MiB files. Full: FULL_WEIGHT (0.5) x that formula (its files removed
and reads saved, per MiB of the whole partition read): hygiene, so it ranks below a
fragmentation-driven plan of the same size, and reading the partition's large files too lowers it
further. Split: SPLIT_WEIGHT (0.1) x files added per MiB read (reads parallelise over more files):
a 4 x target file at 128 MiB gives 0.0006, below any plan that removes files. An expiration's
benefit is EXPIRE_BENEFIT (100) + MiB freed (bytes of the dropped files, plus the estimated expired
share of the rewritten ones): rows past retention are a promise to the table's users, so it sits
at the top of the sensor's scale (benefit points 99, scheduling.benefit_points) and, among
expirations, the most bytes go first. An old-spec plan's files cannot be pruned by
the current spec's partition filters: it scores OLD_SPEC_WEIGHT (0.5) x its files per MiB read
(+ reads saved as above), so it ranks below a fragmented partition of a similar size and file
count. A cluster plan removes no
files; its benefit is CLUSTER_WEIGHT (0.5) x the overlap drop expected (bounds_overlap - 1: as if
each output file met one neighbour) per MiB read, so it ranks below a fragmented partition of
similar size (one file removed per MiB is 1.0) and a badly clustered small partition above a
slightly clustered large one.

Table-level: the manifest rewrite (kind rewrite-manifests) is planned from the manifest list, not
per partition, with its own benefit, 0.1 x manifests removed per MiB of manifests read (planning/
manifests.py); the sensor requests it only for a table none of whose partitions is due.
"""

from __future__ import annotations

from dataclasses import replace

from compaction_assets.planning.model import DeleteMap, FileStat, PartitionPlan, PartitionStats, read_amplification
from compaction_assets.planning.policy import MiB

# Benefit points for reads saved: a partition whose readers decode twice the rows they return
# (read amplification 2.0, brought to 1.0) ranks like one whose rewrite removes 10 files per MiB.
READS_SAVED_WEIGHT = 10.0
# Benefit points per old-spec file per MiB read: half a removed fragment's, so a partition readers
# cannot prune by the current spec ranks below fragmentation of a similar size.
OLD_SPEC_WEIGHT = 0.5
FULL_WEIGHT = 0.5  # a full rewrite's benefit, relative to a fragmentation-driven plan's (hygiene)
SPLIT_WEIGHT = 0.1  # a split's benefit per file added, relative to a file removed
EXPIRE_BENEFIT = 100.0  # an expiration's base benefit (the module doc): above the sensor's top benefit points
CLUSTER_WEIGHT = 0.5  # benefit points per unit of overlap dropped per MiB read (see the module doc)
CLUSTERED_OVERLAP = 1.0  # the overlap a clustered rewrite is expected to leave


def benefit(plan: PartitionPlan, files_removed: int, bytes_read: int, reads_saved: float) -> PartitionPlan:
    """benefit = files removed per MiB read + READS_SAVED_WEIGHT x reads saved, where files removed
    counts data files (inputs - expected outputs) and delete files that will apply to nothing
    any more, and reads saved is the drop in read amplification (rows decoded per live row) the
    plan brings, estimated as if each delete row deleted one row. Tiers save no reads by this
    measure (they remove delete files, not deleted rows)."""
    per_mib = max(files_removed, 0) / (max(bytes_read, 1) / MiB)
    return replace(plan, benefit=per_mib + READS_SAVED_WEIGHT * max(reads_saved, 0.0))


def rewrite_benefit(plan: PartitionPlan, deletes: DeleteMap) -> PartitionPlan:
    """A data rewrite with its benefit (`benefit`): data files removed (inputs - expected outputs) and
    delete files that will apply to nothing any more, per MiB its groups read; reads saved as its
    applied deletes lower the partition's read amplification."""
    gone = deletes_gone(set(plan.source_paths), deletes)
    files_removed = sum(len(g.paths) - g.expected_outputs for g in plan.groups) + len(gone)
    return benefit(plan, files_removed, plan.input_bytes, reads_saved(plan.stats, gone))


def deletes_gone(rewritten: set[str], deletes: DeleteMap) -> list[FileStat]:
    """The delete files that apply to nothing once the data files `rewritten` are rewritten."""
    return [d for d in deletes.distinct(rewritten) if deletes.by_delete[d.path] <= rewritten]


def reads_saved(stats: PartitionStats, gone: list[FileStat]) -> float:
    """The drop in the partition's read amplification once the delete files `gone` apply no more."""
    removed_rows = sum(d.record_count for d in gone)
    after = read_amplification(stats.records - removed_rows, stats.deleted_rows - removed_rows)
    return stats.read_amplification - after
