"""The Polars path's merge-on-read where a group's files are not alike: its chunks are scanned
by name and relabelled by position, and its deleted positions are numbered across a chunk's
files by their manifest record counts. Neither may move a value into another column or a delete
onto another row: such a group is rewritten right (on the per-file path) or fails naming the file.
Found by an outside attack on the Polars merge-on-read path (each case silently committed wrong rows)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.typedef import Record
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from compaction_assets.execution.worker import GroupOutcome, RewriteJob, rewrite_group
from compaction_assets.lake.files import live_files
from compaction_tools.bench.cdc_worker import rewrite_job
from compaction_tools.demo import append_fragments
from tests.lakekit.deletes import commit_delete_files, equality_delete_file, position_delete_file
from tests.lakekit.oracle import row_key
from tests.lakekit.spec_reader import spec_rows

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "a", LongType(), required=False),
    NestedField(3, "b", LongType(), required=False),
)


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[SqlCatalog]:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("ns")
    yield catalog
    catalog.engine.dispose()


def _rows(table: Table, start: int, count: int) -> pa.Table:
    """`count` rows in the table's current columns; column `x` holds id * 10 + (x's field id)."""
    ids = range(start, start + count)
    return pa.table(
        {
            f.name: pa.array([i if f.field_id == 1 else i * 10 + f.field_id for i in ids], pa.int64())
            for f in table.schema().fields
        }
    )


def _data_files(table: Table) -> list[DataFile]:
    return [f.data_file for f in live_files(table) if f.data_file.content == DataFileContent.DATA]


def _append(catalog: SqlCatalog, table: Table, start: int) -> tuple[Table, DataFile]:
    """20 rows appended in the table's current columns: the table reloaded, and the new file."""
    before = {f.file_path for f in _data_files(table)}
    append_fragments(table, [_rows(table, start, 20)])
    table = catalog.load_table("ns.t")
    [added] = [f for f in _data_files(table) if f.file_path not in before]
    return table, added


def _append_rows(catalog: SqlCatalog, table: Table, rows: pa.Table) -> tuple[Table, DataFile]:
    """`rows` appended as one file: the table reloaded, and the new file."""
    before = {f.file_path for f in _data_files(table)}
    append_fragments(table, [rows])
    table = catalog.load_table("ns.t")
    [added] = [f for f in _data_files(table) if f.file_path not in before]
    return table, added


def _one_group(table: Table, first: str, max_files: int) -> RewriteJob:
    """The driver's Polars job for the table's one partition, `first` the group's first source."""
    job = rewrite_job(table, polars=True)
    [group] = job.groups
    sources = sorted(group.sources, key=lambda s: s.path != first)
    group = dataclasses.replace(group, sources=sources, max_files=max_files)
    return RewriteJob.from_json(dataclasses.replace(job, groups=[group]).to_json())


def _written(outcome: GroupOutcome) -> Counter:
    return Counter(
        row_key(r) for f in outcome.data_files for r in pq.read_table(urlparse(f.file_path).path).to_pylist()
    )


def _assert_live_rows(table: Table, outcome: GroupOutcome) -> None:
    assert outcome.error is None, outcome.error
    rows = Counter(row_key(r) for r in spec_rows(table))
    assert _written(outcome) == rows
    for row in rows:  # every value where it belongs (the oracle's rows are in the current schema)
        values = dict(row)
        assert all(values[f.name] in (None, values["id"] * 10 + f.field_id) for f in table.schema().fields[1:])


@pytest.mark.parametrize("delete", ["position", "equality"])
def test_first_chunk_deleted_then_a_file_of_an_older_column_order(catalog: SqlCatalog, delete: str) -> None:
    table = catalog.create_table("ns.t", schema=SCHEMA)
    append_fragments(table, [_rows(table, 0, 20)])  # id, a, b
    with table.update_schema() as update:
        update.move_before("b", "a")
    table = catalog.load_table("ns.t")
    table, newer = _append(catalog, table, 100)  # id, b, a: the table's order now
    if delete == "position":
        commit_delete_files(table, [position_delete_file(table, newer, list(range(20)))])
    else:
        keys = [{"id": i} for i in range(100, 120)]
        commit_delete_files(table, [equality_delete_file(table, 0, newer.partition, ["id"], keys)])
    table = catalog.load_table("ns.t")

    outcome = rewrite_group(_one_group(table, newer.file_path, max_files=2), 0)

    _assert_live_rows(table, outcome)
    assert outcome.rows_deleted == 20


def test_first_chunk_deleted_then_a_file_with_a_dropped_column(catalog: SqlCatalog) -> None:
    table = catalog.create_table("ns.t", schema=SCHEMA)
    append_fragments(table, [_rows(table, 0, 20)])  # id, a, b (field 3)
    with table.update_schema() as update:
        update.delete_column("b")
    with table.update_schema() as update:
        update.add_column("c", LongType())  # field 4, same type and place as b
    table = catalog.load_table("ns.t")
    table, newer = _append(catalog, table, 100)  # id, a, c
    commit_delete_files(table, [position_delete_file(table, newer, list(range(20)))])
    table = catalog.load_table("ns.t")

    outcome = rewrite_group(_one_group(table, newer.file_path, max_files=2), 0)

    _assert_live_rows(table, outcome)  # c is NULL in the older file's rows, never b's values
    assert all(
        r["c"] is None for f in outcome.data_files for r in pq.read_table(urlparse(f.file_path).path).to_pylist()
    )


def test_record_counts_that_cancel_out_never_move_a_delete(catalog: SqlCatalog) -> None:
    """Two files whose manifest entries say 10 rows each hold 9 and 11: the chunk's total adds
    up, but the second file's positions would be offset by 10 and delete the wrong row."""
    table = catalog.create_table("ns.t", schema=SCHEMA)
    append_fragments(table, [_rows(table, 0, 10), _rows(table, 100, 10)])
    table = catalog.load_table("ns.t")
    first, second = sorted(_data_files(table), key=lambda f: f.file_path)
    commit_delete_files(table, [position_delete_file(table, second, [0])])
    table = catalog.load_table("ns.t")
    # rewrite both files in place, as a faulty writer would have: one row moved from the first to the second
    one, two = (pq.read_table(urlparse(f.file_path).path) for f in (first, second))
    pq.write_table(one.slice(0, 9), urlparse(first.file_path).path)
    pq.write_table(pa.concat_tables([one.slice(9), two]), urlparse(second.file_path).path)

    outcome = rewrite_group(_one_group(table, first.file_path, max_files=1), 0)

    assert outcome.data_files == []
    assert "has 9 rows but its manifest entry says 10" in outcome.error


def test_a_zero_row_source_under_equality_deletes_keeps_the_group_on_polars(catalog: SqlCatalog) -> None:
    """Some writers commit empty data files; one with an equality delete applying has nothing to
    delete, and must not send the group's other files to the per-file path."""
    table = catalog.create_table("ns.t", schema=SCHEMA)
    append_fragments(table, [_rows(table, i * 10, 10) for i in range(3)])
    table = catalog.load_table("ns.t")
    path = f"{table.location().rstrip('/')}/data/empty.parquet"
    pq.write_table(schema_to_pyarrow(table.schema()).empty_table(), urlparse(path).path)
    schema = table.schema()
    stats = data_file_statistics_from_parquet_metadata(
        pq.read_metadata(urlparse(path).path),
        compute_statistics_plan(schema, table.properties),
        parquet_path_to_id_mapping(schema),
    )
    empty = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        file_size_in_bytes=len(table.io.new_input(path)),
        **stats.to_serialized_dict(),
    )
    empty.spec_id = 0
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(empty)
    table = catalog.load_table("ns.t")
    commit_delete_files(table, [equality_delete_file(table, 0, Record(), ["id"], [{"id": 3}, {"id": 25}])])
    table = catalog.load_table("ns.t")

    outcome = rewrite_group(_one_group(table, _data_files(table)[0].file_path, max_files=1), 0)

    _assert_live_rows(table, outcome)
    assert outcome.engine == "polars" and outcome.rows_deleted == 2


@pytest.mark.parametrize("first", ["wide", "one-row"])
def test_wide_compressible_keys_are_scanned_in_windows_of_bounded_decoded_size(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """Equality keys of 1,000 characters compress about 100-fold: a window bounded by source bytes
    alone held many times its bound once decoded. The first window is one source; later ones hold
    as many as decode to KEY_WINDOW_DECODED by the ratio seen, and at most KEY_WINDOW_GROWTH times
    the previous window's bytes: a one-row first source (mostly footer) gives a ratio far too low
    (found by outside attacks: 930 MB; then a window of 7x the bound behind a one-row source)."""
    import polars as pl

    from compaction_assets.execution import polars_deletes

    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "k", StringType(), required=False))
    table = catalog.create_table("ns.t", schema=schema)

    def rows(start: int) -> pa.Table:
        ids = range(start, start + 200)
        return pa.table({"id": pa.array(ids, pa.int64()), "k": pa.array([f"{'x' * 1000}{i}" for i in ids])})

    append_fragments(table, [rows(i * 200) for i in range(12)])
    table = catalog.load_table("ns.t")
    if first == "one-row":
        table, small = _append_rows(catalog, table, pa.table({"id": pa.array([-1], pa.int64()), "k": ["y"]}))
    keys = [{"k": f"{'x' * 1000}{i}"} for i in range(0, 2400, 7)]
    commit_delete_files(table, [equality_delete_file(table, 0, Record(), ["k"], keys)])
    table = catalog.load_table("ns.t")
    decoded_per_file = pa.array([f"{'x' * 1000}{i}" for i in range(200)]).nbytes
    monkeypatch.setattr(polars_deletes, "KEY_WINDOW_DECODED", 3 * decoded_per_file)
    windows: list[int] = []
    scan = pl.scan_parquet

    def counted(paths, **options):  # noqa: ANN001, ANN003, ANN202 - polars' own signature
        if options.get("include_file_paths") == polars_deletes.FILE_COLUMN:  # a key scan, not the rewrite's
            windows.append(len(paths))
        return scan(paths, **options)

    monkeypatch.setattr(pl, "scan_parquet", counted)
    first = small.file_path if first == "one-row" else min(f.file_path for f in _data_files(table))

    outcome = rewrite_group(_one_group(table, first, max_files=12), 0)

    assert outcome.error is None and outcome.engine == "polars"
    assert windows[0] == 1 and sum(windows) == len(_data_files(table))
    assert 2 <= max(windows) <= 3, windows  # files alike: as many as decode to the bound, never more
    assert outcome.rows_deleted == len(keys)
    assert _written(outcome) == Counter(row_key(r) for r in spec_rows(table))


def test_uniform_integer_keys_are_tested_by_the_scan_as_the_index_would(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where every source's equality deletes are the same files on one integer column, the key
    scan tests membership itself: NULL matches NULL, a source newer than the deletes keeps its
    rows (one with a position delete of its own), position deletes still apply."""
    from compaction_assets.execution.deletes import GroupDeletes

    schema = Schema(
        NestedField(1, "id", IntegerType(), required=False), NestedField(2, "a", LongType(), required=False)
    )
    table = catalog.create_table("ns.t", schema=schema)

    def rows(ids: list[int | None], a: int) -> pa.Table:
        return pa.table({"id": pa.array(ids, pa.int32()), "a": pa.array([a + k for k in range(len(ids))], pa.int64())})

    append_fragments(table, [rows([*range(20), None], 0)])
    table = catalog.load_table("ns.t")
    table, second = _append_rows(catalog, table, rows([*range(20, 40), None], 100))
    keys = [{"id": None}, {"id": 3}, {"id": 25}, {"id": 1000}]
    commit_delete_files(table, [equality_delete_file(table, 0, Record(), ["id"], keys)])
    table = catalog.load_table("ns.t")
    commit_delete_files(table, [position_delete_file(table, second, [0, 1])])
    table = catalog.load_table("ns.t")
    table, third = _append_rows(catalog, table, rows([3, 25, None, 7], 200))  # newer than the equality deletes
    commit_delete_files(table, [position_delete_file(table, third, [3])])
    table = catalog.load_table("ns.t")
    uniform = []
    keys_of = GroupDeletes.uniform_keys

    def recorded(self, sources):  # noqa: ANN001, ANN202 - GroupDeletes' own signature
        uniform.append(keys_of(self, sources))
        return uniform[-1]

    monkeypatch.setattr(GroupDeletes, "uniform_keys", recorded)
    first = min(f.file_path for f in _data_files(table))

    outcome = rewrite_group(_one_group(table, first, max_files=1), 0)

    assert outcome.error is None and outcome.engine == "polars"
    [(name, found, nulls)] = uniform
    assert name == "id" and sorted(found.tolist()) == [3, 25, 1000] and nulls
    assert outcome.rows_deleted == 7  # NULL twice, 3, 25; positions 0 and 1 of the second file, 3 of the third
    assert _written(outcome) == Counter(row_key(r) for r in spec_rows(table))
