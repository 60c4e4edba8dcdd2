"""Which path rewrites a group (Polars, bulk Arrow scan, per-file projection) and that each keeps
the rows: by content, against tables whose files need projection by field id."""

import os
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from compaction_assets.execution.polars_rewrite import decoded_row_bytes, held_row_bytes, local_path
from compaction_assets.execution.polars_storage import (
    MAX_CONCURRENT_SCANS,
    SCAN_BYTES_IN_FLIGHT,
    SCAN_VARIABLES,
    concurrent_scans,
    scan_concurrency,
)
from compaction_assets.execution.source_reader import SourceReader
from compaction_assets.execution.worker import rewrite_group
from compaction_assets.execution.writers import RollingWriter
from compaction_assets.lake.datafile_codec import decode_partition
from compaction_assets.lake.digest import rows_digest
from compaction_tools.demo import append_fragments
from tests.conftest import create_fragmented, data_files
from tests.lakekit.jobs import rewrite_job


def _rows(table) -> list[dict]:
    return sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])


def test_plain_fragments_go_through_polars_with_field_ids_and_statistics(lake):
    table = create_fragmented(lake, "ns.plain", {"eu": 40, "us": 30})
    before = rows_digest(table)

    outcomes = [o for o in lake.engine.compact("ns.plain") if o.status == "committed"]

    assert {o.engine for o in outcomes} == {"polars"} and len(outcomes) == 2
    table = lake.table("ns.plain")
    assert rows_digest(table) == before
    for f in data_files(table):
        assert f["lower_bounds"] and f["upper_bounds"] and f["null_value_counts"] and f["column_sizes"]
    # a pyiceberg scan with a filter prunes and reads the Polars-written files by field id
    assert table.scan(row_filter="id < 10").to_arrow().num_rows == 10


def test_a_swapped_column_name_never_goes_by_name(lake):
    """a and b trade names: reading old files by name would swap their values, so Polars is off."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "a", StringType(), required=False),
        NestedField(3, "b", StringType(), required=False),
    )
    table = lake.catalog.create_table("ns.swap", schema=schema)
    append_fragments(table, [pa.table({"id": [i], "a": [f"first-{i}"], "b": [f"second-{i}"]}) for i in range(8)])
    with table.update_schema() as update:
        update.rename_column("a", "tmp")
    with table.update_schema() as update:
        update.rename_column("b", "a")
    with table.update_schema() as update:
        update.rename_column("tmp", "b")
    table = lake.table("ns.swap")
    append_fragments(table, [pa.table({"id": [i], "b": [f"first-{i}"], "a": [f"second-{i}"]}) for i in range(8, 16)])
    expected = _rows(lake.table("ns.swap"))
    assert expected[0] == {"id": 0, "b": "first-0", "a": "second-0"}

    [outcome] = lake.engine.compact("ns.swap")

    assert outcome.status == "committed" and outcome.engine == "arrow"
    assert _rows(lake.table("ns.swap")) == expected


def test_files_of_an_older_schema_are_projected_the_rest_scanned_in_bulk(lake):
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "name", StringType(), False))
    table = lake.catalog.create_table("ns.grown", schema=schema)
    append_fragments(table, [pa.table({"id": pa.array([i], pa.int64()), "name": [f"n{i}"]}) for i in range(6)])
    with table.update_schema() as update:
        update.add_column("email", StringType())
    table = lake.table("ns.grown")
    new = [pa.table({"id": pa.array([i], pa.int64()), "name": [f"n{i}"], "email": [f"{i}@x"]}) for i in range(6, 12)]
    append_fragments(table, new)
    table = lake.table("ns.grown")
    paths = [f["file_path"] for f in data_files(table)]
    old_paths = {p for p in paths if "email" not in pq.read_schema(urlparse(p).path).names}
    assert len(old_paths) == 6
    expected = _rows(table)

    job = rewrite_job(lake.engine, "ns.grown")
    [group] = job.groups
    metadata = table.metadata
    writer = RollingWriter(table.io, metadata, decode_partition(group.partition), group, 1 << 30, 0)
    reader = SourceReader(metadata, table.io, group.sources, decode_partition(group.partition), 0, writer.convert)
    rows = [row for batch in reader.batches() for row in batch.to_pylist()]
    assert set(reader.projected_paths) == old_paths
    assert set(reader.bulk_paths) == {s.path for s in group.sources} - old_paths
    assert sorted(rows, key=lambda r: r["id"]) == expected

    # the same group through the worker: Polars refuses the mixed schemas, the Arrow path writes it
    outcome = rewrite_group(job, 0)
    assert outcome.error is None and outcome.engine == "arrow" and outcome.rows_read == 12


def test_a_corrupt_page_under_an_intact_footer_is_named(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 12})
    victim = sorted(f["file_path"] for f in data_files(table))[5]
    path = Path(urlparse(victim).path)
    raw = bytearray(path.read_bytes())
    raw[4:300] = bytes(296)  # the first data pages; the footer at the end still parses
    path.write_bytes(bytes(raw))

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "failed" and victim in outcome.reason


def test_local_paths_are_sliced_only_where_parse_location_agrees():
    io = PyArrowFileIO()
    for location in [
        "file:///w/t/data/a.parquet",
        "file:///w/a b%20c.parquet",
        "file:///w/a?b#c.parquet",
        "/w/a.parquet",
    ]:
        assert local_path(io.properties, location) == PyArrowFileIO.parse_location(location)[2], location
    assert local_path(io.properties, "s3://bucket/t/a.parquet") is None


def test_polars_scans_many_small_local_sources_at_once_and_leaves_the_environment_as_it_was(monkeypatch):
    """Tiny sources get up to MAX_CONCURRENT_SCANS in flight, one large source among them limits
    it, sources near the Polars limit keep Polars' default (nothing set); a value the environment
    sets wins; all is restored after."""
    for name in SCAN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert concurrent_scans([11_000] * 5_000) == MAX_CONCURRENT_SCANS
    assert concurrent_scans([SCAN_BYTES_IN_FLIGHT // 10] * 3) == 10
    assert concurrent_scans([SCAN_BYTES_IN_FLIGHT * 2]) == 1
    assert concurrent_scans([1_000] * 10_000 + [SCAN_BYTES_IN_FLIGHT // 2]) == 2  # counted at the largest
    with scan_concurrency([11_000] * 100):
        assert [os.environ[n] for n in SCAN_VARIABLES] == [str(MAX_CONCURRENT_SCANS)] * 2
    assert not any(n in os.environ for n in SCAN_VARIABLES)
    with scan_concurrency([6 * 1024 * 1024] * 10):  # 1 in flight: no more than Polars' own
        assert not any(n in os.environ for n in SCAN_VARIABLES)
    with pytest.raises(RuntimeError), scan_concurrency([1_000]):
        raise RuntimeError("a failing sink")
    assert not any(n in os.environ for n in SCAN_VARIABLES)
    monkeypatch.setenv(SCAN_VARIABLES[0], "3")
    with scan_concurrency([1_000]):
        assert os.environ[SCAN_VARIABLES[0]] == "3" and os.environ[SCAN_VARIABLES[1]] == str(MAX_CONCURRENT_SCANS)
    assert os.environ[SCAN_VARIABLES[0]] == "3" and SCAN_VARIABLES[1] not in os.environ


def test_sources_of_long_runs_count_as_their_decoded_size(tmp_path):
    """Parquet stores a column of long runs in a few bytes per row; a scan holds it decoded, at
    8 bytes per row: such sources get no more in flight than Polars' default."""
    rows = 200_000
    runs = pa.table({f"c{j}": pa.array([k // 4096 for k in range(rows)], pa.int64()) for j in range(4)})
    path = tmp_path / "runs.parquet"
    pq.write_table(runs, path, compression="zstd")
    footer = pq.read_metadata(path)

    assert decoded_row_bytes(footer) < 8  # what the footer says: under a byte per column
    assert held_row_bytes(footer) == 32.0
    held = int(rows * held_row_bytes(footer))
    assert path.stat().st_size < SCAN_BYTES_IN_FLIGHT // MAX_CONCURRENT_SCANS  # by its size, 64 in flight
    assert concurrent_scans([held] * 300) == 1


def test_a_polars_panic_falls_back_to_the_arrow_path_with_every_row(lake, monkeypatch):
    """A value Polars cannot parse in one of its variables makes it panic (a BaseException, not an
    Exception): the group goes through the Arrow path instead, and keeps its rows."""
    table = create_fragmented(lake, "ns.panic", {"eu": 12})
    expected = _rows(table)
    job = rewrite_job(lake.engine, "ns.panic")
    monkeypatch.setenv(SCAN_VARIABLES[0], "not-a-number")

    outcome = rewrite_group(job, 0)

    assert outcome.error is None and outcome.engine == "arrow" and outcome.rows_read == len(expected)
    written = pa.concat_tables(pq.read_table(urlparse(f.file_path).path) for f in outcome.data_files)
    assert sorted(written.to_pylist(), key=lambda r: r["id"]) == expected
