"""Garbage collection, separate from compaction: a compaction only replaces files; GC deletes
them later, once no retained snapshot and no in-flight task needs them.

1. Expire snapshots older than the retention, always keeping the newest `min_snapshots_to_keep`
   and every branch or tag head.
2. Delete files (data files, manifests, manifest lists) reachable only from expired snapshots.
3. Delete orphans: data and manifest files under the table location that no snapshot references,
   that are no statistics file of the table metadata, and that no open task attempt owns, older
   than the grace period (a writer may be about to commit a newer one) and, while an attempt of
   ours is open, than its start (see orphan_cutoff_ms): Java's DeleteOrphanFiles `olderThan`,
   never later than what is in flight.
Nothing an open attempt claims (files it reads or writes) is deleted in 2 or 3, nor anything its
commit may write: the manifests and manifest list pyiceberg names for it, written between its
check and the catalog's pointer swap, are younger than the attempt. The open attempts are read
again after the files are listed: an attempt whose commit wrote a listed file is then still open
(its files are younger than its start), or it ended: committed (the catalog, read again right
before deleting, references the files) or rolled back (they are garbage). Paths are compared
by file identity, not spelling (lake.storage: `/a`, `file:/a`, `file:///a` are one file). Any path
outside the table's own location, or matching a referenced one but for scheme or authority, is
refused before anything is expired or deleted; deletion itself goes through
storage.delete_unreferenced, which reads the table again and never deletes a referenced file.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import AssertRefSnapshotId, RemoveSnapshotsUpdate

from compaction_assets.commit.ledger import Ledger
from compaction_assets.config import GcConfig
from compaction_assets.errors import CompactionError, ConfigError
from compaction_assets.faults import crash_point
from compaction_assets.lake.storage import (
    Claims,
    Listed,
    OutsideTableLocation,
    PathSet,
    PrefixMismatch,
    delete_unreferenced,
    file_sizes,
    is_inside,
    statistics_files,
    table_files,
)
from compaction_assets.lake.storage import reachable as storage_reachable
from compaction_assets.planning.policy import ENABLED_PROPERTY

HOUR_MS = 3600 * 1000
MAX_AGE_PROPERTY = "history.expire.max-snapshot-age-ms"  # Iceberg's own names
MIN_KEEP_PROPERTY = "history.expire.min-snapshots-to-keep"
GRACE_PROPERTY = "compaction.gc.orphan-grace-ms"
ORPHAN_SUFFIXES = (".parquet", ".avro", ".orc")  # never metadata.json, version hints or stats
# Clock skew allowed between the host that recorded an attempt's start and the storage's mtimes:
# S3 refuses requests signed more than 15 minutes off its clock, and keeps whole seconds.
IN_FLIGHT_SKEW_MS = 15 * 60 * 1000


@dataclass(frozen=True)
class GcPolicy:
    max_snapshot_age_ms: int
    min_snapshots_to_keep: int
    orphan_grace_ms: int

    @staticmethod
    def resolve(table_name: str, config: GcConfig, properties: Mapping[str, str]) -> GcPolicy:
        """compaction.yaml's gc: section, overridden by the table's Iceberg properties."""
        values = {
            MAX_AGE_PROPERTY: config.max_snapshot_age_hours * HOUR_MS,
            MIN_KEEP_PROPERTY: config.min_snapshots_to_keep,
            GRACE_PROPERTY: config.orphan_grace_hours * HOUR_MS,
        }
        for prop in values:
            if prop in properties:
                try:
                    values[prop] = int(properties[prop])
                except ValueError:
                    raise ConfigError(f"table '{table_name}': {prop}={properties[prop]!r} is not an integer") from None
            if values[prop] < (1 if prop == MIN_KEEP_PROPERTY else 0):
                raise ConfigError(f"table '{table_name}': {prop}={values[prop]} is out of range")
        return GcPolicy(int(values[MAX_AGE_PROPERTY]), int(values[MIN_KEEP_PROPERTY]), int(values[GRACE_PROPERTY]))


@dataclass
class GcReport:
    table_name: str
    dry_run: bool
    paused: bool = False
    snapshots_expired: list[int] = field(default_factory=list)
    expired_files: list[str] = field(default_factory=list)
    orphan_files: list[str] = field(default_factory=list)
    bytes_reclaimed: int = 0

    @property
    def files_deleted(self) -> int:
        return len(self.expired_files) + len(self.orphan_files)


def collect_garbage(
    table: Table, ledger: Ledger, policy: GcPolicy, dry_run: bool = False, now_ms: int | None = None
) -> GcReport:
    """Expire, then delete expired-only files and orphans (see the module docstring).

    The open attempts are read before the table is (re)read: an attempt that commits in between
    has its files in the table read, not taken for orphans; and again after the listing (see the
    module docstring). Raises OutsideTableLocation or
    PrefixMismatch, before anything is expired or deleted, for a path it must not or cannot judge.
    """
    name = ".".join(table.name())
    report = GcReport(name, dry_run)
    # the grace counts from before the open attempts are read: a file written since is younger than it
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    claims = ledger.open_claims(name)
    table.refresh()
    if table.properties.get(ENABLED_PROPERTY, "true").lower() == "false":
        report.paused = True
        return report
    location = table.location().rstrip("/")
    kept = _snapshots_to_keep(table, policy, now_ms)
    expired = [s for s in table.metadata.snapshots if s.snapshot_id not in kept]
    retained_paths = reachable(table, [s for s in table.metadata.snapshots if s.snapshot_id in kept])
    retained_paths |= statistics_files(table.metadata)
    expired_paths = reachable(table, expired)
    retained, referenced = PathSet(retained_paths), PathSet([*retained_paths, *expired_paths])
    listed = table_files(location, ORPHAN_SUFFIXES, table.io)
    claims |= ledger.open_claims(name)  # after the listing: an attempt that wrote a listed file began before
    older_than_ms = orphan_cutoff_ms(now_ms, policy.orphan_grace_ms, claims)
    try:
        expired_only = _expired_only(expired_paths, retained, claims)
        orphans = _orphans(listed, older_than_ms, referenced, claims)
    except PrefixMismatch as exc:
        raise PrefixMismatch(f"table '{name}': refusing GC: {exc}") from None
    _refuse_outside(name, location, [*expired_only, *orphans])
    report.snapshots_expired = [s.snapshot_id for s in expired]
    report.expired_files, report.orphan_files = expired_only, orphans
    report.bytes_reclaimed = sum(file_sizes(table.io, expired_only).values()) + sum(listed[p].size for p in orphans)
    if dry_run:
        return report
    if expired:
        _expire(table, report.snapshots_expired)
    crash_point("gc_after_expire")
    delete_unreferenced(table, [*expired_only, *orphans], claims)
    return report


def _expired_only(expired_paths: Iterable[str], retained: PathSet, claims: Claims) -> list[str]:
    """Which files of expired snapshots to delete: those no retained snapshot or open attempt references."""
    return sorted(p for p in expired_paths if p not in retained and not claims.covers(p))


def _orphans(listed: dict[str, Listed], older_than_ms: int, referenced: PathSet, claims: Claims) -> list[str]:
    """Which listed files are orphans: older than the cutoff, referenced by no snapshot nor open attempt."""
    return sorted(  # files of expired snapshots are not orphans: counted once, above
        p
        for p, info in listed.items()
        if info.mtime_ms is not None and info.mtime_ms < older_than_ms and p not in referenced and not claims.covers(p)
    )


def _refuse_outside(name: str, location: str, paths: list[str]) -> None:
    """Whether every path to delete is inside the table location; raises OutsideTableLocation if not."""
    outside = [p for p in paths if not is_inside(p, location)]
    if outside:
        raise OutsideTableLocation(
            f"table '{name}': refusing GC: {outside[0]} is outside the table location {location} "
            f"({len(outside)} such path(s)); nothing was expired or deleted"
        )


def orphan_cutoff_ms(now_ms: int, grace_ms: int, claims: Claims) -> int:
    """Files modified before this (epoch ms) may be orphans: the grace period's start or, while an
    attempt of ours is open, IN_FLIGHT_SKEW_MS before the oldest one began, whichever is earlier.
    A file its commit writes is younger than its start by the storage's clock as long as that is
    within the margin of the clock that recorded the start (the attempt's host)."""
    if claims.oldest_start_ms is None:
        return now_ms - grace_ms
    return min(now_ms - grace_ms, claims.oldest_start_ms - IN_FLIGHT_SKEW_MS)


class RefsMoved(CompactionError):
    """A snapshot GC chose to expire became a branch or tag head meanwhile: nothing expired or deleted this run."""


EXPIRE_TRIES = 3


def _expire(table: Table, snapshot_ids: list[int]) -> None:
    """Expire the snapshots unless one of them is now a branch or tag head. pyiceberg 0.12's
    expire_snapshots commits with no requirement: a snapshot another engine made a ref head since
    GC read the table (main rolled back to it, a new tag) would be expired and that ref removed
    with it (an empty table). So: reload, check, and commit asserting every ref is where the check
    saw it (a ref that moved in between fails the commit; then check again). Raises RefsMoved."""
    name = ".".join(table.name())
    for _ in range(EXPIRE_TRIES):
        current = table.catalog.load_table(table.name())
        refs = current.metadata.refs
        if headed := sorted(set(snapshot_ids) & {r.snapshot_id for r in refs.values()}):
            raise RefsMoved(
                f"table '{name}': snapshot {headed[0]} became a branch or tag head during GC; "
                "nothing was expired or deleted, run GC again"
            )
        if not (ids := [i for i in snapshot_ids if current.metadata.snapshot_by_id(i) is not None]):
            return  # another engine expired them first
        requirements = tuple(AssertRefSnapshotId(ref=ref, snapshot_id=r.snapshot_id) for ref, r in refs.items())
        try:
            table.catalog.commit_table(current, requirements, (RemoveSnapshotsUpdate(snapshot_ids=ids),))
            return
        except CommitFailedException:
            continue
    raise RefsMoved(f"table '{name}': branches or tags kept moving during GC; nothing was expired or deleted")


def _snapshots_to_keep(table: Table, policy: GcPolicy, now_ms: int) -> set[int]:
    newest_first = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms, reverse=True)
    keep = {s.snapshot_id for s in newest_first[: policy.min_snapshots_to_keep]}
    keep |= {s.snapshot_id for s in newest_first if s.timestamp_ms >= now_ms - policy.max_snapshot_age_ms}
    keep |= {ref.snapshot_id for ref in table.metadata.refs.values()}  # branch and tag heads
    return keep


def reachable(table: Table, snapshots: Iterable[Snapshot]) -> set[str]:
    """Manifest lists, manifests and live data/delete files of the given snapshots."""
    return storage_reachable(table.io, snapshots)
