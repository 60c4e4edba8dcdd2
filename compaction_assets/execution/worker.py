"""What runs inside a Spark Python worker: rewrite one file group into target-size Iceberg files.

Reading (execution/source_reader.py) projects every source file onto the current table schema by
Iceberg field id, as pyiceberg's ArrowScan does (renamed columns keep their values, added columns
read as null, promoted types are cast); files that need no projection are scanned in bulk.
Delete files listed for a source (merge-on-read) are applied to its batches as they stream
(execution/deletes.py); a group with deletes never takes the Polars path. A group of a data
expiration drops the rows whose expire field is below the cutoff (NULLs kept) from the batches, after
deletes, vectorised, and counts them (rows_expired); it never takes the Polars path either. Writing goes through
pyiceberg's Parquet writer, so result files carry field ids and the column statistics pyiceberg
computes. Both stream record batches: memory is bounded by one row-group buffer (plus the group's
delete keys and positions), not by the size of the group. A sorted or z-ordered group (major,
full and cluster rewrites of a table with a sort order or z-order columns) goes through the
external sort (execution/external_sort.py), bounded by the job's sort budget.

An old-spec group (`output_spec_id` set) is read as any group, under its sources' own partition
and spec, and written by a PartitionedWriter: each batch split by the partitions of the output
spec (execution/partitioning), a RollingWriter per partition, all buffers within one row-group
budget.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import time
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema, sanitize_column_names
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyiceberg.typedef import Record

from compaction_assets.errors import InputFileError, worker_error
from compaction_assets.execution import durable, polars_deletes, polars_rewrite, polars_storage
from compaction_assets.execution.deletes import GroupDeletes
from compaction_assets.execution.external_sort import ExternalSort, SortSpec
from compaction_assets.execution.source_reader import SourceReader
from compaction_assets.execution.write_behind import WriteBehind
from compaction_assets.execution.writers import PartitionedWriter, RollingWriter
from compaction_assets.faults import crash_point
from compaction_assets.lake.datafile_codec import datafile_from_json, datafile_to_json, decode_partition
from compaction_assets.planning.policy import DEFAULT_SORT_MEMORY

if TYPE_CHECKING:
    import numpy as np
    import pyarrow.parquet as pq

MiB = 1024 * 1024


@dataclass(frozen=True)
class DeleteSpec:
    """A delete file some sources of a group must have applied (the driver decided which, by
    the spec's rule: lake.deletes.ApplyingDeletes)."""

    path: str
    content: int  # DataFileContent: 1 position deletes, 2 equality deletes
    size: int
    records: int
    equality_ids: list[int] | None = None  # equality deletes: the field ids rows are matched on
    # a deletion vector (format version 3): its blob in the Puffin file at `path`, and its one data file
    content_offset: int | None = None
    content_size_in_bytes: int | None = None
    referenced_data_file: str | None = None


@dataclass(frozen=True)
class SourceFile:
    path: str
    size: int
    records: int
    deletes: list[int] = field(default_factory=list)  # indices into its GroupSpec.deletes that apply to it
    # row lineage (format version 3: RewriteJob.row_lineage): what its rows' _row_id and
    # _last_updated_sequence_number inherit where the file holds none (execution/lineage)
    first_row_id: int | None = None
    file_sequence_number: int | None = None


@dataclass(frozen=True)
class ExpireFilter:
    """A data expiration's row filter: rows whose field `field_id` is < `cutoff` (in the field's own
    unit: planning/expiration.py) are dropped; NULLs are kept."""

    field_id: int
    cutoff: int


@dataclass(frozen=True)
class GroupSpec:
    """One file group: sources of one partition, where and how to name the results, which path."""

    sources: list[SourceFile]
    partition: list  # encoded partition values (datafile_codec)
    spec_id: int
    output_dir: str
    file_prefix: str  # the attempt id: every file this group writes starts with it
    max_files: int  # roll to a new file at the target size only while fewer than this exist
    polars: bool  # the driver found the group fit for Polars (polars_rewrite.qualifies)
    deletes: list[DeleteSpec] = field(default_factory=list)  # delete files some of its sources need applied
    expire: ExpireFilter | None = None  # a data expiration's group: rows past retention are dropped
    # None: results keep the sources' partition and spec; else (old-spec) each row is written into
    # its partition under this spec, in a folder per partition below output_dir
    output_spec_id: int | None = None
    sort: bool = False  # rewritten in the job's order (sort_columns, or zorder_columns when set)


@dataclass(frozen=True)
class RewriteJob:
    """Everything a worker needs; serialised into the Spark closure as JSON."""

    metadata_json: str
    io_properties: dict[str, str]
    target_file_size_bytes: int
    groups: list[GroupSpec]
    tasks: list[list[int]]  # group indices per Spark task (execution/packing)
    sort_columns: list[tuple[str, str]] = field(default_factory=list)  # (file-schema column, ascending|descending)
    zorder_columns: list[str] = field(default_factory=list)  # file-schema columns; win over sort_columns
    sort_budget_bytes: int = DEFAULT_SORT_MEMORY  # Arrow bytes a sorted group holds in memory (external_sort)
    # format version 3: every row's _row_id and _last_updated_sequence_number are written into the
    # results as read (execution/lineage); such groups never take the Polars path
    row_lineage: bool = False

    def to_json(self) -> str:
        # vars, not dataclasses.asdict: asdict deep-copies every SourceFile (0.05 s for 5,000)
        return json.dumps(self, default=vars)

    @staticmethod
    def from_json(raw: str) -> RewriteJob:
        doc = json.loads(raw)
        doc["groups"] = [
            GroupSpec(
                **{
                    **g,
                    "sources": [SourceFile(**s) for s in g["sources"]],
                    "deletes": [DeleteSpec(**d) for d in g["deletes"]],
                    "expire": ExpireFilter(**g["expire"]) if g.get("expire") else None,
                }
            )
            for g in doc["groups"]
        ]
        doc["sort_columns"] = [tuple(c) for c in doc["sort_columns"]]
        return RewriteJob(**doc)

    @property
    def sort_spec(self) -> SortSpec:
        return SortSpec(tuple(self.sort_columns), tuple(self.zorder_columns))


@dataclass
class GroupOutcome:
    group: int
    data_files: list[DataFile]
    error: str | None
    rows_read: int  # rows decoded from the sources, deleted ones included
    bytes_read: int
    peak_rss: int = 0  # the worker process's peak resident bytes while rewriting the group
    engine: str = "arrow"  # polars (whole group in Polars) | arrow (pyarrow, per-file projection where needed)
    rows_deleted: int = 0  # rows of rows_read that deletes removed (rows written = rows_read - rows_deleted)
    seconds: float = 0.0  # spent in rewrite_group (the rest of a Spark job is dispatch and hand-off)
    rows_expired: int = 0  # rows of rows_read a data expiration dropped (after deletes)
    spill_files: int = 0  # runs a sorted group spilled to local disk (0: sorted in memory, or unsorted)


def rewrite_tasks(job_json: str, tasks: Iterable[int]) -> Iterator[dict]:
    """The Spark task function (execution/dispatch): the groups of each task index are rewritten one
    after the other, one result row (RESULT_ARROW_SCHEMA) per group."""
    job = RewriteJob.from_json(job_json)
    with durable.TaskOutputs(job.io_properties) as outputs:  # the driver commits only once they are on disk
        for index in (g for task in tasks for g in job.tasks[task]):
            started = time.perf_counter()
            outcome = rewrite_group(job, index)
            release_memory()
            outputs.add([f.file_path for f in outcome.data_files])
            yield {
                "group": index,
                "data_files": json.dumps([datafile_to_json(f) for f in outcome.data_files]),
                "error": outcome.error,
                "rows_read": outcome.rows_read,
                "bytes_read": outcome.bytes_read,
                "peak_rss": outcome.peak_rss,
                "engine": outcome.engine,
                "rows_deleted": outcome.rows_deleted,
                "seconds": time.perf_counter() - started,
                "rows_expired": outcome.rows_expired,
                "spill_files": outcome.spill_files,
            }


RESULT_ARROW_SCHEMA = pa.schema(
    [
        ("group", pa.int32()),
        ("data_files", pa.string()),
        ("error", pa.string()),
        ("rows_read", pa.int64()),
        ("bytes_read", pa.int64()),
        ("peak_rss", pa.int64()),
        ("engine", pa.string()),
        ("rows_deleted", pa.int64()),
        ("seconds", pa.float64()),
        ("rows_expired", pa.int64()),
        ("spill_files", pa.int32()),
    ]
)


def outcome_from_row(row: dict) -> GroupOutcome:
    return GroupOutcome(
        group=row["group"],
        data_files=[datafile_from_json(d) for d in json.loads(row["data_files"])],
        error=row["error"],
        rows_read=row["rows_read"],
        bytes_read=row["bytes_read"],
        peak_rss=row["peak_rss"],
        engine=row["engine"],
        rows_deleted=row["rows_deleted"],
        seconds=row["seconds"],
        rows_expired=row["rows_expired"],
        spill_files=row["spill_files"],
    )


@dataclass(frozen=True)
class _TableVersion:
    """What every group of one table version shares, worked out once per worker process rather
    than per group (on the 200-column "wide" bench table, parsing the metadata, sanitising the
    schema and relabelling a file's columns cost ~0.1 s per group, serial Python)."""

    metadata: TableMetadata
    file_schema: Schema  # the output files' (sanitised names)
    targets: dict[str, pa.Schema | None]  # SourceReader's relabel targets by physical schema
    lineage_targets: dict[str, pa.Schema | None]  # ... of readers adding row lineage (other keys)

    @functools.cached_property
    def statistics(self) -> polars_rewrite.Statistics:
        """How pyiceberg derives the output files' column statistics from their footers."""
        return polars_rewrite.statistics_for(self.file_schema, self.metadata.properties)


@functools.lru_cache(maxsize=4)
def _table_version(metadata_json: str) -> _TableVersion:
    metadata = TableMetadataUtil.parse_raw(metadata_json)
    return _TableVersion(metadata, sanitize_column_names(metadata.schema()), {}, {})


def rewrite_group(job: RewriteJob, index: int) -> GroupOutcome:
    """Rewrite group `index`; on any failure, delete what it wrote and report the error as data."""
    spec = job.groups[index]
    _reset_peak_rss()
    version = _table_version(job.metadata_json)
    metadata = _group_metadata(version.metadata, spec)
    io = load_file_io(job.io_properties, metadata.location)
    partition = decode_partition(spec.partition)
    lineage = job.row_lineage
    writer = _group_writer(job, index, spec, version, metadata, io, partition)
    bytes_in = sum(s.size for s in spec.sources)
    try:
        deletes = GroupDeletes(io, metadata.schema(), metadata.name_mapping(), spec.sources, spec.deletes)
    except InputFileError as exc:  # an equality delete the rewrite cannot apply: fail, nothing written
        return GroupOutcome(index, [], str(exc), 0, 0, peak_rss())
    targets = version.lineage_targets if lineage else version.targets
    reader = SourceReader(
        metadata, io, spec.sources, partition, spec.spec_id, writer.convert, deletes, targets, lineage=lineage
    )
    if (
        not lineage
        and (written := _rewrite_with_polars(spec, version, io, partition, reader, writer, deletes)) is not None
    ):
        records = sum(s.records for s in spec.sources)
        return GroupOutcome(
            index, written, None, records, bytes_in, peak_rss(), "polars", rows_deleted=deletes.rows_deleted
        )
    expiry = _Expiry(spec.expire, writer.file_schema.find_field(spec.expire.field_id).name) if spec.expire else None
    sorter = ExternalSort(job.sort_spec, job.sort_budget_bytes) if spec.sort and job.sort_spec else None
    try:
        _write_batches(spec, reader, writer, expiry, sorter)
        written = writer.close()
        expired = expiry.rows_expired if expiry else 0
        return GroupOutcome(
            index,
            written,
            None,
            reader.rows_read,
            bytes_in,
            peak_rss(),
            rows_deleted=deletes.rows_deleted,
            rows_expired=expired,
            spill_files=sorter.spill_files if sorter else 0,
        )
    except Exception as exc:  # reported to the driver, which fails the attempt with this message
        writer.abort()
        error = worker_error(exc)
        return GroupOutcome(index, [], error, reader.rows_read, 0, peak_rss(), rows_deleted=deletes.rows_deleted)


def _group_metadata(metadata: TableMetadata, spec: GroupSpec) -> TableMetadata:
    """Decides the metadata a group writes with: with an expiration, full metrics on its column."""
    if spec.expire is not None:  # outputs keep the expire column's bounds whatever the metrics mode:
        # without them the next plan could not tell what they hold, and would rewrite them again
        column = metadata.schema().find_column_name(spec.expire.field_id)
        metrics = {**metadata.properties, f"write.metadata.metrics.column.{column}": "full"}
        metadata = metadata.model_copy(update={"properties": metrics})
    return metadata


def _group_writer(
    job: RewriteJob,
    index: int,
    spec: GroupSpec,
    version: _TableVersion,
    metadata: TableMetadata,
    io: FileIO,
    partition: Record,
) -> RollingWriter | PartitionedWriter:
    """Decides the group's writer: rolling in its own partition, or partitioned by its output spec."""
    lineage = job.row_lineage
    if spec.output_spec_id is None:
        return RollingWriter(
            io,
            metadata,
            partition,
            spec,
            job.target_file_size_bytes,
            index,
            file_schema=version.file_schema,
            lineage=lineage,
        )
    return PartitionedWriter(
        io, metadata, spec, job.target_file_size_bytes, index, version.file_schema, lineage=lineage
    )


def _write_batches(
    spec: GroupSpec,
    reader: SourceReader,
    writer: RollingWriter | PartitionedWriter,
    expiry: _Expiry | None,
    sorter: ExternalSort | None,
) -> None:
    """Writes the group's rows on the per-file path: expired rows dropped, sorted if `sorter`."""
    batches = reader.batches()
    if expiry is not None:
        batches = expiry.filter(batches)
    with (
        contextlib.closing(sorter.sorted(batches) if sorter else batches) as batches,
        WriteBehind(writer.write) if sorter else contextlib.nullcontext() as behind,
    ):
        write = behind.put if behind else writer.write
        for batch in batches:
            write(batch)
            if reader.rows_read >= spec.sources[0].records:  # decoded, so deletes cannot skip it
                crash_point("worker_mid_group")
        if behind:
            behind.close()


class _Expiry:
    """Drops a data expiration's expired rows from batches in the file schema; counts them."""

    def __init__(self, rule: ExpireFilter, column: str) -> None:
        self._rule = rule
        self._column = column
        self.rows_expired = 0

    def filter(self, batches: Iterator[pa.RecordBatch]) -> Generator[pa.RecordBatch, None, None]:
        for batch in batches:
            values = batch.column(self._column)
            if pa.types.is_integer(values.type):  # int and long hold epoch millis: compare as long
                values = values.cast(pa.int64())
            expired = pc.fill_null(pc.less(values, pa.scalar(self._rule.cutoff, values.type)), False)
            if (count := pc.sum(expired).as_py() or 0) == 0:
                yield batch
                continue
            self.rows_expired += count
            yield batch.filter(pc.invert(expired))


def _rewrite_with_polars(
    spec: GroupSpec,
    version: _TableVersion,
    io: FileIO,
    partition: Record,
    reader: SourceReader,
    writer: RollingWriter | PartitionedWriter,
    deletes: GroupDeletes,
) -> list[DataFile] | None:
    """The group through Polars if the driver found it fit (see polars_rewrite), its delete files
    applied (polars_deletes); None: use the per-file path (`deletes` then counts from zero again)."""
    if not _polars_fit(spec) or not isinstance(writer, RollingWriter):
        return None  # isinstance never fails: a PartitionedWriter has an output_spec_id
    try:
        footer = polars_rewrite.read_footer(io, spec.sources[0].path)
        physical = footer.schema.to_arrow_schema()
    except (OSError, pa.ArrowException):
        return None  # the per-file path reports it, naming the file
    target = reader.target_for(physical)
    polars_target = polars_rewrite.polars_schema(target) if target is not None else None
    if target is None or polars_target is None:
        return None
    deleted = None
    if any(s.deletes for s in spec.sources):
        fits, deleted = _polars_deleted(spec, io, deletes, writer, target, physical, footer)
        if not fits:
            return None
    written = polars_rewrite.rewrite_with_polars(
        io,
        version.metadata,
        version.statistics,
        polars_target,
        spec.sources,
        partition,
        spec.spec_id,
        writer.name,
        spec.max_files,
        footer,
        deleted,
    )
    if written is None:
        deletes.rows_deleted = 0
    return written


def _polars_fit(spec: GroupSpec) -> bool:
    """Decides whether the driver's choice of Polars stands: no sort, expiry or repartitioning."""
    return not (not spec.polars or spec.sort or spec.expire or spec.output_spec_id is not None)


def _polars_deleted(
    spec: GroupSpec,
    io: FileIO,
    deletes: GroupDeletes,
    writer: RollingWriter,
    target: pa.Schema,
    physical: pa.Schema,
    footer: pq.FileMetaData,
) -> tuple[bool, list[np.ndarray] | None]:
    """Decides the deleted positions per source for the Polars path; (False, None): use the per-file path."""
    if polars_rewrite.ROW_INDEX in physical.names or polars_deletes.FILE_COLUMN in physical.names:
        return False, None
    try:
        storage = polars_storage.storage_for(io, [s.path for s in spec.sources])
        if storage is None:
            return False, None
        deleted = polars_deletes.deleted_positions(
            deletes, storage, spec.sources, target, physical.names, footer.serialized_size
        )
    except Exception as exc:  # noqa: BLE001 - a bad delete file: the per-file path fails the group, naming it
        polars_rewrite.log.warning("polars rewrite of %s fell back to the per-file path: %s", writer.name, exc)
        deletes.rows_deleted = 0
        return False, None
    return True, deleted


def release_memory() -> None:
    """Give the pages a finished group freed back to the system. Arrow's pool (mimalloc, pyarrow's
    default on Linux) and glibc keep freed pages for reuse, and Spark keeps a worker for the next
    task: a worker that rewrote a 1 GB group on the Arrow path, then a 1 GB one through Polars,
    peaked at 512 MiB in the second (316 with this), and an idle worker held its last group's
    pages beside the busy one. Polars' own allocator is not reached from here."""
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (macOS, musl): nothing to trim
        return None


_LIBC = _glibc()


def _reset_peak_rss() -> None:
    """Python workers are reused across tasks: restart the kernel's peak-RSS count (Linux)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss(status: Path = Path("/proc/self/status")) -> int:
    """VmHWM (peak resident bytes) from a /proc/<pid>/status file; 0 where /proc is missing.
    Not getrusage's ru_maxrss: that survives exec, so a spawned child would report its parent's."""
    with contextlib.suppress(OSError):
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0
