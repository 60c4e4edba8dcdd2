"""Writing a group's rows into Iceberg data files, inside a Spark Python worker.

`RollingWriter` writes batches (in the table's scan schema, converted to the file schema with
field ids) into Parquet files of about the target size through pyiceberg's Parquet writer, so
result files carry the statistics pyiceberg computes; a file rolls after a row group once near
the target. `PartitionedWriter` splits each batch by the output spec's partitions (an old-spec
group) into a RollingWriter per partition, all buffers within one row-group budget. Both hand back
the DataFiles they wrote, and delete what they wrote when aborted.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa
from pyiceberg.io import FileIO, OutputFile, OutputStream
from pyiceberg.io.fileformat import FileFormatFactory, FileFormatWriter
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema, sanitize_column_names
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record

from compaction_assets.execution.lineage import with_lineage_fields
from compaction_assets.execution.parquet_encoding import ArrowPathWriter
from compaction_assets.execution.partitioning import partition_folder, split_by_partition
from compaction_assets.iceberg_compat.arrow import to_requested_schema
from compaction_assets.lake.partition_key import PartitionId, partition_id

if TYPE_CHECKING:
    from compaction_assets.execution.worker import GroupSpec  # the worker imports these writers

MiB = 1024 * 1024
MAX_BUFFER_BYTES = 32 * MiB  # Arrow bytes buffered before a row group is written
MIN_BUFFER_BYTES = 64 * 1024  # ... and at least these (tiny targets: tests, demos)
ROW_GROUPS_PER_TARGET = 4  # a file rolls after a row group: a quarter of the target in Arrow bytes keeps it near


class _TrackedOutput(OutputFile):
    """An OutputFile that keeps the stream it opens, so the writer's progress can be read."""

    def __init__(self, inner: OutputFile) -> None:
        super().__init__(inner.location)
        self._inner = inner
        self.stream: OutputStream | None = None

    def __len__(self) -> int:
        return len(self._inner)

    def exists(self) -> bool:
        return self._inner.exists()

    def to_input_file(self):  # noqa: ANN201 - pyiceberg's own signature
        return self._inner.to_input_file()

    def create(self, overwrite: bool = False) -> OutputStream:
        self.stream = self._inner.create(overwrite=overwrite)
        return self.stream


class RollingWriter:
    """Writes batches into Parquet files of about the target size, starting a new file when full.

    The last of a group's `max_files` files takes whatever remains, as Iceberg's bin-pack does,
    so a group never leaves a small tail file behind.
    """

    def __init__(
        self,
        io: FileIO,
        metadata: TableMetadata,
        partition: Record,
        spec: GroupSpec,
        target_bytes: int,
        index: int,
        buffer_limit: int = MAX_BUFFER_BYTES,
        file_schema: Schema | None = None,
        lineage: bool = False,
    ) -> None:
        """`file_schema`: the table schema's sanitised form, if the caller has it already.
        `lineage`: batches carry the row-lineage columns after the file schema's (execution/lineage),
        written with their field ids and statistics."""
        self._io = io
        self._metadata = metadata
        self._table_schema = metadata.schema()
        self.file_schema = sanitize_column_names(self._table_schema) if file_schema is None else file_schema
        self._write_schema = with_lineage_fields(self.file_schema) if lineage else self.file_schema
        self._format = FileFormatFactory.get(FileFormat.PARQUET)
        self._partition = partition
        self._spec = spec
        self._target = target_bytes
        self._buffer_limit = min(buffer_limit, max(MIN_BUFFER_BYTES, target_bytes // ROW_GROUPS_PER_TARGET))
        self.name = f"{spec.output_dir.rstrip('/')}/{spec.file_prefix}-{index:05d}"
        self._buffer: list[pa.RecordBatch] = []
        self._arrow_schema: pa.Schema | None = None
        self.buffered = 0  # Arrow bytes held, not yet written
        self._open: tuple[_TrackedOutput, FileFormatWriter] | None = None  # the file being written
        self._written: list[DataFile] = []
        self._opened: list[str] = []

    def convert(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A batch in the table's scan schema -> the file schema (sanitised names, field ids)."""
        return to_requested_schema(
            self.file_schema,
            self._table_schema,
            batch,
            include_field_ids=True,
            format_model=self._format,
        )

    def write(self, converted: pa.RecordBatch) -> None:
        """Buffer a batch already in the file schema (see `convert`); flush full row groups."""
        if converted.num_rows == 0:
            return
        # Files written before and after a schema change project to different Arrow types
        # (e.g. string vs large_string); one output file needs one Arrow schema.
        if self._arrow_schema is None:
            self._arrow_schema = converted.schema
        elif converted.schema != self._arrow_schema:
            converted = converted.cast(self._arrow_schema)
        # a batch larger than a row group (a whole source file's, say) is written in slices, so
        # files roll near the target (a split writes one oversized file into several)
        rows = max(1, -(-converted.num_rows * self._buffer_limit // max(converted.nbytes, 1)))
        for start in range(0, converted.num_rows, rows):
            piece = converted.slice(start, rows)
            self._buffer.append(piece)
            self.buffered += piece.nbytes
            if self.buffered >= self._buffer_limit:
                self.flush()

    def close(self) -> list[DataFile]:
        self.flush()
        self._finish_file()
        return self._written

    def abort(self) -> None:
        """Delete every file this writer opened (best effort: recovery also sweeps by prefix)."""
        for path in self._opened:
            with contextlib.suppress(FileNotFoundError, OSError):
                self._io.delete(path)

    def flush(self) -> None:
        """Write the buffered batches as a row group (rolling to a new file when this one is full)."""
        if not self._buffer:
            return
        if self._open is None:
            path = f"{self.name}-{len(self._opened):05d}.parquet"
            self._opened.append(path)
            output = _TrackedOutput(self._io.new_output(path))
            self._open = output, ArrowPathWriter(output, self._write_schema, self._metadata.properties)
        output, writer = self._open
        table = pa.Table.from_batches(self._buffer)
        stream = output.stream
        before = stream.tell() if stream is not None else 0
        writer.write(table)
        self._buffer, self.buffered = [], 0
        stream = output.stream
        # full when one more row group like this one would overshoot the target by more than
        # stopping here falls short of it: files land within half a row group of the target
        written = stream.tell() if stream is not None else 0
        full = stream is not None and written + (written - before) / 2 >= self._target
        if full and len(self._written) + 1 < self._spec.max_files:
            self._finish_file()

    def _finish_file(self) -> None:
        if self._open is None:
            return
        output, writer = self._open
        stats = writer.close()
        data_file = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=output.location,
            file_format=FileFormat.PARQUET,
            partition=self._partition,
            file_size_in_bytes=len(output),
            sort_order_id=None,
            equality_ids=None,
            key_metadata=None,
            **stats.to_serialized_dict(),
        )
        data_file.spec_id = self._spec.spec_id
        self._written.append(data_file)
        self._open = None


class PartitionedWriter:
    """An old-spec group's writer: each batch is split by the partitions of spec `output_spec_id`
    (execution/partitioning), each partition written by a RollingWriter of its own into its folder
    below the group's output_dir, with that spec's id and its partition values. Memory: all
    partitions' buffers together stay under MAX_BUFFER_BYTES (the fullest is flushed as a row group
    when they would not), plus one open Parquet writer per partition seen."""

    def __init__(
        self,
        io: FileIO,
        metadata: TableMetadata,
        spec: GroupSpec,
        target_bytes: int,
        index: int,
        file_schema: Schema | None = None,
        lineage: bool = False,
    ) -> None:
        self._io, self._metadata, self._spec = io, metadata, spec
        self._lineage = lineage
        self._target, self._index = target_bytes, index
        if spec.output_spec_id is None:
            raise ValueError("a PartitionedWriter needs the group's output_spec_id")
        self._partition_spec = metadata.specs()[spec.output_spec_id]
        # converts; never writes
        self._template = RollingWriter(io, metadata, Record(), spec, target_bytes, index, file_schema=file_schema)
        self.file_schema = self._template.file_schema
        self.convert = self._template.convert
        self._writers: dict[PartitionId, RollingWriter] = {}  # by typed values (NaN is one partition)

    def write(self, converted: pa.RecordBatch) -> None:
        for partition, rows in split_by_partition(converted, self._partition_spec, self.file_schema):
            self._writer_for(partition).write(rows)
        writers = list(self._writers.values())
        while sum(w.buffered for w in writers) > MAX_BUFFER_BYTES:
            max(writers, key=lambda w: w.buffered).flush()

    def close(self) -> list[DataFile]:
        return [f for w in self._writers.values() for f in w.close()]

    def abort(self) -> None:
        for writer in self._writers.values():
            writer.abort()

    def _writer_for(self, partition: Record) -> RollingWriter:
        key = partition_id(self._partition_spec.spec_id, partition)
        if (writer := self._writers.get(key)) is None:
            folder = partition_folder(self._spec.output_dir, self._partition_spec, self._metadata.schema(), partition)
            # no file limit per partition: its rows are not known in advance, files roll at the target
            spec = replace(self._spec, output_dir=folder, spec_id=self._partition_spec.spec_id, max_files=2**31)
            limit = max(MiB, MAX_BUFFER_BYTES // 4)
            writer = self._writers[key] = RollingWriter(
                self._io,
                self._metadata,
                partition,
                spec,
                self._target,
                self._index,
                limit,
                self.file_schema,
                lineage=self._lineage,
            )
        return writer
