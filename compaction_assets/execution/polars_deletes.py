"""Merge-on-read on the Polars path: which rows of each source its delete files delete.

The rules are the Arrow path's own (execution/deletes.GroupDeletes: position deletes, equality
deletes with null-safe equality and the per-source applying files); only their input differs.
Position deletes need nothing of the source; equality deletes need its key columns, read here
alone (by the names Polars will read it by: a Polars group's names are its field ids), cast to the
table's types. The result is each source's deleted positions, sorted, unique and within its
records; the Polars scan numbers its rows across the sources and drops those (polars_rewrite).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO

from compaction_assets.execution.deletes import GroupDeletes

_NONE = np.empty(0, dtype=np.int64)


def deleted_positions(
    deletes: GroupDeletes, io: FileIO, sources: Sequence, target: pa.Schema, physical: Sequence[str]
) -> list[np.ndarray]:
    """Per source (SourceFile-like: path, records, deletes), the positions its delete files
    delete. `target` is the group's output schema and `physical` the first source's column names,
    position for position (the Polars path's relabel). Raises ValueError if a source's key columns
    do not hold its manifest's record count (the per-file path then reports the file)."""
    by_name = dict(zip(target.names, physical, strict=True))
    positions = []
    for source in sources:
        if not source.deletes or not source.records:
            positions.append(_NONE)
            continue
        names = deletes.key_columns(source)
        keys = _key_columns(io, source.path, [by_name[n] for n in names], target, names) if names else None
        if keys is not None and keys.num_rows != source.records:
            raise ValueError(f"{source.path}: {keys.num_rows} rows, its manifest entry says {source.records}")
        mask = deletes.deleted(source, 0, source.records, keys)
        positions.append(_NONE if mask is None else np.flatnonzero(mask).astype(np.int64))
    deletes.rows_deleted += sum(len(p) for p in positions)
    return positions


def _key_columns(io: FileIO, path: str, columns: list[str], target: pa.Schema, names: list[str]) -> pa.RecordBatch:
    """`columns` of the file at `path`, as one batch named `names` in `target`'s types."""
    with io.new_input(path).open() as stream:
        table = pq.read_table(stream, columns=columns, use_threads=False)
    arrays = [table.column(c).cast(target.field(n).type).combine_chunks() for c, n in zip(columns, names, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, names=names)
