"""Outside attack on the issue-20 tiers (expiration, old specs, clustering): each test is a finding,
failing on main at the time of writing. Real tables, real Parquet, real Spark; no mocks."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table.sorting import NullOrder, SortField, SortOrder
from pyiceberg.transforms import IdentityTransform

from compaction_assets.execution.external_sort import ExternalSort, SortSpec
from compaction_assets.lake.files import live_files
from tests.lakekit.expiry import MIXED, Writer, read, read_duckdb
from tests.lakekit.expiry import make_table as make_expire_table
from tests.lakekit.oracle import row_key
from tests.lakekit.reads import assert_duckdb_reads_what_pyiceberg_reads, data_file_list, multiset
from tests.lakekit.sorted_tables import make_table


def _sparse(n: int, seed: int = 5) -> pa.Table:
    """Rows whose sort column is NULL (or NaN) for about half of them."""
    rng = np.random.default_rng(seed)
    f = rng.random(n) * 100
    f[rng.random(n) < 0.3] = np.nan
    return pa.table(
        {
            "id": pa.array(np.arange(n)),
            "f": pa.array(f, mask=rng.random(n) < 0.3),
            "payload": pa.array([f"p{i:012d}" for i in range(n)]),
        }
    )


def test_external_sort_crashes_when_the_last_keys_null_or_nan_rows_exceed_the_budget(tmp_path):
    """Found by the second outside attack on issue 20: a split of a run on the LAST sort key sent its
    NULL and NaN rows to runs flagged 'equal on this key', which _emit then split again at
    level == len(keys): IndexError as soon as such a run was larger than the budget. A single-key
    sort on a sparse column, larger than memory, is the ordinary case."""
    table = _sparse(40_000)
    sort = ExternalSort(SortSpec(keys=(("f", "ascending"),)), budget_bytes=64 * 1024, spill_dir=str(tmp_path))

    out = pa.Table.from_batches(list(sort.sorted(iter(table.to_batches(max_chunksize=4096)))))

    assert Counter(out.column("id").to_pylist()) == Counter(range(40_000))
    expected = table.take(pc.sort_indices(table, [("f", "ascending")])).column("f")
    assert _comparable(out.column("f")) == _comparable(expected)  # values, then NaN, then nulls


def _comparable(column: pa.ChunkedArray) -> list:
    """Values with NaN spelled out (NaN != NaN for Arrow's equals too)."""
    return ["NaN" if v is not None and v != v else v for v in column.to_pylist()]


def test_a_major_sorted_by_a_sparse_column_larger_than_the_sort_budget_fails_every_time(lake, spark):
    """The same through the engine: a table sorted by a column with many NULLs, its group larger than
    compaction.sort.memory-bytes: the attempt fails (IndexError in the Spark worker), on every run."""
    rng = np.random.default_rng(11)
    n, files = 60_000, 6
    a = rng.integers(0, 1_000_000, n)
    data = pa.table(
        {
            "id": pa.array(np.arange(n)),
            "region": pa.array(["eu"] * n),
            "a": pa.array(np.where(rng.random(n) < 0.5, None, a).tolist(), pa.int64()),
            "b": pa.array(rng.random(n) * 1000),
            "s": pa.array(np.char.add("k", rng.integers(0, 10**6, n).astype(str))),
        }
    )
    chunks = [data.slice(i * (n // files), n // files) for i in range(files)]
    order = SortOrder(SortField(source_id=3, transform=IdentityTransform(), null_order=NullOrder.NULLS_LAST))
    table = make_table(lake, chunks, {}, sort_order=order)
    largest = max(f.file_size_in_bytes for f in data_file_list(table))
    with table.transaction() as txn:
        txn.set_properties(
            {
                "compaction.target-file-size-bytes": str(largest * 2),
                "compaction.sort.memory-bytes": str(128 * 1024),
            }
        )
    expected = Counter(row_key(r) for c in chunks for r in c.to_pylist())

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed" and outcome.kind == "major", outcome.reason
    after = lake.table("ns.t")
    assert multiset(after) == expected
    assert_duckdb_reads_what_pyiceberg_reads(after)


# ------------------------------------------------------------------ data expiration

CENTURIES = str(1000 * 365 * 86_400_000 * 100)  # a retention of 100,000 years: "keep (almost) forever"


def test_a_very_long_retention_with_a_file_lacking_bounds_crashes_the_plan(lake, clocked):
    """retention-ms is only checked to be positive. With a long one (cutoff before year 1) and a file
    whose expire column has no bounds (metrics mode counts: the verdict is REWRITE, as documented),
    ExpireRule.describe() formats the cutoff with datetime.fromtimestamp: ValueError 'year ... is
    out of range' (planning/expiration.py:60, called from planner.py:620): the whole table's plan
    fails, every tier of every partition with it. Nothing is past such a retention: it should plan
    as if expiration found nothing (here: the minor the fragments ask for)."""
    writer = Writer()
    make_expire_table(
        lake,
        writer,
        {"mixed": MIXED["mixed"]},
        **{
            "compaction.expire.field": "ts",
            "compaction.expire.retention-ms": CENTURIES,
            "write.metadata.metrics.column.ts": "counts",
        },
    )
    table = lake.table("ns.ev")
    assert all(3 not in (f.data_file.lower_bounds or {}) for f in live_files(table))
    before = read(table)

    clocked().plan("ns.ev")  # raises ValueError today
    outcomes = clocked().compact("ns.ev")

    assert all(o.ok for o in outcomes), [(o.partition_key, o.reason) for o in outcomes]
    assert read(lake.table("ns.ev")) == before == read_duckdb(lake.table("ns.ev"))  # nothing is that old


# ------------------------------------------------------------------ old partition specs


from compaction_assets.commit.consistency import check_partitions  # noqa: E402


def test_a_partition_without_bounds_on_the_expire_column_is_rewritten_by_every_run_forever(lake, clocked):
    """The expire column has no bounds (the table's metrics mode for it is `counts`, which the
    worker's output honours too): every file is a REWRITE (expiration.py:79) and stays one after
    being rewritten. A partition with nothing past retention ('new') is then planned as an
    expiration on every run, at EXPIRE_BENEFIT (ahead of every compaction of every other partition),
    each run rewriting all its files and expiring 0 rows. Rows stay right; the work never ends."""
    writer = Writer()
    make_expire_table(
        lake,
        writer,
        {"old": MIXED["old"], "new": MIXED["new"]},
        **{
            "compaction.expire.field": "ts",
            "compaction.expire.retention-ms": str(86_400_000),
            "write.metadata.metrics.column.ts": "counts",
        },
    )
    first = clocked().compact("ns.ev")
    assert all(o.ok for o in first), [(o.partition_key, o.reason) for o in first]
    after = lake.table("ns.ev")
    assert read(after) == writer.kept() and read_duckdb(after) == writer.kept()
    attempts = lake.engine.ledger.attempts(table_name="ns.ev")
    reports = check_partitions(after, lake.engine.ledger, {a.partition_key: a.task_id for a in attempts}, 60)
    assert all(r.passed for r in reports.values()), {k: r.problems for k, r in reports.items()}

    runs = [clocked().compact("ns.ev") for _ in range(2)]

    rewrites = [
        (o.partition_key, o.kind, o.rows_expired, o.reason) for run in runs for o in run if o.status == "committed"
    ]
    assert rewrites == [], rewrites
    assert read(lake.table("ns.ev")) == writer.kept()
