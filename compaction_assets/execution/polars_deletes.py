"""Merge-on-read on the Polars path: which rows of each source its delete files delete.

The rules are the Arrow path's own (execution/deletes.GroupDeletes: position deletes, equality
deletes with null-safe equality and the per-source applying files); only their input differs.
Position deletes need nothing of the source; equality deletes need its key columns, read here
alone (by the names Polars will read it by: a Polars group's names are its field ids), cast to the
table's types. The result is each source's deleted positions, sorted, unique and within its
records; the Polars scan numbers its rows across the sources and drops those (polars_rewrite).
That numbering offsets each source's positions by the records of the sources before it, so every
source's row count is checked against its manifest entry here (its key columns', else its
footer's): two wrong counts that cancel out would otherwise move deletes onto other rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO

from compaction_assets.execution.deletes import GroupDeletes

_NONE = np.empty(0, dtype=np.int64)
READERS = 8  # sources read at once: footers and key columns are small, mostly waiting on storage
_WINDOW = 64  # sources whose key columns are held at once


def deleted_positions(
    deletes: GroupDeletes, io: FileIO, sources: Sequence, target: pa.Schema, physical: Sequence[str]
) -> list[np.ndarray]:
    """Per source (SourceFile-like: path, records, deletes), the positions its delete files
    delete. `target` is the group's output schema and `physical` the first source's column names,
    position for position (the Polars path's relabel). Raises ValueError if a source does not
    hold its manifest's record count (the per-file path then fails the group, naming the file)."""
    by_name = dict(zip(target.names, physical, strict=True))
    wanted = [deletes.key_columns(s) if s.deletes and s.records else [] for s in sources]
    positions = []
    for source, names, keys in zip(sources, wanted, _read_all(io, sources, wanted, by_name, target), strict=True):
        rows = keys if isinstance(keys, int) else keys.num_rows
        if rows != source.records:
            raise ValueError(f"{source.path} has {rows} rows but its manifest entry says {source.records}")
        if not source.deletes or not source.records:
            positions.append(_NONE)
            continue
        mask = deletes.deleted(source, 0, source.records, keys if names else None)
        positions.append(_NONE if mask is None else np.flatnonzero(mask).astype(np.int64))
    deletes.rows_deleted += sum(len(p) for p in positions)
    return positions


def _read_all(
    io: FileIO, sources: Sequence, wanted: list[list[str]], by_name: dict[str, str], target: pa.Schema
) -> Iterator[pa.RecordBatch | int]:
    """Per source, in order: its key columns (`wanted`), else its footer's row count; read
    READERS at a time, at most _WINDOW sources ahead."""

    def read(k: int) -> pa.RecordBatch | int:
        names = wanted[k]
        if names:
            return _key_columns(io, sources[k].path, [by_name[n] for n in names], target, names)
        with io.new_input(sources[k].path).open() as stream:
            return pq.read_metadata(stream).num_rows

    with ThreadPoolExecutor(READERS) as pool:
        for start in range(0, len(sources), _WINDOW):
            yield from pool.map(read, range(start, min(start + _WINDOW, len(sources))))


def _key_columns(io: FileIO, path: str, columns: list[str], target: pa.Schema, names: list[str]) -> pa.RecordBatch:
    """`columns` of the file at `path`, as one batch named `names` in `target`'s types."""
    with io.new_input(path).open() as stream:
        table = pq.read_table(stream, columns=columns, use_threads=False)
    arrays = [table.column(c).cast(target.field(n).type).combine_chunks() for c, n in zip(columns, names, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, names=names)
