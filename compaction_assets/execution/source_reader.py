"""Reading a group's source files, in the Arrow schema the output file is written with.

Two paths, same rows:
- **bulk**: files whose columns already are the table's columns (same field ids in the same
  order, same Arrow types; nested columns with the same children and child ids) need no
  projection, only new labels. Their footers are read on
  a thread pool and the files are scanned together by one pyarrow dataset scanner, which decodes
  several files at a time on Arrow's threads (without the GIL) while the caller encodes. This is
  what makes thousands of tiny files cheap: one Python call per batch instead of per-file setup.
- **projected**: every other file (renamed, added, dropped or promoted columns, evolved nested
  types, missing ids without a name mapping) goes through pyiceberg's ArrowScan one file at a time, which
  projects it onto the current schema by field id. On an object store, where a small file costs
  a few requests' latency, the next files' bytes are fetched on a thread pool while the current
  one is projected (at most OVERLAP_FILES in flight and READAHEAD_BYTES held; larger files are
  read in turn), and ArrowScan reads each from memory.

Both apply the group's delete files (execution/deletes.py) to each batch after conversion: a
bulk scan's batches are tagged with their file, in each file's row order, so row positions are
counted per file on either path.

Whether a physical schema qualifies is decided once per distinct schema, by running pyiceberg's
own projection on an empty batch of it: the bulk path is taken only where that projection is a
pure relabel.

With `lineage` (a format-version-3 table), each batch also gets `_row_id` and
`_last_updated_sequence_number` (execution/lineage), from the file's own columns where it has them
(they are not table columns: the bulk path relabels the others) and inherited otherwise, before
deletes are applied.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs  # noqa: F401 - pa.fs
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile
from pyiceberg.io.pyarrow import ArrowScan, PyArrowFileIO, pyarrow_to_schema
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record
from pyiceberg.types import ListType, MapType, StructType

from compaction_assets.errors import InputFileError
from compaction_assets.execution.deletes import GroupDeletes
from compaction_assets.execution.lineage import (
    LAST_UPDATED_FIELD_ID,
    ROW_ID_FIELD_ID,
    add_lineage,
    lineage_positions,
    with_lineage_fields,
)
from compaction_assets.iceberg_compat.arrow import scan_batches_with_deletes, to_requested_schema

NestedType = StructType | ListType | MapType
MiB = 1024 * 1024
READAHEAD_BYTES = 64 * MiB  # source bytes one bulk scan may have in flight
FOOTER_THREADS = 8  # footers read at once from an object store
CHUNK_FILES = 2048  # files whose footers are held at once
OVERLAP_FILES = 8  # remote files fetched at once for the projected path (1: one after the other)


class SourceReader:
    """Streams the rows of `sources` (SourceFile-like: path, size, records) converted by `convert`.

    `convert` maps a batch in the table's scan schema to the output file's schema (the
    RollingWriter's conversion); bulk batches are labelled with its result directly.
    """

    def __init__(
        self,
        metadata: TableMetadata,
        io: FileIO,
        sources: list,
        partition: Record,
        spec_id: int,
        convert: Callable[[pa.RecordBatch], pa.RecordBatch],
        deletes: GroupDeletes | None = None,
        targets: dict[str, pa.Schema | None] | None = None,
        lineage: bool = False,
    ) -> None:
        self._metadata = metadata
        self._io = io
        self._sources = sources
        self._partition = partition
        self._spec_id = spec_id
        self._convert = convert
        self._deletes = deletes
        self.rows_read = 0  # rows decoded, deleted ones included
        self._schema = metadata.schema()
        self._lineage = lineage
        self._read_schema = with_lineage_fields(self._schema) if lineage else self._schema
        self._downcast = metadata.format_version <= 2
        # relabel targets by physical schema, field ids included; `targets` shares them between the
        # readers of groups of one table version (same schema, name mapping and conversion)
        self._targets: dict[str, pa.Schema | None] = {} if targets is None else targets
        self.bulk_paths: list[str] = []
        self.projected_paths: list[str] = []

    def batches(self) -> Generator[pa.RecordBatch, None, None]:
        io = self._io
        located = [_locate(io, s.path) for s in self._sources] if isinstance(io, PyArrowFileIO) else []
        if not located or any(fs is not located[0][1] for _, fs in located):
            yield from self._project_all(self._sources, remote=not all(_is_local(s.path) for s in self._sources))
            return
        # pre-buffering coalesces reads for object stores; on a local disk it only costs time
        remote = not isinstance(located[0][1], pa.fs.LocalFileSystem)
        self._format = ds.ParquetFileFormat(
            default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=remote)
        )
        # chunks bound the footers held in memory (~20 KB each) however many files a group has
        pairs = list(zip(self._sources, located, strict=True))
        for start in range(0, len(pairs), CHUNK_FILES):
            chunk = pairs[start : start + CHUNK_FILES]
            runs, projected = self._split(chunk, remote)
            for target, found, run in runs.values():
                yield from self._scan(target, run, found)
            yield from self._project_all(projected, remote)

    def _split(self, chunk: list, remote: bool) -> tuple[dict[str, tuple[pa.Schema, dict[int, int], list]], list]:
        """Bulk fragments grouped by physical schema (one scanner each), with their target schema
        and where their lineage columns are (with `lineage`: the target relabels the other columns);
        the rest for ArrowScan. Remote files get their size from the manifest, which spares a HEAD
        request per open."""
        fragments = [
            self._format.make_fragment(path, fs, file_size=source.size if remote else None)
            for source, (path, fs) in chunk
        ]
        if remote:  # footers of remote files: latency-bound, so read several at once
            with ThreadPoolExecutor(FOOTER_THREADS) as pool:
                errors = list(pool.map(_load_footer, fragments))
        else:
            errors = [_load_footer(f) for f in fragments]
        runs: dict[str, tuple[pa.Schema, dict[int, int], list]] = {}  # one scanner per identical physical schema
        projected = []
        for (source, _), fragment, error in zip(chunk, fragments, errors, strict=True):
            if error is not None:
                raise _unreadable(source.path, error)
            if fragment.metadata.num_rows != source.records:
                raise _count_mismatch(source.path, fragment.metadata.num_rows, source.records)
            physical = fragment.physical_schema
            key = _schema_key(physical)
            found = lineage_positions(physical) if self._lineage else {}
            if found:
                kept = [f for i, f in enumerate(physical) if i not in found.values()]
                target = self.target_for(pa.schema(kept, metadata=physical.metadata))
            else:
                target = self.target_for(physical, key)
            if target is None:
                projected.append(source)
                self.projected_paths.append(source.path)
            else:
                runs.setdefault(key, (target, found, []))[2].append((source, fragment))
                self.bulk_paths.append(source.path)
        return runs, projected

    def target_for(self, physical: pa.Schema, key: str | None = None) -> pa.Schema | None:
        """`relabel_target(physical)`, computed once per physical schema (`key`: its _schema_key)."""
        key = _schema_key(physical) if key is None else key
        if key not in self._targets:
            self._targets[key] = self.relabel_target(physical)
        return self._targets[key]

    def relabel_target(self, physical: pa.Schema) -> pa.Schema | None:
        """The output schema for files of `physical`, if converting them is only a relabel:
        the same columns by field id, in the same order, of the same Arrow types (nested columns:
        the same Iceberg type, children and their ids included, and the same Arrow type)."""
        try:
            file_schema = pyarrow_to_schema(
                physical,
                self._metadata.name_mapping(),
                downcast_ns_timestamp_to_us=self._downcast,
                format_version=self._metadata.format_version,
            )
        except ValueError:  # no field ids and no name mapping: ArrowScan decides what that means
            return None
        columns, wanted = file_schema.columns, self._schema.columns
        if [f.field_id for f in columns] != [f.field_id for f in wanted]:
            return None
        if any(
            isinstance(f.field_type, NestedType) and f.field_type != w.field_type
            for f, w in zip(columns, wanted, strict=True)
        ):
            return None
        empty = pa.RecordBatch.from_arrays([pa.array([], f.type) for f in physical], schema=physical)
        scanned = to_requested_schema(
            self._schema,
            file_schema,
            empty,
            downcast_ns_timestamp_to_us=self._downcast,
            allow_timestamp_tz_mismatch=True,
        )
        target = self._convert(scanned).schema
        same = len(target) == len(physical) and all(
            t.type == p.type and (t.nullable or not p.nullable) for t, p in zip(target, physical, strict=False)
        )
        return target if same else None

    def _scan(
        self, target: pa.Schema, run: list[tuple[Any, ds.ParquetFileFragment]], found: dict[int, int]
    ) -> Iterator[pa.RecordBatch]:
        """Scan files of one physical schema, a window of at most READAHEAD_BYTES at a time
        (large files: one at a time, so memory stays at one file's row group). `found`: where its
        lineage columns are (lineage_positions)."""
        window: list[tuple[Any, ds.ParquetFileFragment]] = []  # (SourceFile-like, its fragment)
        window_bytes = 0
        for item in run:
            if window and window_bytes + item[0].size > READAHEAD_BYTES:
                yield from self._scan_window(target, window, found)
                window, window_bytes = [], 0
            window.append(item)
            window_bytes += item[0].size
        if window:
            yield from self._scan_window(target, window, found)

    def _scan_window(self, target: pa.Schema, window: list, found: dict[int, int]) -> Iterator[pa.RecordBatch]:
        sources = [s for s, _ in window]
        fragments = [f for _, f in window]
        dataset = ds.FileSystemDataset(fragments, fragments[0].physical_schema, self._format, fragments[0].filesystem)
        scanner = dataset.scanner(use_threads=True, fragment_readahead=len(fragments), batch_readahead=4)
        by_path = {f.path: s for s, f in window}
        offsets = dict.fromkeys(by_path, 0)  # rows of each file seen so far: its next row's position
        lineage_columns, lineage_ids = set(found.values()), (ROW_ID_FIELD_ID, LAST_UPDATED_FIELD_ID)
        read = 0
        try:
            # tagged batches come in each file's row order, so a file's positions can be counted
            for tagged in scanner.scan_batches():
                raw, path = tagged.record_batch, tagged.fragment.path
                read += raw.num_rows
                self.rows_read += raw.num_rows
                start = offsets[path]
                offsets[path] += raw.num_rows
                columns = [c for i, c in enumerate(raw.columns) if i not in lineage_columns] if found else raw.columns
                batch = pa.RecordBatch.from_arrays(columns, schema=target)
                if self._lineage:
                    row_ids, updated = (raw.column(found[i]) if i in found else None for i in lineage_ids)
                    batch = add_lineage(batch, by_path[path], start, row_ids, updated)
                if self._deletes is not None:
                    batch = self._deletes.apply(by_path[path], start, batch)
                yield batch
        except (OSError, pa.ArrowException) as exc:
            raise self._culprit(sources, fragments, exc) from exc
        expected = sum(s.records for s in sources)
        if read != expected:
            raise InputFileError(f"the group's data files have {read} rows but their manifest entries say {expected}")

    @staticmethod
    def _culprit(sources: list, fragments: list[ds.ParquetFileFragment], exc: Exception) -> InputFileError:
        """After a bulk scan failed: read the files one by one to name the bad one."""
        for source, fragment in zip(sources, fragments, strict=True):
            try:
                fragment.to_table(use_threads=False)
            except (OSError, pa.ArrowException) as own:
                return _unreadable(source.path, own)
        return InputFileError(f"cannot read the group's data files: {type(exc).__name__}: {exc}")

    def _project_all(self, sources: list, remote: bool) -> Iterator[pa.RecordBatch]:
        """`sources` through ArrowScan in order; on an object store with the next files' bytes
        fetched meanwhile."""
        if not remote or OVERLAP_FILES <= 1:
            for source in sources:
                yield from self._project(source)
            return
        with ThreadPoolExecutor(OVERLAP_FILES) as pool:
            queue: deque[tuple[Any, Future | None]] = deque()  # (SourceFile-like, its bytes being fetched)
            held = 0  # bytes of the queued files and of the one being projected
            upcoming = iter(sources)
            pending = next(upcoming, None)
            while pending is not None or queue:
                # fetch ahead while the window has room; a file over the budget is read in its turn
                while pending is not None and len(queue) < OVERLAP_FILES:
                    fits = pending.size <= READAHEAD_BYTES
                    if fits and held + pending.size > READAHEAD_BYTES and queue:
                        break
                    queue.append((pending, pool.submit(_fetch, self._io, pending.path) if fits else None))
                    held += pending.size if fits else 0
                    pending = next(upcoming, None)
                source, fetch = queue.popleft()
                if fetch is None:
                    yield from self._project(source)
                    continue
                try:
                    data = fetch.result()
                except Exception as exc:
                    raise _unreadable(source.path, exc) from exc
                yield from self._project(source, _FetchedIO(self._io, source.path, data))
                held -= source.size  # counted until projected: held bytes include the current file's

    def _project(self, source, io: FileIO | None = None) -> Iterator[pa.RecordBatch]:  # noqa: ANN001 - SourceFile
        read = 0
        io = io or self._io
        batches = projected_batches(self._metadata, io, self._read_schema, source, self._partition, self._spec_id)
        for batch in batches:
            if self._lineage:  # the lineage columns come last (_read_schema)
                data = pa.RecordBatch.from_arrays(batch.columns[:-2], schema=pa.schema(list(batch.schema)[:-2]))
                converted = add_lineage(self._convert(data), source, read, batch.column(-2), batch.column(-1))
            else:
                converted = self._convert(batch)
            if self._deletes is not None:
                converted = self._deletes.apply(source, read, converted)
            read += batch.num_rows
            self.rows_read += batch.num_rows
            yield converted


def projected_batches(
    metadata: TableMetadata,
    io: FileIO,
    schema: Schema,
    source,  # noqa: ANN001 - anything with path, size and records (SourceFile, TierFile)
    partition: Record,
    spec_id: int,
    what: str = "data file",
) -> Iterator[pa.RecordBatch]:
    """One file's rows projected onto `schema` by pyiceberg's ArrowScan (by field id, else the
    table's name mapping), streamed. Raises InputFileError naming the file when it cannot be read
    or holds another row count than its manifest entry says."""
    scan = ArrowScan(metadata, io, schema, AlwaysTrue())
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=source.path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=source.records,
        file_size_in_bytes=source.size,
    )
    data_file.spec_id = spec_id
    # The generator behind ArrowScan.to_record_batches, without its whole-file materialisation.
    batches = scan_batches_with_deletes(scan, [FileScanTask(data_file)])
    read = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            break
        except Exception as exc:
            raise InputFileError(f"cannot read {what} {source.path}: {type(exc).__name__}: {exc}") from exc
        read += batch.num_rows
        yield batch
    if read != source.records:
        raise InputFileError(f"{what} {source.path} has {read} rows but its manifest entry says {source.records}")


def _locate(io: PyArrowFileIO, path: str) -> tuple[str, pa.fs.FileSystem]:
    scheme, netloc, local = PyArrowFileIO.parse_location(path, io.properties)
    return local, io.fs_by_scheme(scheme, netloc)


def _fetch(io: FileIO, location: str) -> pa.Buffer:
    """A whole file's bytes (one GET on an object store)."""
    with io.new_input(location).open(seekable=False) as stream:
        return stream.read_buffer() if isinstance(stream, pa.NativeFile) else pa.py_buffer(stream.read())


def _is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file:")


class _FetchedInput(InputFile):
    def __init__(self, location: str, data: pa.Buffer) -> None:
        super().__init__(location)
        self._data = data

    def __len__(self) -> int:
        return self._data.size

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return pa.BufferReader(self._data)


class _FetchedIO(FileIO):
    """A FileIO that serves one file from memory (its fetched bytes) and delegates the rest."""

    def __init__(self, io: FileIO, location: str, data: pa.Buffer) -> None:
        super().__init__(io.properties)
        self._io, self._location, self._data = io, location, data

    def new_input(self, location: str) -> InputFile:
        return _FetchedInput(location, self._data) if location == self._location else self._io.new_input(location)

    def new_output(self, location: str) -> OutputFile:
        return self._io.new_output(location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        self._io.delete(location)


def _schema_key(schema: pa.Schema) -> str:
    """Names, types and field ids: pa.Schema equality ignores field metadata, where the ids live."""
    return schema.to_string(show_field_metadata=True, show_schema_metadata=False)


def _load_footer(fragment: ds.ParquetFileFragment) -> Exception | None:
    try:
        fragment.ensure_complete_metadata()
    except (OSError, pa.ArrowException) as exc:
        return exc
    return None


def _unreadable(path: str, exc: Exception) -> InputFileError:
    return InputFileError(f"cannot read data file {path}: {type(exc).__name__}: {exc}")


def _count_mismatch(path: str, rows: int, records: int) -> InputFileError:
    return InputFileError(f"data file {path} has {rows} rows but its manifest entry says {records}")
