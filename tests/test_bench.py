"""The bench's side-by-side comparison on a small dataset: every contender runs, on fresh tables
each repeat, keeps the rows, and the report carries the medians and every run."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compaction_assets.config import load_config
from compaction_assets.engine import Engine
from compaction_assets.lake.catalog import open_catalog
from compaction_assets.lake.delete_files import commit_delete_files, position_delete_file
from compaction_assets.lake.digest import batches_digest, rows_digest
from compaction_tools.bench import footprint, iceberg_java, memory
from compaction_tools.bench.contenders import peer_expected, rows_match, table_digest, table_rows_match
from compaction_tools.bench.datasets import Dataset, rows
from compaction_tools.bench.ours_process import OursProcess
from compaction_tools.bench.run import (
    NAMESPACE,
    PEER_CHECK,
    TARGET,
    BenchReport,
    bench_config,
    compare,
    compare_dataset,
    comparison_lines,
    stage,
)
from compaction_tools.bench.s3_dataset import compare_s3, s3_source
from tests.lakekit.waiting import wait_until


@pytest.fixture(scope="module")
def bench_root(tmp_path_factory) -> Path:
    """One scratch lake for the module's comparisons (each uses datasets of its own names)."""
    root = tmp_path_factory.mktemp("bench")
    bench_config(root)
    return root


@pytest.fixture(scope="module")
def ours(bench_root):
    """Our engine's own process on the module's lake, as the bench runs it; stopped at teardown."""
    process = OursProcess(bench_root / "compaction.yaml")
    yield process
    process.close()
    assert not process.process.is_alive()


def bench_engine(root: Path, spark) -> Engine:  # noqa: ANN001 - the session fixture
    engine = Engine(load_config(root / "compaction.yaml"), spark=lambda: spark)
    engine.catalog.create_namespace_if_not_exists(NAMESPACE)
    return engine


def test_compare_runs_every_contender_on_fresh_tables(bench_root, spark, ours):
    engine = bench_engine(bench_root, spark)
    lines: list[str] = []

    mini = Dataset("mini", 12, 500, spark_anchor=True)
    report = compare(engine, ours, spark, bench_root, mini, lines.append, repeats=2)

    by_name = {r.contender: r for r in report.results}
    assert set(by_name) == {"ours", "delta-rs", "pyarrow 1 thread", "spark dataframe"}
    assert all(r.rows_identical for r in report.results)
    assert {name: len(by_name[name].runs) for name in ("ours", "delta-rs", "pyarrow 1 thread")} == {
        "ours": 2,
        "delta-rs": 2,
        "pyarrow 1 thread": 2,
    }
    assert by_name["ours"].seconds in by_name["ours"].runs
    assert (by_name["ours"].files_before, by_name["ours"].files_after) == (12, 1)
    assert report.ratio_vs_deltars > 0
    # each repeat compacted its own table over the same files
    for k in range(2):
        table = engine.catalog.load_table(f"{NAMESPACE}.mini_{k}")
        assert len(table.inspect.files()) == 1
    assert sum("run " in line for line in lines) == 2
    assert any("delta-rs" in line and f"rows identical{PEER_CHECK}" in line for line in lines)
    engine.ledger.dispose()


def test_the_s3_dataset_runs_every_contender_through_the_server(tmp_path, spark):
    lines: list[str] = []
    mini = Dataset("s3mini", 6, 300)

    with s3_source(spark, tmp_path, lines.append, mini) as uploaded:  # both passes on one upload
        bytes_in, timed = compare_s3(spark, tmp_path, lines.append, 1, TARGET, mini, uploaded)
        again, _ = compare_s3(spark, tmp_path, lines.append, 1, TARGET, mini, uploaded)

    assert again == bytes_in and sum(line.startswith("[s3] writing") for line in lines) == 1
    assert set(timed) == {"ours", "delta-rs", "pyarrow 1 thread"}
    results = [r for runs in timed.values() for r in runs]
    assert all(r.rows_identical and r.bytes_in == bytes_in > 0 for r in results)
    assert all((r.files_before, r.files_after) == (6, 1) for r in results)
    ours = timed["ours"][0]
    assert ours.phases["rewrite"] > 0
    assert any(line.startswith("[s3] run 1/1: ours") for line in lines)


def test_the_memory_group_on_s3_goes_through_the_server_and_keeps_its_rows(tmp_path, spark):
    lines: list[str] = []

    result = memory.measure_s3(spark, tmp_path, "polars", 0.03, lines.append)

    # 5 files of ~6 MiB (4 distinct): one group, one output, rewritten by Polars from and to the server
    assert (result["kind"], result["path"]) == ("s3", "polars")
    assert result["group_bytes"] > 20 * 1024 * 1024 and result["worker_peak_rss_bytes"] > 0
    assert lines and "rows identical" in lines[-1] and "-> 1)" in lines[-1]
    assert memory.report_lines([result])[0].startswith("memory dataset=s3 path=polars peak_rss_mb=")
    assert not (tmp_path / "data" / "memory-s3-polars").exists()


def test_the_memory_group_in_ours_process_measures_its_whole_tree(bench_root, ours, spark):
    lines: list[str] = []
    engine = bench_engine(bench_root, spark)
    engine.catalog.create_namespace_if_not_exists(NAMESPACE)

    result = memory.measure(engine, bench_root, "flat", "polars", 0.04, lines.append, "zorder", ours)

    # 7 files of ~6 MiB sorted by z-value (the Arrow path) in one group, in ours' process (its
    # Spark JVM and Python workers), whose summed RSS is more than its one worker's
    assert (result["path"], result["order"]) == ("arrow", "zorder")
    assert result["tree_peak_rss_bytes"] > result["worker_peak_rss_bytes"] > 0 and result["tree_peak_pss_bytes"] > 0
    assert "rows identical" in lines[-1] and "whole tree" in lines[-1]
    assert re.search(r" tree_peak_rss_mib=\d+ ", memory.report_lines([result])[0])


@pytest.fixture(scope="module")
def java(tmp_path_factory):
    if reason := iceberg_java.unavailable():
        if os.environ.get("COMPACTION_REQUIRE_JAVA") == "1":
            pytest.fail(f"Iceberg Java is required here (COMPACTION_REQUIRE_JAVA=1): {reason}", pytrace=False)
        pytest.skip(reason)
    session = iceberg_java.JavaIceberg(tmp_path_factory.mktemp("java") / "iceberg-java.log")
    yield session
    session.close()


def test_iceberg_java_rewrites_a_copy_of_the_table_with_the_same_rows(bench_root, spark, ours, java):
    engine = bench_engine(bench_root, spark)
    lines: list[str] = []

    reports = [
        compare(engine, ours, spark, bench_root, dataset, lines.append, repeats=1, java=java)
        for dataset in (Dataset("jmini", 10, 300), Dataset("minizorder", 10, 300, order="zorder"))
    ]
    summary = [line for report in reports for line in comparison_lines(report)]

    flat, zorder = ({r.contender: r for r in report.results} for report in reports)
    assert set(flat) == {"ours", "delta-rs", "pyarrow 1 thread", "iceberg-java"}
    assert set(zorder) == {"ours", "iceberg-java"}  # the others do not sort
    for result in [*flat.values(), *zorder.values()]:
        assert result.rows_identical, result.contender
        assert (result.files_before, result.files_after) == (10, 1), result.contender
        assert result.bytes_after > 0 and result.tree_peak_rss > 0, result.contender
    # ours' footprint is the driver, the Spark JVM and its workers: more than the JVM alone
    assert flat["ours"].tree_peak_rss > 200 * 1024 * 1024
    assert flat["iceberg-java"].tree_peak_rss > 200 * 1024 * 1024  # the JVM and its Python driver
    for name in ("jmini", "minizorder"):
        assert any(re.match(rf"dataset={name} ratio_vs_iceberg_java=\d+\.\d{{3}} ", line) for line in summary)
        for contender in ("ours", "iceberg-java"):
            footprint_line = rf"dataset={name} contender={contender} tree_peak_rss_mib=\d+ tree_peak_pss_mib=\d+"
            assert any(re.fullmatch(footprint_line, line) for line in summary)
    assert any(line.startswith("[minizorder] run 1/1: ours") and "iceberg-java" in line for line in lines)


def test_iceberg_java_applies_the_position_deletes_of_the_mor_dataset_as_ours_does(bench_root, spark, ours, java):
    engine = bench_engine(bench_root, spark)
    lines: list[str] = []

    report = compare_dataset(
        engine, ours, spark, bench_root, Dataset("mor", 12, 600, deletes="position"), lines.append, 1, java, 0
    )

    by_name = {r.contender: r for r in report.results}
    assert set(by_name) == {"ours", "pyarrow 1 thread", "iceberg-java"}
    # 500 of each file's 600 rows deleted by position: 1,200 rows live, in one file, for all three
    for result in by_name.values():
        assert result.rows_identical and (result.files_before, result.files_after) == (12, 1), result.contender
    ours_table = engine.catalog.load_table(f"{NAMESPACE}.mor_0")
    assert ours_table.scan().to_arrow().num_rows == 12 * 100
    assert any(line.startswith("[mor] run 1/1: ours") and "iceberg-java" in line for line in lines)


def test_background_load_runs_busy_processes_for_the_block_and_kills_them():
    def utime(pid: int) -> int:  # clock ticks in user mode
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11])

    with footprint.background_load(2) as pids:
        wait_until(lambda: all(utime(pid) > 0 for pid in pids), 30, interval=0.05, message="no CPU used")
        assert footprint.tree_pids([os.getpid()]) >= {os.getpid(), *pids}
        busy = [utime(pid) for pid in pids]
        assert all(ticks > 0 for ticks in busy)  # they use CPU (utime, clock ticks)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)  # killed and reaped


def test_tree_peak_counts_a_child_process_memory():
    import subprocess
    import sys

    grow = "x = bytearray(300 * 1024 * 1024); import time; time.sleep(1.5)"  # held while the peak is sampled
    mine, _ = footprint.tree_rss_pss([], [os.getpid()])
    with footprint.TreePeak([os.getpid()]) as tree:
        subprocess.run([sys.executable, "-c", grow], check=True)
    with footprint.TreePeak([], [os.getpid()]) as alone:  # this process without its children
        subprocess.run([sys.executable, "-c", grow], check=True)
    assert tree.peak >= mine + 300 * 1024 * 1024 > alone.peak
    # the child's bytearray is its own (not shared): PSS counts it whole too
    assert tree.peak_pss >= alone.peak_pss + 250 * 1024 * 1024 and alone.peak_pss > 0


def test_tree_pss_splits_pages_a_forked_child_shares_and_rss_counts_them_twice():
    shared = bytearray(400 * 1024 * 1024)  # touched: resident in this process, shared with a fork
    child = os.fork()
    if child == 0:
        time.sleep(1.5)  # kept: the child's lifetime, alive while the parent measures
        os._exit(0)
    try:
        wait_until(lambda: child in footprint.tree_pids([os.getpid()]), 1, interval=0.01, message="child not seen")
        rss, pss = footprint.tree_rss_pss([os.getpid()])
    finally:
        os.waitpid(child, 0)
    assert rss >= 2 * len(shared)  # counted in both processes
    assert len(shared) <= pss < rss - len(shared) // 2  # held once


def test_a_datasets_files_and_digest_are_written_once_for_both_passes(tmp_path):
    """The loaded pass reuses the quiet pass's source files and digest; a different dataset in the
    same folder writes its own; clearing a pass's runs keeps them."""
    from compaction_tools.bench import datasets
    from compaction_tools.bench.run import clear_runs

    folder = tmp_path / "data" / "d"
    first = Dataset("d", 3, 50)
    paths = datasets.write_files(folder / "source", first)
    stamps = [p.stat().st_mtime_ns for p in paths]
    digest = datasets.sources_digest(paths)
    (folder / "delta-0").mkdir()
    (folder / "pyarrow-0.log").write_text("a run's leftovers")
    clear_runs(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["source", "source.digest-rows", "source.written"]
    again = datasets.write_files(folder / "source", first)
    assert again == paths and [p.stat().st_mtime_ns for p in again] == stamps
    assert datasets.sources_digest(again) == digest
    assert sorted(p.name for p in (folder / "source").iterdir()) == [p.name for p in paths]  # nothing else in it
    other = datasets.write_files(folder / "source", Dataset("d", 3, 60))
    assert [p.stat().st_mtime_ns for p in other] != stamps
    assert datasets.sources_digest(other).rows == 180


def test_each_stage_is_timed_and_logged_even_when_it_fails():
    report, lines = BenchReport(cores=2), []
    with stage(report, "tiny", lines.append):
        time.sleep(0.05)  # kept: a stage that takes a known time, which the report must show
    with pytest.raises(RuntimeError), stage(report, "memory", lines.append):
        raise RuntimeError("stage failed")
    assert list(report.stage_seconds) == ["tiny", "memory"] and report.stage_seconds["tiny"] >= 0.05
    assert lines[0].startswith("[stage] tiny: ") and lines[1].startswith("[stage] memory: ")


def test_a_result_tables_digest_reads_its_files_at_once_and_its_deletes_through_the_scan(tmp_path):
    catalog = load_config(bench_config(tmp_path)).catalog
    lake = open_catalog(catalog)
    lake.create_namespace_if_not_exists(NAMESPACE)
    table = lake.create_table(f"{NAMESPACE}.digest", schema=rows(0, 10, 0).schema)
    for k in range(3):
        table.append(rows(k * 1_000, 1_000, k))
    assert table_digest(table) == rows_digest(table) and table_digest(table).rows == 3_000
    first = next(iter(table.scan().plan_files())).file
    commit_delete_files(table, [position_delete_file(table, first, [0, 7])])
    table = lake.load_table(f"{NAMESPACE}.digest")
    assert table_digest(table) == rows_digest(table) and table_digest(table).rows == 2_998


def test_a_result_file_whose_field_ids_differ_from_its_names_is_read_as_iceberg_readers_read_it(tmp_path):
    # readers match columns by field id: a file with the right names but swapped ids (found by an
    # outside review: the fast path compared names only, and called such a result identical)
    lake = open_catalog(load_config(bench_config(tmp_path)).catalog)
    lake.create_namespace_if_not_exists(NAMESPACE)
    schema = pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.int64())])
    table = lake.create_table(f"{NAMESPACE}.ids", schema=schema)
    table.append(pa.table({"a": [1], "b": [10]}, schema=schema))
    [path] = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    swapped = pa.schema([f.with_metadata({b"PARQUET:field_id": str(2 - k).encode()}) for k, f in enumerate(schema)])
    pq.write_table(pq.read_table(path).cast(swapped), path)
    table = lake.load_table(f"{NAMESPACE}.ids")
    assert table.scan().to_arrow().to_pylist() == [{"a": 10, "b": 1}]
    assert table_digest(table) == rows_digest(table)


def test_a_peers_first_run_is_checked_by_content_and_its_later_runs_by_row_count(tmp_path):
    import pyarrow.dataset as ds

    pq.write_table(rows(0, 100, 0), tmp_path / "a.parquet")
    pq.write_table(rows(1, 100, 0), tmp_path / "b.parquet")  # as many rows, one id off
    same, other = ds.dataset([tmp_path / "a.parquet"]), ds.dataset([tmp_path / "b.parquet"])
    expected = batches_digest(same.to_batches())
    assert peer_expected(expected, 0) == expected and peer_expected(expected, 1) == 100
    assert rows_match(expected, same) and not rows_match(expected, other)  # content
    assert rows_match(100, other) and not rows_match(99, same)  # count only

    lake = open_catalog(load_config(bench_config(tmp_path)).catalog)
    lake.create_namespace_if_not_exists(NAMESPACE)
    table = lake.create_table(f"{NAMESPACE}.count", schema=rows(0, 10, 0).schema)
    table.append(rows(0, 100, 0))
    first = next(iter(table.scan().plan_files())).file
    commit_delete_files(table, [position_delete_file(table, first, [0, 7])])
    table = lake.load_table(f"{NAMESPACE}.count")
    assert table_rows_match(table, 98) and not table_rows_match(table, 100)  # the deletes apply
    assert table_rows_match(table, rows_digest(table)) and not table_rows_match(table, expected)
