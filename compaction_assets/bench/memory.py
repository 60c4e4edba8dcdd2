"""Worker memory on one large group, per dataset kind and rewrite path (issue 19: peak RSS
< 512 MB on a 2 GB group on every path and dataset type).

Which path a group takes follows from its files: small ones (average <= 8 MiB) go through Polars,
large ones through the Arrow path (polars_rewrite.qualifies). So each kind is written twice, as
~6 MB files and as ~40 MB files, a few distinct files repeated (duplicate rows are still rows:
the check is by content, as a multiset), into one group and one output file.

Issue 20 repeats it sorted: `sort` gives the table a sort order (city, then price descending) and
`zorder` z-order columns (price, qty); a sorted group takes the Arrow path and goes through the
external sort (execution/external_sort.py) with the default sort budget.

    python -m compaction_assets.bench.memory --kind typed --gib 2
    python -m compaction_assets.bench.memory --kind flat --order sort --order zorder --gib 2
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import click
import pyarrow.parquet as pq
from pyiceberg.transforms import IdentityTransform

from compaction_assets.bench import datasets
from compaction_assets.config import load_config
from compaction_assets.engine import Engine
from compaction_assets.execution.spark import spark_session
from compaction_assets.lake.digest import rows_digest

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
) -> dict:
    """Rewrite one group of `gib` GiB of `kind` rows sized for `path` (sorted as `order` says:
    flat rows only); the worker's peak RSS."""
    folder = root / "data" / f"memory-{kind}-{path}-{order}"
    sources = write_group(folder / "source", kind, gib, FILE_BYTES[path])
    bytes_in = sum(p.stat().st_size for p in sources)
    name = f"bench.memory_{kind}_{path}" + (f"_{order}" if order != "none" else "")
    props = {  # a target above the whole group: one group, one output file
        "compaction.target-file-size-bytes": str(bytes_in + 256 * MiB),
        "compaction.max-group-bytes": str(2 * bytes_in + 256 * MiB),
    }
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
            table = engine.catalog.load_table(name)
        expected = rows_digest(table)
        os.sync()
        started = time.perf_counter()
        [outcome] = engine.compact(name)
        seconds = time.perf_counter() - started
        identical = rows_digest(engine.catalog.load_table(name)) == expected
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    sorted_by = f" sorted ({order}, {outcome.spill_files} spill runs)" if order != "none" else ""
    log(
        f"[memory] {kind} via {outcome.engine}{sorted_by}: one group of {bytes_in / 1e9:.2f} GB "
        f"({len(sources)} files of "
        f"{bytes_in / len(sources) / MiB:.0f} MiB -> {outcome.files_written}): {seconds:.1f}s, worker peak RSS "
        f"{outcome.peak_worker_rss / MiB:.0f} MiB, rows {'identical' if identical else 'DIFFERENT'}"
    )
    if outcome.status != "committed" or not identical or (order != "none" and outcome.kind != "major"):
        raise RuntimeError(f"bench: the {kind} memory group did not compact cleanly: {outcome.reason}")
    return {
        "kind": kind,
        "path": outcome.engine,
        "order": order,
        "spill_files": outcome.spill_files,
        "group_bytes": bytes_in,
        "seconds": seconds,
        "worker_peak_rss_bytes": outcome.peak_worker_rss,
    }


def measure_all(engine: Engine, root: Path, kinds: list[str], gib: float, log: Callable[[str], None]) -> list[dict]:
    """`measure` for every kind of `kinds`, on each rewrite path."""
    return [measure(engine, root, kind, path, gib, log) for kind in kinds for path in FILE_BYTES]


def report_lines(results: list[dict]) -> list[str]:
    return [
        f"memory dataset={r['kind']} path={r['path']}"
        + (f" sort={r['order']}" if r.get("order", "none") != "none" else "")
        + f" peak_rss_mb={r['worker_peak_rss_bytes'] / MiB:.0f} group_gb={r['group_bytes'] / 1e9:.2f}"
        for r in results
    ]


def measure_sorted(engine: Engine, root: Path, gib: float, log: Callable[[str], None]) -> list[dict]:
    """The flat group sorted by a sort order and by z-order (issue 20)."""
    return [measure(engine, root, "flat", "arrow", gib, log, order) for order in ORDERS[1:]]


@click.command()
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KINDS), help="default: all")
@click.option("--gib", default=2.0, show_default=True)
@click.option("--order", "orders", multiple=True, type=click.Choice(ORDERS), help="default: none (flat rows only)")
def main(kinds: tuple[str, ...], gib: float, orders: tuple[str, ...]) -> None:
    from compaction_assets.bench.run import bench_config

    root = Path(tempfile.mkdtemp(prefix="compaction-memory-"))
    try:
        config = load_config(bench_config(root))
        spark = spark_session(config.spark)
        engine = Engine(config, spark=lambda: spark)
        engine.catalog.create_namespace_if_not_exists("bench")
        if set(orders) - {"none"}:
            results = [measure(engine, root, "flat", "arrow", gib, click.echo, order) for order in orders]
        else:
            results = measure_all(engine, root, list(kinds or KINDS), gib, click.echo)
        for line in report_lines(results):
            click.echo(line)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
