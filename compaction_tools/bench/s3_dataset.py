"""The bench's "s3" dataset: the files of "small" on the local S3-protocol server, every contender
reading and writing through it.

moto's S3 server runs in a child process (bench.s3_paths.slow_s3, no added delay), so its Python
shares no GIL with our driver. The source files are uploaded once; then, `repeats` times and
interleaved: ours compacts a fresh Iceberg table (SQLite catalog, warehouse in the bucket, Polars
reaching S3 through object_store) over the same objects; delta-rs `optimize.compact()` compacts a
Delta table converted in place over a server-side copy of them (a Delta table owns its folder);
one pyarrow thread copies them through pyarrow's S3FileSystem into target-size files. Each result
is read back through the server and compared by the multiset of its rows; then it is deleted, so
the in-memory server holds the sources and one run's results at most. Spark's DataFrame rewrite
does not take part (the pyspark wheel has no S3A filesystem).

    python -m compaction_tools.bench.s3_dataset --repeats 3
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import yaml

from compaction_assets.config import load_config
from compaction_assets.engine.facade import Engine
from compaction_assets.lake.digest import RowsDigest, batches_digest
from compaction_tools.bench import contenders, datasets
from compaction_tools.bench.datasets import CODEC, DELTA_CODEC, Dataset
from compaction_tools.bench.ours_process import OursProcess
from compaction_tools.bench.s3_paths import slow_s3
from compaction_tools.local_s3 import LocalS3

S3 = Dataset("s3", datasets.SMALL.files, datasets.SMALL.rows_per_file)
SOURCE_PREFIX = "source"
# pyarrow's S3 client gives up on a request that moves no byte for 3 s: a range read of a 96 MB
# result makes moto read all of it from its temporary file, which took longer than that under a
# load average of 18 and failed the bench's row checks. Set on every pyarrow client of the bench.
REQUEST_TIMEOUT_S = 60.0


def filesystem(s3: LocalS3) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem on the server (what the pyarrow contender and the checks use)."""
    scheme, _, address = s3.endpoint.partition("://")
    return pafs.S3FileSystem(
        access_key=s3.access_key,
        secret_key=s3.secret_key,
        region=s3.region,
        endpoint_override=address,
        scheme=scheme,
        request_timeout=REQUEST_TIMEOUT_S,
    )


def delta_storage_options(s3: LocalS3) -> dict[str, str]:
    """delta-rs' object_store options for the server; commits by conditional put (If-None-Match)."""
    return {
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_REGION": s3.region,
        "AWS_CONDITIONAL_PUT": "etag",
    }


def s3_config(root: Path, s3: LocalS3) -> Path:
    """A compaction.yaml whose catalog's warehouse is in the bucket."""
    doc = {
        "catalog": {
            "name": "bench_s3",
            "properties": {
                **s3.catalog_properties("sqlite:///s3-catalog.db"),
                "s3.request-timeout": str(REQUEST_TIMEOUT_S),
            },
        },
        "state": {"uri": "sqlite:///s3-state.db"},
        "spark": {"mode": "local", "master": "local[2]"},
        "tables": [{"match": "*", "policy": {"target_file_size_bytes": 128 * 1024 * 1024}}],
    }
    path = root / "compaction-s3.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def s3_engine(root: Path, s3: LocalS3, spark) -> Engine:  # noqa: ANN001 - a SparkSession
    """An engine on `s3_config`, running on the bench's session."""
    engine = Engine(load_config(s3_config(root, s3)), spark=lambda: spark)
    engine.catalog.create_namespace_if_not_exists("bench")
    return engine


@dataclass
class S3Source:
    """The dataset's files on a running server, with ours' process for it: what every pass over
    the dataset shares (uploading small's 441 MB to moto took 1.5-3 minutes)."""

    s3: LocalS3
    fs: pafs.S3FileSystem
    sources: list[str]
    local: list[Path]
    expected: RowsDigest
    bytes_in: int
    engine: Engine
    ours: OursProcess


@contextmanager
def s3_source(spark, root: Path, log: Callable[[str], None], dataset: Dataset = S3) -> Iterator[S3Source]:  # noqa: ANN001
    """Upload `dataset` once to a new server and start ours' process on it; both stopped at exit."""
    folder = root / "data" / dataset.name
    log(f"[s3] writing {dataset.files} files x {dataset.rows_per_file} rows to the local S3 server (moto) ...")
    local = datasets.write_files(folder / "source", dataset)
    expected = batches_digest(ds.dataset(local).to_batches())
    with slow_s3(0.0) as s3:
        fs = filesystem(s3)
        sources = upload(fs, folder / "source", f"{s3.bucket}/{SOURCE_PREFIX}")
        infos = fs.get_file_info(sources)
        bytes_in = sum(i.size for i in infos)
        if len(sources) != dataset.files or bytes_in != sum(p.stat().st_size for p in local):
            raise RuntimeError(f"bench: the upload to {s3.endpoint} did not keep the {dataset.files} source files")
        engine = s3_engine(root, s3, spark)
        from compaction_tools.bench.run import warmup_table  # run imports this module

        ours = OursProcess(root / "compaction-s3.yaml", warmup_table(engine))
        try:
            yield S3Source(s3, fs, sources, local, expected, bytes_in, engine, ours)
        finally:
            ours.close()


def compare_s3(
    spark,  # noqa: ANN001 - the bench's warm SparkSession
    root: Path,
    log: Callable[[str], None],
    repeats: int,
    target: int,
    dataset: Dataset = S3,
    source: S3Source | None = None,
) -> tuple[int, dict[str, list[contenders.Result]]]:
    """Time ours, delta-rs and the pyarrow copy `repeats` times on the dataset's files on the
    server (`source`: uploaded already; else uploaded here, once). Returns the source bytes and
    every contender's runs."""
    if source is None:
        with s3_source(spark, root, log, dataset) as uploaded:
            return compare_s3(spark, root, log, repeats, target, dataset, uploaded)
    return source.bytes_in, _runs(source, repeats, target, dataset, log)


def _runs(
    source: S3Source, repeats: int, target: int, dataset: Dataset, log: Callable[[str], None]
) -> dict[str, list[contenders.Result]]:
    """`repeats` interleaved runs of every contender on the uploaded files."""
    engine, ours, fs, s3, sources = source.engine, source.ours, source.fs, source.s3, source.sources
    expected, bytes_in = source.expected, source.bytes_in
    timed: dict[str, list[contenders.Result]] = {}
    for k in range(repeats):
        table_name = f"bench.s3_{k}"
        iceberg_table(engine, table_name, pq.read_schema(source.local[0]), sources)
        delta_uri = _delta_table(s3, fs, sources, f"delta-{k}")
        out = f"{s3.bucket}/pyarrow-{k}"
        peers = contenders.peer_expected(expected, k)
        for contender in (
            partial(contenders.ours, ours, engine.catalog, table_name, expected, bytes_in, dataset.files),
            partial(deltars, s3, delta_uri, target, peers, bytes_in, dataset.files),
            partial(pyarrow_copy, s3, sources, out, target, peers, bytes_in),
        ):
            result = contender()
            if not result.rows_identical:
                raise RuntimeError(f"bench: {result.contender} changed the rows of {dataset.name}")
            timed.setdefault(result.contender, []).append(result)
        _drop(engine, fs, s3, table_name, [delta_uri.removeprefix("s3://"), out])
        log(f"[s3] run {k + 1}/{repeats}: " + ", ".join(f"{c} {r[-1].seconds:.2f}s" for c, r in timed.items()))
    return timed


def upload(fs: pafs.S3FileSystem, folder: Path, destination: str) -> list[str]:
    """Copy `folder`'s files to `destination` (bucket/prefix); the objects there, sorted."""
    pafs.copy_files(str(folder), destination, destination_filesystem=fs)
    return sorted(i.path for i in fs.get_file_info(pafs.FileSelector(destination)))


def iceberg_table(
    engine: Engine, name: str, schema: pa.Schema, sources: list[str], properties: dict[str, str] | None = None
) -> None:
    """An unpartitioned Iceberg table in the bucket over the source objects (bucket/key; pyiceberg add_files)."""
    props = {"write.parquet.compression-codec": CODEC, **(properties or {})}
    table = engine.catalog.create_table(name, schema=schema, properties=props)
    table.add_files([f"s3://{p}" for p in sources])


def _delta_table(s3: LocalS3, fs: pafs.S3FileSystem, sources: list[str], prefix: str) -> str:
    """A Delta table over server-side copies of `sources` (convert_to_deltalake, in place)."""
    from deltalake import convert_to_deltalake

    for source in sources:
        fs.copy_file(source, f"{s3.bucket}/{prefix}/{os.path.basename(source)}")
    uri = f"s3://{s3.bucket}/{prefix}"
    convert_to_deltalake(uri, storage_options=delta_storage_options(s3))
    return uri


def _drop(engine: Engine, fs: pafs.S3FileSystem, s3: LocalS3, table_name: str, prefixes: list[str]) -> None:
    """Delete one run's tables and results from the server (sources stay)."""
    location = engine.catalog.load_table(table_name).location()
    engine.catalog.drop_table(table_name)
    for prefix in [location.removeprefix("s3://"), *prefixes]:
        fs.delete_dir(prefix)


def deltars(
    s3: LocalS3, uri: str, target_bytes: int, expected: RowsDigest | int, bytes_in: int, files: int
) -> contenders.Result:
    """delta-rs `optimize.compact()` on the server, Snappy; timed in a child process."""
    options = delta_storage_options(s3)
    seconds, rss = contenders.in_child(_deltars_compact, uri, options, target_bytes)
    from deltalake import DeltaTable

    table = DeltaTable(uri, storage_options=options)
    identical = contenders.rows_match(expected, table.to_pyarrow_dataset())
    return contenders.Result("delta-rs", seconds, bytes_in, files, len(table.file_uris()), rss, "process", identical)


def _deltars_compact(uri: str, options: dict[str, str], target_bytes: int) -> None:
    from deltalake import DeltaTable, WriterProperties

    DeltaTable(uri, storage_options=options).optimize.compact(
        target_size=target_bytes, writer_properties=WriterProperties(compression=DELTA_CODEC)
    )


def pyarrow_copy(
    s3: LocalS3, sources: list[str], out: str, target_bytes: int, expected: RowsDigest | int, bytes_in: int
) -> contenders.Result:
    """The limit: one thread streaming every object's batches into target-size objects."""
    seconds, rss = contenders.in_child(_pyarrow_copy, s3, sources, out, target_bytes)
    fs = filesystem(s3)
    written = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(out)))
    identical = contenders.rows_match(expected, ds.dataset(written, filesystem=fs))
    return contenders.Result(
        "pyarrow 1 thread", seconds, bytes_in, len(sources), len(written), rss, "process", identical
    )


def _pyarrow_copy(s3: LocalS3, sources: list[str], out: str, target_bytes: int) -> None:
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    fs = filesystem(s3)

    def batches():
        for source in sources:
            with fs.open_input_file(source) as stream:
                yield from pq.ParquetFile(stream).iter_batches(batch_size=65_536, use_threads=False)

    contenders.write_rolling(batches(), out, target_bytes, fs.open_output_stream)


def measure(repeats: int = 3, workdir: Path | None = None, log: Callable[[str], None] = print) -> dict:
    """The s3 dataset alone on a fresh local Spark session (warmed up first): medians and ratios."""
    import tempfile

    from compaction_assets.execution.spark import spark_session
    from compaction_tools.bench import run

    root = Path(workdir or tempfile.mkdtemp(prefix="compaction-bench-s3-"))
    root.mkdir(parents=True, exist_ok=True)
    config = load_config(run.bench_config(root))
    spark = spark_session(config.spark)
    spark.sparkContext.setLogLevel("ERROR")
    engine = Engine(config, spark=lambda: spark)
    engine.catalog.create_namespace_if_not_exists(run.NAMESPACE)
    run.warm_up(engine, os.cpu_count() or 1)
    bytes_in, timed = compare_s3(spark, root, log, repeats, run.TARGET)
    report = run.DatasetReport(S3.name, S3.files, S3.rows, bytes_in)
    report.results.extend(run.median_results(timed))
    run.log_results(report, log)
    return {
        "dataset": S3.name,
        "ratio_vs_deltars": report.ratio_vs_deltars,
        "share_of_2x_pyarrow": report.share_of_two_pyarrow_cores,
        "seconds": {r.contender: r.seconds for r in report.results},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    figures = measure(args.repeats, args.dir)
    print(
        f"dataset=s3 ratio_vs_deltars={figures['ratio_vs_deltars']:.3f} "
        f"share_of_2x_pyarrow={figures['share_of_2x_pyarrow']:.3f} ({time.perf_counter() - started:.0f}s)"
    )


if __name__ == "__main__":
    main()
