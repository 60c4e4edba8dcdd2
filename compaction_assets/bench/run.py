"""`compaction-assets bench`: ours vs delta-rs vs pyarrow vs Spark on the same data, in one run.

Every figure is measured in this process run, side by side, and reported as ratios: the
machines are shared and noisy, so absolute seconds mean little on their own.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import yaml
from pyiceberg.table import Table

from compaction_assets.bench import (
    cdc,
    contenders,
    datasets,
    drain,
    fixed_cost,
    many_tables,
    memory,
    plan_at_scale,
    planning_scale,
    s3_dataset,
)
from compaction_assets.bench.datasets import Dataset
from compaction_assets.config import load_config
from compaction_assets.engine import Engine, describe_phases
from compaction_assets.execution.spark import spark_session
from compaction_assets.lake.digest import batches_digest, rows_digest

MiB = 1024 * 1024
TARGET = 128 * MiB
NAMESPACE = "bench"


@dataclass
class DatasetReport:
    dataset: str
    files: int
    rows: int
    bytes: int
    results: list[contenders.Result] = field(default_factory=list)

    def seconds(self, contender: str) -> float | None:
        return next((r.seconds for r in self.results if r.contender == contender), None)

    @property
    def path(self) -> str:
        """The rewrite paths our median run took."""
        return next((r.path for r in self.results if r.contender == "ours"), "")

    @property
    def ratio_vs_deltars(self) -> float | None:
        """None where delta-rs does not take part (it has no merge-on-read deletes to apply)."""
        theirs = self.seconds("delta-rs")
        return self.seconds("ours") / theirs if theirs else None

    @property
    def share_of_two_pyarrow_cores(self) -> float:
        """Our MB/s over twice the single-thread pyarrow MB/s (the per-core limit on 2 cores)."""
        return self.seconds("pyarrow 1 thread") / 2 / self.seconds("ours")


@dataclass
class BenchReport:
    cores: int
    session_start_s: float = 0.0
    warmup_s: float = 0.0
    datasets: list[DatasetReport] = field(default_factory=list)
    extras: dict = field(default_factory=dict)

    def to_json(self) -> str:
        doc = asdict(self)
        for report, entry in zip(self.datasets, doc["datasets"], strict=True):
            ratio = report.ratio_vs_deltars
            entry["ratio_vs_deltars"] = None if ratio is None else round(ratio, 3)
            for result, row in zip(report.results, entry["results"], strict=True):
                row["mb_per_s"] = round(result.mb_per_s, 1)
        return json.dumps(doc, indent=2)


def bench_config(root: Path) -> Path:
    """A scratch lake: SQLite catalog and ledger, local Spark, Snappy output like the peers."""
    doc = {
        "catalog": {
            "name": "bench",
            "properties": {"type": "sql", "uri": "sqlite:///catalog.db", "warehouse": "file://warehouse"},
        },
        "state": {"uri": "sqlite:///state.db"},
        "spark": {
            "mode": "local",
            "master": "local[2]",
            "conf": {"spark.sql.shuffle.partitions": "4", "spark.ui.showConsoleProgress": "false"},
        },
        "tables": [{"match": "*", "policy": {"target_file_size_bytes": TARGET}}],
    }
    path = root / "compaction.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def compare(
    engine: Engine,
    spark,
    root: Path,
    dataset: Dataset,
    log: Callable[[str], None],
    repeats: int,
) -> DatasetReport:
    """Generate `dataset` once, then time every contender on it; each must keep the rows.

    Ours, delta-rs and the pyarrow copy run `repeats` times, interleaved, each time on fresh
    tables over the same files (hard links), and each is reported by its median run: on a shared
    machine a single run of either side can be off by a third. The Spark DataFrame rewrite, ten
    times slower than the rest, runs once."""
    folder = root / "data" / dataset.name
    log(f"[{dataset.name}] writing {dataset.files} files x {dataset.rows_per_file} rows ...")
    sources = datasets.write_files(folder / "source", dataset)
    bytes_in = sum(p.stat().st_size for p in sources)
    expected = batches_digest(ds.dataset(sources).to_batches())
    report = DatasetReport(dataset.name, dataset.files, dataset.rows, bytes_in)
    timed: dict[str, list[contenders.Result]] = {}
    for k in range(repeats):
        table_name = f"{NAMESPACE}.{dataset.name}_{k}"
        datasets.iceberg_table(engine.catalog, table_name, sources, {})
        delta_uri = datasets.delta_table(datasets.linked(sources, folder / f"delta-{k}"))
        for contender in (  # one after the other, in this order
            partial(contenders.ours, engine, table_name, expected, bytes_in, dataset.files),
            partial(contenders.deltars, delta_uri, TARGET, expected, bytes_in, dataset.files),
            partial(contenders.pyarrow_copy, sources, folder / f"pyarrow-{k}", TARGET, expected, bytes_in),
        ):
            # no contender pays for writing back files the set-up or the one before it wrote
            # (the kernel's writeback of a few hundred MB costs seconds of CPU on 2 cores)
            os.sync()
            result = contender()
            _check(dataset, result)
            timed.setdefault(result.contender, []).append(result)
        seconds = ", ".join(f"{c} {r[-1].seconds:.2f}s" for c, r in timed.items())
        log(f"[{dataset.name}] run {k + 1}/{repeats}: {seconds}")
    report.results.extend(median_results(timed))
    if dataset.spark_anchor:
        spark_result = contenders.spark_dataframe(spark, sources, folder / "spark", TARGET, expected, bytes_in)
        _check(dataset, spark_result)
        report.results.append(spark_result)
    log_results(report, log)
    return report


def log_results(report: DatasetReport, log: Callable[[str], None]) -> None:
    for result in report.results:
        log(
            f"[{report.dataset}] {result.contender:<16} {result.seconds:7.2f}s {result.mb_per_s:7.1f} MB/s  "
            f"files {result.files_before} -> {result.files_after}  peak RSS {result.peak_rss / MiB:6.0f} MiB "
            f"({result.rss_of})  rows {'identical' if result.rows_identical else 'DIFFERENT'}"
            + (f"  median of {len(result.runs)}" if len(result.runs) > 1 else "")
        )
        if result.phases:
            log(f"[{report.dataset}] {result.contender:<16} median split: {describe_phases(result.phases)}")


def median_results(timed: dict[str, list[contenders.Result]]) -> list[contenders.Result]:
    """Each contender's median run, with every run's seconds."""
    medians = []
    for results in timed.values():
        median = sorted(results, key=lambda r: r.seconds)[len(results) // 2]
        median.runs = [r.seconds for r in results]
        medians.append(median)
    return medians


def _check(dataset: Dataset, result: contenders.Result) -> None:
    if not result.rows_identical:
        raise RuntimeError(f"bench: {result.contender} changed the rows of {dataset.name}")


def memory_group(engine: Engine, root: Path, log: Callable[[str], None], gib: float = 2.0) -> dict:
    """Rewrite one group of `gib` GiB (one output file) and report the worker's peak RSS."""
    files = max(6, round(gib * 1024**3 / 29.5e6))  # a 1M-row file of these rows is ~29.5 MB
    dataset = Dataset("large", files, 1_000_000)
    folder = root / "data" / dataset.name
    log(f"[memory] writing {files} files x 1M rows (~{gib:g} GiB) ...")
    sources = datasets.write_files(folder, dataset)
    bytes_in = sum(p.stat().st_size for p in sources)
    name = f"{NAMESPACE}.large"
    # a target above the whole group: the planner packs every file into one group, one output file
    props = {
        "compaction.target-file-size-bytes": str(bytes_in + 256 * MiB),
        "compaction.max-group-bytes": str(2 * bytes_in + 256 * MiB),
    }
    table = datasets.iceberg_table(engine.catalog, name, sources, props)
    expected = rows_digest(table)
    os.sync()
    started = time.perf_counter()
    outcomes = engine.compact(name)
    seconds = time.perf_counter() - started
    outcome = outcomes[0]
    identical = rows_digest(engine.catalog.load_table(name)) == expected
    log(
        f"[memory] one group of {bytes_in / 1e9:.2f} GB ({outcome.groups} group, {files} -> {outcome.files_written} "
        f"file): {seconds:.1f}s, {bytes_in / 1e6 / seconds:.0f} MB/s, worker peak RSS "
        f"{outcome.peak_worker_rss / MiB:.0f} MiB, rows {'identical' if identical else 'DIFFERENT'}"
    )
    if outcome.status != "committed" or not identical:
        raise RuntimeError(f"bench: the large group did not compact cleanly: {outcome.reason}")
    return {
        "group_bytes": bytes_in,
        "groups": outcome.groups,
        "seconds": seconds,
        "worker_peak_rss_bytes": outcome.peak_worker_rss,
    }


def commits_per_table(engine: Engine, log: Callable[[str], None], partitions: int = 50) -> dict:
    """Compact a table with `partitions` fragmented partitions; count the snapshots it took."""
    table = partitioned_fragments(engine, f"{NAMESPACE}.wide", partitions)
    before = len(table.metadata.snapshots)
    outcomes = engine.compact(f"{NAMESPACE}.wide")
    commits = len(engine.catalog.load_table(table.name()).metadata.snapshots) - before
    compacted = sum(o.status == "committed" for o in outcomes)
    log(f"[commits] {compacted} of {partitions} partitions compacted in {commits} commit(s) to the table")
    return {"partitions": partitions, "partitions_compacted": compacted, "commits": commits}


def partitioned_fragments(engine: Engine, name: str, partitions: int, files_per_partition: int = 6) -> Table:
    """A table partitioned by an int column, `files_per_partition` files of ten rows in each."""
    from compaction_assets.demo import append_fragments

    batches = [
        datasets.rows(i * 10, 10, i).append_column("part", pa.array([i % partitions] * 10, pa.int32()))
        for i in range(partitions * files_per_partition)
    ]
    table = engine.catalog.create_table(name, schema=batches[0].schema)
    with table.update_spec() as spec:
        spec.add_identity("part")
    append_fragments(table, batches)
    return engine.catalog.load_table(name)


def run_bench(
    workdir: Path | None,
    sets: list[Dataset],
    log: Callable[[str], None],
    large_gib: float,
    tables: int,
    port: int,
    runs: int,
    repeats: int,
    drain_partitions: int = 2000,
    planning_files: int = 200_000,
    defs_tables: tuple[int, ...] = (1000, 10000),
) -> BenchReport:
    """Everything `compaction-assets bench` prints (its options document the defaults)."""
    root = Path(workdir or tempfile.mkdtemp(prefix="compaction-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    config_path = bench_config(root)
    config = load_config(config_path)
    report = BenchReport(cores=os.cpu_count() or 1)
    started = time.perf_counter()
    spark = spark_session(config.spark)
    spark.sparkContext.setLogLevel("ERROR")
    report.session_start_s = time.perf_counter() - started
    engine = Engine(config, spark=lambda: spark)
    engine.catalog.create_namespace_if_not_exists(NAMESPACE)
    log(f"bench in {root}: {report.cores} cores; Spark session started in {report.session_start_s:.1f}s")
    started = time.perf_counter()
    warm_up(engine, report.cores)
    report.warmup_s = time.perf_counter() - started
    log(f"warm-up compaction (starts the Spark Python workers, as a long-lived session has) {report.warmup_s:.1f}s")
    try:
        for dataset in sets:
            if dataset.name in (cdc.CDC.name, s3_dataset.S3.name):
                if dataset.name == cdc.CDC.name:
                    bytes_in, timed = cdc.compare_cdc(engine, root, log, repeats, TARGET)
                else:
                    bytes_in, timed = s3_dataset.compare_s3(spark, root, log, repeats, TARGET)
                own_report = DatasetReport(dataset.name, dataset.files, dataset.rows, bytes_in)
                own_report.results.extend(median_results(timed))
                log_results(own_report, log)
                report.datasets.append(own_report)
            else:
                report.datasets.append(compare(engine, spark, root, dataset, log, repeats))
            shutil.rmtree(root / "data" / dataset.name, ignore_errors=True)
        if large_gib:
            report.extras["memory"] = memory_group(engine, root, log, large_gib)
            paths = [memory.measure(engine, root, "flat", "polars", large_gib, log)]
            report.extras["memory_paths"] = paths + memory.measure_all(engine, root, ["typed", "wide"], large_gib, log)
            report.extras["memory_paths"] += memory.measure_sorted(engine, root, large_gib, log)
            on_s3 = [memory.measure_s3(spark, root, path, large_gib, log) for path in memory.FILE_BYTES]
            report.extras["memory_paths"] += on_s3
            shutil.rmtree(root / "data", ignore_errors=True)
        report.extras["commits"] = commits_per_table(engine, log)
        spark.stop()
        if runs:
            report.extras["fixed_cost"] = fixed_cost.measure(config_path, port, runs, log=log)
        if tables:
            report.extras["planning"] = planning_scale.measure(config_path, tables, log=log)
        if drain_partitions:
            report.extras["drain"] = drain.measure(root / "data", drain_partitions, log=log)
        if planning_files:
            report.extras["plan_at_scale"] = plan_at_scale.measure(planning_files, log=log)
        if defs_tables:
            report.extras["many_tables"] = many_tables.measure(defs_tables, log=log)
    finally:
        shutil.rmtree(root / "data", ignore_errors=True)
    for d in report.datasets:
        spark_df = d.seconds("spark dataframe")
        log(
            f"[{d.dataset}] ours at {d.share_of_two_pyarrow_cores:.0%} of 2 x single-thread pyarrow"
            + (f"; ours/spark-dataframe {d.seconds('ours') / spark_df:.2f}" if spark_df else "")
        )
    if flat := report.extras.get("memory"):
        log(f"peak_rss_mb={flat['worker_peak_rss_bytes'] / MiB:.0f} group_gb={flat['group_bytes'] / 1e9:.2f}")
    for line in memory.report_lines(report.extras.get("memory_paths", [])):
        log(line)
    if cost := report.extras.get("fixed_cost"):
        cold, warm = cost["cold_local_s"], cost["warm_connect_s"]
        log(f"warm_over_cold={cost['warm_over_cold']:.3f} (cold {cold:.1f}s, warm {warm:.1f}s)")
        log(
            f"dagster_run_fixed_cost_s={cost['dagster_run_fixed_cost_s']:.2f} (local Spark "
            f"{cost['dagster_run_fixed_cost_local_s']:.2f}); "
            f"dagster_warm_over_local={cost['dagster_warm_over_local']:.3f} "
            f"(run {cost['dagster_run_warm_s']:.1f}s warm, {cost['dagster_run_local_s']:.1f}s local)"
        )
        log(
            f"dagster_run_fixed_cost_s={cost['dagster_host_run_fixed_cost_s']:.2f} in the warm run host; "
            f"dagster_host_over_local={cost['dagster_host_over_local']:.3f} "
            f"(run {cost['dagster_host_run_s']:.1f}s from RUN_STARTING, {cost['dagster_run_local_s']:.1f}s local)"
        )
    if figures := report.extras.get("drain"):
        drain.report(figures, log)
    for line in many_tables.report_lines(report.extras["many_tables"]) if defs_tables else []:
        log(line)
    if commits := report.extras.get("commits"):
        log(f"commits_per_table={commits['commits']} for {commits['partitions_compacted']} partitions")
    for d in report.datasets:
        ratio = d.ratio_vs_deltars
        if d.dataset == cdc.CDC.name:
            ours = next(r for r in d.results if r.contender == "ours")
            log(f"cdc_worker_peak_rss_mb={ours.peak_rss / MiB:.0f} equality_keys={cdc.EQUALITY_KEYS}")
        log(
            f"dataset={d.dataset} "
            + (f"ratio_vs_deltars={ratio:.3f} " if ratio is not None else "")
            + f"share_of_2x_pyarrow={d.share_of_two_pyarrow_cores:.3f}"
            + (f" path={d.path}" if d.path else "")
        )
    return report


def warm_up(engine: Engine, cores: int) -> None:
    """Compact a throwaway table of one partition per core once, so every Spark Python worker
    has started and imported what a rewrite needs, as in a long-lived session."""
    partitioned_fragments(engine, f"{NAMESPACE}.warmup", cores)
    engine.compact(f"{NAMESPACE}.warmup")
