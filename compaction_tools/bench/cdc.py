"""The bench's merge-on-read datasets, "cdc" and "mor": ours vs one pyarrow thread (and Iceberg Java on "mor").

1,000 data files, then about a fifth of their rows deleted: by 300 equality-delete files on `id`
(1,000,200 keys: the memory bound's key count) and by 200 position-delete files (500 rows of one
data file each), each kind in a commit of its own after the data, as a stream's later checkpoints
would. The limit contender reads every file, drops its position-deleted rows, anti-joins it with
the equality keys and writes target-size files, on one thread. Iceberg Java, where it takes
part, runs `rewrite_data_files` with `delete-file-threshold` 1 on a copy of the table with the same
deletes, on "mor" only: the same 1,000 files with position deletes alone (400 files of 500
positions), as an upsert stream writing position deletes leaves them. On cdc's equality deletes it
did 10 of 53 tasks in 11 minutes (each task joins its files with all 1M keys), which no 60-minute
bench run can hold. All keep the same rows: checked against the rows the dataset generator knows
are live.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.typedef import Record

from compaction_assets.engine.facade import Engine
from compaction_assets.lake.delete_files import commit_delete_files, equality_delete_file, position_delete_file
from compaction_assets.lake.digest import RowsDigest
from compaction_assets.lake.files import live_files
from compaction_tools.bench import contenders, datasets, iceberg_java
from compaction_tools.bench.datasets import Dataset
from compaction_tools.bench.ours_process import OursProcess

CDC = Dataset("cdc", 1_000, 5_000, deletes="equality+position")
MOR = Dataset("mor", 1_000, 5_000, deletes="position")
EQUALITY_FILES, KEYS_PER_EQUALITY_FILE = 300, 3_334
POSITION_FILES, POSITIONS_PER_FILE = 200, 500
MOR_POSITION_FILES = 400
EQUALITY_KEYS = EQUALITY_FILES * KEYS_PER_EQUALITY_FILE


@dataclass(frozen=True)
class CdcDeletes:
    equality_keys: np.ndarray  # ids deleted by equality
    positions: dict[str, np.ndarray]  # source file name -> deleted row positions


def plan_deletes(dataset: Dataset, seed: int = 3) -> CdcDeletes:
    """Which rows go: with equality deletes (cdc), equality keys drawn over every file and
    positions in POSITION_FILES files; with position deletes only (mor), positions in
    MOR_POSITION_FILES files."""
    rng = np.random.default_rng(seed)
    equality = "equality" in dataset.deletes.split("+")
    keys = (
        rng.choice(dataset.rows, size=EQUALITY_KEYS, replace=False).astype(np.int64)
        if equality
        else np.array([], np.int64)
    )
    victims = rng.choice(
        dataset.files, size=min(dataset.files, POSITION_FILES if equality else MOR_POSITION_FILES), replace=False
    )
    positions = {
        f"part-{i:05d}.parquet": np.sort(
            rng.choice(dataset.rows_per_file, min(dataset.rows_per_file, POSITIONS_PER_FILE), replace=False)
        )
        for i in victims
    }
    return CdcDeletes(keys, positions)


def _live_batches(sources: list[Path], deletes: CdcDeletes) -> Iterator[pa.RecordBatch]:
    """The rows that must survive, from the generator's own knowledge of what it deleted."""
    keys = np.sort(deletes.equality_keys)
    for source in sources:
        table = pq.read_table(source)
        yield from table.filter(_keep(table, keys, deletes.positions.get(source.name))).to_batches()


def _keep(table: pa.Table, sorted_keys: np.ndarray, positions: np.ndarray | list[int] | None) -> pa.Array:
    """Rows neither at a deleted position nor with a deleted id. The key lookup is a binary search
    in keys sorted once (pc.is_in would hash all 1M keys again for every file)."""
    keep = np.ones(table.num_rows, dtype=bool)
    if positions is not None:
        keep[positions] = False
    if not len(sorted_keys):
        return pa.array(keep)
    ids = table.column("id").to_numpy()
    found = np.searchsorted(sorted_keys, ids).clip(max=len(sorted_keys) - 1)
    keep &= sorted_keys[found] != ids
    return pa.array(keep)


def commit_cdc_deletes(catalog: Catalog, table_name: str, deletes: CdcDeletes) -> None:
    """Write and commit the equality deletes (one commit), then the position deletes (another)."""
    table = catalog.load_table(table_name)
    if len(deletes.equality_keys):
        chunks = np.array_split(deletes.equality_keys, EQUALITY_FILES)
        equality = [
            equality_delete_file(table, table.spec().spec_id, Record(), ["id"], [{"id": int(k)} for k in chunk])
            for chunk in chunks
        ]
        commit_delete_files(table, equality)
    live = {Path(f.path).name: f.data_file for f in live_files(table) if not f.is_delete}
    position = [position_delete_file(table, live[name], pos.tolist()) for name, pos in deletes.positions.items()]
    commit_delete_files(table, position)


def pyarrow_anti_join(
    sources: list[Path], deletes: CdcDeletes, out: Path, target_bytes: int, expected: RowsDigest | int, bytes_in: int
) -> contenders.Result:
    """The limit: one thread reading each file, dropping deleted rows, writing target-size files."""
    positions = {name: pos.tolist() for name, pos in deletes.positions.items()}
    seconds, rss = contenders.in_child(
        _anti_join, [str(p) for p in sources], deletes.equality_keys, positions, str(out), target_bytes
    )
    return contenders.pyarrow_result(seconds, rss, len(sources), out, expected, bytes_in)


def _anti_join(sources: list[str], keys: np.ndarray, positions: dict[str, list[int]], out: str, target: int) -> None:
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    sorted_keys = np.sort(keys)
    tables = (pq.read_table(source, use_threads=False) for source in sources)
    contenders.write_rolling(
        (t.filter(_keep(t, sorted_keys, positions.get(Path(s).name))) for s, t in zip(sources, tables, strict=True)),
        out,
        target,
    )


def compare_cdc(
    engine: Engine,
    ours: OursProcess,
    root: Path,
    log: Callable[[str], None],
    repeats: int,
    target: int,
    java: iceberg_java.JavaIceberg | None = None,
    load: int = 0,
    dataset: Dataset = CDC,
) -> tuple[int, dict[str, list[contenders.Result]]]:
    """Generate the cdc dataset once; time ours, the pyarrow anti-join and Iceberg Java (if
    `java` is given) on it `repeats` times, interleaved. `load` (the background-load processes
    running meanwhile) names the tables apart from the quiet pass's. Returns the source bytes and
    every contender's runs."""
    from compaction_tools.bench.run import JAVA_TABLE, java_options

    folder = root / "data" / dataset.name
    log(f"[{dataset.name}] writing {dataset.files} files x {dataset.rows_per_file} rows and the delete plan ...")
    sources = datasets.write_files(folder / "source", dataset)
    deletes = plan_deletes(dataset)
    expected = datasets.sources_digest(sources, dataset.name, partial(_live_batches, sources, deletes))
    bytes_in = sum(p.stat().st_size for p in sources)
    timed: dict[str, list[contenders.Result]] = {}
    for k in range(repeats):
        run_name = f"{dataset.name}_{k}" + (f"_load{load}" if load else "")
        name = f"bench.{run_name}"
        datasets.iceberg_table(engine.catalog, name, sources, {})
        commit_cdc_deletes(engine.catalog, name, deletes)
        peers = contenders.peer_expected(expected, k)
        runs = [
            partial(_ours, ours, engine.catalog, name, expected, bytes_in, dataset.files),
            partial(pyarrow_anti_join, sources, deletes, folder / f"pyarrow-{k}", target, peers, bytes_in),
        ]
        if java is not None:
            run = iceberg_java.run_catalog(java, folder / "java", f"java_{run_name}")
            datasets.iceberg_table(run.catalog, JAVA_TABLE, sources, {})
            commit_cdc_deletes(run.catalog, JAVA_TABLE, deletes)
            options = java_options(deletes=True)
            runs.append(
                partial(contenders.iceberg_java, java, run, JAVA_TABLE, peers, bytes_in, dataset.files, options, {})
            )
        for contender in runs:
            result = contender()
            if not result.rows_identical:
                raise RuntimeError(f"bench: {result.contender} kept other rows than the live ones of cdc")
            timed.setdefault(result.contender, []).append(result)
        if java is not None:
            run.dispose()
        loaded = f" (background load {load})" if load else ""
        log(
            f"[{dataset.name}] run {k + 1}/{repeats}{loaded}: "
            + ", ".join(f"{c} {r[-1].seconds:.2f}s" for c, r in timed.items())
        )
    return bytes_in, timed


def _ours(
    ours: OursProcess, catalog: Catalog, name: str, expected: RowsDigest, bytes_in: int, files: int
) -> contenders.Result:
    """contenders.ours, and every delete file gone afterwards (the cdc run plans a full rewrite)."""
    result = contenders.ours(ours, catalog, name, expected, bytes_in, files)
    if remaining := [f for f in live_files(catalog.load_table(name)) if f.is_delete]:
        raise RuntimeError(f"bench: {len(remaining)} delete file(s) of {name} left after a full rewrite")
    return result
