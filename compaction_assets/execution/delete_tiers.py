"""The two cheaper merge-on-read tiers: new position-delete files for a partition, its data untouched.

- **convert-equality-deletes** (Amoro's minor optimizing): the rows of a partition's data files that
  its equality deletes match become position deletes. Only the equality columns of the data files
  are read, projected onto the current schema by Iceberg field id with pyiceberg's ArrowScan (as
  source_reader does: renamed columns keep their values, promoted types are cast, a column a file
  lacks reads NULL). A delete applies to a data file when the file's data sequence number is lower
  than the delete's; values match with SQL null-safe equality (NULL matches NULL; as in Java,
  NaN matches NaN and -0.0 does not match 0.0). A row a position delete already removes may be
  listed again: harmless, and the next rewrite of the position deletes drops the duplicate.
- **rewrite-position-deletes** (Iceberg's rewrite_position_delete_files): a partition's
  position-delete files become one (or a few, at the target size) holding each (file_path, pos)
  that still applies: its data file is live and no newer than the delete file that named it.
  Duplicates collapse; entries for dead data files are dropped.

Each job writes one position-delete file per partition (a few when it passes the target size),
sorted by file_path then pos, with exact file_path bounds: a file naming one data file references
it (equal bounds, as Java's writer records them).

Both are pure functions of table metadata, a FileIO and file lists, so they run in a Spark Python
worker (`run_tier_rows`, a Spark task function like worker.rewrite_tasks: execution/dispatch) or
in-process. Output files go to the job's output folder, named after its file prefix (the attempt
id), so recovery sweeps them like rewrite results; the commit gives them a new data sequence number,
which is >= every data file they name. Key sets are built once per job (a hash join per chunk of
data rows, never per-row Python): memory is the delete keys plus one chunk of data keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record

from compaction_assets.errors import InputFileError
from compaction_assets.execution.source_reader import projected_batches
from compaction_assets.lake.datafile_codec import (
    decode_partition,
    encode_partition,
)
from compaction_assets.lake.delete_files import FILE_PATH_ID, POS_ID, PositionDeleteWriter
from compaction_assets.lake.deletes import applies

if TYPE_CHECKING:
    from compaction_assets.lake.files import LiveFile

CHUNK_ROWS = 1 << 20  # data-file key rows joined against the delete keys at once (at least the key count)
ACERO_THREADS = False  # a Spark task owns one core: Acero's threads there only raise the memory peak
_NO_SPEC = -1  # an equality-delete file is read without partition values: it holds its own columns


class Tier(StrEnum):
    """The kinds the planner records for these tiers (beside minor and major)."""

    CONVERT_EQUALITY_DELETES = "convert-equality-deletes"
    REWRITE_POSITION_DELETES = "rewrite-position-deletes"


@dataclass(frozen=True)
class TierFile:
    """A live data or delete file as a tier job needs it."""

    path: str
    size: int
    records: int
    sequence_number: int  # its data sequence number
    equality_ids: list[int] | None = None  # equality deletes: the field ids rows are matched on

    @staticmethod
    def of(live: LiveFile) -> TierFile:
        return TierFile(
            live.path, live.size, live.record_count, live.data_sequence_number, live.data_file.equality_ids or None
        )


@dataclass(frozen=True)
class TierJob:
    """One partition's tier: its files, and where and how to name the position-delete files written."""

    tier: str  # a Tier value
    spec_id: int  # spec and encoded partition (datafile_codec) of the position deletes written
    partition: list
    output_dir: str
    file_prefix: str  # the attempt id: every file this job writes starts with it
    data_files: list[TierFile]
    deletes: list[TierFile]

    @staticmethod
    def convert(
        data_files: Sequence[LiveFile], equality_deletes: Sequence[LiveFile], output_dir: str, file_prefix: str
    ) -> TierJob:
        """Convert `equality_deletes` for the `data_files` of one partition (the caller's scope:
        the partition's and any unpartitioned-spec deletes); only data files one of them applies to
        (by sequence numbers) are kept, and the job reports exactly those as covered. A delete of
        an unpartitioned spec applies to every partition: it may go only once all are converted."""
        applying = [d for d in data_files if any(applies(e, d) for e in equality_deletes)]
        spec_id, partition = _one_partition(applying or data_files)
        return TierJob(
            Tier.CONVERT_EQUALITY_DELETES,
            spec_id,
            partition,
            output_dir,
            file_prefix,
            [TierFile.of(d) for d in applying],
            [TierFile.of(e) for e in equality_deletes],
        )

    @staticmethod
    def rewrite(
        live_data_files: Sequence[LiveFile], position_deletes: Sequence[LiveFile], output_dir: str, file_prefix: str
    ) -> TierJob:
        """Rewrite one partition's `position_deletes`. `live_data_files` must hold every live data
        file they may name (for deletes of an unpartitioned spec: the table's): entries naming no
        file listed are dropped."""
        spec_id, partition = _one_partition(position_deletes)
        return TierJob(
            Tier.REWRITE_POSITION_DELETES,
            spec_id,
            partition,
            output_dir,
            file_prefix,
            [TierFile.of(d) for d in live_data_files],
            [TierFile.of(p) for p in position_deletes],
        )


def _one_partition(files: Sequence[LiveFile]) -> tuple[int, list]:
    scopes = {f.partition_id for f in files}
    if len(scopes) != 1:
        raise ValueError(f"a tier job covers one partition, got {len(scopes)}")
    first = files[0].data_file
    return first.spec_id, encode_partition(first.partition)


@dataclass(frozen=True)
class TierRun:
    """Tier jobs of one table; serialised into the Spark closure as JSON."""

    metadata_json: str
    io_properties: dict[str, str]
    target_file_size_bytes: int
    jobs: list[TierJob]

    def to_json(self) -> str:
        return json.dumps(self, default=vars)

    @staticmethod
    def from_json(raw: str) -> TierRun:
        doc = json.loads(raw)
        doc["jobs"] = [
            TierJob(
                **{
                    **j,
                    "data_files": [TierFile(**f) for f in j["data_files"]],
                    "deletes": [TierFile(**f) for f in j["deletes"]],
                }
            )
            for j in doc["jobs"]
        ]
        return TierRun(**doc)


@dataclass
class TierOutcome:
    """What one job did; `error` set (and nothing written) when it failed."""

    job: int
    tier: str
    delete_files: list[DataFile]  # position-delete files written (content POSITION_DELETES)
    covered_data_files: list[str]  # convert: every data file checked; rewrite: the data files named
    rows_read: int  # convert: key rows read from data files; rewrite: rows read from delete files
    rows_written: int  # position-delete rows written (convert: rows the equality deletes matched)
    rows_dropped: int = 0  # rewrite: rows read but not written (dead or newer data files, duplicates)
    bytes_read: int = 0
    peak_rss: int = 0
    error: str | None = None


def convert_equality_deletes(
    metadata: TableMetadata, io: FileIO, job: TierJob, target_file_size_bytes: int, index: int = 0
) -> TierOutcome:
    """Position deletes for every row of `job.data_files` an equality delete of `job.deletes` matches.

    Raises InputFileError naming a file that cannot be read; files written so far are deleted.
    """
    schema = metadata.schema()
    by_ids = _deletes_by_ids(job.deletes, {f.field_id for f in schema.fields})
    key_schema, types = _key_schema(schema, by_ids)
    newest = max((d.sequence_number for d in job.deletes), default=0)
    partition = decode_partition(job.partition)

    bytes_read = sum(d.size for d in job.deletes)
    keys = [_KeySet(ids, deletes, metadata, io, types) for ids, deletes in by_ids.items()]
    data = sorted(job.data_files, key=lambda f: f.path)
    to_read = [f for f in data if f.sequence_number < newest and f.records > 0]
    seqs = pa.array([f.sequence_number for f in to_read], pa.int64())
    paths = pa.array([f.path for f in to_read], pa.string())
    chunk_rows = max(CHUNK_ROWS, max((len(k.table) for k in keys), default=0))
    name = f"{job.output_dir.rstrip('/')}/{job.file_prefix}-{index:05d}-deletes"
    writer = PositionDeleteWriter(io, name, job.spec_id, partition, target_file_size_bytes)
    try:
        rows_read, rows_written, read_bytes = _match_data_files(
            metadata, io, job, key_schema, types, partition, to_read, chunk_rows, keys, seqs, paths, writer
        )
        bytes_read += read_bytes
        written = writer.close()
    except BaseException:
        writer.abort()
        raise
    return TierOutcome(
        index, Tier.CONVERT_EQUALITY_DELETES, written, [f.path for f in data], rows_read, rows_written, 0, bytes_read
    )


def _deletes_by_ids(deletes: list[TierFile], top_level: set[int]) -> dict[tuple[int, ...], list[TierFile]]:
    """Groups equality delete files by their sorted field ids; raises for one with none or a nested id."""
    by_ids: dict[tuple[int, ...], list[TierFile]] = {}
    for delete in deletes:
        ids = tuple(sorted(delete.equality_ids or ()))
        if not ids:
            raise ValueError(f"{delete.path} is not an equality delete file (no equality_ids)")
        if any(i not in top_level for i in ids):
            raise ValueError(f"equality delete file {delete.path}: field ids {list(ids)} are not all top-level columns")
        by_ids.setdefault(ids, []).append(delete)
    return by_ids


def _key_schema(schema: Schema, by_ids: dict[tuple[int, ...], list[TierFile]]) -> tuple[Schema, dict[int, pa.DataType]]:
    """Decides the key columns to read from data files (every field id of any delete) and their Arrow storage types."""
    key_ids = sorted({i for ids in by_ids for i in ids})
    key_schema = Schema(*[schema.find_field(i) for i in key_ids])
    types = {
        i: _storage(t)
        for i, t in zip(key_ids, schema_to_pyarrow(key_schema, include_field_ids=False).types, strict=True)
    }
    return key_schema, types


def _match_data_files(
    metadata: TableMetadata,
    io: FileIO,
    job: TierJob,
    key_schema: Schema,
    types: dict[int, pa.DataType],
    partition: Record,
    to_read: list[TierFile],
    chunk_rows: int,
    keys: list[_KeySet],
    seqs: pa.Array,
    paths: pa.Array,
    writer: PositionDeleteWriter,
) -> tuple[int, int, int]:
    """Reads the data files' keys in chunks of about `chunk_rows` and writes the matched positions:
    returns rows read, rows written and data bytes read."""
    rows_read = rows_written = bytes_read = 0
    chunk: list[pa.Table] = []
    buffered = 0
    for number, data_file in enumerate(to_read):
        projected = projected_batches(metadata, io, key_schema, data_file, partition, job.spec_id)
        start = 0
        for batch in projected:
            chunk.append(_data_keys(batch, key_schema, types, number, start))
            start += batch.num_rows
        rows_read += start
        bytes_read += data_file.size
        buffered += start
        if buffered >= chunk_rows or number == len(to_read) - 1:
            rows_written += _match_chunk(pa.concat_tables(chunk), keys, seqs, paths, writer)
            chunk, buffered = [], 0
    return rows_read, rows_written, bytes_read


class _KeySet:
    """The keys of the equality deletes on one set of field ids: each distinct key once, with the
    highest data sequence number of a delete holding it (a row of a data file of sequence number s
    is deleted iff that number is > s). NULLs are made joinable: each column becomes a null flag
    and its value with NULL replaced by a value of the column (a sentinel; the flag keeps them apart).
    A column whose keys are all NULL joins on its flag alone."""

    def __init__(
        self,
        ids: tuple[int, ...],
        deletes: list[TierFile],
        metadata: TableMetadata,
        io: FileIO,
        types: dict[int, pa.DataType],
    ) -> None:
        self.ids = ids
        schema = metadata.schema()
        select = Schema(*[schema.find_field(i) for i in ids])
        parts = []
        for delete in deletes:
            for batch in projected_batches(
                metadata, io, select, delete, Record(), _NO_SPEC, what="equality delete file"
            ):
                columns = [_column(batch, schema.find_field(i).name, types[i]) for i in ids]
                seq = pa.repeat(pa.scalar(delete.sequence_number, pa.int64()), batch.num_rows)
                parts.append(pa.table([*columns, seq], names=[*(f"k{i}" for i in ids), "_seq"]))
        raw = (
            pa.concat_tables(parts)
            if parts
            else pa.table({**{f"k{i}": pa.array([], types[i]) for i in ids}, "_seq": pa.array([], pa.int64())})
        )
        self.sentinels: dict[int, pa.Scalar | None] = {}
        for i in ids:
            valid = pc.drop_null(raw.column(f"k{i}"))
            self.sentinels[i] = valid[0] if len(valid) else None
        flagged = self.normalise(raw)
        self.names = [n for n in flagged.column_names if n != "_seq"]
        self.table = flagged.group_by(self.names, use_threads=ACERO_THREADS).aggregate([("_seq", "max")])

    def normalise(self, keys: pa.Table) -> pa.Table:
        """Columns `k<id>` -> null flags `n<id>` and sentinel-filled values `v<id>`; others kept."""
        columns, names = [], []
        for i in self.ids:
            column = keys.column(f"k{i}")
            columns.append(pc.is_null(column))
            names.append(f"n{i}")
            if (sentinel := self.sentinels[i]) is not None:
                columns.append(pc.fill_null(column, sentinel))
                names.append(f"v{i}")
        for name in keys.column_names:
            if not name.startswith("k"):
                columns.append(keys.column(name))
                names.append(name)
        return pa.table(columns, names=names)


def _match_chunk(
    chunk: pa.Table, keys: list[_KeySet], seqs: pa.Array, paths: pa.Array, writer: PositionDeleteWriter
) -> int:
    """Write the positions of the chunk's rows some key set deletes; returns how many."""
    hits = []
    for key_set in keys:
        probe = key_set.normalise(chunk.select([*(f"k{i}" for i in key_set.ids), "_file", "_pos"]))
        joined = probe.join(key_set.table, keys=key_set.names, join_type="inner", use_threads=ACERO_THREADS)
        deleted = pc.greater(joined.column("_seq_max"), pc.take(seqs, joined.column("_file")))
        hits.append(joined.filter(deleted).select(["_file", "_pos"]))
    found = pa.concat_tables(hits)
    if len(keys) > 1:  # a row several key sets delete is one position
        found = found.group_by(["_file", "_pos"], use_threads=ACERO_THREADS).aggregate([])
    found = found.sort_by([("_file", "ascending"), ("_pos", "ascending")])
    writer.write(pc.take(paths, found.column("_file")), found.column("_pos"))
    return len(found)


def _data_keys(
    batch: pa.RecordBatch, key_schema: Schema, types: dict[int, pa.DataType], number: int, start: int
) -> pa.Table:
    """A data file's key columns (`k<id>`, canonical types) with its index and each row's position."""
    columns = [_column(batch, f.name, types[f.field_id]) for f in key_schema.fields]
    names = [f"k{f.field_id}" for f in key_schema.fields]
    files = pa.repeat(pa.scalar(number, pa.int32()), batch.num_rows)
    positions = pa.array(np.arange(start, start + batch.num_rows, dtype=np.int64))
    return pa.table([*columns, files, positions], names=[*names, "_file", "_pos"])


def _column(batch: pa.RecordBatch, name: str, canonical: pa.DataType) -> pa.Array:
    """A projected column in one Arrow type for every file (string vs large_string, extension storage);
    every NaN one bit pattern (Java's Double.compare: NaN matches NaN, whatever its payload)."""
    column = batch.column(name)
    if isinstance(column.type, pa.BaseExtensionType):
        column = column.storage
    column = column if column.type == canonical else column.cast(canonical)
    if pa.types.is_floating(column.type):
        column = pc.if_else(pc.is_nan(column), pa.scalar(float("nan"), column.type), column)
    return column


def _storage(arrow_type: pa.DataType) -> pa.DataType:
    return arrow_type.storage_type if isinstance(arrow_type, pa.BaseExtensionType) else arrow_type


def rewrite_position_deletes(
    metadata: TableMetadata, io: FileIO, job: TierJob, target_file_size_bytes: int, index: int = 0
) -> TierOutcome:
    """One sorted, deduplicated set of the (file_path, pos) rows of `job.deletes` that still apply to
    a data file of `job.data_files` (listed, with a data sequence number <= the delete file's).

    Raises InputFileError naming a file that cannot be read; files written so far are deleted.
    """
    del metadata  # position-delete files have one schema, whatever the table's
    live = sorted(job.data_files, key=lambda f: f.path)
    live_paths = pa.array([f.path for f in live], pa.string())
    live_seqs = pa.array([f.sequence_number for f in live], pa.int64())
    kept: list[pa.Table] = []
    rows_read = bytes_read = 0
    for delete in job.deletes:
        for paths, positions in _position_rows(io, delete):
            rows_read += len(paths)
            found = pc.index_in(paths, value_set=live_paths)
            keep = pc.fill_null(pc.less_equal(pc.take(live_seqs, found), delete.sequence_number), False)
            kept.append(pa.table({"_file": found.filter(keep), "_pos": positions.filter(keep)}))
        bytes_read += delete.size
    rows = (
        pa.concat_tables(kept)
        if kept
        else pa.table({"_file": pa.array([], pa.int32()), "_pos": pa.array([], pa.int64())})
    )
    rows = (
        rows.group_by(["_file", "_pos"], use_threads=ACERO_THREADS)
        .aggregate([])
        .sort_by([("_file", "ascending"), ("_pos", "ascending")])
    )
    name = f"{job.output_dir.rstrip('/')}/{job.file_prefix}-{index:05d}-deletes"
    writer = PositionDeleteWriter(io, name, job.spec_id, decode_partition(job.partition), target_file_size_bytes)
    try:
        writer.write(pc.take(live_paths, rows.column("_file")), rows.column("_pos"))
        written = writer.close()
    except BaseException:
        writer.abort()
        raise
    named = sorted(set(pc.take(live_paths, pc.unique(rows.column("_file"))).to_pylist()))
    return TierOutcome(
        index, Tier.REWRITE_POSITION_DELETES, written, named, rows_read, len(rows), rows_read - len(rows), bytes_read
    )


def _position_rows(io: FileIO, delete: TierFile) -> Iterator[tuple[pa.Array, pa.Array]]:
    """(file_path, pos) of a position-delete file, a row group at a time; columns by field id
    (else by the spec's names)."""
    read = 0
    try:
        with io.new_input(delete.path).open() as stream:
            parquet = pq.ParquetFile(stream)
            by_id = {
                int(f.metadata[b"PARQUET:field_id"]): f.name
                for f in parquet.schema_arrow
                if f.metadata and b"PARQUET:field_id" in f.metadata
            }
            columns = [by_id.get(FILE_PATH_ID, "file_path"), by_id.get(POS_ID, "pos")]
            for batch in parquet.iter_batches(columns=columns):
                read += batch.num_rows
                yield batch.column(0).cast(pa.string()), batch.column(1).cast(pa.int64())
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise InputFileError(f"cannot read position delete file {delete.path}: {type(exc).__name__}: {exc}") from exc
    if read != delete.records:
        raise InputFileError(
            f"position delete file {delete.path} has {read} rows but its manifest entry says {delete.records}"
        )
