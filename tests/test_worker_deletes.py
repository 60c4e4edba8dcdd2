"""The worker applies a group's delete files while it rewrites (merge-on-read): real tables in a
SQLite catalog, real position- and equality-delete files committed as another engine would, the
job built as the driver builds it (which deletes apply to which source: lake.deletes.ApplyingDeletes),
`rewrite_group` in-process; the written rows must equal what the spec-literal reader reads before."""

from __future__ import annotations

import datetime as dt
import functools
import math
import tempfile
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO, schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)

from compaction_assets.execution import deletes as deletes_module
from compaction_assets.execution import equality_keys, worker
from compaction_assets.execution.deletes import GroupDeletes
from compaction_assets.execution.source_reader import SourceReader
from compaction_assets.execution.worker import (
    DeleteSpec,
    RewriteJob,
    SourceFile,
    outcome_from_row,
    rewrite_group,
    rewrite_tasks,
)
from compaction_assets.lake.files import live_files
from compaction_tools.bench.cdc_worker import cdc_table, peak_rss_with_keys, position_deletes, rewrite_job
from compaction_tools.demo import append_fragments
from tests.lakekit.deletes import commit_delete_files, equality_delete_file, position_delete_file
from tests.lakekit.oracle import row_key
from tests.lakekit.spec_reader import spec_rows

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "k", StringType(), required=False),
    NestedField(4, "n", IntegerType(), required=False),
)
SMALL_ROW_GROUPS = {"write.parquet.row-group-limit": "8"}  # several batches per file: positions span batches
BY_REGION = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"))


def _catalog(root: Path) -> SqlCatalog:
    catalog = SqlCatalog("t", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
    catalog.create_namespace("ns")
    return catalog


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[SqlCatalog]:
    catalog = _catalog(tmp_path)
    yield catalog
    catalog.engine.dispose()


@pytest.fixture(params=["bulk", "projected", "polars"])
def read_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test on the bulk scan (where files allow it), again with every file projected, and
    again with groups the driver found fit for Polars (polars_deletes: the same rules, other input)."""
    if request.param == "projected":
        monkeypatch.setattr(SourceReader, "relabel_target", lambda self, physical: None)
    if request.param == "polars":
        monkeypatch.setitem(build_job.__globals__, "rewrite_job", functools.partial(rewrite_job, polars=True))
    return request.param


def _rows(start: int, count: int, region: str, k: list[Any] | None = None, n: list[Any] | None = None) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": [region] * count,
            "k": pa.array(k if k is not None else [f"k{i % 7}" if i % 5 else None for i in ids], pa.string()),
            "n": pa.array(n if n is not None else [i % 11 if i % 4 else None for i in ids], pa.int32()),
        }
    )


def _data_files(table: Table, region: str | None = None) -> list[DataFile]:
    return sorted(
        (
            f.data_file
            for f in live_files(table)
            if f.data_file.content == DataFileContent.DATA and (region is None or f.data_file.partition[0] == region)
        ),
        key=lambda f: f.file_path,
    )


def build_job(table: Table, **options: Any) -> RewriteJob:  # noqa: ANN401
    """The job a driver sends (one group per partition), through JSON as Spark gets it."""
    return RewriteJob.from_json(rewrite_job(table, **options).to_json())


def _written(files: list[DataFile]) -> list[dict]:
    return [row for f in files for row in pq.read_table(urlparse(f.file_path).path).to_pylist()]


def rewrite_all(table: Table, **job_options: Any) -> tuple[list[dict], list]:  # noqa: ANN401
    job = build_job(table, **job_options)
    outcomes = [rewrite_group(job, i) for i in range(len(job.groups))]
    for outcome in outcomes:
        assert outcome.error is None, outcome.error
    return [row for o in outcomes for row in _written(o.data_files)], outcomes


def assert_rewrite_keeps_live_rows(table: Table, **job_options: Any) -> list:  # noqa: ANN401
    expected = Counter(row_key(r) for r in spec_rows(table))
    rows, outcomes = rewrite_all(table, **job_options)
    assert Counter(row_key(r) for r in rows) == expected
    decoded = sum(f.record_count for f in _data_files(table))
    assert sum(o.rows_read for o in outcomes) == decoded
    assert sum(o.rows_deleted for o in outcomes) == decoded - sum(expected.values())
    return outcomes


def test_position_and_equality_deletes_in_a_partitioned_table(catalog: SqlCatalog, read_path: str) -> None:
    table = catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION, properties=SMALL_ROW_GROUPS)
    append_fragments(table, [_rows(i * 40, 40, region) for i, region in enumerate(["eu", "us", "eu", "us", "eu"])])
    eu = _data_files(table, "eu")
    us = _data_files(table, "us")
    # one position-delete file naming three data files (positions overlap another file's), one per file
    commit_delete_files(
        table,
        [
            position_deletes(
                table,
                {eu[0].file_path: [0, 3, 39], eu[1].file_path: [5, 6], eu[2].file_path: [0]},
                0,
                eu[0].partition,
                row_group_size=2,
            ),
            position_delete_file(table, eu[0], [3, 4, 10]),
            position_delete_file(table, us[1], [1, 2, 3]),
        ],
    )
    # equality deletes: on k (with NULL), on (k, n) (with NULL in each), partition-scoped
    commit_delete_files(
        table,
        [
            equality_delete_file(table, 0, eu[0].partition, ["k"], [{"k": "k3"}, {"k": None}, {"k": "absent"}]),
            equality_delete_file(
                table,
                0,
                us[0].partition,
                ["k", "n"],
                [{"k": "k1", "n": 1}, {"k": "k2", "n": None}, {"k": "k2", "n": 2}],
            ),
        ],
    )
    # data appended after the equality deletes: they do not apply to it
    append_fragments(table, [_rows(1000, 30, "eu"), _rows(2000, 30, "us")])
    table = catalog.load_table("ns.t")

    outcomes = assert_rewrite_keeps_live_rows(table)

    assert all(o.engine == ("polars" if read_path == "polars" else "arrow") for o in outcomes)
    assert all(o.rows_deleted > 0 for o in outcomes)


def test_equality_delete_on_a_promoted_and_renamed_column(catalog: SqlCatalog, read_path: str) -> None:
    table = catalog.create_table("ns.t", schema=SCHEMA)
    append_fragments(table, [_rows(i * 30, 30, "x") for i in range(3)])
    # an int delete file written before the promotion, on the column's old name
    commit_delete_files(table, [equality_delete_file(table, 0, _data_files(table)[0].partition, ["n"], [{"n": 3}])])
    with table.update_schema() as update:
        update.update_column("n", LongType())
    with table.update_schema() as update:
        update.rename_column("n", "amount")
    table = catalog.load_table("ns.t")
    wide = _rows(500, 30, "x").rename_columns(["id", "region", "k", "amount"])
    wide = wide.set_column(3, "amount", pa.array([(1 << 40) + i % 3 for i in range(30)], pa.int64()))
    append_fragments(table, [wide])
    table = catalog.load_table("ns.t")
    commit_delete_files(
        table,
        [
            equality_delete_file(
                table, 0, _data_files(table)[0].partition, ["amount"], [{"amount": (1 << 40) + 1}, {"amount": 7}]
            )
        ],
    )
    table = catalog.load_table("ns.t")

    assert_rewrite_keeps_live_rows(table)


def test_files_without_field_ids_are_read_through_the_name_mapping(
    catalog: SqlCatalog, tmp_path: Path, read_path: str
) -> None:
    table = catalog.create_table("ns.t", schema=SCHEMA)
    paths = []
    for i in range(3):
        path = tmp_path / f"plain-{i}.parquet"
        pq.write_table(_rows(i * 25, 25, "x"), path)  # no field ids: add_files gives the table a name mapping
        paths.append(f"file://{path}")
    table.add_files(paths)
    table = catalog.load_table("ns.t")
    files = _data_files(table)
    commit_delete_files(
        table,
        [
            position_deletes(table, {files[0].file_path: [1, 2], files[2].file_path: [24]}, 0, files[0].partition),
            equality_delete_file(table, 0, files[0].partition, ["n"], [{"n": None}, {"n": 5}]),
        ],
    )
    table = catalog.load_table("ns.t")

    assert_rewrite_keeps_live_rows(table)


def test_sorted_rewrite_applies_deletes(catalog: SqlCatalog, read_path: str) -> None:
    table = catalog.create_table("ns.t", schema=SCHEMA)
    append_fragments(table, [_rows(i * 20, 20, "x") for i in reversed(range(4))])
    files = _data_files(table)
    commit_delete_files(
        table,
        [
            position_delete_file(table, files[1], [0, 19]),
            equality_delete_file(table, 0, files[0].partition, ["id"], [{"id": 7}, {"id": 70}]),
        ],
    )
    table = catalog.load_table("ns.t")

    outcomes = assert_rewrite_keeps_live_rows(table, sort_columns=[("id", "descending")])

    ids = [r["id"] for r in _written(outcomes[0].data_files)]
    assert ids == sorted(ids, reverse=True) and 7 not in ids and 70 not in ids


def test_a_group_with_deletes_takes_polars_and_applies_them(catalog: SqlCatalog) -> None:
    table = catalog.create_table("ns.t", schema=SCHEMA)
    append_fragments(table, [_rows(i * 20, 20, "x") for i in range(3)])
    commit_delete_files(table, [position_delete_file(table, _data_files(table)[0], [0])])
    table = catalog.load_table("ns.t")

    [outcome] = assert_rewrite_keeps_live_rows(table, polars=True)

    assert outcome.engine == "polars" and outcome.rows_deleted == 1


def test_an_equality_key_the_schema_no_longer_has_fails_the_group(catalog: SqlCatalog) -> None:
    table = catalog.create_table("ns.t", schema=SCHEMA)
    append_fragments(table, [_rows(i * 20, 20, "x") for i in range(2)])
    commit_delete_files(table, [equality_delete_file(table, 0, _data_files(table)[0].partition, ["k"], [{"k": "k1"}])])
    with table.update_schema() as update:
        update.delete_column("k")
    table = catalog.load_table("ns.t")
    job = build_job(table)

    outcome = rewrite_group(job, 0)

    assert outcome.data_files == [] and "field id 3" in outcome.error and "current schema" in outcome.error


def test_the_result_row_carries_rows_deleted(catalog: SqlCatalog) -> None:
    table = catalog.create_table("ns.t", schema=SCHEMA)
    append_fragments(table, [_rows(i * 20, 20, "x") for i in range(2)])
    commit_delete_files(table, [position_delete_file(table, _data_files(table)[1], [2, 3, 4])])
    job = build_job(catalog.load_table("ns.t"))

    [row] = rewrite_tasks(job.to_json(), [0])

    assert list(row) == worker.RESULT_ARROW_SCHEMA.names
    outcome = outcome_from_row(row)
    assert (outcome.rows_read, outcome.rows_deleted, outcome.error) == (40, 3, None)


# property: random rows, random position and equality deletes, interleaved with appends


_events = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 30)),
        st.tuples(st.just("pos"), st.lists(st.integers(0, 40), min_size=1, max_size=8), st.integers(0, 10)),
        st.tuples(
            st.just("eq"),
            st.sampled_from([("n",), ("k",), ("k", "n"), ("id",)]),
            st.lists(
                st.tuples(st.sampled_from(["k1", "k2", "k3", None]), st.one_of(st.none(), st.integers(0, 6))),
                min_size=1,
                max_size=6,
            ),
        ),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_events, projected=st.booleans(), rows_seed=st.integers(0, 1000))
def test_property_output_is_the_live_rows(events: list[tuple], projected: bool, rows_seed: int) -> None:
    with tempfile.TemporaryDirectory() as root, pytest.MonkeyPatch.context() as patch:
        if projected:
            patch.setattr(SourceReader, "relabel_target", lambda self, physical: None)
        catalog = _catalog(Path(root))
        table = catalog.create_table("ns.t", schema=SCHEMA, properties=SMALL_ROW_GROUPS)
        start = 0
        for event in [("append", 10), *events]:
            table = catalog.load_table("ns.t")
            if event[0] == "append":
                count = event[1]
                ids = range(start, start + count)
                k = [[f"k{(i * rows_seed) % 4}", None][(i + rows_seed) % 3 == 0] for i in ids]
                n = [None if (i * 7 + rows_seed) % 5 == 0 else (i + rows_seed) % 7 for i in ids]
                append_fragments(table, [_rows(start, count, "x", k, n)])
                start += count
            elif event[0] == "pos":
                files = _data_files(table)
                target = files[event[2] % len(files)]
                positions = sorted({p % target.record_count for p in event[1]})
                commit_delete_files(table, [position_delete_file(table, target, positions)])
            else:
                columns, values = event[1], event[2]
                rows = [{"k": k, "n": n, "id": None if n is None else n * 3} | {} for k, n in values]
                rows = [{c: r[c] for c in columns} for r in rows]
                commit_delete_files(
                    table, [equality_delete_file(table, 0, _data_files(table)[0].partition, list(columns), rows)]
                )
        table = catalog.load_table("ns.t")
        assert_rewrite_keeps_live_rows(table)
        catalog.engine.dispose()


def test_a_cdc_table_split_in_two_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Global equality deletes and position-delete files naming several data files, two groups
    (the bench's table, small): every group applies all of them to its own sources."""
    # position-delete row groups of 3 rows: the row groups naming only the other group's files are skipped
    table = cdc_table(tmp_path, files=12, rows_per_file=50, equality_files=4, position_files=3, position_row_group=3)
    expected = Counter(row_key(r) for r in spec_rows(table))
    job = rewrite_job(table, parts=2)
    assert len(job.groups) == 2
    pruned = []  # row groups skipped, per position-delete file read
    admitting = deletes_module._row_groups_admitting

    def counting(metadata: pq.FileMetaData, column: str, paths: set[str]) -> list[int]:
        groups = admitting(metadata, column, paths)
        pruned.append(metadata.num_row_groups - len(groups))
        return groups

    monkeypatch.setattr(deletes_module, "_row_groups_admitting", counting)

    outcomes = [rewrite_group(job, i) for i in range(2)]

    assert [o.error for o in outcomes] == [None, None]
    assert Counter(row_key(r) for o in outcomes for r in _written(o.data_files)) == expected
    assert sum(o.rows_deleted for o in outcomes) == 600 - sum(expected.values()) == 120
    assert sum(pruned) > 0


@pytest.mark.slow
def test_a_million_equality_keys_stay_under_512_mb(tmp_path: Path) -> None:
    """1,000,000 long equality keys applying to 1,000,000 rows: the worker's peak RSS, in a fresh process."""
    peak, deleted = peak_rss_with_keys(tmp_path, keys=1_000_000)

    assert deleted == 200_000
    assert 0 < peak < 512 * 2**20


# the key index alone, on every kind of key column, and with a hash that always collides

_KEY_TYPES = {
    "long": (LongType(), [1, 2, None, 1 << 40]),
    "int-as-long": (LongType(), [3, None]),  # delete file written with int32 values
    "string": (StringType(), ["a", "", None, "ß"]),
    "date": (DateType(), [dt.date(2024, 1, 1), None]),
    "timestamp": (TimestampType(), [dt.datetime(2024, 1, 1, 12), None]),
    "timestamptz": (TimestamptzType(), [dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC)]),
    "boolean": (BooleanType(), [True, None]),
    "decimal": (DecimalType(10, 2), [Decimal("1.50"), None]),
    "binary": (BinaryType(), [b"\x00\x01", None]),
    "double": (DoubleType(), [0.5, float("nan"), None]),
}


def _same(a: Any, b: Any) -> bool:  # noqa: ANN401
    """Iceberg equality with NULL equal to NULL and NaN equal to NaN."""
    if a is None or b is None:
        return a is None and b is None
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("colliding", [False, True], ids=["hash", "every-hash-collides"])
@pytest.mark.parametrize("kind", sorted(_KEY_TYPES))
def test_key_index_matches_null_safe_on_every_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, colliding: bool
) -> None:
    """Delete file 0 keys on `key` alone (every value but the second, written narrower for
    int-as-long); file 1 on (tag, key) with tag "t" and every value. Data: each value with tag
    "t" and again with "u"."""
    if colliding:  # every key and row shares one hash: only the exact comparison decides
        monkeypatch.setattr(equality_keys, "_row_hashes", lambda table: np.zeros(table.num_rows, np.uint64))
    iceberg_type, values = _KEY_TYPES[kind]
    schema = Schema(NestedField(5, "key", iceberg_type, required=False), NestedField(6, "tag", StringType()))
    arrow = schema_to_pyarrow(schema)
    only_key = values[:1] + values[2:]
    key_path, pair_path = tmp_path / "key.parquet", tmp_path / "pair.parquet"
    key_field = arrow.field(0).with_type(pa.int32()) if kind == "int-as-long" else arrow.field(0)
    pq.write_table(pa.table([pa.array(only_key, key_field.type)], schema=pa.schema([key_field])), key_path)
    pq.write_table(pa.table([pa.array(values, arrow.field(0).type), ["t"] * len(values)], schema=arrow), pair_path)
    specs = [DeleteSpec(f"file://{key_path}", 2, 0, 0, [5]), DeleteSpec(f"file://{pair_path}", 2, 0, 0, [6, 5])]
    keys, tags = values * 2, ["t"] * len(values) + ["u"] * len(values)
    batch = pa.RecordBatch.from_arrays([pa.array(keys, arrow.field(0).type), pa.array(tags)], schema=arrow)

    for applying in ([0], [1], [0, 1]):
        source = SourceFile("data.parquet", 0, batch.num_rows, list(applying))
        group = GroupDeletes(PyArrowFileIO(), schema, None, [source], specs)
        kept = group.apply(source, 0, batch)

        expected = [
            (k, t)
            for k, t in zip(keys, tags, strict=True)
            if not (0 in applying and any(_same(k, v) for v in only_key))
            and not (1 in applying and t == "t" and any(_same(k, v) for v in values))
        ]
        got = list(zip(kept.column(0).to_pylist(), kept.column(1).to_pylist(), strict=True))
        assert len(got) == len(expected), (applying, got, expected)
        assert all(_same(g[0], e[0]) and g[1] == e[1] for g, e in zip(got, expected, strict=True)), (got, expected)
        assert group.rows_deleted == batch.num_rows - len(expected)


def test_many_delete_histories_share_one_key_index(catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CDC history: each commit's data, then an equality delete on id and on (k, n): every data
    file has its own set of applying deletes (the later ones). More sets than masks are cached."""
    monkeypatch.setattr(equality_keys, "ACTIVE_CACHE", 2)
    table = catalog.create_table("ns.t", schema=SCHEMA, properties=SMALL_ROW_GROUPS)
    for step in range(10):
        append_fragments(table, [_rows(step * 20, 20, "x")])
        table = catalog.load_table("ns.t")
        partition = _data_files(table)[0].partition
        earlier = list(range(0, step * 20 + 20, 7))  # ids of this and every earlier commit
        commit_delete_files(
            table,
            [
                equality_delete_file(table, 0, partition, ["id"], [{"id": i} for i in earlier[step % 3 :: 3]]),
                equality_delete_file(table, 0, partition, ["k", "n"], [{"k": f"k{step % 7}", "n": step % 11}]),
            ],
        )
        table = catalog.load_table("ns.t")
    job = build_job(table)
    assert len({tuple(s.deletes) for s in job.groups[0].sources}) == 10

    outcomes = assert_rewrite_keeps_live_rows(table)

    assert outcomes[0].rows_deleted > 0


def test_a_missing_delete_file_fails_the_group_naming_it(catalog: SqlCatalog, read_path: str) -> None:
    table = catalog.create_table("ns.t", schema=SCHEMA)
    append_fragments(table, [_rows(i * 20, 20, "x") for i in range(2)])
    files = _data_files(table)
    commit_delete_files(
        table,
        [
            position_delete_file(table, files[0], [1]),
            equality_delete_file(table, 0, files[0].partition, ["k"], [{"k": "k1"}]),
        ],
    )
    job = build_job(catalog.load_table("ns.t"))
    for victim in job.groups[0].deletes:
        Path(urlparse(victim.path).path).rename(urlparse(victim.path).path + ".gone")

        outcome = rewrite_group(job, 0)

        assert outcome.data_files == [] and victim.path in outcome.error and "delete file" in outcome.error
        Path(urlparse(victim.path).path + ".gone").rename(urlparse(victim.path).path)
