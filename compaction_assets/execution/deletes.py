"""Applying a group's delete files to its source rows while they stream (merge-on-read).

The driver lists, per source, the delete files that apply to it (lake.deletes.ApplyingDeletes);
`GroupDeletes.apply` removes the rows they delete from each batch the SourceReader yields, the
batch already projected onto the current table schema (columns carry their Iceberg field ids):
- **position deletes**: rows of the delete files whose `file_path` is the source's path, at those
  0-based positions. Each position-delete file is read once per group (its file_path column
  dictionary-encoded, only row groups whose file_path statistics admit a source of the group),
  keeping the rows of the group's sources; a source's positions are one
  sorted int64 array (8 bytes per deleted row; repeats are harmless), not a Python set.
  A deletion vector (format version 3: a `deletion-vector-v1` Puffin blob, at its entry's
  content_offset and content_size_in_bytes) holds the positions of the one data file it
  references; only its blob is read, its length, magic and CRC checked.
- **equality deletes**: a row is deleted if its `equality_ids` columns equal, with SQL null-safe
  equality (NULL equals NULL), a row of an applying equality-delete file. Delete values are read
  by field id and cast to the column's current type. All delete files of the group with the same
  set of equality ids share one deduplicated key index, built once, with for each key the delete
  files that hold it; a source then looks up its rows in it and keeps a key only if one of the
  files applying to it holds that key (a byte per key, cached per distinct set of files).
  One integer-like column is matched exactly on a sorted array (`np.searchsorted`); other keys by
  a 64-bit row hash (Polars `hash_rows`) on a sorted hash array, every hash match verified value by
  value (NaN equals NaN and -0.0 is not 0.0, as Java's Double.compare has it; a uuid by its bytes),
  so a collision never deletes a row.
  Memory: the keys once, not a copy per source or per batch (measured: 1 M long keys add ~90 MB to
  the peak while built, ~50 MB after; 1 M (long, string) keys ~125 MB); lookups cost
  O(rows log keys) and never rebuild a hash table.
Equality ids must be top-level columns of the current schema: a key on a dropped or nested field
fails the group (DeleteFileError) before anything is read.
"""

from __future__ import annotations

import bisect
import functools
import zlib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFileContent
from pyiceberg.schema import Schema, sanitize_column_names
from pyiceberg.table.name_mapping import NameMapping
from pyroaring import BitMap

from compaction_assets.errors import InputFileError
from compaction_assets.execution.equality_keys import HashedKeys, IntegerKeys, KeyIndex, as_int64, integer_like

FIELD_ID = b"PARQUET:field_id"
FILE_PATH_ID = 2147483546  # the reserved field ids of a position-delete file's columns (Iceberg spec)
POS_ID = 2147483545
DELETE_READERS = 8  # equality-delete files read at once


class DeleteFileError(InputFileError):
    """A delete file cannot be applied (unreadable, or keyed on a column the table no longer has)."""


class GroupDeletes:
    """The delete files of one group, applied per source batch (see the module doc).

    `sources` are SourceFile-like (path, deletes: indices into `deletes`), `deletes` DeleteSpec-like
    (path, content, equality_ids). Raises DeleteFileError at once for an equality delete keyed on a
    field id the current schema lacks, or on a nested field.
    """

    def __init__(
        self, io: FileIO, schema: Schema, name_mapping: NameMapping | None, sources: Sequence, deletes: Sequence
    ) -> None:
        self._io = io
        self._deletes = deletes
        self._name_mapping = name_mapping
        self._sources = {s.path: s for s in sources}
        self.rows_deleted = 0
        self._positions: dict[str, np.ndarray] | None = None  # loaded on first use, for every source at once
        self._indexes: dict[tuple[int, ...], KeyIndex] = {}
        self._plans: dict[tuple[int, ...], tuple[bool, dict[tuple[int, ...], frozenset[int]]]] = {}  # by deletes
        self._keyed = [
            _ids_key(d.equality_ids) if d.content == DataFileContent.EQUALITY_DELETES else None for d in deletes
        ]
        top_level = {f.field_id: f for f in schema.fields}
        for spec in deletes:
            if spec.content != DataFileContent.EQUALITY_DELETES:
                continue
            for field_id in spec.equality_ids or ():
                if field_id in top_level:
                    continue
                nested = schema.find_column_name(field_id) is not None
                where = "a nested field" if nested else "no column of the current schema"
                raise DeleteFileError(
                    f"equality delete file {spec.path} matches on field id {field_id}, which is {where}: "
                    "it cannot be applied"
                )
            if not spec.equality_ids:
                raise DeleteFileError(f"equality delete file {spec.path} has no equality_ids")
        self._fields = top_level
        self._schema = schema

    @functools.cached_property
    def _names(self) -> dict[int, str]:
        """Column names by field id: converted batches are in the output file schema, the sanitised
        names of the current schema (worked out on first use: most groups have no equality deletes)."""
        return {f.field_id: f.name for f in sanitize_column_names(self._schema).fields}

    def apply(self, source, start: int, batch: pa.RecordBatch) -> pa.RecordBatch:  # noqa: ANN001 - SourceFile
        """`batch` (rows `start`.. of `source`, in the output schema) without its deleted rows."""
        if not source.deletes or batch.num_rows == 0:
            return batch
        try:
            return self._apply(source, start, batch)
        except (OSError, pa.ArrowException) as exc:  # not the data file's fault: say so
            raise DeleteFileError(f"cannot apply delete files to {source.path}: {type(exc).__name__}: {exc}") from exc

    def _apply(self, source, start: int, batch: pa.RecordBatch) -> pa.RecordBatch:  # noqa: ANN001 - SourceFile
        deleted = self.deleted(source, start, batch.num_rows, batch)
        if deleted is None:
            return batch
        removed = int(deleted.sum())
        if removed == 0:
            return batch
        self.rows_deleted += removed
        return batch.filter(pa.array(~deleted))

    def key_columns(self, source) -> list[str]:  # noqa: ANN001 - SourceFile
        """The output-schema columns the equality deletes applying to `source` match on."""
        _, by_ids = self._plan_for(tuple(source.deletes))
        return list(dict.fromkeys(self._names[i] for ids in by_ids for i in ids))

    def deleted(
        self,
        source,  # noqa: ANN001 - SourceFile
        start: int,
        rows: int,
        columns: pa.RecordBatch | pa.Table | None,
    ) -> np.ndarray | None:
        """Which of rows `start`..`start + rows` of `source` its delete files delete (None: none
        apply); `columns` holds those rows' `key_columns`, in the output schema, at least."""
        deleted = self.deleted_by_position(source, start, rows)
        for ids, applying in self._plan_for(tuple(source.deletes))[1].items():
            index = self._indexes.get(ids)
            if index is None:
                index = self._indexes[ids] = self._build_index(ids)
            if columns is None:
                raise ValueError(f"{source.path}: equality deletes apply but no key columns were given")
            hit = index.deleted([columns.column(self._names[i]) for i in ids], applying)
            deleted = hit if deleted is None else deleted | hit
        return deleted

    def deleted_by_position(self, source, start: int, rows: int) -> np.ndarray | None:  # noqa: ANN001 - SourceFile
        """Which of rows `start`..`start + rows` of `source` its position deletes delete (None: none)."""
        if not self._plan_for(tuple(source.deletes))[0]:
            return None
        positions = self._source_positions(source.path)
        lo, hi = np.searchsorted(positions, [start, start + rows])
        if hi == lo:
            return None
        deleted = np.zeros(rows, dtype=bool)
        deleted[positions[lo:hi] - start] = True
        return deleted

    def uniform_keys(self, sources: Sequence) -> tuple[str, np.ndarray, bool] | None:
        """Where the equality deletes applying to each of `sources` (SourceFile-like) are the same
        files, or none, and match on one integer column: its output-schema name, every key they
        hold as int64 (repeats kept) and whether one of them holds NULL. A source's rows are then
        deleted by equality exactly where their key is among these (NULL matching NULL), so a
        reader may test membership itself. Else None (the per-set index applies)."""
        plans = {frozenset(self._plan_for(tuple(s.deletes))[1].items()) for s in sources if s.deletes}
        plans.discard(frozenset())
        if len(plans) != 1:
            return None
        [plan] = plans
        if len(plan) != 1:
            return None
        [(ids, applying)] = plan
        if len(ids) != 1 or not pa.types.is_integer(self._types(ids)[0]):
            return None
        values, nulls = [_EMPTY], False
        for _, table in self._key_parts(ids, applying):
            column = table.column(0).combine_chunks()
            nulls = nulls or column.null_count > 0
            values.append(as_int64(column.drop_null()))
        return self._names[ids[0]], np.concatenate(values), nulls

    def _plan_for(self, applying: tuple[int, ...]) -> tuple[bool, dict[tuple[int, ...], frozenset[int]]]:
        plan = self._plans.get(applying)
        if plan is None:
            plan = self._plans[applying] = self._plan(applying)
        return plan

    def _plan(self, applying: tuple[int, ...]) -> tuple[bool, dict[tuple[int, ...], frozenset[int]]]:
        """Whether position deletes are among `applying`, and its equality deletes by equality ids."""
        by_ids: dict[tuple[int, ...], set[int]] = {}
        has_positions = False
        for i in applying:
            ids = self._keyed[i]
            if ids is None:
                has_positions = True
            else:
                by_ids.setdefault(ids, set()).add(i)
        return has_positions, {ids: frozenset(applying) for ids, applying in by_ids.items()}

    # position deletes

    def _source_positions(self, path: str) -> np.ndarray:
        if self._positions is None:
            self._positions = self._load_positions()
        return self._positions.get(path, _EMPTY)

    def _load_positions(self) -> dict[str, np.ndarray]:
        """Every position-delete file of the group read once, keeping its rows for the group's
        sources; a source's positions sorted (repeats are harmless)."""
        wanted: dict[int, set[str]] = {}
        for source in self._sources.values():
            for i in source.deletes:
                if self._keyed[i] is None:
                    wanted.setdefault(i, set()).add(source.path)
        found: dict[str, list[np.ndarray]] = {}
        for i, paths in wanted.items():
            spec = self._deletes[i]
            if getattr(spec, "content_offset", None) is not None:  # a deletion vector
                if spec.referenced_data_file in paths:
                    found.setdefault(spec.referenced_data_file, []).append(_read_deletion_vector(self._io, spec))
                continue
            try:
                table = self._read(spec.path, {FILE_PATH_ID: "file_path", POS_ID: "pos"}, paths)
                files = table.column(0).unify_dictionaries().combine_chunks()
                if not pa.types.is_dictionary(files.type):
                    files = pc.dictionary_encode(files)
            except (OSError, pa.ArrowException) as exc:
                raise _unreadable(spec.path, exc) from exc
            codes = files.indices.to_numpy(zero_copy_only=False)
            pos = table.column(1).to_numpy()
            for code, path in enumerate(files.dictionary.to_pylist()):
                if path in paths:
                    found.setdefault(path, []).append(pos[codes == code])
        return {path: np.sort(np.concatenate(parts)).astype(np.int64) for path, parts in found.items()}

    def _read(self, path: str, columns: dict[int, str | None], paths: set[str] | None = None) -> pa.Table:
        """Columns of a delete file by field id (else the spec's name, else the table's name
        mapping), named by field id. With `paths`: a position-delete file, its file_path column
        dictionary-encoded, only the row groups whose file_path statistics admit one of `paths`."""
        with self._io.new_input(path).open() as stream:
            # a first column under another name than the spec's is read plain (and encoded by the caller)
            parquet = pq.ParquetFile(stream, read_dictionary=None if paths is None else ["file_path"])
            physical = parquet.schema_arrow
            names = [self._column_name(physical, field_id, fallback, path) for field_id, fallback in columns.items()]
            if paths is None:
                table = parquet.read(columns=names, use_threads=False)
            else:
                groups = _row_groups_admitting(parquet.metadata, names[0], paths)
                table = parquet.read_row_groups(groups, columns=names, use_threads=False)
        return table.rename_columns([str(i) for i in columns])

    def _column_name(self, physical: pa.Schema, field_id: int, fallback: str | None, path: str) -> str:
        for f in physical:
            if f.metadata and f.metadata.get(FIELD_ID) == str(field_id).encode():
                return f.name
        if fallback is not None and fallback in physical.names:
            return fallback
        if self._name_mapping is not None:
            for mapped in self._name_mapping:
                if mapped.field_id == field_id:
                    for name in mapped.names:
                        if name in physical.names:
                            return name
        raise DeleteFileError(f"delete file {path} has no column for field id {field_id}")

    # equality deletes

    def _types(self, ids: tuple[int, ...]) -> list[pa.DataType]:
        return [schema_to_pyarrow(Schema(self._fields[i])).field(0).type for i in ids]

    def _build_index(self, ids: tuple[int, ...]) -> KeyIndex:
        types = self._types(ids)
        parts = self._key_parts(ids, [i for i in range(len(self._deletes)) if self._keyed[i] == ids])
        index = IntegerKeys(parts, types) if len(ids) == 1 and integer_like(types[0]) else HashedKeys(parts, types)
        del parts
        pa.default_memory_pool().release_unused()  # the delete files' buffers: give the pages back
        return index

    def _key_parts(self, ids: tuple[int, ...], files: Iterable[int]) -> list[tuple[int, pa.Table]]:
        """The key columns `ids` of the equality-delete files `files` (indices into the group's
        deletes), in the table's types, 8 files at a time (small files: mostly opening them and
        waiting on storage)."""
        types = self._types(ids)

        def read(i: int) -> tuple[int, pa.Table]:
            path = self._deletes[i].path
            try:
                table = self._read(path, dict.fromkeys(ids))
                return i, pa.table(
                    [c.cast(t) for c, t in zip(table.columns, types, strict=True)], names=table.column_names
                )
            except (OSError, pa.ArrowException) as exc:
                raise _unreadable(path, exc) from exc

        with ThreadPoolExecutor(DELETE_READERS) as pool:
            return list(pool.map(read, sorted(files)))


_EMPTY = np.empty(0, dtype=np.int64)


DV_MAGIC = b"\xd1\xd3\x39\x64"


def _read_deletion_vector(io: FileIO, spec) -> np.ndarray:  # noqa: ANN001 - DeleteSpec
    """The positions a deletion vector deletes: its blob (4-byte big-endian length of magic and
    vector, the magic, a portable 64-bit Roaring bitmap, a big-endian CRC-32 of magic and vector:
    the spec's `deletion-vector-v1`), checked, its cardinality against the entry's record count."""
    offset, length = spec.content_offset, spec.content_size_in_bytes
    try:
        with io.new_input(spec.path).open() as stream:
            stream.seek(offset)
            blob = stream.read(length)
        if len(blob) != length or length < 12:
            raise ValueError(f"the blob at offset {offset} is cut short ({len(blob)} of {length} bytes)")
        size = int.from_bytes(blob[:4], "big")
        body = blob[4 : 4 + size]
        if body[:4] != DV_MAGIC or size + 8 != length:
            raise ValueError(f"no deletion-vector-v1 blob at offset {offset} (length {length})")
        if zlib.crc32(body) != int.from_bytes(blob[4 + size :], "big"):
            raise ValueError(f"the deletion vector at offset {offset} fails its CRC check")
        positions = _roaring64_positions(memoryview(body)[4:])
    except (OSError, ValueError) as exc:
        raise _unreadable(spec.path, exc) from exc
    if len(positions) != spec.records:
        raise _unreadable(
            spec.path,
            ValueError(f"its deletion vector holds {len(positions)} positions, its entry says {spec.records}"),
        )
    return positions


def _roaring64_positions(vector: memoryview) -> np.ndarray:
    """A portable 64-bit Roaring bitmap (a little-endian count of 32-bit bitmaps, each a little-endian
    key, the high 32 bits, and a portable 32-bit bitmap) as sorted int64 positions."""
    count, at, parts = int.from_bytes(vector[:8], "little"), 8, []
    for _ in range(count):
        key = int.from_bytes(vector[at : at + 4], "little")
        bitmap = BitMap.deserialize(bytes(vector[at + 4 :]))
        at += 4 + len(bitmap.serialize())  # portable serialisation keeps each container as read
        parts.append(np.frombuffer(bitmap.to_array(), dtype=np.uint32).astype(np.int64) + (key << 32))
    return np.concatenate(parts) if parts else _EMPTY


def _ids_key(equality_ids: Sequence[int] | None) -> tuple[int, ...]:
    """Equality ids as a set (the order of a file's columns does not change what it deletes)."""
    return tuple(sorted(equality_ids or ()))


def _row_groups_admitting(metadata: pq.FileMetaData, column: str, paths: set[str]) -> list[int]:
    """Row groups whose min/max statistics of `column` admit one of `paths` (all, without them).
    Truncated statistics stay bounds (Parquet writers round a truncated max up), so this is safe."""
    ordered = sorted(p.encode() for p in paths)
    leaf = next((j for j in range(metadata.num_columns) if metadata.schema.column(j).path == column), None)
    groups = []
    for g in range(metadata.num_row_groups):
        stats = metadata.row_group(g).column(leaf).statistics if leaf is not None else None
        if stats is None or not stats.has_min_max:
            groups.append(g)
            continue
        low, high = (v.encode() if isinstance(v, str) else v for v in (stats.min, stats.max))
        k = bisect.bisect_left(ordered, low)
        if k < len(ordered) and ordered[k] <= high:
            groups.append(g)
    return groups


def _unreadable(path: str, exc: Exception) -> DeleteFileError:
    return DeleteFileError(f"cannot read delete file {path}: {type(exc).__name__}: {exc}")
