"""Benchmark data: the same Parquet files registered in an Iceberg table and in a Delta table.

Rows: id, timestamp, two strings (one random, one low-cardinality), a double and an int, as in
issue #5. Files are written once with pyarrow (Snappy, as every contender writes) and hard-linked
into the Iceberg table's data folder, so every contender reads the very same bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

CITIES = np.array(["amsterdam", "berlin", "lisbon", "madrid", "oslo", "paris", "rome", "vienna", "warsaw", "zurich"])
CODEC = "snappy"


@dataclass(frozen=True)
class Dataset:
    name: str
    files: int
    rows_per_file: int

    @property
    def rows(self) -> int:
        return self.files * self.rows_per_file


SMALL = Dataset("small", 500, 20_000)
TINY = Dataset("tiny", 5_000, 200)


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


def write_files(folder: Path, dataset: Dataset, seed: int = 1) -> list[Path]:
    """The dataset as `files` Parquet files of `rows_per_file` rows each."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(dataset.files):
        path = folder / f"part-{i:05d}.parquet"
        pq.write_table(
            rows(i * dataset.rows_per_file, dataset.rows_per_file, seed * 1_000_003 + i), path, compression=CODEC
        )
        paths.append(path)
    return paths


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
