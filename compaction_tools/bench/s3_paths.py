"""The rewrite paths on object storage, side by side: tables of many small files on moto's S3
server, each rewritten as one group in this process (the worker's code, no Spark) by every path:
a table in the current schema by the bulk pyarrow scan and by Polars; a table whose files all
predate a column (so each needs projection) by the per-file path fetching one file after the
other (the old behaviour) and with the next files fetched meanwhile. The same on local disk.

moto runs in a child process (so its Python does not share this process's GIL) and can add a
fixed delay to every request, emulating an object store's first-byte latency (real S3: ~10-30 ms
in-region for small GETs); without it, moto answers in ~1-3 ms of server CPU per request.

    python -m compaction_tools.bench.s3_paths --files 300 --repeats 3 --delay-ms 0 10
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa

from compaction_assets.execution import source_reader
from compaction_tools.local_s3 import LocalS3

MiB = 1024 * 1024


def _serve(port: int, delay: float, ready) -> None:  # noqa: ANN001 - an Event
    import logging

    from moto.moto_server.threaded_moto_server import MotoRequestHandler
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    inner = DomainDispatcherApplication(create_backend_app)

    def app(environ, start_response):  # noqa: ANN001, ANN202 - WSGI
        time.sleep(delay)
        return inner(environ, start_response)

    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)
    ready.set()
    server.serve_forever()


@contextmanager
def slow_s3(delay_seconds: float, bucket: str = "lake") -> Iterator[LocalS3]:
    """moto's S3 server in a child process, every request delayed by `delay_seconds`."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_serve, args=(port, delay_seconds, ready), daemon=True)
    child.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the S3 server did not start")
        s3 = LocalS3(endpoint=f"http://127.0.0.1:{port}", bucket=bucket)
        for _ in range(50):
            try:
                s3.client().create_bucket(Bucket=bucket)
                break
            except Exception:  # noqa: BLE001 - not listening yet
                time.sleep(0.1)
        yield s3
    finally:
        child.terminate()
        child.join(10)


def _table(catalog, name: str, files: int, rows: int, evolved: bool):  # noqa: ANN001, ANN202
    """`files` small files; `evolved`: all written before a column was added, so each needs projection."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType

    from compaction_assets.lake.appends import append_fragments

    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "payload", StringType(), required=False),
        NestedField(3, "amount", DoubleType(), required=False),
    )
    table = catalog.create_table(name, schema=schema)

    def chunk(start: int) -> pa.Table:
        ids = range(start, start + rows)
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "payload": [f"{i:08d}-{(i * 2654435761) % 2**32:010d}" for i in ids],
                "amount": [i * 0.25 for i in ids],
            }
        )

    append_fragments(table, (chunk(k * rows) for k in range(files)))
    if evolved:
        with table.update_schema() as update:
            update.add_column("note", StringType())
    table.refresh()
    return table


def _job(table, polars: bool):  # noqa: ANN001, ANN202
    from compaction_assets.execution import polars_rewrite
    from compaction_assets.execution.worker import GroupSpec, RewriteJob, SourceFile

    tasks = list(table.scan().plan_files())
    sources = [SourceFile(t.file.file_path, t.file.file_size_in_bytes, t.file.record_count) for t in tasks]
    group = GroupSpec(
        sources=sources,
        partition=[],
        spec_id=0,
        output_dir=f"{table.location()}/data",
        file_prefix=f"bench-{time.monotonic_ns()}",
        max_files=1,
        polars=polars and polars_rewrite.qualifies(table.metadata, table.io, sources, False),
    )
    return RewriteJob(
        metadata_json=table.metadata.model_dump_json(),
        io_properties=dict(table.io.properties),
        target_file_size_bytes=512 * MiB,
        groups=[group],
        tasks=[[0]],
    )


# contender -> (table, engine it must report, files fetched at once on the projected path)
CONTENDERS = {
    "arrow-bulk": ("current", "arrow", source_reader.OVERLAP_FILES),
    "polars": ("current", "polars", source_reader.OVERLAP_FILES),
    "projected-sequential": ("evolved", "arrow", 1),
    "projected-overlapped": ("evolved", "arrow", source_reader.OVERLAP_FILES),
}


def _timed(table, contender: str) -> float:  # noqa: ANN001
    from compaction_assets.execution.worker import rewrite_group

    _, engine, overlap = CONTENDERS[contender]
    job = _job(table, polars=contender == "polars")
    saved = source_reader.OVERLAP_FILES
    source_reader.OVERLAP_FILES = overlap
    try:
        start = time.perf_counter()
        outcome = rewrite_group(job, 0)
        elapsed = time.perf_counter() - start
    finally:
        source_reader.OVERLAP_FILES = saved
    if outcome.error or outcome.engine != engine or outcome.rows_read != sum(s.records for s in job.groups[0].sources):
        raise RuntimeError(f"{contender}: {outcome.engine} {outcome.error}")
    for data_file in outcome.data_files:
        table.io.delete(data_file.file_path)
    return elapsed


def run(files: int, rows: int, repeats: int, delays_ms: list[float]) -> list[dict]:
    from pyiceberg.catalog import load_catalog

    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as root:
        for delay in [None, *delays_ms]:
            where = "local disk" if delay is None else f"s3 +{delay:g} ms"
            with slow_s3(delay / 1000) if delay is not None else _nothing() as s3:
                name = f"c{len(results)}"
                uri = f"sqlite:///{root}/{name}.db"
                if s3 is None:
                    props = {"type": "sql", "uri": uri, "warehouse": f"file://{root}/{name}"}
                else:
                    props = s3.catalog_properties(uri, prefix=name)
                catalog = load_catalog(name, **props)
                catalog.create_namespace("b")
                tables = {
                    kind: _table(catalog, f"b.{kind}", files, rows, kind == "evolved")
                    for kind in ("current", "evolved")
                }
                times: dict[str, list[float]] = {c: [] for c in CONTENDERS}
                for _ in range(repeats):
                    for contender, (kind, _, _) in CONTENDERS.items():  # interleaved: drift hits all alike
                        times[contender].append(_timed(tables[kind], contender))
                row = {"where": where, "files": files, **{c: round(statistics.median(t), 3) for c, t in times.items()}}
                results.append(row)
                print(json.dumps(row), flush=True)
    return results


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--delay-ms", type=float, nargs="+", default=[0.0, 20.0])
    args = parser.parse_args()
    rows = run(args.files, args.rows, args.repeats, args.delay_ms)
    print(f"{'where':<12} {'files':>5} " + " ".join(f"{c:>21}" for c in CONTENDERS))
    for row in rows:
        print(f"{row['where']:<12} {row['files']:>5} " + " ".join(f"{row[c]:>20.2f}s" for c in CONTENDERS))


if __name__ == "__main__":
    main()
