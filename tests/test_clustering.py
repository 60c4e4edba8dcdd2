"""Sort and clustering with bounded memory (issue 20): the external sort, z-order, bounds_overlap and
kind cluster, on real tables with real Spark; rows checked against what was written and DuckDB."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType

from compaction_assets.errors import ConfigError
from compaction_assets.execution.external_sort import ExternalSort, SortSpec, spill_root
from compaction_assets.execution.zorder import bits_per_column, interleave
from compaction_assets.lake import ordinal
from compaction_assets.planning.overlap import Clustering, bounds_overlap
from compaction_assets.planning.planner import plan_partition, plan_table
from compaction_assets.planning.policy import Policy
from compaction_tools.demo import append_fragments
from tests.lakekit.dagster_runs import materialization_metadata, run_partition
from tests.lakekit.oracle import row_key
from tests.lakekit.plan_files import F
from tests.lakekit.reads import assert_duckdb_reads_what_pyiceberg_reads, data_file_list, local, multiset
from tests.lakekit.sorted_tables import FILES, make_table, shuffled


def spark_local_dir(spark) -> Path:
    """Where a Spark Python worker of this session spills (execution/external_sort.spill_root)."""
    [root] = spark.sparkContext.parallelize([0], 1).map(lambda _: spill_root()).collect()
    return Path(root)


# ------------------------------------------------------------------ the sort itself, in process


def typed_rows(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    floats = rng.random(n) * 10 - 5
    floats[rng.random(n) < 0.02] = np.nan
    return pa.table(
        {
            "i": pa.array(np.where(rng.random(n) < 0.05, None, rng.integers(-50, 50, n)).tolist(), pa.int64()),
            "f": pa.array(np.where(rng.random(n) < 0.05, None, floats).tolist(), pa.float64()),
            "s": pa.array([None if x % 17 == 0 else f"v{x % 300:03d}" for x in rng.integers(0, 10**6, n)]),
            "t": pa.array(rng.integers(0, 10**12, n), pa.timestamp("us", tz="UTC")),
            "payload": pa.array(rng.integers(0, 10**9, n)),
        }
    )


def key_rows(table: pa.Table, names: list[str]) -> list[tuple]:
    return [tuple("NaN" if v != v else v for v in r.values()) for r in table.select(names).to_pylist()]


def rows_multiset(table: pa.Table) -> Counter:
    """The rows as a multiset (NaN as a marker: NaN != NaN would make every NaN row unequal)."""
    nan = "NaN"
    return Counter(row_key({k: nan if v != v else v for k, v in r.items()}) for r in table.to_pylist())


@pytest.mark.parametrize(
    "keys",
    [
        (("i", "ascending"), ("s", "descending")),
        (("f", "descending"), ("t", "ascending")),
        (("s", "ascending"), ("f", "ascending"), ("payload", "ascending")),
    ],
    ids=["int-asc-string-desc", "float-nan-desc-timestamp", "string-float-long"],
)
def test_external_sort_with_a_small_budget_spills_many_runs_and_sorts_as_pyarrow(tmp_path, keys):
    table = typed_rows(60_000, seed=len(keys))
    sorter = ExternalSort(SortSpec(keys=keys), budget_bytes=64 * 1024, spill_dir=str(tmp_path))

    out = pa.Table.from_batches(list(sorter.sorted(table.to_batches(4_000))))

    expected = table.take(pc.sort_indices(table, sort_keys=list(keys)))
    names = [k for k, _ in keys]
    assert key_rows(out, names) == key_rows(expected, names)  # same order on the keys (ties may differ)
    assert rows_multiset(out) == rows_multiset(table)
    assert sorter.spill_files > 20
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("over", [1.1, 1.4, 1.9])
@pytest.mark.parametrize("zorder", [False, True], ids=["keys", "zorder"])
def test_a_group_just_over_the_budget_splits_into_ranges_of_about_equal_rows(tmp_path, over, zorder):
    # the splitters were the sample's smallest and largest value when a run needed 3 ranges (1-1.5
    # budgets): each split peeled a few rows off, the run was rewritten thousands of times, and the
    # bench's 2 GB z-order group of 7 files ended in a RecursionError after minutes
    table = typed_rows(40_000, seed=9)
    spec = SortSpec(zorder=("i", "f")) if zorder else SortSpec(keys=(("f", "ascending"), ("i", "ascending")))
    sorter = ExternalSort(spec, budget_bytes=int(table.nbytes / over), spill_dir=str(tmp_path))

    out = pa.Table.from_batches(list(sorter.sorted(table.to_batches(4_000))))

    assert rows_multiset(out) == rows_multiset(table)
    if not zorder:
        expected = table.take(pc.sort_indices(table, sort_keys=list(spec.keys)))
        assert key_rows(out, ["f", "i"]) == key_rows(expected, ["f", "i"])
    # the input run, then one split (the z-value adds a column): each row written to disk twice
    assert sorter.spilled_bytes <= 2.5 * table.nbytes
    assert os.listdir(tmp_path) == []


def _one_value_holding_most_rows(where: str, rows: int = 1_000_000, others: int = 20_000) -> pa.Table:
    rng = np.random.default_rng(4)
    rest = rng.permutation(np.arange(1, others + 1)) * 10
    value = {"lowest": 0, "middle": others * 5 + 5, "highest": (others + 1) * 10}[where]
    keys = np.concatenate([np.full(rows - others, value), rest])
    rng.shuffle(keys)
    return pa.table({"k": keys.astype(np.int64), "p": np.arange(rows)})


@pytest.mark.parametrize("others", [20_000, 500], ids=["2%-distinct", "500-rare"])
@pytest.mark.parametrize("where", ["lowest", "middle", "highest"])
@pytest.mark.parametrize("zorder", [False, True], ids=["keys", "zorder"])
def test_a_value_holding_most_rows_is_split_off_at_once(tmp_path, where, others, zorder):
    # found by an outside attack: splitters from the sample's distinct values (or its ends only)
    # split such a value off a little at a time, the run written again at every split (a 122 MiB
    # group: 45 times its size to disk); rare values the sample missed were peeled off one by one
    table = _one_value_holding_most_rows(where, others=others)
    spec = SortSpec(zorder=("k",)) if zorder else SortSpec(keys=(("k", "ascending"),))
    sorter = ExternalSort(spec, budget_bytes=int(table.nbytes / 1.1), spill_dir=str(tmp_path))

    out = pa.Table.from_batches(list(sorter.sorted(table.to_batches(65_536))))

    assert out.num_rows == table.num_rows and sorted(out.column("p").to_pylist()) == list(range(table.num_rows))
    if not zorder:
        assert out.column("k").to_pylist() == sorted(table.column("k").to_pylist())
    assert sorter.spilled_bytes <= 2.5 * table.nbytes  # each row to disk twice: the input run, one split
    assert os.listdir(tmp_path) == []


def _unchecked_strings(values: list[bytes]) -> pa.Array:
    """A string array holding `values` as they are (Arrow and Parquet readers do not check UTF-8)."""
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int32)
    return pa.Array.from_buffers(
        pa.string(), len(values), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(values))]
    )


@pytest.mark.parametrize("kind", ["end-of-time timestamp", "far-future date", "invalid utf-8 at both ends"])
def test_a_spilled_sort_keeps_key_values_python_cannot_hold(tmp_path, kind):
    # found by an outside attack: the run's smallest and largest value went through Python (as_py)
    # to become splitters: a Long.MAX timestamp sentinel, a date past year 9999 or a string of
    # invalid UTF-8 (Arrow does not check it) failed the spilled sort; in memory they sort
    rng = np.random.default_rng(2)
    n = 30_000
    values = rng.integers(0, 10**6, n).astype(np.int64)
    if kind == "end-of-time timestamp":
        values[::100] = np.iinfo(np.int64).max
        keys = pa.array(values, pa.timestamp("us", tz="UTC"))
    elif kind == "far-future date":
        values[::100] = 2_932_897 + 10  # 9999-12-31 is day 2,932,896
        keys = pa.array(values.astype(np.int32), pa.date32())
    else:
        raw = [f"k{v:07d}".encode() for v in values]
        raw[17], raw[18] = b"\xff\xfe-largest", b"\x00\xff-smallest"
        keys = _unchecked_strings(raw)
    table = pa.table({"k": keys, "o": np.arange(n)})
    sorter = ExternalSort(SortSpec(keys=(("k", "ascending"),)), budget_bytes=table.nbytes // 3, spill_dir=str(tmp_path))

    out = pa.Table.from_batches(list(sorter.sorted(table.to_batches(4_096))))

    expected = table.take(pc.sort_indices(table, sort_keys=[("k", "ascending")]))
    assert sorter.spill_files > 1 and out.column("o").equals(expected.column("o"))


def test_external_sort_of_a_group_within_budget_stays_in_memory(tmp_path):
    table = typed_rows(1_000, seed=3)
    sorter = ExternalSort(SortSpec(keys=(("i", "ascending"),)), budget_bytes=64 * 1024 * 1024, spill_dir=str(tmp_path))
    out = pa.Table.from_batches(list(sorter.sorted(table.to_batches(100))))
    assert out.column("i").equals(table.take(pc.sort_indices(table, sort_keys=[("i", "ascending")])).column("i"))
    assert sorter.spill_files == 0 and os.listdir(tmp_path) == []


def test_zorder_spilled_equals_zorder_in_memory_and_the_value_is_never_written(tmp_path):
    table = typed_rows(30_000, seed=5)
    spec = SortSpec(zorder=("i", "s"))
    spilled = ExternalSort(spec, budget_bytes=32 * 1024, spill_dir=str(tmp_path))
    in_memory = ExternalSort(spec, budget_bytes=1 << 30, spill_dir=str(tmp_path))
    a = pa.Table.from_batches(list(spilled.sorted(table.to_batches(2_000))))
    b = pa.Table.from_batches(list(in_memory.sorted(table.to_batches(2_000))))
    assert a.schema == table.schema and key_rows(a, a.column_names) == key_rows(b, b.column_names)
    assert spilled.spill_files > 10 and in_memory.spill_files == 0
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("k", [1, 2, 3, 5, 9, 20])
def test_zorder_interleaves_bits_most_significant_first_as_one_bit_at_a_time_would(k):
    bits = bits_per_column(k)
    rng = np.random.default_rng(k)
    columns = [rng.integers(0, 1 << bits, 2_000, dtype=np.uint64) for _ in range(k)]
    columns[0][:2] = [0, (1 << bits) - 1]  # the extremes
    expected = [0] * 2_000
    for row in range(2_000):
        for bit in range(bits - 1, -1, -1):
            for column in columns:
                expected[row] = (expected[row] << 1) | ((int(column[row]) >> bit) & 1)
    assert interleave(columns, bits).tolist() == expected


def test_the_spill_dir_is_removed_when_the_input_fails_or_the_consumer_stops(tmp_path):
    table = typed_rows(20_000, seed=9)

    def failing():
        for i, batch in enumerate(table.to_batches(1_000)):
            if i == 12:
                raise OSError("source file vanished")
            yield batch

    sorter = ExternalSort(SortSpec(keys=(("i", "ascending"),)), budget_bytes=16 * 1024, spill_dir=str(tmp_path))
    with pytest.raises(OSError, match="vanished"):
        list(sorter.sorted(failing()))
    assert sorter.spill_files == 1 and os.listdir(tmp_path) == []

    sorter = ExternalSort(SortSpec(zorder=("i", "f")), budget_bytes=16 * 1024, spill_dir=str(tmp_path))
    rows = sorter.sorted(table.to_batches(1_000))
    next(rows)  # the consumer (a writer) fails after the first batch and closes the iterator
    assert os.listdir(tmp_path) != []
    rows.close()
    assert os.listdir(tmp_path) == []


def test_ordinals_never_reverse_the_order_of_values():
    table = typed_rows(5_000, seed=11).append_column(
        "d", pa.array(np.random.default_rng(1).integers(-(10**6), 10**6, 5_000)).cast(pa.decimal128(22, 2))
    )
    for name in table.column_names:
        ordered = table.take(pc.sort_indices(table, sort_keys=[(name, "ascending")])).column(name)
        keys, valid = ordinal.ordinals(ordered)
        present = keys[valid & ~ordinal.is_nan(ordered.combine_chunks())]
        assert (present[1:] >= present[:-1]).all(), name


# ------------------------------------------------------------------ real tables, real Spark


def test_major_sorts_through_spill_runs_and_files_get_disjoint_bounds(lake, spark):
    chunks = shuffled()
    order = SortOrder(
        SortField(source_id=3, transform=IdentityTransform(), null_order=NullOrder.NULLS_LAST),
        SortField(source_id=4, transform=IdentityTransform(), direction=SortDirection.DESC),
    )
    table = make_table(lake, chunks, {}, sort_order=order)
    largest = max(f.file_size_in_bytes for f in data_file_list(table))
    with table.transaction() as txn:  # undersized files (a major), a small sort budget: many spill runs
        txn.set_properties(
            {
                "compaction.target-file-size-bytes": str(largest * 2),  # every file < 0.75 x target
                "compaction.sort.memory-bytes": str(256 * 1024),
            }
        )
    expected = Counter(row_key(r) for c in chunks for r in c.to_pylist())
    assert multiset(lake.table("ns.t")) == expected
    spill_dir = spark_local_dir(spark)

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed" and outcome.kind == "major", outcome.reason
    assert outcome.spill_files > 20
    assert not list(spill_dir.glob("compaction-sort-*"))
    table = lake.table("ns.t")
    assert multiset(table) == expected
    assert_duckdb_reads_what_pyiceberg_reads(table)
    files = sorted(data_file_list(table), key=lambda f: f.file_path)  # written in order: -00000, -00001, ...
    assert len(files) >= 2
    rows = pa.concat_tables(pq.read_table(local(f.file_path), columns=["a", "b"]) for f in files)
    assert rows.equals(rows.take(pc.sort_indices(rows, sort_keys=[("a", "ascending"), ("b", "descending")])))
    assert outcome.bounds_overlap["before"] > 5 and outcome.bounds_overlap["after"] <= 1.0
    assert outcome.bounds_overlap["columns"] == ["a", "b"] and outcome.bounds_overlap["order"] == "sort"


def test_zorder_clusters_healthy_files_once_and_again_after_new_files(lake, spark):
    chunks = shuffled(seed=3)
    table = make_table(lake, chunks, {})
    smallest = min(f.file_size_in_bytes for f in data_file_list(table))
    with table.transaction() as txn:  # files of the target size: no minor, no major
        txn.set_properties(
            {
                "compaction.target-file-size-bytes": str(smallest),
                "compaction.zorder-columns": "a,b",
                "compaction.sort.memory-bytes": str(512 * 1024),
                "compaction.cluster.min-overlap": "0.5",
            }
        )
    expected = Counter(row_key(r) for c in chunks for r in c.to_pylist())
    [plan] = lake.engine.plan("ns.t").to_compact
    assert plan.kind == "cluster" and "bounds overlap 7.00 on zorder(a, b)" in plan.reason, plan.reason
    shown = lake.cli("plan", "ns.t").stdout
    assert "clustering: zorder(a, b); cluster when bounds overlap >= 0.5" in shown
    assert "cluster: bounds overlap 7.00 on zorder(a, b) >= cluster-min-overlap=0.5" in shown

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed" and outcome.kind == "cluster", outcome.reason
    before, after = outcome.bounds_overlap["before"], outcome.bounds_overlap["after"]
    # well below (seen: 2.67 and 3.5, by where output files roll, which follows the read order)
    assert before == 7.0 and after < 0.75 * before, outcome.bounds_overlap
    table = lake.table("ns.t")
    assert bounds_overlap(data_file_list(table), lake.engine.plan("ns.t").clustering) == pytest.approx(after, abs=1e-3)
    assert multiset(table) == expected
    assert_duckdb_reads_what_pyiceberg_reads(table)
    assert not list(spark_local_dir(spark).glob("compaction-sort-*"))
    names = pq.ParquetFile(local(data_file_list(table)[0].file_path)).schema_arrow.names
    assert names == ["id", "region", "a", "b", "s"]  # the z-value is never written

    # the result still overlaps more than min-overlap, but it is our own cluster's: not again
    [again] = lake.engine.plan("ns.t").partitions
    assert again.kind is None and "from our last cluster rewrite" in again.reason, again.reason
    # new files arrive: clustered again, with them
    more = shuffled(seed=4)[:2]
    append_fragments(lake.table("ns.t"), [c.set_column(0, "id", pa.array(np.arange(len(c)) + 10**7)) for c in more])
    [plan] = lake.engine.plan("ns.t").to_compact
    assert plan.kind == "cluster" and plan.input_files == len(data_file_list(lake.table("ns.t")))


def test_zorder_wins_over_the_sort_order_and_major_uses_it(lake):
    order = SortOrder(SortField(source_id=5, transform=IdentityTransform()))
    chunks = [c.slice(0, 2_000) for c in shuffled(seed=8)]
    table = make_table(lake, chunks, {"compaction.zorder-columns": "a, b"}, sort_order=order)
    with table.transaction() as txn:
        largest = max(f.file_size_in_bytes for f in data_file_list(table))
        txn.set_properties({"compaction.target-file-size-bytes": str(4 * largest)})  # undersized, no fragments
    tplan = lake.engine.plan("ns.t")
    assert tplan.clustering.describe() == "zorder(a, b)"
    [outcome] = lake.engine.compact("ns.t")
    assert outcome.kind == "major" and outcome.bounds_overlap["order"] == "zorder", outcome.reason
    for f in data_file_list(lake.table("ns.t")):  # files of about the target: 1 or 2
        s = pq.read_table(local(f.file_path), columns=["s"]).column("s")
        assert s.to_pylist() != sorted(s.to_pylist())  # not ordered by the sort order's column


def test_an_unknown_zorder_column_is_a_config_error_naming_table_and_column(lake):
    make_table(lake, [shuffled()[0].slice(0, 10)], {"compaction.zorder-columns": "a,nope"})
    with pytest.raises(ConfigError, match=r"table 'ns.t'.*'nope'"):
        lake.engine.plan("ns.t")


def test_a_source_failing_mid_sort_fails_the_attempt_and_leaves_no_spill(lake, spark):
    chunks = shuffled(seed=5)
    table = make_table(lake, chunks, {"compaction.zorder-columns": "a,b", "compaction.sort.memory-bytes": "65536"})
    largest = max(f.file_size_in_bytes for f in data_file_list(table))
    with table.transaction() as txn:
        txn.set_properties({"compaction.target-file-size-bytes": str(largest * FILES)})
    last = max(data_file_list(lake.table("ns.t")), key=lambda f: f.file_path)
    path = Path(local(last.file_path))
    raw = bytearray(path.read_bytes())
    footer = int.from_bytes(raw[-8:-4], "little")
    data_end = len(raw) - 8 - footer
    raw[4:data_end] = os.urandom(data_end - 4)  # every page, not the footer: fails while decoding
    path.write_bytes(bytes(raw))

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "failed", outcome.reason
    assert not list(spark_local_dir(spark).glob("compaction-sort-*"))
    assert lake.table("ns.t").current_snapshot().snapshot_id == table.current_snapshot().snapshot_id


def test_the_materialisation_reports_kind_cluster_and_bounds_overlap(lake):
    from dagster import instance_for_test

    chunks = [c.slice(0, 5_000) for c in shuffled(seed=6)]
    table = make_table(lake, chunks, {})
    smallest = min(f.file_size_in_bytes for f in data_file_list(table))
    with table.transaction() as txn:
        txn.set_properties({"compaction.target-file-size-bytes": str(smallest), "compaction.zorder-columns": "a,s"})
    with instance_for_test() as instance:
        result, check = run_partition(lake, instance, "region=eu")
    assert result.success and check.passed
    meta = materialization_metadata(result)
    assert meta["kind"] == "cluster"
    assert meta["bounds_overlap"]["columns"] == ["a", "s"]
    assert meta["bounds_overlap"]["after"] < meta["bounds_overlap"]["before"] == 7.0


# ------------------------------------------------------------------ the planner's rules


@dataclass(frozen=True)
class Bounded(F):
    """A data file as the planner sees it (tests/test_planner.py), with bounds on column `a` (id 3)."""

    low: int = 0
    high: int = 0

    @cached_property
    def data_file(self) -> DataFile:
        low, high = ({3: to_bytes(LongType(), v)} for v in (self.low, self.high))
        args = {"file_path": self.path, "file_size_in_bytes": self.size, "record_count": self.record_count}
        return DataFile.from_args(**args, lower_bounds=low, upper_bounds=high, partition=Record(self.partition_key))


def stat(path: str, size: int, low: int, high: int, key: str) -> Bounded:
    return Bounded(path, size, partition_key=key, low=low, high=high)


MB = 1024 * 1024
CLUSTER_POLICY = Policy(target_file_size_bytes=64 * MB, max_group_bytes=1024 * MB, cluster_min_overlap=2.0)
ON_A = Clustering(("a",), (3,), (LongType(),), zorder=False)


def spread(n: int, key: str, size: int = 64 * MB, disjoint: bool = False) -> list[Bounded]:
    return [
        stat(f"s3://b/{key}/f{i}.parquet", size, i * 10 if disjoint else 0, i * 10 + 9 if disjoint else 1000, key)
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("files", "clustered", "kind", "reason"),
    [
        (spread(6, "p=1"), set(), "cluster", "cluster: bounds overlap 5.00 on sort(a) >= cluster-min-overlap=2"),
        (spread(6, "p=1", disjoint=True), set(), None, "bounds overlap 0.00 on sort(a) < cluster-min-overlap=2"),
        (spread(6, "p=1"), {f"s3://b/p=1/f{i}.parquet" for i in range(6)}, None, "from our last cluster rewrite"),
        (spread(6, "p=1", size=MB), set(), "minor", "minor: 6 fragment(s)"),
        (spread(1, "p=1"), set(), None, "fewer than 2 data files"),
    ],
    ids=["overlapping", "disjoint", "our-own-cluster-output", "fragments-win", "one-file"],
)
def test_planner_clusters_healthy_overlapping_partitions_once(files, clustered, kind, reason):
    plan = plan_partition("p=1", files, CLUSTER_POLICY, 0, clustering=ON_A, clustered=clustered)
    assert plan.kind == kind and reason in plan.reason, plan.reason


def test_cluster_ranks_below_fragmentation_of_similar_size():
    fragmented = [stat(f"s3://b/p=2/f{i}.parquet", 3 * MB, i * 10, i * 10 + 9, "p=2") for i in range(128)]
    overlapping = spread(6, "p=1")  # 384 MiB, every file spans everything
    plans = plan_table([*overlapping, *fragmented], CLUSTER_POLICY, 0, clustering=ON_A)
    assert [(p.partition_key, p.kind) for p in plans] == [("p=2", "minor"), ("p=1", "cluster")]
    assert 0 < plans[1].benefit < plans[0].benefit
