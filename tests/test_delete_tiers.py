"""The cheaper merge-on-read tiers (execution/delete_tiers.py) on real tables: real data files
appended by pyiceberg, real delete files committed as another engine would, the tier run
in-process (and through its mapInArrow entry point, and on Spark), its result committed by a
test-only swap, and the table read before and after by the spec reader and DuckDB."""

from __future__ import annotations

from collections import Counter
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import DataFileContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from compaction_assets.errors import InputFileError
from compaction_assets.execution import delete_tiers
from compaction_assets.execution.delete_tiers import (
    Tier,
    TierJob,
    TierOutcome,
    TierRun,
    convert_equality_deletes,
    rewrite_position_deletes,
)
from compaction_assets.execution.dispatch import arrow_batches
from compaction_assets.execution.tier_tasks import TIER_RESULT_ARROW_SCHEMA, outcome_from_row, run_tier_rows, run_tiers
from compaction_assets.lake import delete_files
from compaction_assets.lake.deletes import referenced_data_file
from compaction_assets.lake.files import LiveFile, live_files
from tests.lakekit.deletes import (
    commit_delete_files,
    equality_delete_file,
    position_delete_file,
    position_delete_rows,
    swap_delete_files,
)
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.oracle import row_key
from tests.lakekit.spec_reader import spec_rows

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "k", IntegerType(), required=False),
    NestedField(4, "s", StringType(), required=False),
)
BY_REGION = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"))
TARGET = 128 * 1024 * 1024


def make_table(root: Path, partitioned: bool = True) -> tuple[SqlCatalog, Table]:
    catalog = SqlCatalog("t", uri=f"sqlite:///{root}/c.db", warehouse=f"file://{root}/wh")
    catalog.create_namespace("ns")
    spec = BY_REGION if partitioned else PartitionSpec()
    return catalog, catalog.create_table("ns.t", schema=SCHEMA, partition_spec=spec)


@pytest.fixture
def table(tmp_path: Path):
    catalog, table = make_table(tmp_path)
    yield table
    catalog.engine.dispose()


def append(table: Table, rows: list[dict]) -> None:
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))
    table.refresh()


def rows_of(ids: range, region: str, k=lambda i: i % 4, s=lambda i: "abc"[i % 3]) -> list[dict]:
    return [{"id": i, "region": region, "k": k(i), "s": s(i)} for i in ids]


def multiset(rows: list[dict]) -> Counter:
    return Counter(row_key(r) for r in rows)


def live(table: Table) -> list[LiveFile]:
    return live_files(table)


def data_file_of(table: Table, first_id: int) -> LiveFile:
    """The live data file whose id range is the narrowest holding `first_id` (one per test append)."""
    ranges = []
    for f in live(table):
        if not f.is_delete:
            lower = int.from_bytes(f.data_file.lower_bounds[1], "little", signed=True)
            upper = int.from_bytes(f.data_file.upper_bounds[1], "little", signed=True)
            if lower <= first_id <= upper:
                ranges.append((upper - lower, f.path, f))
    return min(ranges)[2]


def output_dir(table: Table, key: str = "") -> str:
    """The partition's data folder, as the engine names it (`key`: its partition key)."""
    data = f"{table.location().rstrip('/')}/data"
    return f"{data}/{key}" if key else data


def convert_all(table: Table, prefix: str = "attempt1") -> list[TierOutcome]:
    """Convert every partition's equality deletes (scope: the partition's own and global ones) and
    commit each partition's swap."""
    files = live(table)
    data = [f for f in files if not f.is_delete]
    equality = [f for f in files if f.data_file.content == DataFileContent.EQUALITY_DELETES]
    outcomes = []
    for index, pid in enumerate({d.partition_id for d in data}):
        scope = [e for e in equality if e.partition_id == pid or len(e.data_file.partition) == 0]
        if not scope:
            continue
        partition = [d for d in data if d.partition_id == pid]
        job = TierJob.convert(partition, scope, output_dir(table, partition[0].partition_key), prefix)
        outcome = convert_equality_deletes(table.metadata, table.io, job, TARGET, index)
        outcomes.append(outcome)
        # global deletes stay until every partition is converted
        removed = [e.data_file for e in scope if len(e.data_file.partition) > 0]
        swap_delete_files(table, removed, outcome.delete_files)
    globals_ = [e.data_file for e in equality if len(e.data_file.partition) == 0]
    if globals_:
        swap_delete_files(table, globals_, [])
    return outcomes


def rewrite_all(table: Table, prefix: str = "attempt2") -> list[TierOutcome]:
    files = live(table)
    data = [f for f in files if not f.is_delete]
    positions = [f for f in files if f.data_file.content == DataFileContent.POSITION_DELETES]
    outcomes = []
    for index, pid in enumerate({p.partition_id for p in positions}):
        scope = [p for p in positions if p.partition_id == pid]
        job = TierJob.rewrite(data, scope, output_dir(table, scope[0].partition_key), prefix)
        outcome = rewrite_position_deletes(table.metadata, table.io, job, TARGET, index)
        outcomes.append(outcome)
        swap_delete_files(table, [p.data_file for p in scope], outcome.delete_files)
    return outcomes


def deletes_by_content(table: Table) -> Counter:
    return Counter(DataFileContent(f.data_file.content).name for f in live(table) if f.is_delete)


def test_convert_equality_deletes_null_safe_multi_column_and_by_sequence_number(table):
    append(table, rows_of(range(0, 12), "eu", k=lambda i: None if i % 5 == 0 else i % 4))  # A
    append(table, rows_of(range(100, 108), "eu", s=lambda i: None if i % 2 else "a"))  # B
    append(table, rows_of(range(200, 206), "us"))  # C: a delete of eu never touches it
    append(table, rows_of(range(300, 304), "eu", k=lambda i: 7, s=lambda i: "zz"))  # D: no key matches it
    eu = data_file_of(table, 0).data_file
    us = data_file_of(table, 200).data_file
    commit_delete_files(
        table,
        [
            # (k, s): NULL k matches NULL k; (1, NULL) matches B's rows with s NULL and k 1
            equality_delete_file(
                table, eu.spec_id, eu.partition, ["k", "s"], [{"k": None, "s": "a"}, {"k": 1, "s": None}]
            ),
            equality_delete_file(table, eu.spec_id, eu.partition, ["id"], [{"id": 3}, {"id": 104}, {"id": 999}]),
            equality_delete_file(table, us.spec_id, us.partition, ["k"], [{"k": 2}]),
        ],
    )
    # E, newer than the deletes: its id 3 and (None, "a") rows survive (data seq not < delete seq)
    append(
        table, [{"id": 3000 + i, "region": "eu", "k": None, "s": "a"} for i in range(3)] + rows_of(range(3, 4), "eu")
    )
    # a position delete already there: conversion leaves it alone
    commit_delete_files(table, [position_delete_file(table, data_file_of(table, 200).data_file, [0])])
    before = multiset(spec_rows(table))

    outcomes = convert_all(table)

    assert multiset(spec_rows(table)) == before
    assert multiset(duckdb_rows(table)) == before
    assert deletes_by_content(table) == {"POSITION_DELETES": 3}
    by_region = {o.delete_files[0].partition[0]: o for o in outcomes}
    # eu: A rows k NULL & s "a" (id 0: s "a"), (1, NULL) in B (ids 101, 105 have k 1 and s NULL), id 3, id 104
    expected_eu = {0, 3, 101, 105, 104}
    assert by_region["eu"].rows_written == len(expected_eu)
    assert sorted(by_region["eu"].covered_data_files) == sorted(data_file_of(table, i).path for i in (0, 100, 300))
    assert by_region["us"].rows_written == sum(1 for i in range(200, 206) if i % 4 == 2)
    survivors = Counter(r["id"] for r in spec_rows(table))
    assert not (expected_eu - {3}) & set(survivors)
    assert survivors[3] == 1 and {3000, 3001, 3002, 5, 10} <= set(survivors)  # E's rows; k NULL, s not "a"


def test_convert_across_row_groups_chunks_and_key_sets(table, monkeypatch):
    """Positions count across a file's batches; chunks of data keys end at file boundaries; a row
    two key sets delete is listed once."""
    monkeypatch.setattr(delete_tiers, "CHUNK_ROWS", 25)
    with table.transaction() as txn:
        txn.set_properties({"write.parquet.row-group-limit": "8"})
    for start in (0, 30, 60):
        append(table, rows_of(range(start, start + 30), "eu"))
    [first] = [f for f in live(table) if f.path == data_file_of(table, 0).path]
    assert pq.ParquetFile(first.path.removeprefix("file://")).metadata.num_row_groups > 1
    eu = first.data_file
    commit_delete_files(
        table,
        [
            equality_delete_file(table, eu.spec_id, eu.partition, ["k", "s"], [{"k": 1, "s": "b"}]),
            equality_delete_file(table, eu.spec_id, eu.partition, ["k"], [{"k": 1}]),
            equality_delete_file(table, eu.spec_id, eu.partition, ["id"], [{"id": 29}, {"id": 30}, {"id": 89}]),
        ],
    )
    before = multiset(spec_rows(table))
    [outcome] = convert_all(table)
    assert outcome.rows_written == len({i for i in range(90) if i % 4 == 1} | {29, 30, 89})
    assert multiset(spec_rows(table)) == before == multiset(duckdb_rows(table))


def test_converted_file_is_sorted_and_bounds_name_its_data_files(table):
    append(table, rows_of(range(0, 10), "eu"))
    append(table, rows_of(range(10, 20), "eu"))
    eu = data_file_of(table, 0).data_file
    commit_delete_files(table, [equality_delete_file(table, eu.spec_id, eu.partition, ["k"], [{"k": 1}])])
    [outcome] = convert_all(table, prefix="att-42")
    [delete_file] = outcome.delete_files
    assert delete_file.content == DataFileContent.POSITION_DELETES
    assert delete_file.spec_id == eu.spec_id and delete_file.partition == eu.partition
    assert Path(delete_file.file_path.removeprefix("file://")).name.startswith("att-42")
    rows = pq.read_table(delete_file.file_path.removeprefix("file://"))
    assert [f.metadata[b"PARQUET:field_id"] for f in rows.schema] == [b"2147483546", b"2147483545"]
    pairs = list(zip(rows.column("file_path").to_pylist(), rows.column("pos").to_pylist(), strict=True))
    assert pairs == sorted(pairs) and len(pairs) == 5 == delete_file.record_count
    paths = sorted({p for p, _ in pairs})
    assert delete_file.lower_bounds[2147483546] == paths[0].encode()
    assert delete_file.upper_bounds[2147483546] == paths[-1].encode()
    assert referenced_data_file(delete_file) is None  # two data files: partition-scoped


def test_one_data_file_gives_a_referencing_delete_file(table):
    append(table, rows_of(range(0, 10), "eu"))
    eu = data_file_of(table, 0)
    commit_delete_files(table, [equality_delete_file(table, eu.spec_id, eu.data_file.partition, ["k"], [{"k": 1}])])
    [outcome] = convert_all(table)
    assert referenced_data_file(outcome.delete_files[0]) == eu.path


def test_convert_matches_a_renamed_promoted_key_and_an_added_column_read_as_null(table):
    append(table, rows_of(range(0, 10), "eu"))  # A: k is an int column named "k"
    a = data_file_of(table, 0).data_file
    # written before the schema change: an int column named "k" in the delete file too
    commit_delete_files(table, [equality_delete_file(table, a.spec_id, a.partition, ["k"], [{"k": 2}])])
    with table.update_schema() as update:
        update.update_column("k", LongType())
        update.add_column("extra", StringType())
    with table.update_schema() as update:
        update.rename_column("k", "key")
    table.refresh()
    append(table, [{"id": 100 + i, "region": "eu", "key": 2**40 + i, "s": "x", "extra": "e"} for i in range(3)])
    append(table, [{"id": 200, "region": "eu", "key": 1, "s": "y", "extra": None}])
    eu = data_file_of(table, 0).data_file
    commit_delete_files(
        table,
        [
            equality_delete_file(table, eu.spec_id, eu.partition, ["key"], [{"key": 1}, {"key": 2**40 + 1}]),
            # NULL-safe: "extra" IS NULL and s = "b" matches A's rows (which lack the column) with s "b"
            equality_delete_file(table, eu.spec_id, eu.partition, ["extra", "s"], [{"extra": None, "s": "b"}]),
        ],
    )
    before = multiset(spec_rows(table))
    [outcome] = convert_all(table)
    assert multiset(spec_rows(table)) == before
    assert multiset(duckdb_rows(table)) == before
    gone = {1, 2, 5, 6, 9, 101, 200} | {i for i in range(10) if "abc"[i % 3] == "b"}
    assert outcome.rows_written == len(gone)
    assert not gone & {r["id"] for r in spec_rows(table)}


def test_global_equality_deletes_on_an_unpartitioned_table(tmp_path):
    catalog, table = make_table(tmp_path, partitioned=False)
    append(table, rows_of(range(0, 20), "eu"))
    append(table, rows_of(range(20, 30), "us"))
    commit_delete_files(table, [equality_delete_file(table, 0, Record(), ["s"], [{"s": "a"}])])
    append(table, rows_of(range(30, 33), "eu"))  # newer: its "a" rows stay
    commit_delete_files(table, [equality_delete_file(table, 0, Record(), ["k", "s"], [{"k": 1, "s": "b"}])])
    before = multiset(spec_rows(table))
    assert multiset(duckdb_rows(table)) == before  # global deletes: DuckDB applies them right
    [outcome] = convert_all(table)
    assert multiset(spec_rows(table)) == before == multiset(duckdb_rows(table))
    assert deletes_by_content(table) == {"POSITION_DELETES": 1}
    assert len(outcome.covered_data_files) == 3
    catalog.engine.dispose()


def test_rewrite_position_deletes_drops_dead_and_newer_entries_and_duplicates(table, tmp_path):
    append(table, rows_of(range(0, 10), "eu"))  # A
    append(table, rows_of(range(10, 20), "eu"))  # B: removed later
    append(table, rows_of(range(20, 30), "eu"))  # C
    a, b, c = (data_file_of(table, i).data_file for i in (0, 10, 20))
    # a data file added after the delete that names it (its path known in advance): not deleted
    late_path = f"{output_dir(table)}/region=eu/late.parquet"
    no_ids = pa.schema([f.remove_metadata() for f in table.schema().as_arrow()])
    pq.write_table(pa.Table.from_pylist(rows_of(range(40, 45), "eu"), schema=no_ids), late_path.removeprefix("file://"))
    commit_delete_files(
        table,
        [
            position_delete_file(table, a, [1, 2]),
            position_delete_file(table, a, [2, 3]),  # 2 twice, across files
            position_delete_file(table, b, [0, 5]),  # B dies below
            position_delete_rows(table, a.spec_id, a.partition, [c.file_path, a.file_path, late_path], [4, 9, 0]),
        ],
    )
    table.add_files([late_path])
    table.refresh()
    with table.transaction() as txn, txn.update_snapshot().overwrite() as overwrite:
        overwrite.delete_data_file(b)
    table.refresh()
    before = multiset(spec_rows(table))
    assert len(before) == 10 - 4 + 10 - 1 + 5

    [outcome] = rewrite_all(table)

    assert multiset(spec_rows(table)) == before
    assert multiset(duckdb_rows(table)) == before
    assert multiset(table.scan().to_arrow().to_pylist()) == before
    [delete_file] = outcome.delete_files
    rows = pq.read_table(delete_file.file_path.removeprefix("file://"))
    pairs = list(zip(rows.column("file_path").to_pylist(), rows.column("pos").to_pylist(), strict=True))
    assert pairs == sorted({(a.file_path, p) for p in (1, 2, 3, 9)} | {(c.file_path, 4)})
    assert (outcome.rows_read, outcome.rows_written, outcome.rows_dropped) == (9, 5, 4)
    assert outcome.covered_data_files == sorted([a.file_path, c.file_path])
    assert deletes_by_content(table) == {"POSITION_DELETES": 1}


def test_target_size_rolls_position_delete_files(table, monkeypatch):
    monkeypatch.setattr(delete_files, "WRITE_ROWS", 4096)
    append(table, rows_of(range(0, 30000), "eu"))
    a = data_file_of(table, 0).data_file
    commit_delete_files(
        table, [position_delete_file(table, a, range(0, 30000, 2)), position_delete_file(table, a, range(1, 30000, 4))]
    )
    before = multiset(spec_rows(table))
    files = live(table)
    job = TierJob.rewrite(
        [f for f in files if not f.is_delete], [f for f in files if f.is_delete], output_dir(table), "roll"
    )
    outcome = rewrite_position_deletes(table.metadata, table.io, job, target_file_size_bytes=1)
    assert len(outcome.delete_files) > 1
    assert sum(f.record_count for f in outcome.delete_files) == outcome.rows_written == 15000 + 7500
    swap_delete_files(table, [f.data_file for f in files if f.is_delete], outcome.delete_files)
    assert multiset(spec_rows(table)) == before == multiset(duckdb_rows(table))


def test_unreadable_delete_file_is_named_and_nothing_is_left_behind(table):
    append(table, rows_of(range(0, 10), "eu"))
    a = data_file_of(table, 0).data_file
    commit_delete_files(
        table,
        [
            position_delete_file(table, a, [1]),
            equality_delete_file(table, a.spec_id, a.partition, ["k"], [{"k": 1}]),
        ],
    )
    files = live(table)
    data = [f for f in files if not f.is_delete]
    [pos] = [f for f in files if f.data_file.content == DataFileContent.POSITION_DELETES]
    [eq] = [f for f in files if f.data_file.content == DataFileContent.EQUALITY_DELETES]
    Path(pos.path.removeprefix("file://")).write_bytes(b"not parquet")
    job = TierJob.rewrite(data, [pos], output_dir(table), "broken")
    with pytest.raises(InputFileError, match=pos.path):
        rewrite_position_deletes(table.metadata, table.io, job, TARGET)
    Path(data[0].path.removeprefix("file://")).write_bytes(b"not parquet")
    job = TierJob.convert(data, [eq], output_dir(table), "broken")
    with pytest.raises(InputFileError, match=data[0].path):
        convert_equality_deletes(table.metadata, table.io, job, TARGET)
    assert not list(Path(output_dir(table).removeprefix("file://")).rglob("broken*"))


def test_equality_delete_on_a_dropped_column_is_refused_by_name(table):
    append(table, rows_of(range(0, 10), "eu"))
    a = data_file_of(table, 0).data_file
    commit_delete_files(table, [equality_delete_file(table, a.spec_id, a.partition, ["s"], [{"s": "a"}])])
    with table.update_schema() as update:
        update.delete_column("s")
    table.refresh()
    files = live(table)
    [eq] = [f for f in files if f.is_delete]
    job = TierJob.convert([f for f in files if not f.is_delete], [eq], output_dir(table), "dropped")
    with pytest.raises(ValueError, match=eq.path):
        convert_equality_deletes(table.metadata, table.io, job, TARGET)


def tier_run(table: Table) -> TierRun:
    files = live(table)
    data = [f for f in files if not f.is_delete]
    eq = [f for f in files if f.data_file.content == DataFileContent.EQUALITY_DELETES]
    pos = [f for f in files if f.data_file.content == DataFileContent.POSITION_DELETES]
    jobs = [
        TierJob.convert(data, eq, output_dir(table), "spark"),
        TierJob.rewrite(data, pos, output_dir(table), "spark"),
    ]
    return TierRun(table.metadata.model_dump_json(), dict(table.io.properties), TARGET, jobs)


def two_tier_table(table: Table) -> None:
    append(table, rows_of(range(0, 10), "eu"))
    a = data_file_of(table, 0).data_file
    commit_delete_files(
        table,
        [
            position_delete_file(table, a, [1, 2]),
            position_delete_file(table, a, [2, 7]),
            equality_delete_file(table, a.spec_id, a.partition, ["k"], [{"k": 3}]),
        ],
    )


def test_task_function_runs_each_job_and_reports_a_row_also_through_map_in_arrow(table):
    two_tier_table(table)
    run = tier_run(table)
    assert TierRun.from_json(run.to_json()) == run
    batches = arrow_batches(
        partial(run_tier_rows, run.to_json()),
        TIER_RESULT_ARROW_SCHEMA,
        iter([pa.record_batch([pa.array([1, 0], pa.int64())], names=["id"])]),
    )
    outcomes = sorted((outcome_from_row(r) for b in batches for r in b.to_pylist()), key=lambda o: o.job)
    assert [o.tier for o in outcomes] == [Tier.CONVERT_EQUALITY_DELETES, Tier.REWRITE_POSITION_DELETES]
    assert [o.error for o in outcomes] == [None, None]
    assert (outcomes[0].rows_written, outcomes[1].rows_written, outcomes[1].rows_dropped) == (2, 3, 1)
    assert all(o.peak_rss > 0 for o in outcomes)
    before = multiset(spec_rows(table))
    swap_delete_files(
        table, [f.data_file for f in live(table) if f.is_delete], [f for o in outcomes for f in o.delete_files]
    )
    assert multiset(spec_rows(table)) == before == multiset(duckdb_rows(table))


def test_task_function_reports_a_failure_as_data(table):
    two_tier_table(table)
    run = tier_run(table)
    Path(run.jobs[0].data_files[0].path.removeprefix("file://")).unlink()
    [row] = run_tier_rows(run.to_json(), [0])
    outcome = outcome_from_row(row)
    assert outcome.delete_files == [] and run.jobs[0].data_files[0].path in outcome.error


def test_tiers_run_on_spark(table, spark):
    two_tier_table(table)
    before = multiset(spec_rows(table))
    outcomes = run_tiers(spark, tier_run(table))
    assert [o.error for o in outcomes] == [None, None]
    swap_delete_files(
        table, [f.data_file for f in live(table) if f.is_delete], [f for o in outcomes for f in o.delete_files]
    )
    assert multiset(spec_rows(table)) == before == multiset(duckdb_rows(table))


KEYS = st.one_of(st.none(), st.integers(0, 3))
STRS = st.one_of(st.none(), st.sampled_from(["a", "b"]))
REGIONS = st.sampled_from(["eu", "us"])
ROWS = st.lists(st.tuples(KEYS, STRS), min_size=1, max_size=12)
STEP = st.one_of(
    st.tuples(st.just("append"), REGIONS, ROWS),
    st.tuples(
        st.just("eq"), REGIONS, st.sampled_from([("k",), ("k", "s")]), st.lists(st.tuples(KEYS, STRS), max_size=4)
    ),
    st.tuples(st.just("pos"), st.integers(0, 20), st.lists(st.integers(0, 11), min_size=1, max_size=4)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(eu=ROWS, us=ROWS, steps=st.lists(STEP, min_size=1, max_size=8))
def test_property_converted_and_rewritten_tables_read_identically(tmp_path_factory, monkeypatch, eu, us, steps):
    """Random histories of appends, equality deletes (one or two columns, NULLs) and position
    deletes: after converting every equality delete, then rewriting every position delete, the
    table reads the same in the spec reader, and DuckDB agrees once no equality delete is left."""
    monkeypatch.setattr(delete_tiers, "CHUNK_ROWS", 10)  # several chunks per partition
    catalog, table = make_table(tmp_path_factory.mktemp("prop"))
    try:
        next_id = 0
        for step in [("append", "eu", eu), ("append", "us", us), *steps]:
            data = [f for f in live(table) if not f.is_delete]
            if step[0] == "append":
                rows = [{"id": next_id + n, "region": step[1], "k": k, "s": s} for n, (k, s) in enumerate(step[2])]
                next_id += len(rows)
                append(table, rows)
            elif step[0] == "eq":
                f = next(d.data_file for d in data if d.data_file.partition[0] == step[1])
                values = [dict(zip(step[2], v[: len(step[2])], strict=True)) for v in step[3]]
                commit_delete_files(table, [equality_delete_file(table, f.spec_id, f.partition, list(step[2]), values)])
            else:
                target = data[step[1] % len(data)].data_file
                positions = sorted({p % target.record_count for p in step[2]})
                commit_delete_files(table, [position_delete_file(table, target, positions)])
        before = multiset(spec_rows(table))
        convert_all(table)
        assert multiset(spec_rows(table)) == before
        assert multiset(duckdb_rows(table)) == before
        assert deletes_by_content(table).get("EQUALITY_DELETES", 0) == 0
        rewrite_all(table)
        assert multiset(spec_rows(table)) == before
        assert multiset(duckdb_rows(table)) == before
        assert deletes_by_content(table).get("POSITION_DELETES", 0) <= 2
    finally:
        catalog.engine.dispose()
