"""Merge-on-read on the Polars path: which rows of each source its delete files delete.

The rules are the Arrow path's own (execution/deletes.GroupDeletes: position deletes, equality
deletes with null-safe equality and the per-source applying files); only their input differs.
Position deletes need nothing of the source; equality deletes need its key columns, read here
alone by one Polars scan over the sources (by the names Polars will read them by: a Polars
group's names are its field ids), cast to the table's types. The result is each source's deleted
positions, sorted, unique and within its records; the Polars scan numbers its rows across the
sources and drops those (polars_rewrite). That numbering offsets each source's positions by the
records of the sources before it, so every source's row count is checked against its manifest
entry here (as its key columns came, else from its footer): two wrong counts that cancel out
would otherwise move deletes onto other rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO

from compaction_assets.execution.deletes import GroupDeletes
from compaction_assets.execution.polars_storage import PolarsStorage, footer_reads

if TYPE_CHECKING:
    import polars as pl

_NONE = np.empty(0, dtype=np.int64)
FOOTER_READERS = 8  # footers read at once: small reads, mostly waiting on storage
# The sources whose key columns one scan reads and holds (a few copies, as Polars, Arrow and cast):
# at most this many rows (32 MB of longs) and this many source bytes. Keys of variable width
# (strings, binary) may decode to many times their source bytes (an outside attack held 234 MB of
# 2,000-character keys at a 930 MB peak with the row bound alone): their first window is one
# source, and each later one holds as many source bytes as decode to about KEY_WINDOW_DECODED by
# the largest ratio of decoded key bytes to source bytes seen so far, and at most KEY_WINDOW_GROWTH
# times the previous window's (a small first source, mostly footer, gave a ratio far too low:
# a second attack's window decoded to 7x the bound).
KEY_WINDOW_ROWS = 4_000_000
KEY_WINDOW_BYTES = 64 * 1024 * 1024
KEY_WINDOW_DECODED = 32 * 1024 * 1024
KEY_WINDOW_GROWTH = 4
# the key scan's file-path column: a group whose files have a column of this name takes the per-file path
FILE_COLUMN = "__compaction_file"


def deleted_positions(
    deletes: GroupDeletes,
    storage: PolarsStorage,
    sources: Sequence,
    target: pa.Schema,
    physical: Sequence[str],
    footer_bytes: int,
) -> list[np.ndarray]:
    """Per source (SourceFile-like: path, records, deletes), the positions its delete files
    delete. `target` is the group's output schema and `physical` the first source's column names,
    position for position (the Polars path's relabel); `footer_bytes` the size of its footer.
    Raises ValueError if a source does not hold its manifest's record count (the per-file path
    then fails the group, naming the file)."""
    by_name = dict(zip(target.names, physical, strict=True))
    wanted = [deletes.key_columns(s) if s.deletes and s.records else [] for s in sources]
    names = list(dict.fromkeys(n for w in wanted for n in w))
    uniform = deletes.uniform_keys(sources) if names else None
    read = _source_reads(storage, sources, target, names, by_name, footer_bytes, uniform)
    positions = []
    for source, source_keys, (batch, rows) in zip(sources, wanted, read, strict=True):
        if rows != source.records:
            raise ValueError(f"{source.path} has {rows} rows but its manifest entry says {source.records}")
        mask = _source_mask(deletes, source, bool(source_keys), batch, rows, uniform is not None)
        positions.append(_NONE if mask is None else np.flatnonzero(mask).astype(np.int64))
    deletes.rows_deleted += sum(len(p) for p in positions)
    return positions


def _source_reads(
    storage: PolarsStorage,
    sources: Sequence,
    target: pa.Schema,
    names: list[str],
    by_name: dict[str, str],
    footer_bytes: int,
    uniform: tuple | None,
) -> Iterator[tuple[pa.RecordBatch | np.ndarray | None, int]]:
    """Decides how the sources are read: a membership mask (uniform keys), key columns, or footers alone."""
    if uniform is not None:  # the scan tests each row's key itself: a mask per source
        name, keys, nulls = uniform
        return _key_columns(storage, sources, [by_name[name]], target, [name], footer_bytes, (keys, nulls))
    if names:
        return _key_columns(storage, sources, [by_name[n] for n in names], target, names, footer_bytes)
    if storage.io is None:
        raise ValueError("Polars storage without a FileIO cannot read the sources' footers")
    return ((None, rows) for rows in _row_counts(storage.io, sources))


def _source_mask(
    deletes: GroupDeletes,
    source: Any,
    has_keys: bool,
    batch: pa.RecordBatch | np.ndarray | None,
    rows: int,
    uniform: bool,
) -> np.ndarray | None:
    """Decides a source's deleted-row mask (None: no row deleted) from its deletes and key read."""
    if not (source.deletes and rows):
        return None
    if not uniform:
        return deletes.deleted(source, 0, rows, batch if has_keys else None)
    mask = deletes.deleted_by_position(source, 0, rows)
    if has_keys:
        mask = batch if mask is None else mask | batch
    return mask


def _key_columns(
    storage: PolarsStorage,
    sources: Sequence,
    columns: list[str],
    target: pa.Schema,
    names: list[str],
    footer_bytes: int,
    member: tuple[np.ndarray, bool] | None = None,
) -> Iterator[tuple[pa.RecordBatch | np.ndarray, int]]:
    """Per source, in order: its `columns` as a batch named `names` in `target`'s types, and its
    row count. One Polars scan per window of sources (KEY_WINDOW_ROWS, KEY_WINDOW_BYTES and
    KEY_WINDOW_DECODED). With `member` (keys as int64, whether NULL is one; one integer column):
    instead of the batch, a bool per row, whether its key is one of them (NULL matching NULL)."""
    import polars as pl

    wanted = _key_expressions(columns, names, member)
    variable = member is None and any(_variable_width(target.field(n).type) for n in names)
    start, ratio, previous = 0, None, 0  # ratio: the most decoded key bytes per source byte a window has held
    while start < len(sources):
        budget = _window_budget(variable, ratio, previous)
        end, size = _window_end(sources, start, budget)
        window = sources[start:end]
        paths = [storage.path(s.path) for s in window]
        with footer_reads(footer_bytes):
            frame = pl.scan_parquet(
                paths,
                glob=False,
                hive_partitioning=False,
                missing_columns="raise",
                extra_columns="ignore",
                storage_options=storage.options,
                include_file_paths=FILE_COLUMN,
            )
            read = frame.select([*wanted, FILE_COLUMN]).collect()
        files, lengths = _runs(read.get_column(FILE_COLUMN))
        read = read.drop(FILE_COLUMN)
        if variable:  # only variable-width keys are windowed by the decoded size
            previous = size
            if read.estimated_size():
                ratio = max(ratio or 0.0, read.estimated_size() / max(size, 1))
        batch = _key_batch(read, member is not None, target, columns, names)
        del read
        counts = _file_counts(files, lengths, paths)
        yield from _pieces(batch, paths, counts)
        start = end


def _key_expressions(columns: list[str], names: list[str], member: tuple[np.ndarray, bool] | None) -> list:
    """Decides what the key scan selects: the key columns, or with `member` one membership flag."""
    import polars as pl

    if member is not None:
        keys = pl.Series(member[0], dtype=pl.Int64)
        if member[1]:
            keys = keys.extend(pl.Series([None], dtype=pl.Int64))
        return [pl.col(columns[0]).cast(pl.Int64).is_in(keys.implode(), nulls_equal=True).alias(names[0])]
    return [pl.col(c) for c in columns]


def _window_budget(variable: bool, ratio: float | None, previous: int) -> float:
    """Decides a window's source-byte budget: fixed for fixed-width keys, else from the decoded ratio seen."""
    if not variable:
        return KEY_WINDOW_BYTES
    if ratio is None:
        return 0
    return min(KEY_WINDOW_BYTES, KEY_WINDOW_DECODED / ratio, KEY_WINDOW_GROWTH * previous)


def _window_end(sources: Sequence, start: int, budget: float) -> tuple[int, int]:
    """Decides where the window from `start` ends (at least one source) and its source bytes."""
    end, rows, size = start + 1, sources[start].records, sources[start].size
    while end < len(sources) and rows + sources[end].records <= KEY_WINDOW_ROWS and size + sources[end].size <= budget:
        rows, size = rows + sources[end].records, size + sources[end].size
        end += 1
    return end, size


def _key_batch(
    read: pl.DataFrame, member: bool, target: pa.Schema, columns: list[str], names: list[str]
) -> pa.RecordBatch | np.ndarray:
    """Decides a window's result: a bool per row with `member`, else the key columns in `target`'s types."""
    if member:
        return read.get_column(names[0]).to_numpy()
    table = read.to_arrow()
    arrays = [table.column(c).cast(target.field(n).type).combine_chunks() for c, n in zip(columns, names, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _file_counts(files: list[str], lengths: list[int], paths: list[str]) -> dict[str, int]:
    """Rows per file of a window's scan; raises if the scan named files other than the window's."""
    counts = dict(zip(files, lengths, strict=True))
    if len(counts) != len(files) or not set(counts) <= set(paths):
        raise ValueError(
            f"a key-column scan named files other than the group's: {sorted(set(counts) - set(paths))[:3]}"
        )
    return counts


def _pieces(
    batch: pa.RecordBatch | np.ndarray, paths: list[str], counts: dict[str, int]
) -> Iterator[tuple[pa.RecordBatch | np.ndarray, int]]:
    """Splits a window's result per file, in the window's order (a file of no rows gets an empty piece)."""
    offset = 0
    for path in paths:
        count = counts.get(path, 0)
        piece = batch.slice(offset, count) if isinstance(batch, pa.RecordBatch) else batch[offset : offset + count]
        yield piece, count
        offset += count


def _variable_width(t: pa.DataType) -> bool:
    """Strings and binary (equality keys are never nested): Arrow gives them no bit width."""
    try:
        t.bit_width  # noqa: B018 - raises for a type of no fixed width
    except ValueError:
        return True
    return False


def _runs(files: pl.Series) -> tuple[list[str], list[int]]:
    """The runs of equal values of a Polars string column: values, lengths."""
    runs = files.rle().struct.unnest()
    return runs.get_column("value").to_list(), runs.get_column("len").to_list()


def _row_counts(io: FileIO, sources: Sequence) -> Iterator[int]:
    """Each source's row count from its footer, in order, FOOTER_READERS at a time."""

    def rows(path: str) -> int:
        with io.new_input(path).open() as stream:
            return pq.read_metadata(stream).num_rows

    with ThreadPoolExecutor(FOOTER_READERS) as pool:
        yield from pool.map(rows, [s.path for s in sources])
