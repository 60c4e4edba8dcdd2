"""Garbage collection, separate from compaction: a compaction only replaces files; GC deletes
them later, once no retained snapshot and no in-flight task needs them.

1. Expire snapshots older than the retention, always keeping the newest `min_snapshots_to_keep`
   and every branch or tag head.
2. Delete files (data files, manifests, manifest lists) reachable only from expired snapshots.
3. Delete orphans: data and manifest files under the table location that no retained snapshot
   references and no open task attempt owns, older than the grace period (a writer may be about
   to commit a newer one).
Any path outside the table's own location is refused before anything is expired or deleted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pyarrow import fs as pafs
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from compaction_assets.commit.ledger import OPEN, Ledger
from compaction_assets.config import GcConfig
from compaction_assets.errors import ConfigError
from compaction_assets.faults import crash_point
from compaction_assets.lake.manifest_cache import live_entries
from compaction_assets.lake.storage import OutsideTableLocation, delete_files, is_inside, table_files
from compaction_assets.planning.policy import ENABLED_PROPERTY

HOUR_MS = 3600 * 1000
MAX_AGE_PROPERTY = "history.expire.max-snapshot-age-ms"  # Iceberg's own names
MIN_KEEP_PROPERTY = "history.expire.min-snapshots-to-keep"
GRACE_PROPERTY = "compaction.gc.orphan-grace-ms"
ORPHAN_SUFFIXES = (".parquet", ".avro", ".orc")  # never metadata.json, version hints or stats


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
    name = ".".join(table.name())
    report = GcReport(name, dry_run)
    if table.properties.get(ENABLED_PROPERTY, "true").lower() == "false":
        report.paused = True
        return report
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    location = table.location().rstrip("/")
    snapshots = table.metadata.snapshots
    kept = _snapshots_to_keep(table, policy, now_ms)
    expired = [s for s in snapshots if s.snapshot_id not in kept]
    retained_files = reachable(table, [s for s in snapshots if s.snapshot_id in kept])
    expired_only = sorted(reachable(table, expired) - retained_files)
    owners = [a.attempt_id for a in ledger.attempts(statuses=OPEN, table_name=name)]
    orphans = _orphans(location, retained_files, owners, now_ms - policy.orphan_grace_ms)
    outside = [p for p in [*expired_only, *orphans] if not is_inside(p, location)]
    if outside:
        raise OutsideTableLocation(
            f"table '{name}': refusing GC: {outside[0]} is outside the table location {location} "
            f"({len(outside)} such path(s)); nothing was expired or deleted"
        )
    report.snapshots_expired = [s.snapshot_id for s in expired]
    report.expired_files, report.orphan_files = expired_only, orphans
    report.bytes_reclaimed = sum(_sizes(location, [*expired_only, *orphans]).values())
    if dry_run:
        return report
    if expired:
        table.maintenance.expire_snapshots().by_ids(report.snapshots_expired).commit()
    crash_point("gc_after_expire")
    delete_files(table.io, location, [*expired_only, *orphans])
    return report


def _snapshots_to_keep(table: Table, policy: GcPolicy, now_ms: int) -> set[int]:
    newest_first = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms, reverse=True)
    keep = {s.snapshot_id for s in newest_first[: policy.min_snapshots_to_keep]}
    keep |= {s.snapshot_id for s in newest_first if s.timestamp_ms >= now_ms - policy.max_snapshot_age_ms}
    keep |= {ref.snapshot_id for ref in table.metadata.refs.values()}  # branch and tag heads
    return keep


def reachable(table: Table, snapshots: Iterable[Snapshot]) -> set[str]:
    """Manifest lists, manifests and live data/delete files of the given snapshots."""
    files: set[str] = set()
    seen_manifests: set[str] = set()
    for snapshot in snapshots:
        files.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            files.add(manifest.manifest_path)
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            files.update(e.data_file.file_path for e in live_entries(manifest, table.io))
    return files


def _orphans(location: str, referenced: set[str], owners: list[str], older_than_ms: int) -> list[str]:
    return sorted(
        uri
        for uri, mtime_ms in table_files(location, ORPHAN_SUFFIXES).items()
        if uri not in referenced
        and not any(uri.rsplit("/", 1)[-1].startswith(owner) for owner in owners)
        and mtime_ms is not None
        and mtime_ms < older_than_ms
    )


def _sizes(location: str, paths: list[str]) -> dict[str, int]:
    """Sizes of the files that exist (inside the location; checked by the caller)."""
    if not paths:
        return {}
    filesystem, _ = pafs.FileSystem.from_uri(location)
    infos = filesystem.get_file_info([pafs.FileSystem.from_uri(p)[1] for p in paths])
    return {p: i.size for p, i in zip(paths, infos, strict=True) if i.type == pafs.FileType.File}
