"""The `compaction-assets` command. Every subcommand reads compaction.yaml ($COMPACTION_CONFIG)."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click

from compaction_assets.commit.ledger import Ledger
from compaction_assets.commit.recovery import open_attempts_note
from compaction_assets.config import load_config
from compaction_assets.engine.facade import Engine
from compaction_assets.engine.outcomes import PartitionOutcome
from compaction_assets.errors import CatalogError, CompactionError, ConfigError
from compaction_assets.lake.catalog import TableNotFound
from compaction_assets.planning.planner import Kind, PartitionPlan
from compaction_assets.redact import RedactingFilter, redact

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from pyiceberg.table import Table

    from compaction_assets.lake.digest import RowsDigest
    from compaction_assets.planning.manifests import ManifestPlan


def _engine(ctx: click.Context, read_only: bool = False, new_catalog: bool = False) -> Engine:
    """The engine for the config. A SQLite catalog file must exist already unless `new_catalog` (a
    mistyped uri would otherwise create an empty catalog); `read_only` commands create no ledger
    file either."""
    if "engine" not in ctx.obj:
        config = load_config(ctx.obj["config"])
        catalog_file = _sqlite_file(config.catalog.properties.get("uri", ""))
        if catalog_file and not catalog_file.exists() and not new_catalog:
            raise CatalogError(
                f"catalog '{config.catalog.name}' not found: no SQLite file at "
                f"{redact(config.catalog.properties['uri'])} (catalog.properties.uri in {config.source})"
            )
        ledger_file = _sqlite_file(config.state_uri)
        ledger = Ledger("sqlite://") if read_only and ledger_file and not ledger_file.exists() else None  # in memory
        ctx.obj["engine"] = Engine(config, ledger=ledger)
    return ctx.obj["engine"]


def _sqlite_file(uri: str) -> Path | None:
    path = uri.removeprefix("sqlite:///").split("?", 1)[0] if uri.startswith("sqlite:///") else ""
    return Path(path) if path not in ("", ":memory:") else None


class _Group(click.Group):
    """Turn any error into a clear message on stderr (credentials masked) and exit code 2.

    Expected errors (CompactionError) already name the thing; anything else is one line with its
    type, and the traceback only with --verbose."""

    def invoke(self, ctx: click.Context):  # noqa: ANN201 - click's signature
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except ConfigError as exc:  # one line per mistake in the file
            click.echo(f"error: {redact(exc)}", err=True)
            sys.exit(2)
        except CompactionError as exc:
            where = _catalog_uri(ctx)
            message = _first_line(exc)
            if isinstance(exc, TableNotFound) and where and where not in message:
                message += f" (catalog uri {where})"
            click.echo(f"error: {redact(message)}", err=True)
            sys.exit(2)
        except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
            if ctx.obj and ctx.obj.get("verbose"):
                logging.getLogger(__name__).exception("unexpected error")
            command = ctx.invoked_subcommand or "command"
            click.echo(f"error: {command}: {type(exc).__name__}: {redact(_first_line(exc))}", err=True)
            sys.exit(2)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _catalog_uri(ctx: click.Context) -> str | None:
    """The configured catalog's uri (credentials masked), if the config could be read."""
    try:
        return redact(load_config(ctx.obj["config"]).catalog.properties.get("uri", "")) or None
    except Exception:  # noqa: BLE001 - only decorates another error
        return None


@click.group(cls=_Group)
@click.option("--config", "config", envvar="COMPACTION_CONFIG", help="compaction.yaml (default ./compaction.yaml)")
@click.option("-v", "--verbose", is_flag=True, help="log progress to stderr")
@click.pass_context
def main(ctx: click.Context, config: str | None, verbose: bool) -> None:
    """Continuous small-file compaction for Apache Iceberg tables."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    logging.getLogger("compaction_assets").setLevel(logging.INFO)
    ctx.obj = {"config": config, "verbose": verbose}


@main.command()
@click.argument("table")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def plan(ctx: click.Context, table: str, as_json: bool) -> None:
    """Show what compaction would do to TABLE, partition by partition, and which open attempts
    hold its files (whose process runs, whose is gone and what to run then)."""
    engine = _engine(ctx, read_only=True)
    tplan = engine.plan(table)
    in_flight = open_attempts_note(engine.ledger, table, engine.config.state.executing_timeout_seconds)
    if as_json:
        doc = {
            "table": table,
            "snapshot_id": tplan.snapshot_id,
            "policy": asdict(tplan.policy),
            "refused": tplan.refused,
            "partitions": [
                {
                    "partition": p.partition_key,
                    "kind": p.kind,
                    "reason": p.reason,
                    "benefit": round(p.benefit, 4),
                    "stats": asdict(p.stats),
                    "groups": [{"files": len(g.paths), "bytes": g.bytes} for g in p.groups],
                    "delete_paths": list(p.delete_paths),
                    "covered_data_paths": list(p.covered_data_paths),
                    "drop_paths": list(p.drop_paths),
                    "expired_rows_estimate": p.expired_rows,
                }
                for p in tplan.partitions
            ],
            "manifests": _manifests_doc(tplan.manifests),
            "in_flight": in_flight,
        }
        click.echo(json.dumps(doc, indent=2))
        return
    policy = tplan.policy
    click.echo(
        f"{table} @ snapshot {tplan.snapshot_id}: target {policy.target_file_size_bytes} B, "
        f"fragment <= {policy.fragment_max_bytes} B, undersized < {policy.undersized_below_bytes} B, "
        f"min_input_files {policy.min_input_files}; delete triggers: >= {policy.delete_file_threshold} delete "
        f"files on a file, deleted-row ratio >= {policy.delete_ratio_threshold}; tiers: >= "
        f"{policy.equality_delete_file_threshold} equality-delete files, >= "
        f"{policy.position_delete_file_threshold} small position-delete files; split > {policy.split_above_bytes} B; "
        + (
            f"full every {policy.full_trigger_interval_ms} ms"
            if policy.full_trigger_interval_ms is not None
            else "full optimizing off"
        )
    )
    if tplan.clustering:
        click.echo(
            f"clustering: {tplan.clustering.describe()}; cluster when bounds overlap >= "
            f"{policy.cluster_min_overlap:g}; sorted rewrites spill beyond {policy.sort_memory_bytes} B"
        )
    if tplan.refused:
        click.echo(f"not compacted: {tplan.refused}")
    if tplan.expire is not None:
        expiry = tplan.expire if isinstance(tplan.expire, str) else f"expires rows where {tplan.expire.describe()}"
        click.echo(f"data expiration: {expiry}")
    click.echo(
        f"{'partition':32} {'files':>6} {'bytes':>12} {'frag':>5} {'under':>5} {'posdel':>6} {'eqdel':>5} "
        f"{'deleted':>9} {'ratio':>5} {'amp':>6}  plan"
    )
    for p in tplan.partitions:
        s = p.stats
        if not p.worth_compacting:
            what = f"nothing: {p.reason}"
        elif p.drop_paths or p.kind == Kind.EXPIRE:
            what = f"{_expire_summary(p)}, benefit {p.benefit:.2f}; {p.reason}"
        elif p.is_tier:
            what = (
                f"{len(p.delete_paths)} delete files over {len(p.covered_data_paths)} data files, "
                f"benefit {p.benefit:.2f}; {p.reason}"
            )
        else:
            what = f"{p.input_files} files in {len(p.groups)} group(s), benefit {p.benefit:.2f}; {p.reason}"
        click.echo(
            f"{p.partition_key or '(unpartitioned)':32} {s.data_files:>6} {s.data_bytes:>12} "
            f"{s.fragments:>5} {s.undersized:>5} {s.position_delete_files:>6} {s.equality_delete_files:>5} "
            f"{s.deleted_rows:>9} {s.delete_ratio:>5.2f} {s.read_amplification:>6.2f}  {what}"
        )
    click.echo(f"{len(tplan.to_compact)} of {len(tplan.partitions)} partition(s) to compact")
    for line in in_flight:
        click.echo(f"in flight: {line}")
    if (m := tplan.manifests) is not None:
        if not m.due:
            click.echo(f"table: nothing: {m.reason}")
        elif tplan.to_compact:
            click.echo(f"table: {m.kind} after the compactions (they merge manifests too): {m.reason}")
        else:
            click.echo(f"table: {m.kind}, benefit {m.benefit:.2f}; {m.reason}")


def _manifests_doc(m: ManifestPlan | None) -> dict | None:
    if m is None:
        return None
    return {
        "kind": m.kind if m.due else None,
        "due": m.due,
        "reason": m.reason,
        "benefit": round(m.benefit, 4),
        "manifests": m.manifests,
        "small": m.small,
        "entries": m.entries,
        "avg_entries": round(m.avg_entries, 2),
        "expected_outputs": m.expected_outputs,
    }


def _expire_summary(p: PartitionPlan) -> str:
    """What a data expiration of one partition would remove: files dropped unread, files rewritten."""
    dropped = len(p.drop_paths)
    return (
        f"expire ~{p.expired_rows} row(s): {dropped} file(s) dropped unread, {p.input_files} file(s) "
        f"rewritten in {len(p.groups)} group(s)"
    )


@main.command()
@click.argument("table")
@click.option("--partition", default=None, help="only this partition, by the key `plan` shows")
@click.option("--dry-run", is_flag=True, help="show what would be expired; change nothing")
@click.pass_context
def expire(ctx: click.Context, table: str, partition: str | None, dry_run: bool) -> None:
    """Drop TABLE's rows past retention now (compaction.expire.field, compaction.expire.retention-ms),
    and nothing else: whole files past it by a metadata-only delete, the rest rewritten without them.
    The same code path as the asset's (which runs expirations first); --dry-run only shows them."""
    engine = _engine(ctx, read_only=dry_run)
    if not dry_run:
        outcomes = engine.expire(table, partition=partition)
        expired = [o for o in outcomes if o.kind == Kind.EXPIRE]
        _print_outcomes(expired)
        _to_dagster(engine, lambda home, events: events.report_outcomes(home, engine, expired))
        if not expired:
            click.echo(f"{table}: nothing past retention")
        if not all(o.ok for o in outcomes):
            sys.exit(1)
        return
    tplan = engine.plan(table, partition)
    if isinstance(tplan.expire, str) or tplan.expire is None:
        click.echo(f"{table}: {tplan.expire or 'expiration is off (set compaction.expire.field and retention-ms)'}")
        return
    plans = [p for p in tplan.to_compact if p.kind == Kind.EXPIRE]
    click.echo(f"{table} @ snapshot {tplan.snapshot_id}: would expire rows where {tplan.expire.describe()}")
    for p in plans:
        click.echo(f"{p.partition_key or '(unpartitioned)'}: {_expire_summary(p)}")
        for path in p.drop_paths:
            click.echo(f"  drop     {path}")
        for path in (path for g in p.groups for path in g.paths):
            click.echo(f"  rewrite  {path}")
    rows = sum(p.expired_rows for p in plans)
    click.echo(f"{len(plans)} of {len(tplan.partitions)} partition(s) to expire, ~{rows} row(s) (estimated)")


@main.command()
@click.argument("table")
@click.option(
    "--partition",
    default=None,
    help="only this partition, by the key `plan` shows (its Iceberg partition path, e.g. region=eu; "
    "NULL is __HIVE_DEFAULT_PARTITION__)",
)
@click.option("--task-id", default=None, help="task id to record (default: a new one per partition)")
@click.pass_context
def compact(ctx: click.Context, table: str, partition: str | None, task_id: str | None) -> None:
    """Compact TABLE (or one partition of it): the same code path as the Dagster asset."""
    engine = _engine(ctx)
    outcomes = engine.compact(table, partition=partition, task_id=task_id)
    _print_outcomes(outcomes)
    _to_dagster(engine, lambda home, events: events.report_outcomes(home, engine, outcomes))
    if not all(o.ok for o in outcomes):
        sys.exit(1)


@main.command()
@click.pass_context
def recover(ctx: click.Context) -> None:
    """Finish or undo every attempt a crash left open (PREPARED, dead EXECUTING).

    Each attempt is decided on its own; those to recommit are committed together, one snapshot
    per table, each with the checks of a normal commit. `compact TABLE` does the same for the
    table's attempts before it plans. Exit code 1 means some attempt could not be decided in
    this run (each is named on stderr with its table); it stays open and is tried again next run.
    At its third failure an attempt is parked instead (FAILED with the reason, its files left
    alone; exit 0), so one bad attempt does not fail every later run; only a table that cannot be
    read at all keeps the exit code at 1 until it can.
    """
    engine = _engine(ctx)
    report = engine.recover()
    click.echo(
        f"recovered {report.handled} attempt(s): {len(report.confirmed)} confirmed committed, "
        f"{len(report.recommitted)} recommitted, {len(report.rolled_back)} rolled back, "
        f"{len(report.abandoned)} abandoned, {len(report.parked)} parked"
    )
    for attempt_id in report.parked:
        parked = engine.ledger.get(attempt_id)
        click.echo(f"  parked {parked.table_name} attempt {attempt_id}: {parked.reason}", err=True)
    for error in report.errors:
        click.echo(f"  could not recover {error}", err=True)
    _to_dagster(engine, lambda home, events: events.report_recovery(home, engine, report))
    if report.errors:
        sys.exit(1)


@main.command()
@click.argument("table")
@click.option("--dry-run", is_flag=True, help="report what would be expired and deleted; change nothing")
@click.pass_context
def gc(ctx: click.Context, table: str, dry_run: bool) -> None:
    """Expire old snapshots of TABLE and delete files nothing references any more."""
    engine = _engine(ctx, read_only=dry_run)
    report = engine.gc(table, dry_run=dry_run)
    _to_dagster(engine, lambda home, events: events.report_maintenance(home, [report]))
    if report.paused:
        click.echo(f"{table}: paused (compaction.enabled=false): GC skipped")
        return
    verb = "would expire" if dry_run else "expired"
    click.echo(
        f"{table}: {verb} {len(report.snapshots_expired)} snapshot(s); "
        f"{'would delete' if dry_run else 'deleted'} {len(report.expired_files)} file(s) of expired snapshots "
        f"and {len(report.orphan_files)} orphan file(s), {report.bytes_reclaimed} bytes"
    )
    for path in [*report.expired_files, *report.orphan_files] if dry_run else []:
        click.echo(f"  {path}")


@main.command("rewrite-manifests")
@click.argument("table")
@click.option("--dry-run", is_flag=True, help="report which manifests would be replaced; change nothing")
@click.option("--task-id", default=None, help="task id to record (default: a new one)")
@click.pass_context
def rewrite_manifests(ctx: click.Context, table: str, dry_run: bool, task_id: str | None) -> None:
    """Merge TABLE's small manifests into few, clustered by partition, if due (metadata only)."""
    engine = _engine(ctx, read_only=dry_run)
    r = engine.rewrite_manifests(table, task_id=task_id, dry_run=dry_run)
    _to_dagster(engine, lambda home, events: events.report_maintenance(home, [r]))
    if r.status == "committed":
        click.echo(
            f"{table}: committed rewrite-manifests in snapshot {r.snapshot_id}: {r.manifests_before} -> "
            f"{r.manifests_after} manifest(s); {r.reason} in {r.seconds:.2f}s"
        )
    elif r.status == "dry_run":
        click.echo(
            f"{table}: would rewrite {r.manifests_replaced} small manifest(s) ({r.entries} entries, "
            f"{r.bytes_replaced} B) into ~{r.manifests_written}: {r.manifests_before} -> ~{r.manifests_after} "
            "manifest(s)"
        )
    else:
        click.echo(f"{table}: {r.status}: {r.reason}")
    if not r.ok:
        sys.exit(1)


@main.command()
@click.argument("table")
@click.pass_context
def pause(ctx: click.Context, table: str) -> None:
    """Stop compacting and collecting garbage for TABLE (persisted in the table: compaction.enabled=false)."""
    _engine(ctx).set_enabled(table, False)
    click.echo(f"{table}: paused")


@main.command()
@click.argument("table")
@click.pass_context
def resume(ctx: click.Context, table: str) -> None:
    """Resume compaction and GC of TABLE (compaction.enabled=true)."""
    _engine(ctx).set_enabled(table, True)
    click.echo(f"{table}: resumed")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Queues (running / queued / capacity / limit), tables (fragmentation, paused, tasks), open tasks;
    in connect mode first the warm Spark Connect server's health."""
    from compaction_assets.commit.ledger import OPEN
    from compaction_assets.status import as_dict, queue_statuses, spark_server_status, table_statuses

    engine = _engine(ctx, read_only=True)
    tables = table_statuses(engine)
    home = _dagster_home(engine.config.source)
    queues = queue_statuses(engine, _dagster_queue_load(home) if home else None)
    counts = engine.ledger.counts()
    server = spark_server_status(engine.config.spark)
    if as_json:
        click.echo(json.dumps(as_dict(tables, queues, counts, server and server[0]), indent=2, default=str))
        return
    if server:
        click.echo(server[1] + "\n")
    click.echo(f"{'queue':12} {'running':>8} {'queued':>7} {'capacity':>9} {'limit':>6}")
    for q in queues:
        running, queued = ("-", "-") if q.running is None else (q.running, q.queued)
        click.echo(f"{q.queue:12} {running:>8} {queued:>7} {q.capacity:>9} {q.limit:>6}")
    click.echo(
        f"(runs from the Dagster instance in {home})"
        if home
        else "(running/queued: no Dagster instance found; set DAGSTER_HOME to the deployment's, "
        "or run `compaction-assets demo` beside this config, which keeps one in .dagster_home)"
    )
    click.echo(
        f"\n{'table':24} {'queue':8} {'files':>6} {'frag':>5} {'small':>5} {'avg bytes':>10} "
        f"{'to do':>5} {'open':>4}  state / last compaction"
    )
    for t in tables:
        state = "error: " + t.error if t.error else ("PAUSED" if t.paused else "active")
        click.echo(
            f"{t.table:24} {t.queue:8} {t.data_files:>6} {t.fragments:>5} {t.small_files:>5} "
            f"{t.avg_file_bytes:>10} {t.partitions_to_compact:>5} {t.open_tasks:>4}  "
            f"{state}, {t.last_compaction or 'never'}"
        )
    click.echo("\ntasks by state: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none yet"))
    for a in engine.ledger.attempts(statuses=OPEN):
        click.echo(
            f"  {a.status:10} {a.table_name} [{a.partition_key or '-'}] attempt {a.attempt_id} since {a.created_at}"
        )


def _to_dagster(engine: Engine, report: Callable[[Path, ModuleType], int]) -> None:
    """Report work done here to the configured Dagster instance, if any (defs/cli_events.py), so
    the UI shows it as materialisations; the work is done either way, so a failure only warns."""
    home = _dagster_home(engine.config.source)
    if home is None or not home.is_dir():
        return
    try:
        from compaction_assets.defs import cli_events

        reported = report(home, cli_events)
    except Exception as exc:  # noqa: BLE001 - the compaction itself succeeded
        click.echo(f"warning: not reported to the Dagster instance in {home}: {redact(_first_line(exc))}", err=True)
        return
    if reported:
        click.echo(f"reported {reported} materialisation(s) to the Dagster instance in {home}")


def _dagster_home(config_source: str) -> Path | None:
    """$DAGSTER_HOME, else the demo's instance beside the config (.dagster_home), if either exists."""
    import os

    if home := os.environ.get("DAGSTER_HOME"):
        return Path(home)
    demo_home = Path(config_source).parent / ".dagster_home"
    return demo_home if (demo_home / "dagster.yaml").exists() else None


def _dagster_queue_load(home: Path) -> dict[str, tuple[int, int]]:
    """Run counts per queue from the Dagster instance in `home`."""
    from dagster import DagsterInstance

    from compaction_assets.defs.sensors import queue_load

    with DagsterInstance.from_config(str(home)) as instance:
        return queue_load(instance)


@main.command()
@click.option("--minutes", default=10.0, show_default=True, help="how long to inject faults")
@click.option("--seed", default=1, show_default=True, help="the schedule of faults; the same seed replays it")
@click.option("--slots", default=4, show_default=True, help="fault loops running side by side")
@click.option("--dir", "workdir", type=click.Path(), default=None, help="scratch lake (default: a temp folder)")
@click.option("--update-readme", type=click.Path(exists=True), default=None, help="rewrite its reliability section")
def soak(minutes: float, seed: int, slots: int, workdir: str | None, update_readme: str | None) -> None:
    """Writers, compactions, GC and random kills together on a scratch lake; then the invariants."""
    from compaction_assets.soak import readme_section, run_soak

    figures = run_soak(minutes, seed, Path(workdir) if workdir else None, log=click.echo, slots=slots)
    if update_readme:
        path = Path(update_readme)
        text = path.read_text()
        begin, end = "<!-- reliability:begin -->", "<!-- reliability:end -->"
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        section = readme_section(figures, f"compaction-assets soak --minutes {minutes:g} --seed {seed} --slots {slots}")
        path.write_text(f"{head}{begin}\n{section}\n{end}{tail}")
    if not figures.invariants.ok:
        sys.exit(1)


@main.command()
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
    from compaction_assets.bench.cdc import CDC, MOR
    from compaction_assets.bench.datasets import SMALL, SORTED, TINY, TYPED, WIDE, ZORDER
    from compaction_assets.bench.run import run_bench
    from compaction_assets.bench.s3_dataset import S3

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


@main.command()
@click.option("--port", default=3000, show_default=True, help="the Dagster UI's port (127.0.0.1)")
@click.option("--spark-port", type=int, default=None, help="the Spark Connect server's port (default: spark.remote's)")
@click.pass_context
def serve(ctx: click.Context, port: int, spark_port: int | None) -> None:
    """Run the production stack for the configured catalog: the warm Spark Connect server (connect
    mode), the run host, the Dagster webserver and daemon; Ctrl-C or SIGTERM stops all of it."""
    import os

    from compaction_assets.config import SPARK_REMOTE_ENV
    from compaction_assets.stack import serve as serve_stack
    from compaction_assets.stack import spark_remote_with_port

    if spark_port is not None:
        os.environ[SPARK_REMOTE_ENV] = spark_remote_with_port(load_config(ctx.obj["config"]).spark.remote, spark_port)
    _engine(ctx, read_only=True)  # the catalog answers (a missing SQLite file is an error) before anything starts
    sys.exit(serve_stack(load_config(ctx.obj["config"]), port))


@main.command()
@click.option(
    "--catalog-uri", required=True, help="sqlite:///PATH, postgresql+psycopg://USER@HOST/DB or http(s)://REST"
)
@click.option("--warehouse", default=None, help="the catalog's warehouse (needed only to create tables)")
@click.option("--name", default=None, help="the catalog's name (default: the one the SQL catalog holds)")
@click.option("-o", "--output", default="compaction.yaml", show_default=True, type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="replace an existing file")
def init(catalog_uri: str, warehouse: str | None, name: str | None, output: Path, force: bool) -> None:
    """Write a commented compaction.yaml for an existing catalog: its tables, suggested queues."""
    from compaction_assets.init_config import init_config

    report = init_config(catalog_uri, output, warehouse=warehouse, name=name, force=force)
    click.echo(f"catalog '{report.catalog_name}': {len(report.tables)} table(s)")
    for table in report.tables:
        click.echo(f"  {table.name}: {table.describe()}")
    click.echo(f"wrote {report.path}")
    for var in report.env_needed:
        click.echo(f"  it reads the catalog password from ${var}: export it before other commands")
    click.echo(f"next: compaction-assets --config {report.path} serve")


@main.command("spark-server")
@click.argument("action", type=click.Choice(["start", "stop", "status"]))
@click.pass_context
def spark_server(ctx: click.Context, action: str) -> None:
    """Run the warm Spark Connect server that `spark.mode: connect` runs share (pyspark's own)."""
    from compaction_assets.execution import connect_server

    cfg = load_config(ctx.obj["config"]).spark
    if action == "start":
        click.echo(f"starting Spark Connect at {cfg.remote} (master {cfg.master}) ...")
        state = connect_server.start(cfg)
    elif action == "stop":
        before = connect_server.status(cfg)
        state = connect_server.stop(cfg)
    else:
        state = connect_server.health(cfg)  # running means answering a request, not only an open port
    click.echo(connect_server.stop_message(before, state) if action == "stop" else state.describe())
    if action == "status" and not state.running:
        sys.exit(3)
    if action == "stop" and state.pid is not None:
        sys.exit(1)


@main.command()
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
    from compaction_assets.demo import claim_demo_catalog, create_demo_lake, s3_demo_config
    from compaction_assets.local_s3 import local_s3

    with contextlib.ExitStack() as stack:
        if s3:
            server = stack.enter_context(local_s3())
            ctx.obj["config"] = str(s3_demo_config(load_config(ctx.obj["config"]), server))
            click.echo(
                f"local S3 server (moto) at {server.endpoint}, warehouse {server.warehouse('demo')}; "
                f"config {ctx.obj['config']} (use it as COMPACTION_CONFIG while the demo runs)"
            )
        claim_demo_catalog(load_config(ctx.obj["config"]).catalog)  # before anything opens (and creates) it
        engine = _engine(ctx, new_catalog=True)
        written = create_demo_lake(engine.catalog, files_per_partition)
        listing = ", ".join(f"{t} {n} files" for t, n in written.items())
        click.echo(f"demo lake in catalog '{engine.catalog.name}': {listing}")
        from compaction_assets.demo_ui import run_dagster_dev, warm_spark

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
        _print_outcomes(outcomes)
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


def _overlap_text(overlap: dict) -> str:
    columns = ", ".join(overlap["columns"])
    return f", bounds overlap {overlap['before']:g} -> {overlap['after']:g} on {overlap['order']}({columns})"


def _print_outcomes(outcomes: list[PartitionOutcome]) -> None:
    for o in outcomes:
        where = f"{o.table_name} [{o.partition_key or 'unpartitioned'}]"
        if o.status == "committed":
            click.echo(
                f"{where}: committed {o.kind}: {o.files_before} -> {o.files_after} files, "
                f"{o.bytes_before} -> {o.bytes_after} bytes, {o.rows} rows, {o.groups} group(s), "
                f"{o.seconds:.1f}s, snapshot {o.snapshot_id}"
                + (f", rewrite path {o.engine}" if o.engine else "")
                + (f"; {o.reason}" if o.kind in (Kind.EXPIRE, Kind.OLD_SPEC) else "")  # what went, where
                + (_overlap_text(o.bounds_overlap) if o.bounds_overlap else "")
            )
        else:
            click.echo(f"{where}: {o.status}: {o.reason}", err=o.status == "failed")
