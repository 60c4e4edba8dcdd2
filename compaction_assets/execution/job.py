"""What Spark runs for one table: planned partitions turned into a rewrite job (data rewrites, one
GroupSpec per planned file group, packed into tasks) and a tier run (delete-file tiers, one TierJob
per partition). Pure: no ledger, no Spark; the engine begins each partition's attempt and hands
its id here as the prefix of the files the partition's groups write.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider

from compaction_assets.execution import polars_rewrite
from compaction_assets.execution.delete_tiers import TierJob, TierRun
from compaction_assets.execution.packing import pack_tasks
from compaction_assets.execution.polars_storage import S3_SCHEMES
from compaction_assets.execution.worker import DeleteSpec, ExpireFilter, GroupOutcome, GroupSpec, RewriteJob, SourceFile
from compaction_assets.lake.clustering import Clustering, file_column_names, sort_keys
from compaction_assets.lake.datafile_codec import encode_partition
from compaction_assets.lake.deletes import is_deletion_vector, referenced_data_file
from compaction_assets.lake.files import LiveFile
from compaction_assets.lake.v3_fields import CONTENT_OFFSET, CONTENT_SIZE_IN_BYTES, MIN_LINEAGE_VERSION, v3_field
from compaction_assets.planning.expiration import ExpireRule
from compaction_assets.planning.model import DeleteMap, FileGroup, Kind, PartitionPlan
from compaction_assets.planning.policy import Policy

# rewrites that write in the table's clustering order (its z-order columns, else its sort order)
SORTED_KINDS = (Kind.MAJOR, Kind.FULL, Kind.CLUSTER)


def data_path(table: Table) -> str:
    """The folder the table's location provider writes data files below."""
    return load_location_provider(table.location(), table.properties).data_path


class RewriteJobBuilder:
    """One table's rewrite job, built a partition at a time (each once its attempt has begun)."""

    def __init__(
        self,
        table: Table,
        files: dict[str, LiveFile],
        deletes: DeleteMap,
        policy: Policy,
        clustering: Clustering | None,
        expire: ExpireRule | str | None,
    ) -> None:
        self.table = table
        self.files = files
        self.deletes = deletes
        self.policy = policy
        self.clustering = clustering
        self.expire = expire
        self.data_path = data_path(table)
        self.groups: list[GroupSpec] = []
        self.lineage = table.metadata.format_version >= MIN_LINEAGE_VERSION  # rows keep _row_id and sequence numbers

    def output_dir(self, plan: PartitionPlan) -> str:
        """Where a partition's rewrite writes: its partition's folder; an old-spec rewrite writes a
        folder per partition of the current spec below the data folder, streaming (unsorted)."""
        if plan.partition_key and plan.kind != Kind.OLD_SPEC:
            return f"{self.data_path}/{plan.partition_key}"
        return self.data_path

    def add(self, plan: PartitionPlan, out_dir: str, file_prefix: str) -> list[GroupSpec]:
        """Add a group spec per group of the plan, writing to `out_dir` files named `file_prefix`...;
        returns them (the job's groups from index len(groups) before the call)."""
        repartition = plan.kind == Kind.OLD_SPEC
        sort = self.clustering is not None and plan.kind in SORTED_KINDS and not repartition
        expiry = None
        if plan.kind == Kind.EXPIRE and isinstance(self.expire, ExpireRule):
            expiry = ExpireFilter(self.expire.field_id, self.expire.cutoff)
        added = []
        for group in plan.groups:
            spec = self._group_spec(plan, group, out_dir, file_prefix, expiry, sort)
            self.groups.append(spec)
            added.append(spec)
        return added

    def _group_spec(
        self,
        plan: PartitionPlan,
        group: FileGroup,
        out_dir: str,
        file_prefix: str,
        expiry: ExpireFilter | None,
        sort: bool,
    ) -> GroupSpec:
        repartition = plan.kind == Kind.OLD_SPEC
        first = self.files[group.paths[0]].data_file
        sources, delete_specs = group_sources(group, self.files, self.deletes, self.lineage)
        return GroupSpec(
            sources=sources,
            partition=encode_partition(first.partition),
            spec_id=first.spec_id,
            output_dir=out_dir,
            file_prefix=file_prefix,
            max_files=group.expected_outputs,
            # the Polars path applies no expiration, writes a source file into one
            # output, and does not split rows by partition (deletes: polars_deletes)
            polars=not self.lineage
            and expiry is None
            and plan.kind != Kind.SPLIT
            and not repartition
            and polars_rewrite.qualifies(self.table.metadata, self.table.io, sources, sort),
            deletes=delete_specs,
            expire=expiry,
            output_spec_id=self.table.spec().spec_id if repartition else None,
            sort=sort,
        )

    def job(self, sorting: bool, task_bytes: int) -> RewriteJob:
        """The job of the groups added. `sorting`: some planned partition writes in clustering
        order; `task_bytes`: how many input bytes packed groups share a Spark task up to."""
        table, clustering, groups = self.table, self.clustering, self.groups
        sizes = [sum(s.size for s in g.sources) for g in groups]
        zorder = sorting and clustering is not None and clustering.zorder
        return RewriteJob(
            metadata_json=slim_metadata_json(table),
            io_properties=dict(table.io.properties),
            target_file_size_bytes=self.policy.target_file_size_bytes,
            groups=groups,
            tasks=pack_tasks(sizes, [packable(g) for g in groups], task_bytes),
            sort_columns=sort_keys(table) if sorting and not zorder else [],
            zorder_columns=file_column_names(table, clustering) if zorder and clustering is not None else [],
            sort_budget_bytes=self.policy.sort_memory_bytes,
            row_lineage=self.lineage,
        )


def tier_output_dir(data_path: str, plan: PartitionPlan) -> str:
    """Where a delete-file tier writes its position deletes: the partition's data folder."""
    return f"{data_path}/{plan.partition_key}" if plan.partition_key else data_path


def tier_job(plan: PartitionPlan, files: dict[str, LiveFile], out_dir: str, file_prefix: str) -> TierJob:
    """One delete-file tier plan's job: a conversion of its equality deletes for the data files
    they cover, else a rewrite of its position deletes against the partition's data files."""
    deletes = [files[p] for p in plan.delete_paths]
    if plan.kind == Kind.CONVERT_EQUALITY_DELETES:
        covered = [files[p] for p in plan.covered_data_paths]
        return TierJob.convert(covered, deletes, out_dir, file_prefix)
    pid = deletes[0].partition_id
    same_partition = [f for f in files.values() if not f.is_delete and f.partition_id == pid]
    return TierJob.rewrite(same_partition, deletes, out_dir, file_prefix)


def tier_run(table: Table, policy: Policy, jobs: list[TierJob]) -> TierRun:
    """The tier jobs of one table, as Spark runs them."""
    return TierRun(slim_metadata_json(table), dict(table.io.properties), policy.target_file_size_bytes, jobs)


def task_seconds(tasks: list[list[int]], results: list[GroupOutcome]) -> list[float]:
    """Seconds each Spark task spent rewriting its groups (one after the other)."""
    seconds = {r.group: r.seconds for r in results}
    return [sum(seconds.get(g, 0.0) for g in task) for task in tasks]


def group_sources(
    group: FileGroup, files: dict[str, LiveFile], deletes: DeleteMap, lineage: bool = False
) -> tuple[list[SourceFile], list[DeleteSpec]]:
    """A group's sources and the distinct delete files applying to them (by LiveFile.path: a
    deletion vector is one of its Puffin file's blobs); each source lists the indices of the ones
    that apply to it (the spec's rule, decided here for the worker). `lineage`: sources carry what
    their rows' lineage inherits (format version 3)."""
    applying = deletes.distinct(group.paths)
    index = {d.path: i for i, d in enumerate(applying)}
    specs = [
        DeleteSpec(
            path=d.data_file.file_path,
            content=int(d.data_file.content),
            size=d.size,
            records=d.record_count,
            equality_ids=list(d.data_file.equality_ids) if d.data_file.equality_ids else None,
            **_deletion_vector(d.data_file),
        )
        for d in applying
    ]
    indices: dict[int, list[int]] = {}  # per shared delete list (DeleteMap), computed once
    sources = []
    for p in group.paths:
        applying_p = deletes.for_data(p)
        if (listed := indices.get(id(applying_p))) is None:
            listed = indices[id(applying_p)] = [index[d.path] for d in applying_p]
        f = files[p]
        if lineage:
            sources.append(SourceFile(p, f.size, f.record_count, listed, f.first_row_id, f.file_sequence_number))
        else:
            sources.append(SourceFile(p, f.size, f.record_count, listed))
    return sources, specs


def _deletion_vector(delete_file: DataFile) -> dict[str, Any]:
    """Where a deletion vector's blob is and which data file it deletes from ({} for other files)."""
    if not is_deletion_vector(delete_file):
        return {}
    return {
        "content_offset": v3_field(delete_file, CONTENT_OFFSET),
        "content_size_in_bytes": v3_field(delete_file, CONTENT_SIZE_IN_BYTES),
        "referenced_data_file": referenced_data_file(delete_file),
    }


def packable(group: GroupSpec) -> bool:
    """A group that may share a Spark task (execution/packing): a local Polars group without delete files."""
    return group.polars and not group.deletes and not _remote(group)


def _remote(group: GroupSpec) -> bool:
    """A group whose files are on object storage (see execution/packing: it keeps a task of its own)."""
    return group.output_dir.startswith(S3_SCHEMES) or group.sources[0].path.startswith(S3_SCHEMES)


def slim_metadata_json(table: Table) -> str:
    """Table metadata without snapshot history: workers need schema, specs and properties only."""
    slim = table.metadata.model_copy(
        update={
            "snapshots": [],
            "snapshot_log": [],
            "metadata_log": [],
            "refs": {},
            "current_snapshot_id": None,
            "statistics": [],
            "partition_statistics": [],
        }
    )
    return slim.model_dump_json()
