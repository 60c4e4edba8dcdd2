"""The merge-on-read rewrite of the worker, measured on its own (no Spark, no commit).

A CDC-like table (default: 1,000 data files, 20% of the rows deleted by 300 equality-delete files
on `id` and 200 position-delete files each naming 5 data files) is rewritten by `rewrite_group`
in 2 processes at once (as 2 Spark tasks would: the files split in 2 groups; best of 2 runs in
the same processes, as Spark reuses its Python workers), and by a
single-thread pyarrow "read, anti-join, write" of the same files (positions dropped by a numpy
mask, equality keys by `Table.join(..., "left anti")` on chunks of at least 500,000 rows, so the
key hash table is built once per chunk, not once per file). Prints both rates (rows decoded per
second) and `share_of_2x_pyarrow` (ours / twice the single thread); then the worker's peak RSS
rewriting 1,000,000 rows with 1,000,000 equality keys (longs) applying, in a fresh process.

    python -m compaction_tools.bench.cdc_worker [--files 1000] [--rows-per-file 2000] [--keys 1000000]
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from compaction_assets.execution.worker import DeleteSpec, GroupSpec, RewriteJob, SourceFile, rewrite_group
from compaction_assets.lake.datafile_codec import encode_partition
from compaction_assets.lake.delete_files import FILE_PATH_ID, POS_ID, commit_delete_files, equality_delete_file
from compaction_assets.lake.deletes import ApplyingDeletes
from compaction_assets.lake.files import live_files
from compaction_tools.bench.datasets import Dataset, iceberg_table, write_files

BASELINE_CHUNK_ROWS = 500_000


def position_deletes(
    table: Table, targets: dict[str, list[int]], spec_id: int, partition: Record, row_group_size: int | None = None
) -> DataFile:
    """One position-delete file listing positions of several data files, as Spark writes them
    (sorted by file_path and pos)."""
    schema = pa.schema(
        [
            pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID)}),
            pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID)}),
        ]
    )
    pairs = sorted((path, int(pos)) for path, positions in targets.items() for pos in positions)
    rows = pa.table({"file_path": [p for p, _ in pairs], "pos": [q for _, q in pairs]}, schema=schema)
    path = f"{table.location().rstrip('/')}/data/pos-delete-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(path).create() as stream:
        pq.write_table(rows, stream, row_group_size=row_group_size)
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=len(pairs),
        file_size_in_bytes=len(table.io.new_input(path)),
        lower_bounds={FILE_PATH_ID: pairs[0][0].encode()},
        upper_bounds={FILE_PATH_ID: pairs[-1][0].encode()},
    )
    delete_file.spec_id = spec_id
    return delete_file


def rewrite_job(
    table: Table, parts: int = 1, sort_columns: list[tuple[str, str]] | None = None, polars: bool = False
) -> RewriteJob:
    """The job a driver sends: each partition's data files in `parts` groups, each source with
    the deletes the spec's rule applies to it (lake.deletes.ApplyingDeletes)."""
    files = live_files(table)
    applying = ApplyingDeletes([f for f in files if f.data_file.content != DataFileContent.DATA])
    by_partition: dict[str, list] = {}
    for f in sorted(files, key=lambda f: f.path):
        if f.data_file.content == DataFileContent.DATA:
            by_partition.setdefault(f.partition_key, []).append(f)
    groups = []
    for _, members in sorted(by_partition.items()):
        size = -(-len(members) // parts)
        for start in range(0, len(members), size):
            deletes: list[DeleteSpec] = []
            index: dict[str, int] = {}
            sources = []
            for f in members[start : start + size]:
                applied = []
                for d in applying.for_data_file(f):
                    if d.path not in index:
                        index[d.path] = len(deletes)
                        ids = d.data_file.equality_ids
                        deletes.append(
                            DeleteSpec(
                                d.path, int(d.data_file.content), d.size, d.data_file.record_count, ids and list(ids)
                            )
                        )
                    applied.append(index[d.path])
                sources.append(SourceFile(f.path, f.size, f.data_file.record_count, applied))
            groups.append(
                GroupSpec(
                    sources=sources,
                    partition=encode_partition(members[0].data_file.partition),
                    spec_id=members[0].data_file.spec_id,
                    output_dir=f"{table.location().rstrip('/')}/data/out",
                    file_prefix=f"bench-{uuid.uuid4().hex[:8]}",
                    max_files=1 << 20,
                    polars=polars,
                    deletes=deletes,
                    sort=bool(sort_columns),
                )
            )
    return RewriteJob(
        metadata_json=table.metadata.model_dump_json(),
        io_properties=dict(table.io.properties),
        target_file_size_bytes=128 << 20,
        groups=groups,
        tasks=[[i] for i in range(len(groups))],
        sort_columns=sort_columns or [],
    )


def cdc_table(
    root: Path,
    files: int = 1000,
    rows_per_file: int = 2000,
    equality_files: int = 300,
    position_files: int = 200,
    deleted_share: float = 0.2,
    extra_keys: int = 0,
    seed: int = 5,
    position_row_group: int | None = None,
) -> Table:
    """An unpartitioned table of `files` data files, `deleted_share` of its rows deleted: three
    quarters by `equality_files` equality deletes on id, the rest by `position_files` position
    deletes (each naming a run of data files); `extra_keys` equality keys match no row."""
    catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
    catalog.create_namespace("bench")
    sources = write_files(root / "source", Dataset("cdc", files, rows_per_file))
    table = iceberg_table(catalog, "bench.cdc", sources, {})
    data = sorted(f.data_file.file_path for f in live_files(table))
    rng = np.random.default_rng(seed)
    total = files * rows_per_file
    chosen = rng.choice(total, int(total * deleted_share), replace=False)
    by_key = chosen[: len(chosen) * 3 // 4]
    by_position = np.sort(chosen[len(chosen) * 3 // 4 :])
    keys = np.concatenate([by_key, total + rng.choice(1 << 40, max(0, extra_keys), replace=False)])
    equality = [
        equality_delete_file(table, 0, Record(), ["id"], [{"id": int(k)} for k in part])
        for part in np.array_split(rng.permutation(keys), equality_files)
    ]
    commit_delete_files(table, equality)
    # data file i holds ids i*rows_per_file.. (write_files); position-delete file j names a run of them
    owner = by_position // rows_per_file
    positional = []
    for run in np.array_split(np.arange(files), position_files):
        targets = {data[i]: (by_position[owner == i] % rows_per_file).tolist() for i in run}
        targets = {path: positions for path, positions in targets.items() if positions}
        if targets:
            positional.append(position_deletes(table, targets, 0, Record(), position_row_group))
    commit_delete_files(table, positional)
    return catalog.load_table("bench.cdc")


def _rewrite(job_json: str, index: int) -> tuple[int, int, int, str | None, float]:
    cpu = time.process_time()
    outcome = rewrite_group(RewriteJob.from_json(job_json), index)
    return outcome.rows_read, outcome.rows_deleted, outcome.peak_rss, outcome.error, time.process_time() - cpu


def worker_rate(job: RewriteJob, repeats: int = 2) -> tuple[float, float, int, int]:
    """Rows decoded per second (wall, and per CPU second of all threads) with every group in its
    own process at once, best of `repeats` (the processes stay, as Spark's Python workers do);
    rows read, deleted."""
    best = (0.0, 0.0)
    with multiprocessing.get_context("spawn").Pool(len(job.groups)) as pool:
        pool.starmap(_noop, [()] * len(job.groups))  # processes started and imports paid before the clock
        for k in range(repeats):
            groups = [dataclasses.replace(g, file_prefix=f"{g.file_prefix}-{k}") for g in job.groups]
            run = dataclasses.replace(job, groups=groups).to_json()
            started = time.perf_counter()
            results = pool.starmap(_rewrite, [(run, i) for i in range(len(groups))])
            seconds = time.perf_counter() - started
            for *_, error, _ in results:
                if error is not None:
                    raise RuntimeError(error)
            read = sum(r[0] for r in results)
            best = max(best[0], read / seconds), max(best[1], read / sum(r[4] for r in results))
    return best[0], best[1], read, sum(r[1] for r in results)


def _noop() -> None:
    import polars  # noqa: F401 - imports paid before timing

    import compaction_assets.execution.worker  # noqa: F401


def _baseline(job_json: str, out: str) -> tuple[int, int, float, float]:
    """Single-thread pyarrow: read each file, drop deleted positions and keys, write one file."""
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    job = RewriteJob.from_json(job_json)
    started, cpu = time.perf_counter(), time.process_time()
    sources = [s for g in job.groups for s in g.sources]
    deletes = {d.path: d for g in job.groups for d in g.deletes}
    keys = pa.table(
        {
            "id": pa.chunked_array(
                [pq.read_table(_local(p), use_threads=False).column(0) for p, d in deletes.items() if d.content == 2]
            ).unique()
        }
    )
    positions: dict[str, list[np.ndarray]] = {}
    for path, d in deletes.items():
        if d.content == 1:
            table = pq.read_table(_local(path), use_threads=False)
            for file, pos in zip(table.column(0).to_pylist(), table.column(1).to_numpy(), strict=True):
                positions.setdefault(file, []).append(pos)
    read = written = 0
    writer: pq.ParquetWriter | None = None
    chunk: list[pa.Table] = []

    def flush(writer: pq.ParquetWriter) -> int:
        joined = pa.concat_tables(chunk).join(keys, "id", join_type="left anti", use_threads=False)
        writer.write_table(joined)
        chunk.clear()
        return joined.num_rows

    for source in sources:
        table = pq.read_table(_local(source.path), use_threads=False)
        read += table.num_rows
        if source.path in positions:
            keep = np.ones(table.num_rows, dtype=bool)
            keep[np.array(positions[source.path])] = False
            table = table.filter(pa.array(keep))
        if writer is None:
            writer = pq.ParquetWriter(out, table.schema, compression="zstd")
        chunk.append(table)
        if sum(t.num_rows for t in chunk) >= BASELINE_CHUNK_ROWS:
            written += flush(writer)
    if writer is None:
        raise ValueError("baseline: the rewrite job has no source files")
    if chunk:
        written += flush(writer)
    writer.close()
    return read, written, time.perf_counter() - started, time.process_time() - cpu


def _local(path: str) -> str:
    return path.removeprefix("file://")


def baseline_rate(job: RewriteJob, out: Path, repeats: int = 2) -> tuple[float, float, int, int]:
    """The single-thread pyarrow rate (rows decoded per second, wall and CPU), best of `repeats`
    in one fresh process; rows read, written."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        runs = [pool.apply(_baseline, (job.to_json(), str(out))) for _ in range(repeats)]
    read, written = runs[0][0], runs[0][1]
    return max(read / r[2] for r in runs), max(read / r[3] for r in runs), read, written


def peak_rss_with_keys(root: Path, keys: int = 1_000_000, rows: int = 1_000_000) -> tuple[int, int]:
    """The worker's peak RSS rewriting `rows` rows (100 files) with `keys` equality keys (long)
    applying, in a fresh process; and the rows it deleted."""
    table = cdc_table(
        root,
        files=100,
        rows_per_file=rows // 100,
        equality_files=10,
        position_files=10,
        deleted_share=0.2,
        extra_keys=keys - int(rows * 0.2) * 3 // 4,
    )
    job = rewrite_job(table)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        _, deleted, peak, error, _ = pool.apply(_rewrite, (job.to_json(), 0))
    if error is not None:
        raise RuntimeError(error)
    return peak, deleted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rows-per-file", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "rate").mkdir()
        table = cdc_table(root / "rate", args.files, args.rows_per_file)
        job = rewrite_job(table, parts=2)
        ours, ours_cpu, read, deleted = worker_rate(job)
        theirs, theirs_cpu, base_read, base_written = baseline_rate(job, root / "baseline.parquet")
        if base_read != read or base_written != read - deleted:
            raise RuntimeError(f"baseline read {base_read} wrote {base_written}; worker read {read} deleted {deleted}")
        print(
            f"dataset=cdc files={args.files} rows={read} deleted={deleted} worker_2proc_rows_per_s={ours:.0f} "
            f"pyarrow_1thread_rows_per_s={theirs:.0f} share_of_2x_pyarrow={ours / (2 * theirs):.2f}"
        )
        # on a busy machine wall rates say little: rows per CPU second (all threads) are what 2 idle cores would give
        print(
            f"worker_rows_per_cpu_s={ours_cpu:.0f} pyarrow_rows_per_cpu_s={theirs_cpu:.0f} "
            f"cpu_share_of_2x_pyarrow_on_2_idle_cores={ours_cpu / theirs_cpu:.2f}"
        )
        (root / "rss").mkdir()
        peak, deleted = peak_rss_with_keys(root / "rss", args.keys)
        print(f"equality_keys={args.keys} rows=1000000 deleted={deleted} worker_peak_rss_mb={peak / 2**20:.0f}")


if __name__ == "__main__":
    main()
