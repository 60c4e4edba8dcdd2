"""Benchmark data: the same Parquet files registered in an Iceberg table and in a Delta table.

Rows by the dataset's kind:
- flat ("small", "tiny"): id, timestamp, two strings (one random, one low-cardinality), a double
  and an int, as in issue #5;
- typed: every type Iceberg users write that delta-rs also reads (issue 19): decimals, timestamptz,
  timestamp, date, bool, int, long, float, double, nullable strings (10-30% nulls), binary,
  list<string>, struct, map<string,long>. Left out: uuid and fixed (Delta has no such types, so
  convert_to_deltalake refuses them) and time (Delta has none either);
- wide: 200 columns of mixed types, mostly primitives, every tenth one nested.
"sorted" and "zorder" are flat rows in a table with a sort order (city, then price descending) or
z-order columns (price, qty): ours rewrites them sorted (a major: `ordering_properties` makes the
files undersized rather than fragments, so the sorted rewrite of kinds major/full/cluster runs),
Iceberg Java with `rewrite_data_files`' sort strategy.
Files are written once with pyarrow (Snappy, as every contender writes) and hard-linked into the
Iceberg table's data folder, so every contender reads the very same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.sorting import SortDirection
from pyiceberg.transforms import IdentityTransform

from compaction_assets.lake.digest import RowsDigest, batches_digest

CITIES = np.array(["amsterdam", "berlin", "lisbon", "madrid", "oslo", "paris", "rome", "vienna", "warsaw", "zurich"])
CODEC = "snappy"
# The codecs delta-rs's WriterProperties takes, and CODEC under its name there
DeltaCodec = Literal["UNCOMPRESSED", "SNAPPY", "GZIP", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"]
_DELTA_CODECS: dict[str, DeltaCodec] = {
    "uncompressed": "UNCOMPRESSED",
    "snappy": "SNAPPY",
    "gzip": "GZIP",
    "brotli": "BROTLI",
    "lz4": "LZ4",
    "zstd": "ZSTD",
    "lz4_raw": "LZ4_RAW",
}
DELTA_CODEC: DeltaCodec = _DELTA_CODECS[CODEC]


@dataclass(frozen=True)
class Dataset:
    name: str
    files: int
    rows_per_file: int
    kind: str = "flat"  # flat | typed | wide: which rows (see the module docstring)
    # the Spark DataFrame rewrite as an extra anchor: on small only (the full bench's hour; on typed
    # and wide it alone took 1-2 and over 10 minutes on the shared 2-core machine)
    spark_anchor: bool = False
    order: str = "none"  # none | sort | zorder: the table's clustering (see the module docstring)
    # none | equality+position | position: the merge-on-read deletes bench/cdc.py commits after the data
    deletes: str = "none"

    @property
    def rows(self) -> int:
        return self.files * self.rows_per_file


SMALL = Dataset("small", 500, 20_000, spark_anchor=True)
TINY = Dataset("tiny", 5_000, 200)
# typed and wide at ~200 and ~160 MB (were 400 each): Iceberg Java took 24 and 54 s a run on them,
# a third of the full bench's hour at 5 quiet and 3 loaded runs
TYPED = Dataset("typed", 300, 5_000, "typed")
WIDE = Dataset("wide", 80, 2_000, "wide")
WIDE_COLUMNS = 200
SORTED = Dataset("sorted", 300, 20_000, order="sort")
ZORDER = Dataset("zorder", 300, 20_000, order="zorder")
SORT_ORDER = (("city", SortDirection.ASC), ("price", SortDirection.DESC))
ZORDER_COLUMNS = ("price", "qty")


def rows(first_id: int, count: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    letters = rng.integers(97, 123, size=(count, 16), dtype=np.uint8)
    return pa.table(
        {
            "id": pa.array(np.arange(first_id, first_id + count, dtype=np.int64)),
            "ts": pa.array(1_760_000_000_000_000 + rng.integers(0, 86_400_000_000, count), pa.timestamp("us")),
            "name": pa.array(letters.view("S16").ravel().astype(str)),
            "city": pa.array(CITIES[rng.integers(0, len(CITIES), count)]),
            "price": pa.array(rng.random(count) * 1000),
            "qty": pa.array(rng.integers(0, 1000, count, dtype=np.int32)),
        }
    )


def typed_rows(first_id: int, count: int, seed: int) -> pa.Table:
    """Twenty-one columns of every type Iceberg users write (that Delta can hold too)."""
    rng = np.random.default_rng(seed)
    flat = rows(first_id, count, seed).combine_chunks().to_batches()[0]
    cents = rng.integers(-(10**9), 10**9, count)
    words = np.array([f"w{i}" for i in range(50)])
    tag_counts = rng.integers(0, 4, count)
    tag_offsets = np.concatenate([[0], np.cumsum(tag_counts)]).astype(np.int32)
    attr_counts = rng.integers(0, 3, count)
    attr_offsets = np.concatenate([[0], np.cumsum(attr_counts)]).astype(np.int32)
    attrs = int(attr_offsets[-1])
    entry = np.arange(attrs) - np.repeat(attr_offsets[:-1], attr_counts)  # keys unique within a map
    return pa.table(
        {
            "id": flat["id"],
            "amount": _decimals(cents, 18, 2),
            "fee": _decimals(cents // 1000, 9, 2),
            "balance": _decimals(rng.integers(-(10**17), 10**17, count), 38, 10),
            "event_ts": flat["ts"].cast(pa.timestamp("us", tz="UTC")),
            "local_ts": flat["ts"],
            "day": pa.array(20_000 + rng.integers(0, 365, count), pa.int32()).cast(pa.date32()),
            "active": pa.array(rng.random(count) < 0.5),
            "qty": flat["qty"],
            "seq": pa.array(rng.integers(0, 2**40, count), pa.int64()),
            "ratio": pa.array(rng.random(count).astype(np.float32)),
            "price": flat["price"],
            "name": _with_nulls(flat["name"], rng, 0.2),
            "city": _with_nulls(flat["city"], rng, 0.1),
            "note": _with_nulls(pa.array(np.char.add("note ", rng.integers(0, 10**6, count).astype(str))), rng, 0.3),
            "payload": pa.array(rng.integers(0, 256, (count, 12), dtype=np.uint8).view("S12").ravel(), pa.binary()),
            "tags": pa.ListArray.from_arrays(
                tag_offsets, pa.array(words[rng.integers(0, len(words), int(tag_offsets[-1]))])
            ),
            "address": pa.StructArray.from_arrays(
                [_with_nulls(flat["city"], rng, 0.1), pa.array(rng.integers(1000, 9999, count, dtype=np.int32))],
                names=["street", "zip"],
            ),
            "attrs": pa.MapArray.from_arrays(
                attr_offsets,
                pa.array(words[(np.repeat(rng.integers(0, len(words), count), attr_counts) + entry) % len(words)]),
                pa.array(rng.integers(0, 10**6, attrs), pa.int64()),
            ),
            "version": pa.array(rng.integers(0, 100, count, dtype=np.int32)),
            "score": _with_nulls(pa.array(rng.random(count)), rng, 0.15),
        }
    )


def wide_rows(first_id: int, count: int, seed: int) -> pa.Table:
    """WIDE_COLUMNS columns: longs, doubles, strings, dates, bools, decimals, and a list or struct every tenth."""
    rng = np.random.default_rng(seed)
    columns: dict[str, pa.Array] = {"id": pa.array(np.arange(first_id, first_id + count, dtype=np.int64))}
    words = np.array([f"v{i}" for i in range(200)])
    for c in range(1, WIDE_COLUMNS):
        kind = c % 10
        if kind in (0, 1, 2):
            column = pa.array(rng.integers(0, 10**6, count), pa.int64())
        elif kind in (3, 4):
            column = pa.array(rng.random(count))
        elif kind in (5, 6):
            column = _with_nulls(pa.array(words[rng.integers(0, len(words), count)]), rng, 0.1)
        elif kind == 7:
            column = pa.array(18_000 + rng.integers(0, 2_000, count), pa.int32()).cast(pa.date32())
        elif kind == 8:
            column = (
                pa.array(rng.random(count) < 0.3)
                if c % 20 == 8
                else _decimals(rng.integers(-(10**9), 10**9, count), 18, 4)
            )
        elif c % 20 == 9:
            offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 3, count))]).astype(np.int32)
            column = pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 100, int(offsets[-1])), pa.int64()))
        else:
            column = pa.StructArray.from_arrays(
                [pa.array(rng.integers(0, 100, count), pa.int64()), pa.array(words[rng.integers(0, 200, count)])],
                names=["n", "s"],
            )
        columns[f"c{c:03d}"] = column
    return pa.table(columns)


def _decimals(unscaled: np.ndarray, precision: int, scale: int) -> pa.Array:
    """decimal(precision, scale) values whose unscaled integers are `unscaled` (int64)."""
    words = np.empty((len(unscaled), 2), dtype="<i8")  # little-endian 128-bit: low word, sign-extended high word
    words[:, 0], words[:, 1] = unscaled, unscaled >> 63
    return pa.Array.from_buffers(pa.decimal128(precision, scale), len(unscaled), [None, pa.py_buffer(words)])


def _with_nulls(values: pa.Array, rng: np.random.Generator, share: float) -> pa.Array:
    return pc.if_else(pa.array(rng.random(len(values)) < share), pa.nulls(len(values), values.type), values)


ROWS = {"flat": rows, "typed": typed_rows, "wide": wide_rows}


def write_files(folder: Path, dataset: Dataset, seed: int = 1) -> list[Path]:
    """The dataset as `files` Parquet files of `rows_per_file` rows each. The files a previous call
    wrote to `folder` for the same dataset and seed are reused (the quiet and the loaded pass share
    them: generating wide or typed data takes longer than compacting it). What says so lies beside
    `folder` (`<folder>.written`), not in it: the folder holds the dataset's files only."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"part-{i:05d}.parquet" for i in range(dataset.files)]
    written = folder.with_name(f"{folder.name}.written")
    identity = f"{dataset!r} seed={seed}"
    if written.exists() and written.read_text() == identity:
        return paths
    for stale in folder.parent.glob(f"{folder.name}.*"):  # the marker, and digests of the old files
        stale.unlink()
    make = ROWS[dataset.kind]
    for i, path in enumerate(paths):
        pq.write_table(
            make(i * dataset.rows_per_file, dataset.rows_per_file, seed * 1_000_003 + i), path, compression=CODEC
        )
    written.write_text(identity)
    return paths


def sources_digest(
    sources: list[Path], name: str = "rows", rows: Callable[[], Iterable[pa.RecordBatch]] | None = None
) -> RowsDigest:
    """The digest of `rows` (default: every row of `sources`), kept beside the files written by
    `write_files` under `name`, so a second pass over the same files does not read them again."""
    folder = sources[0].parent
    cache = folder.with_name(f"{folder.name}.digest-{name}")
    if cache.exists():
        count, sha256 = cache.read_text().split()
        return RowsDigest(int(count), sha256)
    digest = batches_digest(rows() if rows is not None else ds.dataset(sources).to_batches())
    cache.write_text(f"{digest.rows} {digest.sha256}")
    return digest


def iceberg_table(catalog: Catalog, name: str, sources: list[Path], properties: dict[str, str]) -> Table:
    """An unpartitioned Iceberg table over hard links of `sources` (pyiceberg add_files)."""
    schema = pq.read_schema(sources[0])
    table = catalog.create_table(
        name, schema=schema, properties={"write.parquet.compression-codec": CODEC, **properties}
    )
    data = Path(table.location().removeprefix("file://")) / "data"
    data.mkdir(parents=True, exist_ok=True)
    links = []
    for source in sources:
        link = data / source.name
        os.link(source, link)
        links.append(f"file://{link}")
    table.add_files(links)
    return catalog.load_table(name)


def linked(sources: list[Path], folder: Path) -> Path:
    """`folder` holding hard links of `sources` (a table converted in place owns its folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    for source in sources:
        os.link(source, folder / source.name)
    return folder


def delta_table(folder: Path) -> str:
    """`folder`'s Parquet files as a Delta table, in place (delta-rs convert_to_deltalake)."""
    from deltalake import convert_to_deltalake

    convert_to_deltalake(str(folder))
    return str(folder)


def ordering_properties(dataset: Dataset, sources: list[Path], target_bytes: int) -> dict[str, str]:
    """Table properties that make our compaction of `dataset`'s table a sorted one: z-order
    columns, and a fragment ratio under which no source is a fragment (so the files are rewritten
    by a major, which sorts, not bin-packed by a minor, which does not)."""
    if dataset.order == "none":
        return {}
    smallest = min(p.stat().st_size for p in sources)
    props = {"compaction.fragment-ratio": str(max(8, 2 * target_bytes // smallest))}
    if dataset.order == "zorder":
        props["compaction.zorder-columns"] = ",".join(ZORDER_COLUMNS)
    return props


def ordered_table(catalog: Catalog, name: str, sources: list[Path], dataset: Dataset, target_bytes: int) -> Table:
    """`iceberg_table` with `dataset`'s ordering: its properties, and for "sort" the sort order."""
    table = iceberg_table(catalog, name, sources, ordering_properties(dataset, sources, target_bytes))
    if dataset.order == "sort":
        with table.update_sort_order() as sort_order:
            for column, direction in SORT_ORDER:
                if direction == SortDirection.ASC:
                    sort_order.asc(column, IdentityTransform())
                else:
                    sort_order.desc(column, IdentityTransform())
        table = catalog.load_table(name)
    return table


def java_rewrite_args(dataset: Dataset) -> dict[str, str]:
    """`rewrite_data_files`' named arguments for `dataset`: bin-pack by default, the sort strategy
    with the table's sort order, or z-order over the same columns as ours."""
    if dataset.order == "sort":
        return {"strategy": "sort"}
    if dataset.order == "zorder":
        return {"strategy": "sort", "sort_order": f"zorder({','.join(ZORDER_COLUMNS)})"}
    return {}
