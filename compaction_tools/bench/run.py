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
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import pyarrow as pa
import yaml
from pyiceberg.table import Table

from compaction_assets.config import load_config
from compaction_assets.engine.facade import Engine
from compaction_assets.engine.outcomes import describe_phases
from compaction_assets.execution.spark import spark_session
from compaction_tools.bench import (
    cdc,
    contenders,
    datasets,
    drain,
    fixed_cost,
    footprint,
    iceberg_java,
    many_tables,
    memory,
    plan_at_scale,
    planning_scale,
    s3_dataset,
)
from compaction_tools.bench.datasets import Dataset
from compaction_tools.bench.ours_process import OursProcess

MiB = 1024 * 1024
TARGET = 128 * MiB
NAMESPACE = "bench"
JAVA_TABLE = f"{NAMESPACE}.t"  # the table's name in each Iceberg Java run's own catalog


@dataclass
class DatasetReport:
    dataset: str
    files: int
    rows: int
    bytes: int
    results: list[contenders.Result] = field(default_factory=list)
    load: int = 0  # background-load processes this pass ran beside (--background-load)

    def seconds(self, contender: str) -> float | None:
        return next((r.seconds for r in self.results if r.contender == contender), None)

    def ours_seconds(self) -> float:
        """Our seconds, which every ratio divides by or into."""
        ours = self.seconds("ours")
        if ours is None:
            raise ValueError(f"bench: dataset {self.dataset} has no result of ours to compare with")
        return ours

    @property
    def path(self) -> str:
        """The rewrite paths our median run took."""
        return next((r.path for r in self.results if r.contender == "ours"), "")

    @property
    def ratio_vs_deltars(self) -> float | None:
        """None where delta-rs does not take part (it has no merge-on-read deletes to apply)."""
        theirs = self.seconds("delta-rs")
        return self.ours_seconds() / theirs if theirs else None

    @property
    def ratio_vs_iceberg_java(self) -> float | None:
        """Ours over Iceberg Java's rewrite_data_files; None where Java did not take part."""
        theirs = self.seconds(contenders.ICEBERG_JAVA)
        return self.ours_seconds() / theirs if theirs else None

    @property
    def share_of_two_pyarrow_cores(self) -> float | None:
        """Our MB/s over twice the single-thread pyarrow MB/s (the per-core limit on 2 cores);
        None where the pyarrow copy did not run (sorted datasets: it does not sort)."""
        theirs = self.seconds("pyarrow 1 thread")
        return theirs / 2 / self.ours_seconds() if theirs else None

    @property
    def key(self) -> str:
        """`dataset=NAME`, with `background_load=N` on a loaded pass: how summary lines start."""
        return f"dataset={self.dataset}" + (f" background_load={self.load}" if self.load else "")


@dataclass
class BenchReport:
    cores: int
    session_start_s: float = 0.0
    warmup_s: float = 0.0
    datasets: list[DatasetReport] = field(default_factory=list)
    extras: dict = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)  # wall seconds of each stage, in order

    def to_json(self) -> str:
        doc = asdict(self)
        for report, entry in zip(self.datasets, doc["datasets"], strict=True):
            ratio, java = report.ratio_vs_deltars, report.ratio_vs_iceberg_java
            entry["ratio_vs_deltars"] = None if ratio is None else round(ratio, 3)
            entry["ratio_vs_iceberg_java"] = None if java is None else round(java, 3)
            for result, row in zip(report.results, entry["results"], strict=True):
                row["mb_per_s"] = round(result.mb_per_s, 1)
        return json.dumps(doc, indent=2)


@contextmanager
def stage(report: BenchReport, name: str, log: Callable[[str], None]) -> Iterator[None]:
    """Time one stage of the bench (a dataset's pass, the memory stage, ...): logged when it ends."""
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds = report.stage_seconds[name] = time.perf_counter() - started
        log(f"[stage] {name}: {seconds:.0f}s")


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
    ours: OursProcess,
    spark,
    root: Path,
    dataset: Dataset,
    log: Callable[[str], None],
    repeats: int,
    java: iceberg_java.JavaIceberg | None = None,
    load: int = 0,
) -> DatasetReport:
    """Generate `dataset` once, then time every contender on it; each must keep the rows.

        Ours (in its own process, `ours`; `engine` is the bench's, on the same catalog), delta-rs, the
        pyarrow copy and Iceberg Java (if `java` is given) run `repeats` times, interleaved, each time
        on fresh tables over the same files (hard links), and each is reported by its median run: on a
        shared machine a single run of either side can be off by a third. Ours' rows are checked by
        content on every run, a peer's on its first and by count after (contenders.peer_expected).
        The Spark DataFrame rewrite, ten times slower than the rest, runs once, in the quiet pass
        (small only). A sorted dataset runs ours and
        Iceberg Java only (the others do not sort). `load`: the background-load processes running
    meanwhile (the caller starts them), reported with the figures."""
    folder = root / "data" / dataset.name
    log(f"[{dataset.name}] writing {dataset.files} files x {dataset.rows_per_file} rows ...")
    sources = datasets.write_files(folder / "source", dataset)
    bytes_in = sum(p.stat().st_size for p in sources)
    expected = datasets.sources_digest(sources)
    report = DatasetReport(dataset.name, dataset.files, dataset.rows, bytes_in, load=load)
    timed: dict[str, list[contenders.Result]] = {}
    for k in range(repeats):
        run_name = f"{dataset.name}_{k}" + (f"_load{load}" if load else "")  # a new table per pass and run
        table_name = f"{NAMESPACE}.{run_name}"
        datasets.ordered_table(engine.catalog, table_name, sources, dataset, TARGET)
        runs = [partial(contenders.ours, ours, engine.catalog, table_name, expected, bytes_in, dataset.files)]
        peers = contenders.peer_expected(expected, k)
        if dataset.order == "none":
            delta_uri = datasets.delta_table(datasets.linked(sources, folder / f"delta-{k}"))
            runs.append(partial(contenders.deltars, delta_uri, TARGET, peers, bytes_in, dataset.files))
            runs.append(partial(contenders.pyarrow_copy, sources, folder / f"pyarrow-{k}", TARGET, peers, bytes_in))
        if java is not None:
            run = iceberg_java.run_catalog(java, folder / "java", f"java_{run_name}")
            datasets.ordered_table(run.catalog, JAVA_TABLE, sources, dataset, TARGET)
            options, args = java_options(), datasets.java_rewrite_args(dataset)
            java_run = (java, run, JAVA_TABLE, peers, bytes_in, dataset.files, options, args)
            runs.append(partial(contenders.iceberg_java, *java_run))
        for contender in runs:  # one after the other, in this order
            # no contender pays for writing back files the set-up or the one before it wrote
            # (the kernel's writeback of a few hundred MB costs seconds of CPU on 2 cores)
            os.sync()
            result = contender()
            _check(dataset, result)
            timed.setdefault(result.contender, []).append(result)
        if java is not None:
            run.dispose()
        seconds = ", ".join(f"{c} {r[-1].seconds:.2f}s" for c, r in timed.items())
        log(f"[{dataset.name}] run {k + 1}/{repeats}{_loaded(load)}: {seconds}")
    report.results.extend(median_results(timed))
    if dataset.spark_anchor and dataset.order == "none" and not load:
        spark_result = contenders.spark_dataframe(spark, sources, folder / "spark", TARGET, expected, bytes_in)
        _check(dataset, spark_result)
        report.results.append(spark_result)
    log_results(report, log)
    return report


def java_options(deletes: bool = False) -> dict[str, str]:
    """`rewrite_data_files`' options: our target size, any 2 files make a group; with `deletes`,
    a file with one applying delete file is rewritten (merge-on-read)."""
    options = {"target-file-size-bytes": str(TARGET), "min-input-files": "2"}
    return {**options, "delete-file-threshold": "1"} if deletes else options


def _loaded(load: int) -> str:
    return f" (background load {load})" if load else ""


PEER_CHECK = " (by content on the first run, by count after)"  # contenders.peer_expected


def log_results(report: DatasetReport, log: Callable[[str], None]) -> None:
    for result in report.results:
        log(
            f"[{report.dataset}{_loaded(report.load)}] {result.contender:<16} {result.seconds:7.2f}s "
            f"{result.mb_per_s:7.1f} MB/s  files {result.files_before} -> {result.files_after} "
            f"({report.bytes / MiB:.0f} -> {result.bytes_after / MiB:.0f} MiB)  "
            f"peak RSS {result.peak_rss / MiB:6.0f} MiB "
            f"({result.rss_of})  rows {'identical' if result.rows_identical else 'DIFFERENT'}"
            + (PEER_CHECK if result.contender != "ours" and len(result.runs) > 1 else "")
            + (f"  median of {len(result.runs)}" if len(result.runs) > 1 else "")
        )
        if result.phases:
            log(
                f"[{report.dataset}{_loaded(report.load)}] {result.contender:<16} median split: "
                f"{describe_phases(result.phases)}"
            )


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
    from compaction_tools.demo import append_fragments

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
    background_load: int = 0,
    quiet_and_loaded: bool = False,
    loaded_repeats: int | None = None,
    with_java: bool = True,
) -> BenchReport:
    """Everything `compaction-assets bench` prints (its options document the defaults).

    The datasets run beside `background_load` busy processes; with `quiet_and_loaded`, each runs
    quiet and then loaded (`background_load`, default 2; `loaded_repeats` runs per contender).
    `with_java`: Iceberg Java's rewrite_data_files takes part where its venv is installed."""
    root = Path(workdir or tempfile.mkdtemp(prefix="compaction-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    config_path = bench_config(root)
    config = load_config(config_path)
    report = BenchReport(cores=os.cpu_count() or 1)
    started = bench_started = time.perf_counter()
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
    if quiet_and_loaded:
        passes = [(0, repeats), (background_load or 2, loaded_repeats or repeats)]
    else:
        passes = [(background_load, repeats)]
    local_sets = [d for d in sets if d.name != s3_dataset.S3.name]
    java = start_java(root, log) if with_java and local_sets else None
    ours = start_ours(config_path, engine, log) if local_sets else None
    try:
        for dataset in sets:
            with ExitStack() as shared:  # what every pass over the dataset shares
                on_s3 = None
                if dataset.name == s3_dataset.S3.name:
                    on_s3 = shared.enter_context(s3_dataset.s3_source(spark, root, log))
                for load, n in passes:
                    with stage(report, f"{dataset.name}{_loaded(load)}", log), footprint.background_load(load):
                        if load:
                            average = footprint.load_average()
                            log(f"[{dataset.name}] {load} background-load processes; load average {average}")
                        report.datasets.append(
                            compare_dataset(engine, ours, spark, root, dataset, log, n, java, load, on_s3)
                        )
                    log(f"[{dataset.name}] load average {footprint.load_average()}")
                    clear_runs(root / "data" / dataset.name)  # the next pass reuses the source files
            shutil.rmtree(root / "data" / dataset.name, ignore_errors=True)
        if java is not None:
            java.close()
            java = None
        if large_gib:  # in ours' own process, as the datasets were: its whole tree is measured
            with stage(report, "memory", log):
                ours = ours or start_ours(config_path, engine, log)
                paths = memory.measure_all(engine, root, list(memory.KINDS), large_gib, log, ours)
                report.extras["memory_paths"] = paths + memory.measure_sorted(engine, root, large_gib, log, ours)
                s3_paths = [memory.measure_s3(spark, root, path, large_gib, log) for path in memory.FILE_BYTES]
                report.extras["memory_paths"] += s3_paths
                shutil.rmtree(root / "data", ignore_errors=True)
        if ours is not None:
            ours.close()
            ours = None
        report.extras["commits"] = commits_per_table(engine, log)
        spark.stop()
        if runs:
            with stage(report, "fixed cost", log):
                report.extras["fixed_cost"] = fixed_cost.measure(config_path, port, runs, log=log)
        if tables:
            with stage(report, "sensor tick scaling", log):
                report.extras["planning"] = planning_scale.measure(config_path, tables, log=log)
        if drain_partitions:
            with stage(report, "drain", log):
                report.extras["drain"] = drain.measure(root / "data", drain_partitions, log=log)
        if planning_files:
            with stage(report, "planning at scale", log):
                report.extras["plan_at_scale"] = plan_at_scale.measure(planning_files, log=log)
        if defs_tables:
            with stage(report, "code location size", log):
                report.extras["many_tables"] = many_tables.measure(defs_tables, log=log)
    finally:
        for peer in (java, ours):
            if peer is not None:
                peer.close()
        shutil.rmtree(root / "data", ignore_errors=True)
    for d in report.datasets:
        spark_df = d.seconds("spark dataframe")
        if (share := d.share_of_two_pyarrow_cores) is not None:
            log(
                f"[{d.dataset}{_loaded(d.load)}] ours at {share:.0%} of 2 x single-thread pyarrow"
                + (f"; ours/spark-dataframe {d.ours_seconds() / spark_df:.2f}" if spark_df else "")
            )
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
            ours_result = next(r for r in d.results if r.contender == "ours")
            log(f"cdc_worker_peak_rss_mb={ours_result.peak_rss / MiB:.0f} equality_keys={cdc.EQUALITY_KEYS}")
        share = d.share_of_two_pyarrow_cores
        log(
            f"{d.key} "
            + (f"ratio_vs_deltars={ratio:.3f} " if ratio is not None else "")
            + (f"share_of_2x_pyarrow={share:.3f}" if share is not None else "")
            + (f" path={d.path}" if d.path else "")
        )
        for line in comparison_lines(d):
            log(line)
    log(f"load average {footprint.load_average()} (1, 5, 15 min)")
    stages = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in report.stage_seconds.items())
    log(f"bench_wall_s={time.perf_counter() - bench_started:.0f} (stages: {stages})")
    return report


def clear_runs(folder: Path) -> None:
    """Everything a pass over a dataset left in `folder` except its source files (and what
    datasets.write_files keeps beside them)."""
    for path in folder.iterdir() if folder.exists() else ():
        if path.name == "source" or path.name.startswith("source."):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()


def comparison_lines(d: DatasetReport) -> list[str]:
    """`dataset=NAME ratio_vs_iceberg_java=R` (ours over Java's median seconds, with both runs'
    file counts and sizes after) and each contender's whole-footprint peak RSS."""
    lines = []
    if (ratio := d.ratio_vs_iceberg_java) is not None:
        ours, java = (next(r for r in d.results if r.contender == c) for c in ("ours", contenders.ICEBERG_JAVA))
        lines.append(
            f"{d.key} ratio_vs_iceberg_java={ratio:.3f} (ours {ours.seconds:.2f}s, iceberg-java {java.seconds:.2f}s, "
            f"medians of {len(ours.runs) or 1}; files after: "
            f"ours {ours.files_after} / {ours.bytes_after / MiB:.1f} MiB, "
            f"iceberg-java {java.files_after} / {java.bytes_after / MiB:.1f} MiB)"
        )
    for result in d.results:
        if result.tree_peak_rss:
            lines.append(
                f"{d.key} contender={result.contender.replace(' ', '-')} "
                f"tree_peak_rss_mib={result.tree_peak_rss / MiB:.0f}"
                + (f" tree_peak_pss_mib={result.tree_peak_pss / MiB:.0f}" if result.tree_peak_pss else "")
            )
    return lines


def compare_dataset(
    engine: Engine,
    ours: OursProcess | None,
    spark,  # noqa: ANN001 - the bench's SparkSession
    root: Path,
    dataset: Dataset,
    log: Callable[[str], None],
    repeats: int,
    java: iceberg_java.JavaIceberg | None,
    load: int,
    on_s3: s3_dataset.S3Source | None = None,
) -> DatasetReport:
    """One pass over `dataset` (cdc, mor and s3 have comparisons of their own; s3's files are on
    the server `on_s3`, else uploaded for this pass); its report, logged. `ours`: None only when
    every dataset of the run is s3's, which does not run our engine's process."""
    if dataset.deletes != "none":
        # Iceberg Java on position deletes only: on cdc's 1M equality keys it runs for hours (bench/cdc.py)
        java = java if dataset.deletes == "position" else None
        bytes_in, timed = cdc.compare_cdc(
            engine, _started(ours, dataset), root, log, repeats, TARGET, java, load, dataset
        )
    elif dataset.name == s3_dataset.S3.name:
        bytes_in, timed = s3_dataset.compare_s3(spark, root, log, repeats, TARGET, source=on_s3)
    else:
        return compare(engine, _started(ours, dataset), spark, root, dataset, log, repeats, java, load)
    own_report = DatasetReport(dataset.name, dataset.files, dataset.rows, bytes_in, load=load)
    own_report.results.extend(median_results(timed))
    log_results(own_report, log)
    return own_report


def _started(ours: OursProcess | None, dataset: Dataset) -> OursProcess:
    if ours is None:
        raise ValueError(f"bench: dataset {dataset.name} needs our engine's process, which was not started")
    return ours


def start_java(root: Path, log: Callable[[str], None]) -> iceberg_java.JavaIceberg | None:
    """Iceberg Java's session for the bench, started and warmed up untimed (as ours is): one
    rewrite_data_files of a throwaway table. None, with the reason logged, where it is not installed."""
    if reason := iceberg_java.unavailable():
        log(f"iceberg-java: not taking part: {reason}")
        return None
    started = time.perf_counter()
    java = iceberg_java.JavaIceberg(root / "iceberg-java.log")
    spark_version, version = java.versions
    log(f"iceberg-java: Spark {spark_version}, Iceberg {version} started in {time.perf_counter() - started:.1f}s")
    started = time.perf_counter()
    folder = root / "data" / "java-warmup"
    sources = datasets.write_files(folder / "source", Dataset("warmup", 8, 1_000))
    run = iceberg_java.run_catalog(java, folder / "java", "java_warmup")
    datasets.iceberg_table(run.catalog, JAVA_TABLE, sources, {})
    iceberg_java.rewrite_data_files(java, run.name, JAVA_TABLE, java_options())
    run.dispose()
    shutil.rmtree(folder, ignore_errors=True)
    log(f"iceberg-java: warm-up rewrite_data_files {time.perf_counter() - started:.1f}s")
    return java


def warm_up(engine: Engine, cores: int, name: str = "warmup") -> None:
    """Compact a throwaway table (`name`) of one partition per core once, so every Spark Python
    worker has started and imported what a rewrite needs, as in a long-lived session."""
    partitioned_fragments(engine, f"{NAMESPACE}.{name}", cores)
    engine.compact(f"{NAMESPACE}.{name}")


def warmup_table(engine: Engine) -> str:
    """A new table of one partition per core, for a warm-up compaction (see warm_up)."""
    name = f"{NAMESPACE}.warmup_{uuid.uuid4().hex[:8]}"
    partitioned_fragments(engine, name, os.cpu_count() or 1)
    return name


def start_ours(config_path: Path, engine: Engine, log: Callable[[str], None]) -> OursProcess:
    """Our engine's own process for the bench (bench/ours_process.py), started and warmed up untimed
    on a table `engine` (the bench's, on the same catalog) writes for it."""
    started = time.perf_counter()
    ours = OursProcess(config_path, warmup_table(engine))
    log(f"ours: own process (pid {ours.pid}) with a warm local Spark session in {time.perf_counter() - started:.1f}s")
    return ours
