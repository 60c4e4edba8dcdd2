"""The bench's side-by-side comparison on a small dataset: every contender runs, on fresh tables
each repeat, keeps the rows, and the report carries the medians and every run."""

from __future__ import annotations

from compaction_assets.bench import memory
from compaction_assets.bench.datasets import Dataset
from compaction_assets.bench.run import NAMESPACE, TARGET, bench_config, compare
from compaction_assets.bench.s3_dataset import compare_s3
from compaction_assets.config import load_config
from compaction_assets.engine import Engine


def test_compare_runs_every_contender_on_fresh_tables(tmp_path, spark):
    engine = Engine(load_config(bench_config(tmp_path)), spark=lambda: spark)
    engine.catalog.create_namespace(NAMESPACE)
    lines: list[str] = []

    report = compare(engine, spark, tmp_path, Dataset("mini", 12, 500), lines.append, repeats=2)

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
    engine.ledger.dispose()


def test_the_s3_dataset_runs_every_contender_through_the_server(tmp_path, spark):
    lines: list[str] = []

    bytes_in, timed = compare_s3(spark, tmp_path, lines.append, 1, TARGET, Dataset("s3mini", 6, 300))

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
