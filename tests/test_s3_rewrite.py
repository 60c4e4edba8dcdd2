"""The rewrite paths on S3 (moto's server on 127.0.0.1, reached through the catalog's s3.* properties):
Polars reads and writes the objects itself, falls back where it must, and the arrow path overlaps
its reads of remote files; every path keeps the rows, field ids and statistics."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from compaction_assets.engine import Engine, begin
from compaction_assets.execution import source_reader
from compaction_assets.execution.polars_storage import (
    FOOTER_READ_VARIABLE,
    MIN_FOOTER_READ,
    WHOLE_OBJECT_READ,
    footer_reads,
    s3_storage_options,
    storage_for,
)
from compaction_assets.execution.source_reader import SourceReader
from compaction_assets.execution.worker import RewriteJob, rewrite_group
from compaction_assets.execution.writers import RollingWriter
from compaction_assets.lake.appends import append_fragments
from compaction_assets.lake.catalog import load_table
from compaction_assets.lake.datafile_codec import decode_partition
from compaction_assets.lake.delete_files import commit_delete_files, equality_delete_file, position_delete_file
from compaction_assets.lake.digest import rows_digest
from compaction_tools.local_s3 import ACCESS_KEY, SECRET_KEY
from tests.conftest import create_fragmented, data_files


def _job(engine: Engine, table_name: str) -> RewriteJob:
    """The rewrite job the engine would send to Spark for `table_name` (attempts begun in the ledger)."""
    table = load_table(engine.catalog, table_name)
    tplan, files = engine._plan(table, table_name, None)
    _, job, _, _, _ = begin.begin(
        engine.ledger, engine.config, table, table_name, tplan, files, tplan.to_compact, (None, len(tplan.to_compact))
    )
    return RewriteJob.from_json(job.to_json())


def _rows(table) -> list[dict]:  # noqa: ANN001
    return sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])


def _keys(s3_server, table) -> set[str]:  # noqa: ANN001
    """Every object under the table's location, as s3:// URIs, but folder markers: pyarrow's S3 delete
    may leave an empty `data/` object behind (seen once in a full-suite run, not alone), which every
    listing, GC's included, takes for a folder, not a file."""
    bucket, prefix = urlparse(table.location()).netloc, urlparse(table.location()).path.lstrip("/")
    pages = s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    keys = (o["Key"] for page in pages for o in page.get("Contents", []))
    return {f"s3://{bucket}/{key}" for key in keys if not key.endswith("/")}


def _evolved(lake, name: str, old: int, new: int):  # noqa: ANN001, ANN202
    """`old` one-row files written before a column was added, `new` after; the old ones need projection."""
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "name", StringType(), False))
    table = lake.catalog.create_table(name, schema=schema)
    append_fragments(table, [pa.table({"id": pa.array([i], pa.int64()), "name": [f"n{i}"]}) for i in range(old)])
    with table.update_schema() as update:
        update.add_column("email", StringType())
    table = lake.table(name)
    rows = range(old, old + new)
    append_fragments(
        table, [pa.table({"id": pa.array([i], pa.int64()), "name": [f"n{i}"], "email": [f"{i}@x"]}) for i in rows]
    )
    return lake.table(name)


def test_polars_runs_on_s3_and_writes_real_iceberg_files(s3_lake, s3_server):
    odd = "a b/%=é"  # its partition folder is escaped; Polars must take the object keys literally
    table = create_fragmented(s3_lake, "ns.plain", {"eu": 30, odd: 20})
    before = rows_digest(table)

    outcomes = [o for o in s3_lake.engine.compact("ns.plain") if o.status == "committed"]

    assert {o.engine for o in outcomes} == {"polars"} and len(outcomes) == 2
    table = s3_lake.table("ns.plain")
    assert rows_digest(table) == before
    client = s3_server.client()
    for f in data_files(table):
        assert f["file_path"].startswith("s3://")
        assert f["lower_bounds"] and f["upper_bounds"] and f["null_value_counts"] and f["column_sizes"]
        url = urlparse(f["file_path"])
        assert client.head_object(Bucket=url.netloc, Key=url.path[1:])["ContentLength"] == f["file_size_in_bytes"]
        with table.io.new_input(f["file_path"]).open() as stream:
            schema = pq.read_schema(stream)
        assert [fld.metadata[b"PARQUET:field_id"] for fld in schema] == [b"1", b"2", b"3", b"4"]
    # pyiceberg prunes by the written statistics and reads the files by field id
    assert table.scan(row_filter="id < 10").to_arrow().num_rows == 10
    assert len(table.scan(row_filter="id < 10").plan_files()) == 1
    assert table.scan(row_filter=f"region == '{odd}'").to_arrow().num_rows == 20 * 50


def test_storage_options_come_from_the_fileio_properties():
    props = {
        "s3.endpoint": "http://127.0.0.1:9000",
        "client.access-key-id": "AK",
        "s3.secret-access-key": "SK",
        "s3.session-token": "TOK",
        "client.region": "eu-west-1",
        "s3.force-virtual-addressing": "True",
        "uri": "sqlite:///c.db",
    }
    assert s3_storage_options(props) == {
        "aws_endpoint_url": "http://127.0.0.1:9000",
        "aws_allow_http": "true",
        "aws_access_key_id": "AK",
        "aws_secret_access_key": "SK",
        "aws_session_token": "TOK",
        "aws_region": "eu-west-1",
        "aws_virtual_hosted_style_request": "true",
    }
    assert s3_storage_options({"s3.endpoint": "https://s3.example"}) == {"aws_endpoint_url": "https://s3.example"}
    assert s3_storage_options({}) == {}  # object_store's own chain: environment, instance role
    for key in ("s3.role-arn", "s3.signer.uri", "s3.server-side-encryption", "s3.proxy-uri", "client.role-arn"):
        assert s3_storage_options({**props, key: "x"}) is None, key


def test_polars_tail_reads_follow_the_footers_and_read_larger_ones_whole(s3_server, monkeypatch):
    """The tail Polars reads is sized from a source's footer, or to the largest small source (read
    whole); the environment's own setting wins, and is restored after; a footer larger than the
    tail (600 columns, 142 KB) is still read whole."""
    monkeypatch.delenv(FOOTER_READ_VARIABLE, raising=False)
    with footer_reads(1_000):
        assert os.environ[FOOTER_READ_VARIABLE] == str(MIN_FOOTER_READ)
    with footer_reads(100_000):
        assert os.environ[FOOTER_READ_VARIABLE] == "200016"
    # small objects are read whole (one GET each); one past WHOLE_OBJECT_READ keeps footer-sized
    # tails for all (a tail that does not cover an object is wasted); restored after an error too
    with footer_reads(1_000, [900_000, 1_200_000, WHOLE_OBJECT_READ]):
        assert os.environ[FOOTER_READ_VARIABLE] == str(WHOLE_OBJECT_READ)
    with footer_reads(1_000, [900_000, WHOLE_OBJECT_READ + 1]):
        assert os.environ[FOOTER_READ_VARIABLE] == str(MIN_FOOTER_READ)
    with pytest.raises(RuntimeError), footer_reads(1_000, [900_000]):
        raise RuntimeError("a failing scan")
    assert FOOTER_READ_VARIABLE not in os.environ
    monkeypatch.setenv(FOOTER_READ_VARIABLE, "1048576")
    with footer_reads(1_000):
        assert os.environ[FOOTER_READ_VARIABLE] == "1048576"
    assert os.environ[FOOTER_READ_VARIABLE] == "1048576"
    monkeypatch.delenv(FOOTER_READ_VARIABLE)

    import polars as pl

    wide = pa.table({f"column_number_{i:04d}": pa.array(range(i, i + 100), pa.int64()) for i in range(600)})
    sink = pa.BufferOutputStream()
    pq.write_table(wide, sink)
    body = sink.getvalue().to_pybytes()
    assert pq.read_metadata(pa.BufferReader(body)).serialized_size > MIN_FOOTER_READ
    keys = [f"wide-footer/{k}.parquet" for k in range(2)]
    for key in keys:
        s3_server.client().put_object(Bucket=s3_server.bucket, Key=key, Body=body)
    options = s3_storage_options(s3_server.catalog_properties("sqlite://"))
    with footer_reads(0):
        frame = pl.scan_parquet([f"s3://{s3_server.bucket}/{k}" for k in keys], storage_options=options).collect()
    assert frame.to_arrow().cast(wide.schema).equals(pa.concat_tables([wide, wide]))


@pytest.fixture
def recorded_s3(s3_server):  # noqa: ANN001, ANN201
    """A second endpoint on moto's in-process backend (the buckets of `s3_server`) that records
    every request it serves: (method, key path, bytes sent)."""
    from moto.moto_server.threaded_moto_server import MotoRequestHandler
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    requests: list[tuple[str, str, int]] = []
    inner = DomainDispatcherApplication(create_backend_app)

    def app(environ, start_response):  # noqa: ANN001, ANN202 - WSGI
        body = b"".join(inner(environ, start_response))
        requests.append((environ["REQUEST_METHOD"], environ["PATH_INFO"], len(body)))
        return [body]

    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", requests
    finally:
        server.shutdown()
        thread.join()


def test_polars_reads_each_small_source_object_once(s3_lake, recorded_s3):
    """A group of 40 sources of ~160 KB on S3: the sink fetches each whole in one GET, and the
    schema check before it reads footer-sized tails only (it reads up to 16 files' and drops them),
    so about one source's bytes cross the wire per source, not two."""
    endpoint, requests = recorded_s3
    table = create_fragmented(s3_lake, "ns.once", {"eu": 40}, rows=12_000)
    with table.transaction() as txn:  # the tests' policy targets 64 KiB files: these are small at 64 MiB
        txn.set_properties({"compaction.target-file-size-bytes": str(64 << 20)})
    job = _job(s3_lake.engine, "ns.once")
    job = dataclasses.replace(job, io_properties={**job.io_properties, "s3.endpoint": endpoint})
    (group,) = job.groups
    sizes = {"/" + urlparse(s.path).netloc + urlparse(s.path).path: s.size for s in group.sources}  # path style
    assert len(sizes) == 40 and min(sizes.values()) > 2 * MIN_FOOTER_READ

    outcome = rewrite_group(job, 0)

    assert outcome.error is None and outcome.engine == "polars"
    assert outcome.rows_read == sum(s.records for s in group.sources) == 40 * 12_000
    gets = [(path, sent) for method, path, sent in requests if method == "GET" and path in sizes]
    assert {path for path, _ in gets} == set(sizes)  # every source was read
    # one whole GET per source; the schema check's <= 16 footer tails and the first file's
    # footer (read through the FileIO to choose the path) are all the rest
    assert len(gets) <= len(sizes) + 16 + 2
    assert sum(sent for _, sent in gets) <= sum(sizes.values()) + 17 * MIN_FOOTER_READ
    assert sum(f.record_count for f in outcome.data_files) == 40 * 12_000


def test_polars_reaches_s3_schemes_only_for_whole_groups():
    io = PyArrowFileIO({"s3.endpoint": "http://127.0.0.1:9", "s3.region": "us-east-1"})
    storage = storage_for(io, ["s3a://b/k/a=1/x.parquet", "s3n://b/k/y.parquet"])
    assert storage is not None and storage.path("s3a://b/k/a=1/x.parquet") == "s3://b/k/a=1/x.parquet"
    assert storage.path("s3://b/k/a%3D1 b/x.parquet") == "s3://b/k/a%3D1 b/x.parquet"  # keys stay literal
    assert storage_for(io, ["s3://b/x.parquet", "file:///tmp/y.parquet"]) is None
    assert storage_for(io, ["s3://b/x?.parquet"]) is None
    assert storage_for(io, ["gs://b/x.parquet"]) is None
    assert storage_for(PyArrowFileIO({"s3.role-arn": "arn:aws:iam::1:role/r"}), ["s3://b/x.parquet"]) is None


def test_a_swapped_column_name_falls_back_on_s3(s3_lake):
    """a and b trade names: reading old files by name would swap their values, so Polars is off."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "a", StringType(), required=False),
        NestedField(3, "b", StringType(), required=False),
    )
    table = s3_lake.catalog.create_table("ns.swap", schema=schema)
    append_fragments(table, [pa.table({"id": [i], "a": [f"first-{i}"], "b": [f"second-{i}"]}) for i in range(8)])
    for old, new in (("a", "tmp"), ("b", "a"), ("tmp", "b")):
        with table.update_schema() as update:
            update.rename_column(old, new)
    table = s3_lake.table("ns.swap")
    append_fragments(table, [pa.table({"id": [i], "b": [f"first-{i}"], "a": [f"second-{i}"]}) for i in range(8, 16)])
    expected = _rows(s3_lake.table("ns.swap"))
    assert expected[0] == {"id": 0, "b": "first-0", "a": "second-0"}

    [outcome] = s3_lake.engine.compact("ns.swap")

    assert outcome.status == "committed" and outcome.engine == "arrow"
    assert _rows(s3_lake.table("ns.swap")) == expected


def test_polars_failing_on_s3_falls_back_cleans_up_and_leaks_no_credential(s3_lake, s3_server, caplog):
    """A group the driver found fit whose later file is of an older schema: Polars fails on it
    mid-group, deletes what it wrote, and the arrow path rewrites the group."""
    table = _evolved(s3_lake, "ns.grown", old=4, new=6)
    expected = _rows(table)
    job = _job(s3_lake.engine, "ns.grown")
    [group] = job.groups
    old = [s for s in group.sources if "email" not in _names(table, s.path)]
    new = [s for s in group.sources if s not in old]
    job = dataclasses.replace(job, groups=[dataclasses.replace(group, sources=new + old, polars=True)])
    before = _keys(s3_server, table)

    with caplog.at_level(logging.WARNING):
        outcome = rewrite_group(job, 0)

    assert outcome.error is None and outcome.engine == "arrow" and outcome.rows_read == 10
    assert any("fell back" in r.getMessage() for r in caplog.records)
    assert SECRET_KEY not in caplog.text and ACCESS_KEY not in caplog.text
    assert _keys(s3_server, table) == before | {f.file_path for f in outcome.data_files}
    rows = []
    for f in outcome.data_files:
        with table.io.new_input(f.file_path).open() as stream:
            rows += pq.read_table(stream).to_pylist()
    assert sorted(rows, key=lambda r: r["id"]) == expected


def _names(table, path: str) -> list[str]:  # noqa: ANN001
    with table.io.new_input(path).open() as stream:
        return pq.read_schema(stream).names


@pytest.fixture
def fetches(monkeypatch) -> dict:  # noqa: ANN001
    """Counts the projected path's whole-file fetches in flight, and their bytes (each made 20 ms
    slower, as a remote store's latency would), so a test sees whether they overlap."""
    seen = {"now": 0, "max": 0, "calls": 0, "bytes": 0, "max_bytes": 0}
    lock = threading.Lock()
    real = source_reader._fetch

    def counted(io, location):  # noqa: ANN001, ANN202
        size = len(io.new_input(location))
        with lock:
            seen["now"] += 1
            seen["bytes"] += size
            seen["calls"] += 1
            seen["max"] = max(seen["max"], seen["now"])
            seen["max_bytes"] = max(seen["max_bytes"], seen["bytes"])
        try:
            time.sleep(0.02)  # kept: the simulated latency whose overlap is measured
            return real(io, location)
        finally:
            with lock:
                seen["now"] -= 1
                seen["bytes"] -= size

    monkeypatch.setattr(source_reader, "_fetch", counted)
    return seen


def test_arrow_path_on_s3_overlaps_projected_reads_within_the_byte_budget(s3_lake, fetches, monkeypatch):
    table = _evolved(s3_lake, "ns.evolved", old=24, new=6)
    expected = _rows(table)
    job = _job(s3_lake.engine, "ns.evolved")
    [group] = job.groups
    partition = decode_partition(group.partition)

    def read() -> tuple[SourceReader, list[dict]]:
        writer = RollingWriter(table.io, table.metadata, partition, group, 1 << 30, 0)
        reader = SourceReader(table.metadata, table.io, group.sources, partition, 0, writer.convert)
        return reader, sorted((r for b in reader.batches() for r in b.to_pylist()), key=lambda r: r["id"])

    reader, rows = read()
    assert rows == expected and len(reader.projected_paths) == 24 and len(reader.bulk_paths) == 6
    assert fetches["calls"] == 24 and fetches["max"] > 1  # several GETs in flight

    budget = 2 * max(s.size for s in group.sources)
    monkeypatch.setattr(source_reader, "READAHEAD_BYTES", budget)
    fetches["max"] = fetches["max_bytes"] = 0
    assert read()[1] == expected
    assert fetches["max"] > 1 and fetches["max_bytes"] <= budget  # still overlapped, within the budget

    # a whole compaction through Spark (another table: the job above holds the first one's files in flight)
    expected = _rows(_evolved(s3_lake, "ns.evolved2", old=24, new=6))
    [outcome] = s3_lake.engine.compact("ns.evolved2")
    assert outcome.status == "committed" and outcome.engine == "arrow"
    assert _rows(s3_lake.table("ns.evolved2")) == expected


@pytest.mark.parametrize("equality", [False, True], ids=["positions", "positions-and-keys"])
def test_deletes_are_applied_on_s3(s3_lake, equality):
    table = create_fragmented(s3_lake, "ns.mor", {"eu": 8}, rows=20)
    victims = sorted((f for f in table.scan().plan_files()), key=lambda t: t.file.file_path)[:2]
    commit_delete_files(table, [position_delete_file(table, t.file, [0, 5, 19]) for t in victims])
    table = s3_lake.table("ns.mor")
    expected = _rows(table)
    if equality:  # the key columns come from one Polars scan over the objects (polars_deletes)
        ids = {r["id"] for r in expected[7::13]}
        partition = victims[0].file.partition
        commit_delete_files(table, [equality_delete_file(table, 0, partition, ["id"], [{"id": i} for i in ids])])
        table = s3_lake.table("ns.mor")
        expected = [r for r in expected if r["id"] not in ids]
    assert len(expected) == 8 * 20 - 6 - (12 if equality else 0)

    outcomes = [o for o in s3_lake.engine.compact("ns.mor") if o.status == "committed"]

    assert outcomes and {o.engine for o in outcomes} == {"polars"}  # Polars applies them (polars_deletes)
    table = s3_lake.table("ns.mor")
    assert _rows(table) == expected
    assert not [t for t in table.scan().plan_files() if t.delete_files]
