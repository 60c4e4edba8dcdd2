"""The tools' commands, which join `compaction-assets` through the entry point group
`compaction_assets.commands` (pyproject.toml): `bench`, `demo` and `soak`."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from compaction_assets.cli import open_engine
from compaction_assets.config import load_config
from compaction_assets.engine.facade import Engine
from compaction_assets.engine.outcomes import PartitionOutcome
from compaction_assets.reports import print_outcomes

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from compaction_assets.lake.digest import RowsDigest


@click.command()
@click.option("--minutes", default=10.0, show_default=True, help="how long to inject faults")
@click.option("--seed", default=1, show_default=True, help="the schedule of faults; the same seed replays it")
@click.option("--slots", default=4, show_default=True, help="fault loops running side by side")
@click.option("--dir", "workdir", type=click.Path(), default=None, help="scratch lake (default: a temp folder)")
@click.option("--update-readme", type=click.Path(exists=True), default=None, help="rewrite its reliability section")
def soak(minutes: float, seed: int, slots: int, workdir: str | None, update_readme: str | None) -> None:
    """Writers, compactions, GC and random kills together on a scratch lake; then the invariants."""
    from compaction_tools.soak import readme_section, run_soak

    figures = run_soak(minutes, seed, Path(workdir) if workdir else None, log=click.echo, slots=slots)
    if update_readme:
        path = Path(update_readme)
        text = path.read_text()
        begin, end = "<!-- reliability:begin -->", "<!-- reliability:end -->"
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        section = readme_section(figures, f"compaction-assets soak --minutes {minutes:g} --seed {seed} --slots {slots}")
        path.write_text(f"{head}{begin}\n{section}\n{end}{tail}")
    if not figures.report().ok:
        sys.exit(1)


@click.command()
@click.option(
    "--dataset",
    "names",
    multiple=True,
    type=click.Choice(["small", "tiny", "typed", "wide", "cdc", "mor", "s3", "sorted", "zorder"]),
    help="default: all",
)
@click.option("--large-gib", default=2.0, show_default=True, help="size of the one-group memory run (0: skip)")
@click.option("--tables", default=1000, show_default=True, help="tables in the sensor-tick scaling run (0: skip)")
@click.option(
    "--planning-files", default=200_000, show_default=True, help="files of the one-table planning run (0: skip)"
)
@click.option("--port", default=15102, show_default=True, help="port of the bench's own Spark Connect server")
@click.option("--defs-tables", default="1000,10000", show_default=True, help="code location sizes to load (0: skip)")
@click.option("--runs", default=3, show_default=True, help="cold and warm runs in the fixed-cost comparison (0: skip)")
@click.option("--repeats", default=5, show_default=True, help="runs per contender per dataset (median reported)")
@click.option("--drain-partitions", default=2000, show_default=True, help="partitions of the drain run (0: skip)")
@click.option("--dir", "workdir", type=click.Path(), default=None, help="scratch folder (default: a temp folder)")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON at the end")
@click.option(
    "--background-load", default=0, show_default=True, help="busy processes running beside every contender's runs"
)
@click.option(
    "--quiet-and-loaded", is_flag=True, help="each dataset quiet, then at --background-load (default 2 with this flag)"
)
@click.option(
    "--loaded-repeats", type=int, default=None, help="runs per contender in the loaded pass (default: --repeats)"
)
@click.option(
    "--iceberg-java/--no-iceberg-java",
    default=True,
    show_default=True,
    help="Iceberg Java's rewrite_data_files as a contender (where tests/interop/setup_java.sh installed it)",
)
def bench(
    names: tuple[str, ...],
    large_gib: float,
    tables: int,
    planning_files: int,
    port: int,
    defs_tables: str,
    runs: int,
    repeats: int,
    drain_partitions: int,
    workdir: str | None,
    as_json: bool,
    background_load: int,
    quiet_and_loaded: bool,
    loaded_repeats: int | None,
    iceberg_java: bool,
) -> None:
    """Ours vs Iceberg Java vs delta-rs vs pyarrow vs Spark on the same data; memory, fixed cost, planning scale."""
    from compaction_tools.bench.cdc import CDC, MOR
    from compaction_tools.bench.datasets import SMALL, SORTED, TINY, TYPED, WIDE, ZORDER
    from compaction_tools.bench.run import run_bench
    from compaction_tools.bench.s3_dataset import S3

    sets = [d for d in (SMALL, TINY, TYPED, WIDE, CDC, MOR, S3, SORTED, ZORDER) if not names or d.name in names]
    sizes = tuple(n for n in (int(x) for x in defs_tables.split(",")) if n)
    report = run_bench(
        Path(workdir) if workdir else None,
        sets,
        click.echo,
        large_gib,
        tables,
        port,
        runs,
        repeats,
        drain_partitions,
        planning_files,
        sizes,
        background_load=background_load,
        quiet_and_loaded=quiet_and_loaded,
        loaded_repeats=loaded_repeats,
        with_java=iceberg_java,
    )
    if as_json:
        click.echo(report.to_json())


@click.command()
@click.option("--files-per-partition", default=60, show_default=True)
@click.option("--stream", is_flag=True, help="keep a writer appending small files to sales.orders")
@click.option("--no-ui", is_flag=True, help="compact every table now instead of starting Dagster")
@click.option("--port", default=3000, show_default=True)
@click.option(
    "--s3",
    is_flag=True,
    help="warehouse on a local S3 server (moto, in this process, until the demo stops); needs pip install -e '.[s3]'",
)
@click.pass_context
def demo(ctx: click.Context, files_per_partition: int, stream: bool, no_ui: bool, port: int, s3: bool) -> None:
    """Build a fragmented demo lake, then watch Dagster compact it (dagster dev on 127.0.0.1)."""
    from compaction_tools.demo import claim_demo_catalog, create_demo_lake, s3_demo_config
    from compaction_tools.local_s3 import local_s3

    with contextlib.ExitStack() as stack:
        if s3:
            server = stack.enter_context(local_s3())
            ctx.obj["config"] = str(s3_demo_config(load_config(ctx.obj["config"]), server))
            click.echo(
                f"local S3 server (moto) at {server.endpoint}, warehouse {server.warehouse('demo')}; "
                f"config {ctx.obj['config']} (use it as COMPACTION_CONFIG while the demo runs)"
            )
        claim_demo_catalog(load_config(ctx.obj["config"]).catalog)  # before anything opens (and creates) it
        engine = open_engine(ctx, new_catalog=True)
        written = create_demo_lake(engine.catalog, files_per_partition)
        listing = ", ".join(f"{t} {n} files" for t, n in written.items())
        click.echo(f"demo lake in catalog '{engine.catalog.name}': {listing}")
        from compaction_tools.demo_ui import run_dagster_dev, warm_spark

        if no_ui:
            with warm_spark(engine.config):
                try:
                    code = _compact_all(engine, list(written))
                finally:
                    _close_spark_session()
        else:
            code = run_dagster_dev(engine.config, port=port, stream=stream)
    sys.exit(code)


def _close_spark_session() -> None:
    """Stop this process's Spark session before the demo stops its Spark Connect server: a Spark
    Connect client still open at exit retries its clean-up call against the stopped server for many minutes."""
    from pyspark.sql import SparkSession

    if (session := SparkSession.getActiveSession()) is not None:
        session.stop()


def _compact_all(engine: Engine, tables: list[str]) -> int:
    from compaction_assets.lake.catalog import load_table

    failed = False
    committed: list[PartitionOutcome] = []
    started_all = time.monotonic()
    for name in tables:
        before = _digest(load_table(engine.catalog, name))
        started = time.monotonic()
        outcomes = engine.compact(name)
        committed += [o for o in outcomes if o.status == "committed"]
        after = _digest(load_table(engine.catalog, name))
        print_outcomes(outcomes)
        failed |= not all(o.ok for o in outcomes)
        seconds = time.monotonic() - started
        if before is None or after is None:  # tests/test_mor_compaction.py compares such tables
            rows = after.rows if after is not None else "?"
            click.echo(
                f"  {name}: {rows} rows after; content not compared (pyiceberg cannot read equality deletes), "
                f"{seconds:.1f}s"
            )
            continue
        same = before == after
        failed |= not same
        click.echo(
            f"  {name}: {before.rows} rows, content {'identical' if same else 'CHANGED'} "
            f"({before.sha256[:12]}), {seconds:.1f}s"
        )
    paths = sorted({o.engine for o in committed if o.engine})
    click.echo(
        f"total: {len(committed)} partition(s) compacted, {sum(o.files_before for o in committed)} -> "
        f"{sum(o.files_after for o in committed)} files, {sum(o.bytes_before for o in committed)} -> "
        f"{sum(o.bytes_after for o in committed)} bytes, {time.monotonic() - started_all:.1f}s, "
        f"rewrite path {', '.join(paths) or '-'}"
    )
    return 1 if failed else 0


def _digest(table: Table) -> RowsDigest | None:
    """The table's rows digest, or None while it has equality deletes (pyiceberg 0.12 refuses them)."""
    from pyiceberg.manifest import DataFileContent

    from compaction_assets.lake.digest import rows_digest
    from compaction_assets.lake.files import live_files

    if any(f.data_file.content == DataFileContent.EQUALITY_DELETES for f in live_files(table)):
        return None
    return rows_digest(table)
