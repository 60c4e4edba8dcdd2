"""Sorting a file group larger than memory: a distribution sort over Arrow IPC spill runs.

A group that fits the budget (Arrow bytes) is sorted in memory. A larger one is spilled as it is
read into one run on local disk (Spark's local dir, else the temp dir), then split by key range:
a pass over the run samples its first sort column (and its smallest and largest value), splitter
values are the sample's quantiles over its rows (`Splitters`: a value that fills a range's share
of the sample gets a run of its own), and a second pass sends each row to the run of its range
(one vectorised `take` per batch). Each range run is sorted the same way, in memory once it fits
the budget, so a range that stays too large is split again, and a run whose rows all share the
column's value (a heavy value's) is split on the next sort column; a range equal on every
key is written as it is. Ranges come out in key order: ascending or descending as the column's
direction says, then NaN, then null (pyarrow's order with nulls at the end). So memory holds at
most about twice the budget (a range and its sorted copy), whatever the group's size; no row is
handled in Python.

Z-order sorts by a computed z-value (execution/zorder.py): the input run is spilled while the
z-order columns' ranges are measured, the z-value is added as a column when the run is split and
dropped before rows leave the sort.

Runs are not compressed: on the bench's sorted group (265 MB of Parquet, ~360 MB of Arrow, spilled
twice) LZ4 cost 1.9 s of 13.8 s on one core and saved little (random doubles and strings), while
freshly written runs are read back from the page cache. Local disk needs about twice the group's
Arrow size while it sorts.

The spill folder (prefix `compaction-sort-`) is removed when the sort's iterator ends, is closed
or fails: callers close it (contextlib.closing) when they stop early.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compaction_assets.execution.zorder import ZRange
from compaction_assets.lake import ordinal
from compaction_assets.planning.policy import DEFAULT_SORT_MEMORY

SAMPLE_ROWS = 20_000  # sampled from a run (at most about this many) when choosing its splitters
MAX_RANGES = 128  # ranges of one split (a 2 GB Parquet group is ~4 GB of Arrow: ~32 MiB each); with
# heavy values' buckets and the ends, a split writes at most 3 * MAX_RANGES + 4 runs at once
OUTPUT_ROWS = 65_536  # rows per batch handed on
Z_COLUMN = "_compaction_zorder_value"

Transform = Callable[[pa.RecordBatch], pa.RecordBatch] | None


@dataclass(frozen=True)
class SortSpec:
    """How a group is ordered: by `keys` ((column, ascending|descending), in the file schema), or,
    when `zorder` names columns, by their z-value (keys are then ignored)."""

    keys: tuple[tuple[str, str], ...] = ()
    zorder: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.keys or self.zorder)


def spill_root() -> str:
    """Spark's local dir in a Spark Python worker (SPARK_LOCAL_DIRS), else the temp dir."""
    return os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or tempfile.gettempdir()


class _Run:
    """One spill run: an Arrow IPC stream file, written once, read back batch by batch."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bytes = 0
        self.rows = 0
        self._open: tuple[pa.NativeFile, pa.ipc.RecordBatchStreamWriter] | None = None  # sink, writer

    def write(self, batch: pa.RecordBatch) -> None:
        if self._open is None:
            sink = pa.OSFile(str(self.path), "wb")
            self._open = sink, pa.ipc.new_stream(sink, batch.schema)
        self._open[1].write_batch(batch)
        self.bytes += batch.nbytes
        self.rows += batch.num_rows

    def close(self) -> None:
        if self._open is not None:
            sink, writer = self._open
            writer.close()
            sink.close()
            self._open = None

    def batches(self) -> Iterator[pa.RecordBatch]:
        self.close()
        if not self.rows:
            return
        with pa.OSFile(str(self.path), "rb") as source:
            yield from pa.ipc.open_stream(source)

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class ExternalSort:
    """Sorts record batches by `spec` within `budget_bytes` of Arrow data in memory (about twice
    that at peak), spilling under `spill_dir` (default: spill_root()). `spill_files` and
    `spilled_bytes` say how much went to disk."""

    def __init__(self, spec: SortSpec, budget_bytes: int = DEFAULT_SORT_MEMORY, spill_dir: str | None = None):
        if not spec:
            raise ValueError("an external sort needs sort keys or z-order columns")
        self.spec = spec
        self.budget = max(1, budget_bytes)
        self.spill_dir = spill_dir
        self.spill_files = 0
        self.spilled_bytes = 0
        self._folder: Path | None = None
        self._rng = np.random.default_rng(0)
        self._keys = ((Z_COLUMN, "ascending"),) if spec.zorder else spec.keys

    def sorted(self, batches: Iterable[pa.RecordBatch]) -> Generator[pa.RecordBatch, None, None]:
        """The rows of `batches` in order (a generator: close it to stop early)."""
        source = _one_schema(batches)
        held: list[pa.RecordBatch] = []
        size = 0
        for batch in source:
            held.append(batch)
            size += batch.nbytes
            if size > self.budget:
                break
        else:
            if held:
                yield from self._in_memory(pa.Table.from_batches(held))
            return
        self._folder = Path(tempfile.mkdtemp(prefix="compaction-sort-", dir=self.spill_dir or spill_root()))
        try:
            zrange = ZRange(self.spec.zorder) if self.spec.zorder else None
            run = self._new_run()
            for batch in _chain(held, source):
                if zrange is not None:
                    zrange.observe(batch)
                run.write(batch)
            self._account(run)
            transform = _adding_z(zrange) if zrange is not None else None
            yield from self._emit(run, 0, transform)
        finally:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    # ------------------------------------------------------------------ in memory

    def _in_memory(self, table: pa.Table) -> Iterator[pa.RecordBatch]:
        if self.spec.zorder:
            zrange = ZRange(self.spec.zorder)
            zrange.observe(table)
            order = np.argsort(zrange.z_values(table), kind="stable")
            yield from table.take(pa.array(order)).to_batches(OUTPUT_ROWS)
            return
        yield from _sorted_table(table, self._keys).to_batches(OUTPUT_ROWS)

    # ------------------------------------------------------------------ spilled

    def _new_run(self) -> _Run:
        if self._folder is None:
            raise RuntimeError("a spill run outside a spilled sort (no spill folder)")
        self.spill_files += 1
        return _Run(self._folder / f"run-{self.spill_files:06d}.arrows")

    def _account(self, run: _Run) -> None:
        run.close()
        self.spilled_bytes += run.bytes

    def _emit(self, run: _Run, level: int, transform: Transform) -> Iterator[pa.RecordBatch]:
        """The rows of `run` in order; rows of one run are equal on the keys before `level`."""
        if run.bytes <= self.budget:
            batches = [transform(b) if transform else b for b in run.batches()]
            run.delete()
            if batches:
                ordered = _sorted_table(pa.Table.from_batches(batches), self._keys)
                del batches  # only the sorted copy stays while its rows are handed on
                yield from self._output(ordered)
            return
        if level == len(self._keys):  # equal on every key (e.g. the last key's NaN or null rows): any order
            for batch in run.batches():
                yield from self._output(transform(batch) if transform else batch)
            run.delete()
            return
        name, direction = self._keys[level]
        ranges = max(2, min(MAX_RANGES, -(-run.bytes * 2 // self.budget)))
        splitters = self._survey(run, name, transform, ranges)
        if splitters is None:  # every row equal on this key
            yield from self._emit(run, level + 1, transform)
            return
        buckets = self._split(run, name, direction, splitters, transform)
        run.delete()
        for bucket, equal in buckets:
            yield from self._emit(bucket, level + 1 if equal else level, None)

    def _output(self, rows: pa.Table | pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        if self.spec.zorder:
            rows = rows.drop_columns([Z_COLUMN])
        yield from rows.to_batches(OUTPUT_ROWS) if isinstance(rows, pa.Table) else [rows]

    def _survey(self, run: _Run, name: str, transform: Transform, ranges: int) -> Splitters | None:
        """Splitters of column `name` into about `ranges` ranges of equal rows (see Splitters), from
        a random sample of its values and its smallest and largest value; None when the run cannot
        be split on it (every row equal: one value, all NaN or all null)."""
        picked: list[pa.Array] = []
        share = min(1.0, SAMPLE_ROWS / max(run.rows, 1))
        low = high = None
        kinds: set[str] = set()
        for batch in run.batches():
            column = _comparable((transform(batch) if transform else batch).column(name))
            values = _values(column, kinds)
            if not len(values):
                continue
            kinds.add("value")
            low, high = _widen(low, high, values)
            rows = self._rng.choice(len(values), size=self._rng.binomial(len(values), share), replace=False)
            picked.append(values.take(pa.array(np.sort(rows), pa.int64())))
        spread = low is not None and pc.less(low, high).as_py()
        if len(kinds) < 2 and not spread:
            return None
        if low is None:  # NaN and null only: they split apart without splitters
            return Splitters(pa.array([]), pa.array([]))
        return Splitters.from_sample(pa.concat_arrays(picked), low, high, ranges)

    def _split(
        self, run: _Run, name: str, direction: str, splitters: Splitters, transform: Transform
    ) -> list[tuple[_Run, bool]]:
        """Rows of `run` into key-range runs, in output order, each with whether its rows are all
        equal on `name` (a heavy value's, the NaN and the null run)."""
        main = splitters.buckets
        runs = [self._new_run() for _ in range(main + 2)]  # value buckets, then NaN, then null
        for batch in run.batches():
            if transform:
                batch = transform(batch)
            column = _comparable(batch.column(name))
            ids = splitters.bucket_ids(column)
            ids[ordinal.is_nan(column)] = main
            ids[np.asarray(column.is_null(), dtype=bool)] = main + 1
            order = np.argsort(ids, kind="stable")
            grouped = batch.take(pa.array(order))
            ends = np.cumsum(np.bincount(ids, minlength=main + 2))
            start = 0
            for bucket, end in enumerate(ends):
                if end > start:
                    runs[bucket].write(grouped.slice(start, end - start))
                start = end
        for r in runs:
            self._account(r)
        equal = splitters.equal_buckets()
        values = [(r, k in equal) for k, r in enumerate(runs[:main])]
        if direction != "ascending":
            values.reverse()
        ordered = [*values, (runs[main], True), (runs[main + 1], True)]
        kept = []
        for r, same in ordered:
            if r.rows:
                kept.append((r, same))
            else:
                r.delete()
        return kept


@dataclass(frozen=True)
class Splitters:
    """How one split sends values to buckets, in ascending order: `values` (sorted, distinct) cut
    the range (a bucket takes the values above one and up to the next), and each of `heavy` (some
    of `values`) gets a bucket of its own holding only rows equal to it.

    Splitters are the sample's quantiles over its rows, so ranges hold about equal rows; a value
    that fills a good part of a range in the sample is heavy, so its rows leave the range at once
    and go on to the next sort key, however many there are: a value that quantiles of the distinct
    values would miss (one of ~1,000 in the sample holding 95% of the rows) was otherwise split off
    a little at a time, the run written again at every split. The run's smallest and largest value
    are always splitters: no bucket holds every row."""

    values: pa.Array
    heavy: pa.Array

    @classmethod
    def from_sample(cls, sample: pa.Array, low: pa.Scalar, high: pa.Scalar, ranges: int) -> Splitters:
        """Splitters for about `ranges` ranges: the sample's quantiles over its rows, its values
        that fill a range's share of it (at most `ranges` of them: heavy), the run's ends."""
        ordered = sample.take(pc.sort_indices(sample))
        at: np.ndarray | list[int] = (
            np.arange(1, ranges, dtype=np.int64) * len(ordered) // ranges if len(ordered) else []
        )
        counts = pc.value_counts(ordered)
        share = max(2, len(ordered) // ranges)
        heavy = counts.field("values").filter(pc.greater_equal(counts.field("counts"), share))
        ends = pa.array([low, high], type=low.type)  # not through Python: a timestamp past year 9999
        values = pa.concat_arrays([ordered.take(pa.array(at, pa.int64())), heavy, ends])
        return cls(_sorted_distinct(values), _sorted_distinct(heavy))

    @property
    def buckets(self) -> int:
        return len(self.values) + len(self.heavy) + 1

    def bucket_ids(self, column: pa.Array) -> np.ndarray:
        """Each value's bucket: how many splitters it is above, plus how many heavy values it is at
        or above (NaN and null: any)."""
        return _count_below(column, self.values, strict=True) + _count_below(column, self.heavy, strict=False)

    def equal_buckets(self) -> set[int]:
        """The buckets holding one heavy value's rows."""
        if not len(self.heavy):
            return set()
        return set(self.bucket_ids(self.heavy).tolist())


def _values(column: pa.Array | pa.ChunkedArray, kinds: set[str]) -> pa.Array | pa.ChunkedArray:
    """A column's values that are neither NaN nor null; adds "nan" and "null" to `kinds` if it holds them."""
    nan = ordinal.is_nan(column)
    null = np.asarray(column.is_null(), dtype=bool)
    kinds.update(k for k, flags in (("nan", nan), ("null", null)) if flags.any())
    return column.filter(pa.array(~(nan | null))) if (nan.any() or null.any()) else column


def _widen(low: pa.Scalar | None, high: pa.Scalar | None, values: pa.Array | pa.ChunkedArray) -> tuple:
    """Decides the smallest and largest value so far, given the next (non-empty) values."""
    bounds = pc.min_max(values)
    low = bounds["min"] if low is None or pc.less(bounds["min"], low).as_py() else low
    high = bounds["max"] if high is None or pc.greater(bounds["max"], high).as_py() else high
    return low, high


def _count_below(column: pa.Array, splitters: pa.Array, strict: bool) -> np.ndarray:
    """For each value, how many (ascending) splitters are below it (`strict`), or at or below it
    (nulls and NaN: any). Numbers and temporals by a binary search on their order-preserving keys,
    which are exact for them (lake/ordinal.py); strings, binary and decimals by one comparison per
    splitter."""
    t = column.type
    if not len(splitters):
        return np.zeros(len(column), dtype=np.int64)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t) or pa.types.is_boolean(t):
        keys, _ = ordinal.ordinals(column)
        bounds, _ = ordinal.ordinals(splitters.cast(t))
        return np.searchsorted(bounds, keys, side="left" if strict else "right").astype(np.int64)
    above = pc.greater if strict else pc.greater_equal
    ids = np.zeros(len(column), dtype=np.int64)
    for value in splitters:
        ids += np.asarray(above(column, value).fill_null(False), dtype=np.int64)
    return ids


def _sorted_distinct(values: pa.Array) -> pa.Array:
    distinct = pc.unique(values)
    return distinct.take(pc.sort_indices(distinct))


def _sorted_table(table: pa.Table, keys: tuple[tuple[str, str], ...]) -> pa.Table:
    # the key columns in one chunk each: pyarrow sorts a table of many chunks by several keys
    # 3-4x slower (1.2M rows of 60 chunks by a string and a double: 2.0 s, one chunk: 0.55 s)
    view = pa.table({name: _comparable(table.column(name)).combine_chunks() for name in dict(keys)})
    return table.take(pc.sort_indices(view, sort_keys=list(keys)))  # nulls at the end (the default)


def _comparable(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """An extension column (a uuid: extension<arrow.uuid>) as its storage, which pyarrow sorts and
    compares in the same order (a uuid's 16 bytes); any other column as it is."""
    if not isinstance(column.type, pa.BaseExtensionType):
        return column
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array([c.storage for c in column.chunks], column.type.storage_type)
    return column.storage


def _adding_z(zrange: ZRange) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    def add(batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.append_column(Z_COLUMN, pa.array(zrange.z_values(batch), pa.uint64()))

    return add


def _one_schema(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`batches` in the first one's Arrow schema: files written before and after a schema change
    project to different Arrow types (string vs large_string), and a table or an IPC run holds one."""
    schema = None
    for batch in batches:
        if schema is None:
            schema = batch.schema
        elif batch.schema != schema:
            batch = batch.cast(schema)
        yield batch


def _chain(first: list[pa.RecordBatch], rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`first` (handed over, not kept) then `rest`."""
    while first:
        yield first.pop(0)
    yield from rest
