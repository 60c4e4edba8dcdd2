"""Planner: pure functions from file statistics to rewrite groups. No I/O; same input, same plan.

Minor compaction bin-packs fragments (files <= target/fragment_ratio) into groups of about one
target file. Packing counts each file's column data bytes (its manifest column sizes), not its
size on disk: a tiny file is mostly footer, which merging removes. Major compaction rewrites
every undersized file (< min_target_size_ratio x target) in groups of at most max_group_bytes,
writing target-size files. Files are grouped by partition id (spec id, typed values), never by
their rendered key. Minor and major rewrite only files of the current spec that no running
attempt holds.

Old specs (Iceberg's rewrite_data_files `output-spec-id`): a partition of an earlier partition
spec (its partition id names that spec) is planned `old-spec`: all its data files no running
attempt holds, in groups of at most max_group_bytes (a single file qualifies: the point is the
spec), rewritten into the current spec, each row into the partition the current spec gives it.
Its delete files are applied, as in every data rewrite. Table property
`compaction.rewrite-old-specs=false` turns it off (the partition then plans as before: at most
a delete-file tier).

Data expiration (planning/expiration.py) comes first: when `compaction.expire.field` and
`compaction.expire.retention-ms` are both set, a partition with data files that hold rows past
retention gets kind `expire`, whatever else it needs: its files whose every row expired are
dropped by a metadata-only delete (`drop_paths`, never read; a partition whose files all go is
dropped whole), the files with some expired rows are rewritten without them (`groups`, deletes
applying to them applied as in any rewrite). Files of every spec count, those a running attempt
holds do not. A rule the caller could not resolve (its column is not in the current schema)
stops the tier: the reason says so and the other kinds plan as usual.

Merge-on-read. Which live delete files apply to which data file is the spec's exact rule
(lake.deletes.ApplyingDeletes, in `DeleteMap`); a rewrite applies them (the worker does) and
writes only live rows. Per partition the planner measures the delete load (`PartitionStats`) and
picks, first match wins:
0. full optimizing (kind full, Amoro's full trigger interval), when `full_trigger_interval_ms`
   is set and the partition is due: it was never fully rewritten, or its last full rewrite
   (`FullClock`: the engine reads it from the ledger, the planner does no I/O) is at least that
   long ago. Every data file of the partition (current spec; none in flight, else it waits) is
   rewritten, deletes applied, in groups of at most max_group_bytes (the engine sorts them by the
   table's sort order, as major). A partition already optimal is left alone, with the reason:
   no delete applies and the rewrite would not lower its file count (a single file, or files
   of about the target size already);
1. a data rewrite (kind major) when a delete trigger fires: a candidate file with at least
   `delete_file_threshold` applying delete files is rewritten; when the partition's deleted-row
   ratio reaches `delete_ratio_threshold`, every candidate file with an applying delete is. They
   are bin-packed with the partition's fragments into groups of about one target file (so a
   large rewrite spreads over Spark tasks); a file with deletes is a group of its own if nothing
   packs with it (it shrinks; its deletes go);
2. a data rewrite by file size (minor, else major as above); fragments with deletes get them
   applied;
2b. split (Iceberg's max-file-size-bytes): each data file larger than `split_above_bytes` is a
   group of its own, written into `_split_outputs` target-size files (Iceberg's rule: the
   remainder is a file of its own when it is not undersized, else spread over the others while
   they stay within 1.1 x target). Only when no data rewrite above is due: the fragments go
   first, the split comes on a later run;
2c. `cluster` (when the table has a sort order or z-order columns and nothing above fires): the
   partition's files are healthy in size but badly clustered: their bounds_overlap
   (planning/overlap.py) on the clustering columns is at least `cluster_min_overlap`. Every data
   file of the current spec is rewritten sorted / z-ordered, bin-packed into groups of at most
   max_group_bytes. A partition whose data files all came from our last cluster rewrite of it is
   left alone, however much they still overlap (`clustered`: the engine reads them from the ledger),
   so an unchanged partition is clustered once, not forever;
3. `old-spec` for a partition of an earlier spec (above; the size triggers count current-spec
   files only, so 1 and 2 never fire there);
4. `convert-equality-deletes` when at least `equality_delete_file_threshold` equality-delete files
   of the partition alone (below) apply, and reading the key columns of the data files they apply to
   costs less than 1/4 of those files' bytes (what a rewrite would read);
5. `rewrite-position-deletes` when at least `position_delete_file_threshold` small position-delete
   files of the partition alone apply (small: undersized, < min_target_size_ratio x target, as
   the min-file-size of Iceberg's rewrite_position_delete_files);
6. nothing, with the reason.
A tier plan (4, 5) has no groups: it carries the delete files to replace (`delete_paths`) and the
data files they apply to (`covered_data_paths`). A tier replaces only delete files of the partition
itself that apply to no other partition's data files: a global delete (of an unpartitioned spec)
in a partitioned table applies across partitions, and only data rewrites apply it.
A table the caller refuses (e.g. a format it cannot commit) plans nothing, with its reason.

Benefit (plans are ranked by it; the sensor maps it onto run priority, planning/scheduling.py):
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

from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

from pyiceberg.manifest import DataFile, DataFileContent

from compaction_assets.lake.deletes import ApplyingDeletes, is_deletion_vector
from compaction_assets.planning.expiration import ExpireRule, Verdict
from compaction_assets.planning.overlap import Clustering, bounds_overlap
from compaction_assets.planning.policy import MiB, Policy

# Benefit points for reads saved: a partition whose readers decode twice the rows they return
# (read amplification 2.0, brought to 1.0) ranks like one whose rewrite removes 10 files per MiB.
READS_SAVED_WEIGHT = 10.0
# Benefit points per old-spec file per MiB read: half a removed fragment's, so a partition readers
# cannot prune by the current spec ranks below fragmentation of a similar size.
OLD_SPEC_WEIGHT = 0.5
CONVERSION_MAX_COST_SHARE = 0.25  # an equality-delete conversion must read < 1/4 of a rewrite's bytes
FULL_WEIGHT = 0.5  # a full rewrite's benefit, relative to a fragmentation-driven plan's (hygiene)
SPLIT_WEIGHT = 0.1  # a split's benefit per file added, relative to a file removed
SPLIT_SPREAD_MAX = 1.1  # a split's remainder is spread over the other outputs while they stay within 1.1 x target
EXPIRE_BENEFIT = 100.0  # an expiration's base benefit (the module doc): above the sensor's top benefit points
CLUSTER_WEIGHT = 0.5  # benefit points per unit of overlap dropped per MiB read (see the module doc)
CLUSTERED_OVERLAP = 1.0  # the overlap a clustered rewrite is expected to leave


class Kind(StrEnum):
    MINOR = "minor"
    MAJOR = "major"
    CONVERT_EQUALITY_DELETES = "convert-equality-deletes"  # equality deletes -> position deletes, data untouched
    REWRITE_POSITION_DELETES = "rewrite-position-deletes"  # small position-delete files -> one
    # maintenance tiers (issue 20)
    FULL = "full"  # full optimizing: every data file of the partition, in the table's sort order
    SPLIT = "split"  # an oversized data file -> target-size files
    CLUSTER = "cluster"  # healthy sizes, badly clustered: rewritten sorted / z-ordered
    OLD_SPEC = "old-spec"  # files of an earlier partition spec -> the current spec
    EXPIRE = "expire"  # rows past the retention dropped (whole files by metadata, the rest rewritten)
    REWRITE_MANIFESTS = "rewrite-manifests"  # small manifests merged, clustered by partition (table-wide)

    @property
    def is_tier(self) -> bool:
        """A cheaper merge-on-read tier: delete files are replaced, data files are not rewritten."""
        return self in (Kind.CONVERT_EQUALITY_DELETES, Kind.REWRITE_POSITION_DELETES)


class FileStat(Protocol):
    """What the planner needs to know about one file (lake.files.LiveFile has these)."""

    @property
    def path(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def data_bytes(self) -> int: ...
    @property
    def record_count(self) -> int: ...
    @property
    def spec_id(self) -> int: ...
    @property
    def is_delete(self) -> bool: ...
    @property
    def data_file(self) -> DataFile: ...  # content, partition, bounds, equality ids, column sizes
    @property
    def data_sequence_number(self) -> int: ...

    partition_id: Hashable  # files with equal ids are one partition
    partition_key: str  # its injective rendering
    added_at_ms: int


@dataclass(frozen=True)
class DeleteMap:
    """Which live delete files apply to which live data files, by the spec's exact rule
    (lake.deletes.ApplyingDeletes). Built once per plan; the engine fills the rewrite job from it."""

    by_data: Mapping[str, tuple[FileStat, ...]] = field(default_factory=dict)  # data path -> deletes, by path
    by_delete: Mapping[str, frozenset[str]] = field(default_factory=dict)  # delete path -> data paths

    @classmethod
    def of(cls, files: Iterable[FileStat], global_specs: frozenset[int] = frozenset()) -> DeleteMap:
        """`global_specs`: the specs of void fields only, whose deletes are global (global_spec_ids)."""
        files = list(files)
        index = ApplyingDeletes((f for f in files if f.is_delete), global_specs)
        if not index:
            return cls()
        by_data: dict[str, tuple[FileStat, ...]] = {}
        by_delete: dict[str, set[str]] = {}
        shared: dict[tuple[int, ...], tuple[FileStat, ...]] = {}  # one sorted tuple per distinct delete list
        sharing: dict[int, tuple[tuple[FileStat, ...], list[str]]] = {}  # its data files
        for f in files:
            if f.is_delete or not (deletes := index.for_data_file(f)):
                continue
            key = tuple(map(id, deletes))  # the index returns its own objects in a stable order
            if (ordered := shared.get(key)) is None:
                ordered = shared[key] = tuple(sorted(deletes, key=lambda d: d.path))
            by_data[f.path] = ordered
            sharing.setdefault(id(ordered), (ordered, []))[1].append(f.path)
        for ordered, paths in sharing.values():
            for d in ordered:
                by_delete.setdefault(d.path, set()).update(paths)
        return cls(by_data, {k: frozenset(v) for k, v in by_delete.items()})

    def for_data(self, path: str) -> tuple[FileStat, ...]:
        return self.by_data.get(path, ())

    def distinct(self, data_paths: Iterable[str]) -> list[FileStat]:
        """The delete files applying to any of `data_paths`, each once, by path."""
        if not self.by_data:
            return []
        lists = {id(t): t for t in map(self.for_data, data_paths)}  # data files share delete lists
        found = {d.path: d for t in lists.values() for d in t}
        return [found[k] for k in sorted(found)]


def read_amplification(records: int, delete_records: int) -> float:
    """Rows a reader decodes per live row it returns: (records + delete_records) / max(live, 1).

    `records`: the rows of the data files; `delete_records`: the rows of the delete files that
    apply to them, each delete file read once; live = records - delete_records, i.e. each delete
    row is taken to delete one row (an estimate: an equality-delete row can match none or many,
    a position-delete row of another file none). 1.0 when no deletes apply."""
    if not delete_records:
        return 1.0
    return (records + delete_records) / max(records - delete_records, 1)


@dataclass(frozen=True)
class PartitionStats:
    partition_key: str
    data_files: int
    data_bytes: int
    records: int
    fragments: int
    undersized: int
    delete_files: int  # delete files of this partition id (applying or not, to any partition)
    last_write_ms: int
    spec_ids: tuple[int, ...]
    # the delete load: distinct delete files applying to the partition's data files (global ones too)
    position_delete_files: int = 0
    equality_delete_files: int = 0
    data_files_with_deletes: int = 0
    deleted_rows: int = 0  # estimate: the record counts of the applying delete files
    delete_ratio: float = 0.0  # deleted_rows / records, at most 1
    read_amplification: float = 1.0  # see read_amplification()
    bounds_overlap: float | None = None  # on the clustering columns (planning/overlap.py); None: not clustered
    deletion_vectors: int = 0  # of position_delete_files, the deletion vectors (format version 3: one per data file)

    @property
    def avg_file_bytes(self) -> int:
        return self.data_bytes // self.data_files if self.data_files else 0

    @property
    def applying_delete_files(self) -> int:
        return self.position_delete_files + self.equality_delete_files


@dataclass(frozen=True)
class FileGroup:
    """Files rewritten together by one Spark task."""

    paths: tuple[str, ...]
    bytes: int
    data_bytes: int
    records: int
    expected_outputs: int  # files to write: round(data_bytes / target), at least 1


@dataclass(frozen=True)
class PartitionPlan:
    """What to do to one partition. A data rewrite (minor, major) has `groups`; a tier has
    `delete_paths` (the delete files it replaces) and `covered_data_paths` (the data files they
    apply to, which the tier reads but does not rewrite), and no groups. An expiration has
    `drop_paths` (data files removed by metadata), `groups` (files rewritten without expired rows),
    or both, and `expired_rows` (estimated: the dropped files' rows and a share of the others')."""

    stats: PartitionStats
    kind: Kind | None
    groups: tuple[FileGroup, ...] = ()
    reason: str = ""
    benefit: float = 0.0  # see _benefit
    delete_paths: tuple[str, ...] = ()
    covered_data_paths: tuple[str, ...] = ()
    drop_paths: tuple[str, ...] = ()
    expired_rows: int = 0

    @property
    def partition_key(self) -> str:
        return self.stats.partition_key

    @property
    def worth_compacting(self) -> bool:
        return bool(self.groups or self.delete_paths or self.drop_paths)

    @property
    def is_tier(self) -> bool:
        return self.kind is not None and self.kind.is_tier

    @property
    def input_files(self) -> int:
        return sum(len(g.paths) for g in self.groups)

    @property
    def input_bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    @property
    def source_paths(self) -> list[str]:
        """The data files the plan replaces: rewritten (groups) or dropped."""
        return [*(p for g in self.groups for p in g.paths), *self.drop_paths]


@dataclass(frozen=True)
class FullClock:
    """What full optimizing needs to know besides file statistics: now, and when each partition
    (by key) last had a full rewrite committed (epoch ms; the engine reads it from the ledger)."""

    now_ms: int
    last_full_ms: Mapping[str, int] = field(default_factory=dict)

    def due(self, partition_key: str, interval_ms: int) -> tuple[bool, str]:
        """Whether the partition is due for a full rewrite, and why (or when it will be)."""
        last = self.last_full_ms.get(partition_key)
        if last is None:
            return True, "never fully rewritten"
        age = self.now_ms - last
        if age >= interval_ms:
            return True, f"last full rewrite {age / 1000:.0f}s ago >= full.trigger-interval-ms={interval_ms}"
        return False, f"full: next due in {(interval_ms - age) / 1000:.0f}s (full.trigger-interval-ms={interval_ms})"

    def next_due_ms(self, partition_keys: Iterable[str], interval_ms: int) -> int | None:
        """The earliest time one of these partitions, fully rewritten before, comes due again (after now)."""
        due = [last + interval_ms for k in partition_keys if (last := self.last_full_ms.get(k)) is not None]
        return min((t for t in due if t > self.now_ms), default=None)


@dataclass
class _Bin:
    capacity: int
    files: list[FileStat] = field(default_factory=list)
    used: int = 0  # data bytes


def partition_stats(
    partition_key: str,
    files: Sequence[FileStat],
    policy: Policy,
    deletes: DeleteMap | None = None,
    clustering: Clustering | None = None,
) -> PartitionStats:
    """`clustering`: the table's clustering columns, whose bounds_overlap is measured (None: not)."""
    deletes = deletes or DeleteMap()
    data = [f for f in files if not f.is_delete]
    records = sum(f.record_count for f in data)
    applying = deletes.distinct(f.path for f in data)
    deleted = sum(d.record_count for d in applying)
    sizes = [f.size for f in data]
    fragment_max, undersized_below = policy.fragment_max_bytes, policy.undersized_below_bytes
    with_deletes = deletes.by_data
    return PartitionStats(
        partition_key=partition_key,
        data_files=len(data),
        data_bytes=sum(sizes),
        records=records,
        fragments=sum(size <= fragment_max for size in sizes),
        undersized=sum(size < undersized_below for size in sizes),
        delete_files=len(files) - len(data),
        last_write_ms=max((f.added_at_ms for f in files), default=0),
        spec_ids=tuple(sorted({f.spec_id for f in data})),
        position_delete_files=sum(_is_position(d) for d in applying),
        equality_delete_files=sum(not _is_position(d) for d in applying),
        data_files_with_deletes=sum(f.path in with_deletes for f in data) if with_deletes else 0,
        deleted_rows=deleted,
        delete_ratio=min(1.0, deleted / records) if records else 0.0,
        read_amplification=read_amplification(records, deleted),
        bounds_overlap=bounds_overlap([f.data_file for f in data], clustering) if clustering else None,
        deletion_vectors=sum(is_deletion_vector(d.data_file) for d in applying),
    )


def plan_partition(
    partition_key: str,
    files: Sequence[FileStat],
    policy: Policy,
    current_spec_id: int,
    in_flight: Collection[str] = (),
    deletes: DeleteMap | None = None,
    refused: str = "",
    clock: FullClock | None = None,
    expire: ExpireRule | str | None = None,
    clustering: Clustering | None = None,
    clustered: Collection[str] = frozenset(),
    tiers_refused: str = "",
) -> PartitionPlan:
    """Decide an expiration, a data rewrite, a cheaper tier or nothing for one partition (see the
    module doc). A non-empty `tiers_refused` is why the delete-file tiers are not considered (said
    when one would have been due).

    `deletes`: which delete files apply to which data files, for the whole table (global deletes
    live in another partition); None: computed from `files` alone. A non-empty `refused` is why
    the table is not compacted at all: the plan is nothing, with that reason. `clock`: when the
    partition was last fully rewritten; None: full optimizing is not considered. `expire`: the
    table's expiration rule, None when off, or why it cannot run (added to the reason).
    `clustering`: the table's clustering columns (None: no sort order, no z-order); `clustered`:
    the data files our last cluster rewrite of their partition wrote."""
    deletes = deletes if deletes is not None else DeleteMap.of(files)
    stats = partition_stats(partition_key, files, policy, deletes, clustering)
    if refused:
        return PartitionPlan(stats, None, reason=refused)
    load = _load_text(stats)
    if not policy.enabled:
        paused = "compaction is paused for this table (compaction.enabled=false)"
        return PartitionPlan(stats, None, reason=f"{paused}; {load}")
    if isinstance(expire, ExpireRule):
        expiring = _plan_expire(stats, files, policy, in_flight, expire)
        if isinstance(expiring, PartitionPlan):
            return replace(expiring, reason=f"{expiring.reason}; {load}")
        load = f"{expiring}; {load}" if expiring else load
    elif expire:
        load = f"{expire}; {load}"
    full = _plan_full(stats, files, policy, current_spec_id, in_flight, deletes, clock)
    if isinstance(full, PartitionPlan):
        return replace(full, reason=f"{full.reason}; {load}")
    notes = [full] if full else []
    rewrite = _plan_rewrite(stats, files, policy, current_spec_id, in_flight, deletes)
    if isinstance(rewrite, PartitionPlan):
        return replace(rewrite, reason="; ".join([rewrite.reason, *notes, load]))
    notes.insert(0, rewrite)
    split = _plan_split(stats, files, policy, current_spec_id, in_flight, deletes)
    if isinstance(split, PartitionPlan):
        return replace(split, reason="; ".join([split.reason, *notes, load]))
    notes += [split] if split else []
    if clustering is not None:
        cluster = _plan_cluster(stats, files, policy, current_spec_id, in_flight, clustering, clustered)
        if isinstance(cluster, PartitionPlan):
            return replace(cluster, reason="; ".join([cluster.reason, *notes, load]))
        notes += [cluster] if cluster else []
    if old_spec := _plan_old_spec(stats, files, policy, current_spec_id, in_flight, deletes):
        if isinstance(old_spec, PartitionPlan):
            return replace(old_spec, reason="; ".join([old_spec.reason, *notes, load]))
        notes[0] = old_spec  # says more than the size triggers, which count current-spec files only
    for tier in (_plan_equality_conversion, _plan_position_rewrite):
        plan = tier(stats, files, policy, in_flight, deletes)
        if isinstance(plan, PartitionPlan) and tiers_refused:
            notes.append(f"{plan.kind} not run: {tiers_refused}")
            continue
        if isinstance(plan, PartitionPlan):
            return replace(plan, reason=f"{plan.reason}; {load}")
        notes += [plan] if plan else []
    return PartitionPlan(stats, None, reason="; ".join([*notes, load]))


def plan_table(
    files: Iterable[FileStat],
    policy: Policy,
    current_spec_id: int,
    in_flight: Collection[str] = (),
    deletes: DeleteMap | None = None,
    refused: str = "",
    clock: FullClock | None = None,
    expire: ExpireRule | str | None = None,
    clustering: Clustering | None = None,
    clustered: Collection[str] = frozenset(),
    tiers_refused: str = "",
) -> list[PartitionPlan]:
    """Plan every partition (files grouped by partition id); best benefit first, then partition key.
    `deletes`: DeleteMap.of(files) when None (the engine passes the one it also builds jobs from).
    `clock`, `expire`, `clustering`, `clustered`, `tiers_refused`: see plan_partition (the engine
    always passes a clock).

    Raises:
        ValueError: two partitions share a key (keys must be injective: the CLI, the ledger and
            Dagster address partitions by key).
    """
    files = list(files)
    deletes = deletes if deletes is not None else DeleteMap.of(files)
    by_partition: dict[Hashable, list[FileStat]] = {}
    for f in files:
        by_partition.setdefault(f.partition_id, []).append(f)
    keys = Counter(v[0].partition_key for v in by_partition.values())
    if clashes := sorted(k for k, n in keys.items() if n > 1):
        raise ValueError(f"partition key {clashes[0]!r} names {keys[clashes[0]]} different partitions")
    plans = [
        plan_partition(
            v[0].partition_key,
            v,
            policy,
            current_spec_id,
            in_flight,
            deletes,
            refused,
            clock,
            expire,
            clustering,
            clustered,
            tiers_refused,
        )
        for v in by_partition.values()
    ]
    return sorted(plans, key=lambda p: (-p.benefit, p.partition_key))


def _plan_full(
    stats: PartitionStats,
    files: Sequence[FileStat],
    policy: Policy,
    current_spec_id: int,
    in_flight: Collection[str],
    deletes: DeleteMap,
    clock: FullClock | None,
) -> PartitionPlan | str:
    """Full optimizing, or why not ("" when it is off or does not concern the partition)."""
    interval = policy.full_trigger_interval_ms
    data = [f for f in files if not f.is_delete]
    if interval is None or clock is None or not data or data[0].spec_id != current_spec_id:
        return ""  # files of an older spec are another partition's (the old-spec tier's)
    due, why = clock.due(stats.partition_key, interval)
    if not due:
        return why
    if busy := [f for f in data if f.path in in_flight]:
        return f"full: due ({why}) but {len(busy)} file(s) are held by a running attempt: waits"
    groups = tuple(_to_group(b, policy) for b in _bin_pack(data, policy.max_group_bytes))
    with_deletes = sum(f.path in deletes.by_data for f in data) if deletes.by_data else 0
    files_removed = len(data) - sum(g.expected_outputs for g in groups)
    if not with_deletes and files_removed <= 0:
        return (
            f"full: due ({why}) but already optimal: {len(data)} data file(s) would stay "
            f"{sum(g.expected_outputs for g in groups)}, no deletes apply"
        )
    why = f"{Kind.FULL}: due ({why}): all {len(data)} data file(s) rewritten in {len(groups)} group(s)"
    if with_deletes:
        why += f"; {with_deletes} file(s) get their deletes applied"
    plan = _rewrite_benefit(PartitionPlan(stats, Kind.FULL, groups, reason=why), deletes)
    return replace(plan, benefit=FULL_WEIGHT * plan.benefit)


def _plan_split(
    stats: PartitionStats,
    files: Sequence[FileStat],
    policy: Policy,
    current_spec_id: int,
    in_flight: Collection[str],
    deletes: DeleteMap,
) -> PartitionPlan | str:
    """Split oversized files, or "" when the partition has none (candidates: current spec, not in flight)."""
    limit = policy.split_above_bytes
    oversized = sorted(
        (
            f
            for f in files
            if not f.is_delete and f.size > limit and f.spec_id == current_spec_id and f.path not in in_flight
        ),
        key=lambda f: f.path,
    )
    if not oversized:
        return ""
    groups = tuple(  # a file of fewer rows than outputs (large values) splits into at most a row each
        FileGroup(
            (f.path,), f.size, f.data_bytes, f.record_count, min(_split_outputs(f.data_bytes, policy), f.record_count)
        )
        for f in oversized
    )
    if not any(g.expected_outputs > 1 for g in groups):
        return f"{len(oversized)} file(s) > max-file-size-bytes={limit} hold too little column data or rows to split"
    groups = tuple(g for g in groups if g.expected_outputs > 1)
    added = sum(g.expected_outputs - 1 for g in groups)
    why = (
        f"{Kind.SPLIT}: {len(groups)} file(s) > max-file-size-bytes={limit} split into "
        f"{len(groups) + added} file(s) of about target={policy.target_file_size_bytes}"
    )
    if deletes.by_data and (applied := sum(g.paths[0] in deletes.by_data for g in groups)):
        why += f"; {applied} file(s) get their deletes applied"
    read_mib = max(sum(g.bytes for g in groups), 1) / MiB
    return PartitionPlan(stats, Kind.SPLIT, groups, reason=why, benefit=SPLIT_WEIGHT * added / read_mib)


def _split_outputs(data_bytes: int, policy: Policy) -> int:
    """Files an oversized file's data becomes, as Iceberg's SizeBasedFileRewriter.numOutputFiles: the
    remainder past whole target-size files is a file of its own when it would not be undersized;
    else it is spread over the others if that keeps them within SPLIT_SPREAD_MAX x target."""
    target = policy.target_file_size_bytes
    if data_bytes < target:
        return 1
    whole, remainder = divmod(data_bytes, target)
    if remainder > policy.undersized_below_bytes:
        return whole + 1
    if data_bytes / whole < min(SPLIT_SPREAD_MAX * target, policy.split_above_bytes):
        return whole
    return whole + 1


def _plan_expire(
    stats: PartitionStats,
    files: Sequence[FileStat],
    policy: Policy,
    in_flight: Collection[str],
    rule: ExpireRule,
) -> PartitionPlan | str:
    """An expiration, or why not ("" when no row of the partition is past retention)."""
    data = [f for f in files if not f.is_delete]
    verdicts = {f.path: rule.verdict(f.data_file) for f in data}
    expiring = [f for f in data if verdicts[f.path] != Verdict.KEEP]
    todo = [f for f in expiring if f.path not in in_flight]
    busy = len(expiring) - len(todo)
    held = f"{busy} file(s) with rows past retention held by a running attempt" if busy else ""
    if not todo:
        return f"{Kind.EXPIRE}: {held}, not expired now" if held else ""
    drops = sorted((f for f in todo if verdicts[f.path] == Verdict.DROP), key=lambda f: f.path)
    rewrites = [f for f in todo if verdicts[f.path] == Verdict.REWRITE]
    groups = tuple(_to_group(b, policy) for b in _bin_pack(rewrites, policy.target_file_size_bytes))
    dropped_rows = sum(f.record_count for f in drops)
    estimates = {f.path: rule.estimated_rows(f.data_file) for f in rewrites}
    if len(drops) == len(data):
        why = f"whole partition past retention: its {len(drops)} file(s) ({dropped_rows} rows) dropped by metadata"
    else:
        parts = [f"{len(drops)} file(s) ({dropped_rows} rows) dropped by metadata"] if drops else []
        if rewrites:
            parts.append(
                f"{len(rewrites)} file(s) ({sum(f.record_count for f in rewrites)} rows, ~{sum(estimates.values())} "
                "expired, estimated from bounds) rewritten without expired rows"
            )
        why = "; ".join(parts)
    plan = PartitionPlan(
        stats,
        Kind.EXPIRE,
        groups,
        reason=f"{Kind.EXPIRE}: {rule.describe()}: {why}" + (f"; {held}" if held else ""),
        drop_paths=tuple(f.path for f in drops),
        expired_rows=dropped_rows + sum(estimates.values()),
    )
    freed = sum(f.size for f in drops) + sum(f.size * estimates[f.path] / max(f.record_count, 1) for f in rewrites)
    return replace(plan, benefit=EXPIRE_BENEFIT + freed / MiB)


def _plan_rewrite(
    stats: PartitionStats,
    files: Sequence[FileStat],
    policy: Policy,
    current_spec_id: int,
    in_flight: Collection[str],
    deletes: DeleteMap,
) -> PartitionPlan | str:
    """A data rewrite (delete triggers first, then file size), or why there is none."""
    data = [f for f in files if not f.is_delete]
    candidates = [f for f in data if f.spec_id == current_spec_id and f.path not in in_flight]
    fragment_max, undersized_below = policy.fragment_max_bytes, policy.undersized_below_bytes
    fragments = [f for f in candidates if f.size <= fragment_max]
    undersized = [f for f in candidates if f.size < undersized_below]
    with_deletes = [f for f in candidates if f.path in deletes.by_data] if deletes.by_data else []
    by_count = [f for f in with_deletes if len(deletes.for_data(f.path)) >= policy.delete_file_threshold]
    by_ratio = with_deletes if stats.delete_ratio >= policy.delete_ratio_threshold else []
    triggers = []
    if by_count:
        triggers.append(
            f"{len(by_count)} file(s) with >= delete-file-threshold={policy.delete_file_threshold} delete files"
        )
    if by_ratio:
        triggers.append(
            f"deleted-row ratio {stats.delete_ratio:.2f} >= delete-ratio-threshold={policy.delete_ratio_threshold}: "
            f"its {len(by_ratio)} file(s) with deletes"
        )
    if triggers:
        triggered = {f.path: f for f in [*by_count, *by_ratio]}
        extra = [f for f in fragments if f.path not in triggered]
        kind, chosen, capacity = Kind.MAJOR, [*triggered.values(), *extra], policy.target_file_size_bytes
        why = f"{' and '.join(triggers)} rewritten" + (f", packed with {len(extra)} fragment(s)" if extra else "")
    elif len(fragments) >= policy.min_input_files:
        kind, chosen, capacity = Kind.MINOR, fragments, policy.target_file_size_bytes
        why = f"{len(fragments)} fragment(s) >= min_input_files={policy.min_input_files}"
    elif len(undersized) >= policy.min_input_files:
        kind, chosen, capacity = Kind.MAJOR, undersized, policy.max_group_bytes
        why = f"{len(undersized)} undersized file(s) >= min_input_files={policy.min_input_files}"
    else:
        return _nothing_reason(stats, data, candidates, fragments, undersized, with_deletes, deletes, policy)
    # a group of one is worth it only when the file sheds deletes
    bins = [b for b in _bin_pack(chosen, capacity) if len(b.files) >= 2 or deletes.for_data(b.files[0].path)]
    if not bins:
        return f"{kind} candidates do not pack into any group of 2+ files or a file with deletes"
    groups = tuple(_to_group(b, policy) for b in bins)
    if deletes.by_data and (applied := sum(p in deletes.by_data for g in groups for p in g.paths)):
        why += f"; {applied} file(s) get their deletes applied"
    return _rewrite_benefit(PartitionPlan(stats, kind, groups, reason=f"{kind}: {why}"), deletes)


def _rewrite_benefit(plan: PartitionPlan, deletes: DeleteMap) -> PartitionPlan:
    """A data rewrite with its benefit (_benefit): data files removed (inputs - expected outputs) and
    delete files that will apply to nothing any more, per MiB its groups read; reads saved as its
    applied deletes lower the partition's read amplification."""
    stats = plan.stats
    rewritten = set(plan.source_paths)
    removed = [d for d in deletes.distinct(rewritten) if deletes.by_delete[d.path] <= rewritten]
    removed_rows = sum(d.record_count for d in removed)
    after = read_amplification(stats.records - removed_rows, stats.deleted_rows - removed_rows)
    files_removed = sum(len(g.paths) - g.expected_outputs for g in plan.groups) + len(removed)
    return _benefit(plan, files_removed, plan.input_bytes, stats.read_amplification - after)


def _plan_old_spec(
    stats: PartitionStats,
    files: Sequence[FileStat],
    policy: Policy,
    current_spec_id: int,
    in_flight: Collection[str],
    deletes: DeleteMap,
) -> PartitionPlan | str:
    """old-spec: every data file of a partition of an earlier spec, rewritten into the current spec
    in groups of at most max_group_bytes (one file is enough: the point is the spec); or why not
    ("" for a partition of the current spec)."""
    data = [f for f in files if not f.is_delete]
    old = sorted({f.spec_id for f in data} - {current_spec_id})
    if not old:
        return ""
    specs = f"spec {', '.join(map(str, old))}, not the current spec {current_spec_id}"
    if not policy.rewrite_old_specs:
        return f"{len(data)} file(s) of {specs}: not rewritten (compaction.rewrite-old-specs=false)"
    chosen = [f for f in data if f.path not in in_flight]
    if not chosen:
        return f"{len(data)} file(s) of {specs}, all held by a running attempt"
    groups = tuple(_to_group(b, policy) for b in _bin_pack(chosen, policy.max_group_bytes))
    why = f"{len(chosen)} file(s) of {specs}: rewritten into spec {current_spec_id}"
    if applied := sum(f.path in deletes.by_data for f in chosen) if deletes.by_data else 0:
        why += f"; {applied} file(s) get their deletes applied"
    plan = PartitionPlan(stats, Kind.OLD_SPEC, groups, reason=f"{Kind.OLD_SPEC}: {why}")
    rewritten = {f.path for f in chosen}
    removed = [d for d in deletes.distinct(rewritten) if deletes.by_delete[d.path] <= rewritten]
    removed_rows = sum(d.record_count for d in removed)
    after = read_amplification(stats.records - removed_rows, stats.deleted_rows - removed_rows)
    read = sum(g.bytes for g in groups)
    per_mib = OLD_SPEC_WEIGHT * len(chosen) / (max(read, 1) / MiB)
    return replace(plan, benefit=per_mib + READS_SAVED_WEIGHT * max(stats.read_amplification - after, 0.0))


def _plan_cluster(
    stats: PartitionStats,
    files: Sequence[FileStat],
    policy: Policy,
    current_spec_id: int,
    in_flight: Collection[str],
    clustering: Clustering,
    clustered: Collection[str],
) -> PartitionPlan | str:
    """cluster: the partition rewritten sorted / z-ordered, or why not."""
    overlap = stats.bounds_overlap or 0.0
    measured = f"bounds overlap {overlap:.2f} on {clustering.describe()}"
    data = [f for f in files if not f.is_delete]
    candidates = [f for f in data if f.spec_id == current_spec_id]
    if len(candidates) < 2:
        return f"{measured}: fewer than 2 data files of the current spec, nothing to cluster"
    if overlap < policy.cluster_min_overlap:
        return f"{measured} < cluster-min-overlap={policy.cluster_min_overlap:g}"
    if all(f.path in clustered for f in data):
        return f"{measured}, but every file comes from our last cluster rewrite of it: not clustered again"
    if busy := [f for f in candidates if f.path in in_flight]:
        return f"{measured}, but {len(busy)} of its file(s) are held by a running attempt: not clustered now"
    groups = tuple(_to_group(b, policy) for b in _bin_pack(candidates, policy.max_group_bytes))
    plan = PartitionPlan(
        stats,
        Kind.CLUSTER,
        groups,
        reason=(
            f"{Kind.CLUSTER}: {measured} >= cluster-min-overlap={policy.cluster_min_overlap:g}; "
            f"{len(candidates)} file(s) rewritten in {len(groups)} group(s)"
        ),
    )
    per_mib = max(overlap - CLUSTERED_OVERLAP, 0.0) / (max(plan.input_bytes, 1) / MiB)
    return replace(plan, benefit=CLUSTER_WEIGHT * per_mib)


def _plan_equality_conversion(
    stats: PartitionStats,
    files: Sequence[FileStat],
    policy: Policy,
    in_flight: Collection[str],
    deletes: DeleteMap,
) -> PartitionPlan | str:
    """convert-equality-deletes, or why not ("" when no equality delete applies)."""
    data = [f for f in files if not f.is_delete]
    own = [d for d in _own(files, deletes) if not _is_position(d)]
    if not own and not stats.equality_delete_files:
        return ""
    if len(own) < policy.equality_delete_file_threshold:
        return (
            f"{len(own)} equality-delete file(s) of this partition alone, fewer than "
            f"equality-delete-file-threshold={policy.equality_delete_file_threshold}"
        )
    covered = _covered(own, deletes)
    if busy := covered & set(in_flight):
        return f"equality deletes apply to {len(busy)} file(s) a running attempt holds: not converted now"
    keys_by_file: dict[str, set[int]] = {}
    for d in own:
        for path in deletes.by_delete[d.path]:
            keys_by_file.setdefault(path, set()).update(d.data_file.equality_ids or ())
    by_path = {f.path: f for f in data}
    read = sum(_key_bytes(by_path[p], keys_by_file[p]) for p in covered)
    rewrite = sum(by_path[p].size for p in covered)
    if read >= CONVERSION_MAX_COST_SHARE * rewrite:
        return (
            f"converting {len(own)} equality-delete file(s) would read {read} B of key columns, "
            f"not < {CONVERSION_MAX_COST_SHARE:g} of the {rewrite} B a rewrite reads"
        )
    plan = PartitionPlan(
        stats,
        Kind.CONVERT_EQUALITY_DELETES,
        reason=(
            f"{Kind.CONVERT_EQUALITY_DELETES}: {len(own)} equality-delete file(s) >= "
            f"equality-delete-file-threshold={policy.equality_delete_file_threshold}, applying to {len(covered)} "
            f"file(s); reads {read} B of key columns, < {CONVERSION_MAX_COST_SHARE:g} of a rewrite's {rewrite} B"
        ),
        delete_paths=tuple(d.path for d in own),
        covered_data_paths=tuple(sorted(covered)),
    )
    return _benefit(plan, len(own) - 1, read + sum(d.size for d in own), 0.0)


def _plan_position_rewrite(
    stats: PartitionStats,
    files: Sequence[FileStat],
    policy: Policy,
    in_flight: Collection[str],
    deletes: DeleteMap,
) -> PartitionPlan | str:
    """rewrite-position-deletes, or why not ("" when no position delete applies)."""
    small = [d for d in _own(files, deletes) if _is_position(d) and d.size < policy.undersized_below_bytes]
    if not small and not stats.position_delete_files:
        return ""
    if len(small) < policy.position_delete_file_threshold:
        return (
            f"{len(small)} small position-delete file(s) of this partition alone, fewer than "
            f"position-delete-file-threshold={policy.position_delete_file_threshold}"
        )
    covered = _covered(small, deletes)
    if busy := covered & set(in_flight):
        return f"position deletes apply to {len(busy)} file(s) a running attempt holds: not rewritten now"
    plan = PartitionPlan(
        stats,
        Kind.REWRITE_POSITION_DELETES,
        reason=(
            f"{Kind.REWRITE_POSITION_DELETES}: {len(small)} small position-delete file(s) >= "
            f"position-delete-file-threshold={policy.position_delete_file_threshold}, applying to "
            f"{len(covered)} file(s): combined into one"
        ),
        delete_paths=tuple(d.path for d in small),
        covered_data_paths=tuple(sorted(covered)),
    )
    return _benefit(plan, len(small) - 1, sum(d.size for d in small), 0.0)


def _benefit(plan: PartitionPlan, files_removed: int, bytes_read: int, reads_saved: float) -> PartitionPlan:
    """benefit = files removed per MiB read + READS_SAVED_WEIGHT x reads saved, where files removed
    counts data files (inputs - expected outputs) and delete files that will apply to nothing
    any more, and reads saved is the drop in read amplification (rows decoded per live row) the
    plan brings, estimated as if each delete row deleted one row. Tiers save no reads by this
    measure (they remove delete files, not deleted rows)."""
    per_mib = max(files_removed, 0) / (max(bytes_read, 1) / MiB)
    return replace(plan, benefit=per_mib + READS_SAVED_WEIGHT * max(reads_saved, 0.0))


def _own(files: Sequence[FileStat], deletes: DeleteMap) -> list[FileStat]:
    """The partition's own delete files that apply to some of its data files and to no other
    partition's (a tier may replace only those), by path."""
    data = {f.path for f in files if not f.is_delete}
    own = [f for f in files if f.is_delete and _applies_here_only(f, data, deletes)]
    return sorted(own, key=lambda f: f.path)


def _applies_here_only(delete: FileStat, data_paths: set[str], deletes: DeleteMap) -> bool:
    covered = deletes.by_delete.get(delete.path)
    return bool(covered) and covered <= data_paths


def _covered(delete_files: Sequence[FileStat], deletes: DeleteMap) -> set[str]:
    return {p for d in delete_files for p in deletes.by_delete[d.path]}


def _key_bytes(data: FileStat, field_ids: set[int]) -> int:
    """Bytes of the key columns in a data file (manifest column sizes), else its size."""
    sizes = data.data_file.column_sizes or {}
    if not field_ids or any(i not in sizes for i in field_ids):
        return data.size
    return sum(sizes[i] for i in field_ids)


def _is_position(delete: FileStat) -> bool:
    return delete.data_file.content == DataFileContent.POSITION_DELETES


def _load_text(stats: PartitionStats) -> str:
    if not stats.applying_delete_files:
        return "deletes: none apply"
    dvs = f" ({stats.deletion_vectors} of them deletion vectors)" if stats.deletion_vectors else ""
    return (
        f"deletes: {stats.position_delete_files} position-delete{dvs} and {stats.equality_delete_files} "
        f"equality-delete file(s) apply to {stats.data_files_with_deletes} of {stats.data_files} data file(s), "
        f"~{stats.deleted_rows} row(s) deleted (estimated from their record counts), deleted-row ratio "
        f"{stats.delete_ratio:.2f}, read amplification {stats.read_amplification:.2f}"
    )


def _bin_pack(files: Sequence[FileStat], capacity: int) -> list[_Bin]:
    """First-fit decreasing by data bytes (what lands in the output); ties broken by path. Then the
    same number of bins is balanced (each file to the least-filled bin, largest first) where that
    keeps every bin within capacity: groups are Spark tasks, and the fullest one sets the pace."""
    ordered = sorted(files, key=lambda f: (-f.data_bytes, f.path))
    bins: list[_Bin] = []
    for f in ordered:
        target = next((b for b in bins if b.used + f.data_bytes <= b.capacity), None)
        if target is None:
            target = _Bin(capacity)
            bins.append(target)
        target.files.append(f)
        target.used += f.data_bytes
    if len(bins) < 2:
        return bins
    balanced = [_Bin(capacity) for _ in bins]
    for f in ordered:
        target = min(balanced, key=lambda b: b.used)
        target.files.append(f)
        target.used += f.data_bytes
    return balanced if all(b.used <= capacity for b in balanced) else bins


def _to_group(b: _Bin, policy: Policy) -> FileGroup:
    return FileGroup(
        paths=tuple(sorted(f.path for f in b.files)),
        bytes=sum(f.size for f in b.files),
        data_bytes=b.used,
        records=sum(f.record_count for f in b.files),
        expected_outputs=max(1, round(b.used / policy.target_file_size_bytes)),
    )


def _nothing_reason(
    stats: PartitionStats,
    data: Sequence[FileStat],
    candidates: Sequence[FileStat],
    fragments: Sequence[FileStat],
    undersized: Sequence[FileStat],
    with_deletes: Sequence[FileStat],
    deletes: DeleteMap,
    policy: Policy,
) -> str:
    if not stats.data_files:
        return "no data files"
    skipped = len(data) - len(candidates)
    note = f" ({skipped} file(s) of an older spec or in flight not counted)" if skipped else ""
    reason = (
        f"{len(fragments)} fragment(s) and {len(undersized)} undersized file(s), "
        f"fewer than min_input_files={policy.min_input_files}{note}"
    )
    if stats.applying_delete_files:
        most = max((len(deletes.for_data(f.path)) for f in with_deletes), default=0)
        reason += (
            f"; no delete trigger: at most {most} delete file(s) on a candidate file "
            f"(delete-file-threshold={policy.delete_file_threshold}), deleted-row ratio {stats.delete_ratio:.2f} "
            f"(delete-ratio-threshold={policy.delete_ratio_threshold})"
        )
        if len(with_deletes) < stats.data_files_with_deletes:
            reason += f"; {stats.data_files_with_deletes - len(with_deletes)} file(s) with deletes not candidates"
    return reason
