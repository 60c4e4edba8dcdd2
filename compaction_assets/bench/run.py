"""`compaction-assets bench`: ours vs delta-rs vs pyarrow vs Spark on the same data, in one run.

Every figure is measured in this process run, side by side, and reported as ratios: the
machines are shared and noisy, so absolute seconds mean little on their own.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow.dataset as ds
import yaml

from compaction_assets.bench import contenders, datasets
from compaction_assets.bench.datasets import Dataset
from compaction_assets.config import load_config
from compaction_assets.engine import Engine
from compaction_assets.execution.spark import spark_session
from compaction_assets.lake.digest import batches_digest

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

    def seconds(self, contender: str) -> float:
        return next(r.seconds for r in self.results if r.contender == contender)

    @property
    def ratio_vs_deltars(self) -> float:
        return self.seconds("ours") / self.seconds("delta-rs")

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
            entry["ratio_vs_deltars"] = round(report.ratio_vs_deltars, 3)
            for result, row in zip(report.results, entry["results"], strict=True):
                row["mb_per_s"] = round(result.mb_per_s, 1)
        return json.dumps(doc, indent=2)


def bench_config(root: Path, master: str = "local[2]") -> Path:
    """A scratch lake: SQLite catalog and ledger, local Spark, Snappy output like the peers."""
    doc = {
        "catalog": {
            "name": "bench",
            "properties": {"type": "sql", "uri": "sqlite:///catalog.db", "warehouse": "file://warehouse"},
        },
        "state": {"uri": "sqlite:///state.db"},
        "spark": {"mode": "local", "master": master, "conf": {"spark.sql.shuffle.partitions": "4"}},
        "tables": [{"match": "*", "policy": {"target_file_size_bytes": TARGET}}],
    }
    path = root / "compaction.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def compare(engine: Engine, spark, root: Path, dataset: Dataset, log: Callable[[str], None]) -> DatasetReport:  # noqa: ANN001
    """Generate `dataset` once, then time every contender on it; each must keep the rows."""
    folder = root / "data" / dataset.name
    log(f"[{dataset.name}] writing {dataset.files} files x {dataset.rows_per_file} rows ...")
    sources = datasets.write_files(folder / "delta", dataset)
    bytes_in = sum(p.stat().st_size for p in sources)
    expected = batches_digest(ds.dataset(sources).to_batches())
    table_name = f"{NAMESPACE}.{dataset.name}"
    datasets.iceberg_table(engine.catalog, table_name, sources, {})
    delta_uri = datasets.delta_table(folder / "delta")
    report = DatasetReport(dataset.name, dataset.files, dataset.rows, bytes_in)
    runs = [
        lambda: contenders.ours(engine, table_name, expected, bytes_in, dataset.files),
        lambda: contenders.deltars(delta_uri, TARGET, expected, bytes_in, dataset.files),
        lambda: contenders.pyarrow_copy(sources, folder / "pyarrow", TARGET, expected, bytes_in),
        lambda: contenders.spark_dataframe(spark, sources, folder / "spark", TARGET, expected, bytes_in),
    ]
    for run in runs:
        result = run()
        report.results.append(result)
        log(
            f"[{dataset.name}] {result.contender:<16} {result.seconds:7.2f}s {result.mb_per_s:7.1f} MB/s  "
            f"files {result.files_before} -> {result.files_after}  peak RSS {result.peak_rss / MiB:6.0f} MiB "
            f"({result.rss_of})  rows {'identical' if result.rows_identical else 'DIFFERENT'}"
        )
        if not result.rows_identical:
            raise RuntimeError(f"bench: {result.contender} changed the rows of {dataset.name}")
    return report


def run_bench(
    workdir: Path | None, sets: list[Dataset], log: Callable[[str], None] = print, keep: bool = False
) -> BenchReport:
    root = Path(workdir or tempfile.mkdtemp(prefix="compaction-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    config = load_config(bench_config(root))
    import os

    report = BenchReport(cores=os.cpu_count() or 1)
    started = time.perf_counter()
    spark = spark_session(config.spark)
    report.session_start_s = time.perf_counter() - started
    engine = Engine(config, spark=lambda: spark)
    engine.catalog.create_namespace_if_not_exists(NAMESPACE)
    log(f"bench in {root}: {report.cores} cores; Spark session started in {report.session_start_s:.1f}s")
    try:
        for dataset in sets:
            report.datasets.append(compare(engine, spark, root, dataset, log))
    finally:
        if not keep:
            shutil.rmtree(root / "data", ignore_errors=True)
    for d in report.datasets:
        log(
            f"[{d.dataset}] ours at {d.share_of_two_pyarrow_cores:.0%} of 2 x single-thread pyarrow; "
            f"ours/spark-dataframe {d.seconds('ours') / d.seconds('spark dataframe'):.2f}"
        )
    for d in report.datasets:
        log(f"dataset={d.dataset} ratio_vs_deltars={d.ratio_vs_deltars:.3f}")
    return report
