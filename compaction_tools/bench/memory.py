"""Worker memory on one large group, per dataset kind and rewrite path (issue 19: peak RSS
< 512 MB on a 2 GB group on every path and dataset type).

Which path a group takes follows from its files: small ones (average <= 8 MiB) go through Polars,
large ones through the Arrow path (polars_rewrite.qualifies). So each kind is written twice, as
~6 MB files and as ~40 MB files, a few distinct files repeated (duplicate rows are still rows:
the check is by content, as a multiset), into one group and one output file.

Issue 20 repeats it sorted: `sort` gives the table a sort order (city, then price descending) and
`zorder` z-order columns (price, qty); a sorted group takes the Arrow path and goes through the
external sort (execution/external_sort.py) with the default sort budget.

`--s3` measures the flat group on each path with its sources and result on the local S3 server
(moto in a child process), reported as dataset "s3": the group read and written through Polars'
object_store or pyarrow's S3 client rather than local files.

    python -m compaction_tools.bench.memory --kind typed --gib 2
    python -m compaction_tools.bench.memory --kind flat --order sort --order zorder --gib 2
    python -m compaction_tools.bench.memory --s3 --gib 2
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import click
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyiceberg.transforms import IdentityTransform

from compaction_assets.config import load_config
from compaction_assets.engine.facade import Engine
from compaction_assets.execution.spark import spark_session
from compaction_assets.lake.digest import RowsDigest
from compaction_tools.bench import contenders, datasets, footprint
from compaction_tools.bench.ours_process import OursProcess, outcome_fields
from compaction_tools.bench.s3_paths import slow_s3

MiB = 1024 * 1024
FILE_BYTES = {"polars": 6 * MiB, "arrow": 40 * MiB}  # source file size that sends a group down each path
DISTINCT = 4  # distinct files per run, repeated up to the group size
KINDS = ("flat", "typed", "wide")
ORDERS = ("none", "sort", "zorder")  # how the group is ordered (flat rows' columns)


def write_group(folder: Path, kind: str, gib: float, file_bytes: int) -> list[Path]:
    """About `gib` GiB of `kind` rows as files of about `file_bytes` each."""
    folder.mkdir(parents=True, exist_ok=True)
    make = datasets.ROWS[kind]
    sample = folder / "sample.parquet"
    pq.write_table(make(0, 5_000, 0), sample, compression=datasets.CODEC)
    rows = max(1_000, round(5_000 * file_bytes / sample.stat().st_size))
    sample.unlink()
    distinct = []
    for k in range(DISTINCT):
        path = folder / f"part-{k:05d}.parquet"
        pq.write_table(make(k * rows, rows, k), path, compression=datasets.CODEC)
        distinct.append(path)
    count = max(DISTINCT, round(gib * 1024**3 / distinct[0].stat().st_size))
    paths = list(distinct)
    for k in range(DISTINCT, count):
        path = folder / f"part-{k:05d}.parquet"
        os.link(distinct[k % DISTINCT], path)  # the bytes of a distinct file under another name
        paths.append(path)
    return paths


def measure(
    engine: Engine,
    root: Path,
    kind: str,
    path: str,
    gib: float = 2.0,
    log: Callable[[str], None] = print,
    order: str = "none",
    ours: OursProcess | None = None,
) -> dict:
    """Rewrite one group of `gib` GiB of `kind` rows sized for `path` (sorted as `order` says:
    flat rows only); the worker's peak RSS, and the whole tree's with `ours` (see compact_group)."""
    folder = root / "data" / f"memory-{kind}-{path}-{order}"
    sources = write_group(folder / "source", kind, gib, FILE_BYTES[path])
    bytes_in = sum(p.stat().st_size for p in sources)
    name = f"bench.memory_{kind}_{path}" + (f"_{order}" if order != "none" else "")
    props = one_group(bytes_in)
    if order != "none":  # sources undersized, not fragments: a major, which sorts (a minor does not)
        smallest = min(p.stat().st_size for p in sources)
        props["compaction.fragment-ratio"] = str(max(8, 2 * (bytes_in + 256 * MiB) // smallest))
    if order == "zorder":
        props["compaction.zorder-columns"] = "price,qty"
    try:
        table = datasets.iceberg_table(engine.catalog, name, sources, props)
        if order == "sort":
            with table.update_sort_order() as sort_order:
                sort_order.asc("city", IdentityTransform()).desc("price", IdentityTransform())
        os.sync()
        expected = datasets.sources_digest(sources)  # read at once, on Arrow's threads (not via the scan)
        return compact_group(engine, name, kind, len(sources), bytes_in, expected, log, order, ours)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure_s3(spark, root: Path, path: str, gib: float = 2.0, log: Callable[[str], None] = print) -> dict:  # noqa: ANN001
    """`measure` of the flat rows with the sources and the result on the local S3 server (moto, in
    a child process): the group read and written through S3 (Polars' object_store or pyarrow's S3
    client), reported as dataset "s3"."""
    from compaction_tools.bench import s3_dataset

    folder = root / "data" / f"memory-s3-{path}"
    sources = write_group(folder / "source", "flat", gib, FILE_BYTES[path])
    bytes_in = sum(p.stat().st_size for p in sources)
    try:
        expected = datasets.sources_digest(sources)  # the local copies, read at once
        with slow_s3(0.0) as s3:
            fs = s3_dataset.filesystem(s3)
            keys = upload_group(fs, sources, f"{s3.bucket}/memory")
            engine = s3_dataset.s3_engine(root, s3, spark)
            name = f"bench.memory_s3_{path}"
            s3_dataset.iceberg_table(engine, name, pq.read_schema(sources[0]), keys, one_group(bytes_in))
            return compact_group(engine, name, "s3", len(sources), bytes_in, expected, log)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def upload_group(fs: pafs.S3FileSystem, sources: list[Path], destination: str) -> list[str]:
    """`write_group`'s files at `destination` (bucket/prefix): its distinct files uploaded, the
    others copies made by the server (no second trip of their bytes); the object keys, sorted."""
    keys: list[str] = []
    for k, source in enumerate(sources):
        key = f"{destination}/{source.name}"
        if k < DISTINCT:
            pafs.copy_files(str(source), key, destination_filesystem=fs)
        else:
            fs.copy_file(keys[k % DISTINCT], key)
        keys.append(key)
    return sorted(keys)


def one_group(bytes_in: int) -> dict[str, str]:
    """Table properties that make `bytes_in` of sources one group with one output file (a target above it)."""
    return {
        "compaction.target-file-size-bytes": str(bytes_in + 256 * MiB),
        "compaction.max-group-bytes": str(2 * bytes_in + 256 * MiB),
    }


def compact_group(
    engine: Engine,
    name: str,
    kind: str,
    files: int,
    bytes_in: int,
    expected: RowsDigest,
    log: Callable[[str], None],
    order: str = "none",
    ours: OursProcess | None = None,
) -> dict:
    """Compact table `name` (one group), check its rows against `expected` (its sources' digest),
    log and return the figures. With `ours` (our engine in a process of its own) the group is
    compacted there and the peak RSS summed over its whole tree (that process, its Spark JVM and
    Python workers) is taken too; else in this process, the worker's peak only."""
    tree = None
    if ours is not None:
        with footprint.TreePeak([ours.pid]) as tree:
            answer = ours.compact(name)
        seconds, [outcome] = answer.seconds, answer.outcomes
    else:
        started = time.perf_counter()
        [compacted] = engine.compact(name)
        seconds = time.perf_counter() - started
        outcome = outcome_fields(compacted)
    identical = contenders.table_digest(engine.catalog.load_table(name)) == expected
    sorted_by = f" sorted ({order}, {outcome['spill_files']} spill runs)" if order != "none" else ""
    whole = f", whole tree {tree.peak / MiB:.0f} MiB (PSS {tree.peak_pss / MiB:.0f})" if tree else ""
    log(
        f"[memory] {kind} via {outcome['engine']}{sorted_by}: one group of {bytes_in / 1e9:.2f} GB "
        f"({files} files of {bytes_in / files / MiB:.0f} MiB -> {outcome['files_written']}): {seconds:.1f}s, "
        f"worker peak RSS {outcome['peak_worker_rss'] / MiB:.0f} MiB{whole}, "
        f"rows {'identical' if identical else 'DIFFERENT'}"
    )
    if outcome["status"] != "committed" or not identical or (order != "none" and outcome["kind"] != "major"):
        raise RuntimeError(f"bench: the {kind} memory group did not compact cleanly: {outcome['reason']}")
    return {
        "kind": kind,
        "path": outcome["engine"],
        "order": order,
        "spill_files": outcome["spill_files"],
        "group_bytes": bytes_in,
        "groups": outcome["groups"],
        "seconds": seconds,
        "worker_peak_rss_bytes": outcome["peak_worker_rss"],
        "tree_peak_rss_bytes": tree.peak if tree else None,
        "tree_peak_pss_bytes": tree.peak_pss if tree else None,
    }


def measure_all(
    engine: Engine,
    root: Path,
    kinds: list[str],
    gib: float,
    log: Callable[[str], None],
    ours: OursProcess | None = None,
) -> list[dict]:
    """`measure` for every kind of `kinds`, on each rewrite path."""
    return [measure(engine, root, kind, path, gib, log, ours=ours) for kind in kinds for path in FILE_BYTES]


def report_lines(results: list[dict]) -> list[str]:
    return [
        f"memory dataset={r['kind']} path={r['path']}"
        + (f" sort={r['order']}" if r.get("order", "none") != "none" else "")
        + f" peak_rss_mb={r['worker_peak_rss_bytes'] / MiB:.0f}"
        + (f" tree_peak_rss_mib={r['tree_peak_rss_bytes'] / MiB:.0f}" if r.get("tree_peak_rss_bytes") else "")
        + f" group_gb={r['group_bytes'] / 1e9:.2f}"
        for r in results
    ]


def measure_sorted(
    engine: Engine, root: Path, gib: float, log: Callable[[str], None], ours: OursProcess | None = None
) -> list[dict]:
    """The flat group sorted by a sort order and by z-order (issue 20)."""
    return [measure(engine, root, "flat", "arrow", gib, log, order, ours) for order in ORDERS[1:]]


@click.command()
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KINDS), help="default: all")
@click.option("--gib", default=2.0, show_default=True)
@click.option("--order", "orders", multiple=True, type=click.Choice(ORDERS), help="default: none (flat rows only)")
@click.option("--s3", "on_s3", is_flag=True, help="the flat group on the local S3 server, each path")
def main(kinds: tuple[str, ...], gib: float, orders: tuple[str, ...], on_s3: bool) -> None:
    from compaction_tools.bench.run import bench_config

    root = Path(tempfile.mkdtemp(prefix="compaction-memory-"))
    ours = None
    try:
        config_path = bench_config(root)
        config = load_config(config_path)
        engine = Engine(config, spark=lambda: spark_session(config.spark))
        engine.catalog.create_namespace_if_not_exists("bench")
        if on_s3:
            spark = spark_session(config.spark)
            results = [measure_s3(spark, root, path, gib, click.echo) for path in FILE_BYTES]
        else:
            ours = OursProcess(config_path)  # the group compacted there: the whole tree is measured
            if set(orders) - {"none"}:
                results = [measure(engine, root, "flat", "arrow", gib, click.echo, order, ours) for order in orders]
            else:
                results = measure_all(engine, root, list(kinds or KINDS), gib, click.echo, ours)
        for line in report_lines(results):
            click.echo(line)
    finally:
        if ours is not None:
            ours.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
