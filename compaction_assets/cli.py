"""The `compaction-assets` command. Every subcommand reads compaction.yaml ($COMPACTION_CONFIG)."""

from __future__ import annotations

import json
import logging
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING

import click

from compaction_assets.commit.ledger import Ledger
from compaction_assets.commit.recovery import open_attempts_note
from compaction_assets.config import load_config
from compaction_assets.engine.facade import Engine
from compaction_assets.errors import CatalogError, CompactionError, ConfigError
from compaction_assets.lake.catalog import TableNotFound
from compaction_assets.planning.planner import Kind
from compaction_assets.redact import RedactingFilter, redact
from compaction_assets.reports import expire_summary, plan_doc, plan_lines, print_outcomes

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from compaction_assets.status import QueueStatus, TableStatus


def open_engine(ctx: click.Context, read_only: bool = False, new_catalog: bool = False) -> Engine:
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

    # Commands other installed packages add through the entry point group COMMANDS_GROUP (`bench`,
    # `demo` and `soak` come from compaction_tools, which the product never imports), loaded only
    # when listed or run: loading them here, at import, would import them while they import us.
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_installed_commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if (command := super().get_command(ctx, cmd_name)) is not None:
            return command
        entry = _installed_commands().get(cmd_name)
        return entry.load() if entry is not None else None


COMMANDS_GROUP = "compaction_assets.commands"


def _installed_commands() -> dict[str, EntryPoint]:
    return {entry.name: entry for entry in entry_points(group=COMMANDS_GROUP)}


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
    engine = open_engine(ctx, read_only=True)
    tplan = engine.plan(table)
    in_flight = open_attempts_note(engine.ledger, table, engine.config.state.executing_timeout_seconds)
    if as_json:
        click.echo(json.dumps(plan_doc(table, tplan, in_flight), indent=2))
        return
    for line in plan_lines(table, tplan, in_flight):
        click.echo(line)


@main.command()
@click.argument("table")
@click.option("--partition", default=None, help="only this partition, by the key `plan` shows")
@click.option("--dry-run", is_flag=True, help="show what would be expired; change nothing")
@click.pass_context
def expire(ctx: click.Context, table: str, partition: str | None, dry_run: bool) -> None:
    """Drop TABLE's rows past retention now (compaction.expire.field, compaction.expire.retention-ms),
    and nothing else: whole files past it by a metadata-only delete, the rest rewritten without them.
    The same code path as the asset's (which runs expirations first); --dry-run only shows them."""
    engine = open_engine(ctx, read_only=dry_run)
    if not dry_run:
        _expire_now(engine, table, partition)
        return
    _show_expiry(engine, table, partition)


def _expire_now(engine: Engine, table: str, partition: str | None) -> None:
    """Runs the expiration, prints and reports its outcomes; exits 1 if any failed."""
    outcomes = engine.expire(table, partition=partition)
    expired = [o for o in outcomes if o.kind == Kind.EXPIRE]
    print_outcomes(expired)
    _to_dagster(engine, lambda home, events: events.report_outcomes(home, engine, expired))
    if not expired:
        click.echo(f"{table}: nothing past retention")
    if not all(o.ok for o in outcomes):
        sys.exit(1)


def _show_expiry(engine: Engine, table: str, partition: str | None) -> None:
    """Prints what an expiration would drop and rewrite (--dry-run), or why there is none."""
    tplan = engine.plan(table, partition)
    if isinstance(tplan.expire, str) or tplan.expire is None:
        click.echo(f"{table}: {tplan.expire or 'expiration is off (set compaction.expire.field and retention-ms)'}")
        return
    plans = [p for p in tplan.to_compact if p.kind == Kind.EXPIRE]
    click.echo(f"{table} @ snapshot {tplan.snapshot_id}: would expire rows where {tplan.expire.describe()}")
    for p in plans:
        click.echo(f"{p.partition_key or '(unpartitioned)'}: {expire_summary(p)}")
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
    engine = open_engine(ctx)
    outcomes = engine.compact(table, partition=partition, task_id=task_id)
    print_outcomes(outcomes)
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
    engine = open_engine(ctx)
    report = engine.recover()
    click.echo(
        f"recovered {report.handled} attempt(s): {len(report.confirmed)} confirmed committed, "
        f"{len(report.recommitted)} recommitted, {len(report.rolled_back)} rolled back, "
        f"{len(report.abandoned)} abandoned, {len(report.parked)} parked"
    )
    for attempt_id in report.parked:
        if (parked := engine.ledger.get(attempt_id)) is not None:
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
    engine = open_engine(ctx, read_only=dry_run)
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
    engine = open_engine(ctx, read_only=dry_run)
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
    open_engine(ctx).set_enabled(table, False)
    click.echo(f"{table}: paused")


@main.command()
@click.argument("table")
@click.pass_context
def resume(ctx: click.Context, table: str) -> None:
    """Resume compaction and GC of TABLE (compaction.enabled=true)."""
    open_engine(ctx).set_enabled(table, True)
    click.echo(f"{table}: resumed")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Queues (running / queued / capacity / limit), tables (fragmentation, paused, tasks), open tasks;
    in connect mode first the warm Spark Connect server's health."""
    from compaction_assets.commit.ledger import OPEN
    from compaction_assets.status import as_dict, queue_statuses, spark_server_status, table_statuses

    engine = open_engine(ctx, read_only=True)
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
    _echo_queues(queues, home)
    _echo_tables(tables)
    click.echo("\ntasks by state: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none yet"))
    for a in engine.ledger.attempts(statuses=OPEN):
        click.echo(
            f"  {a.status:10} {a.table_name} [{a.partition_key or '-'}] attempt {a.attempt_id} since {a.created_at}"
        )


def _echo_queues(queues: list[QueueStatus], home: Path | None) -> None:
    """`status`: the queue table, then where its run counts came from (or why there are none)."""
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


def _echo_tables(tables: list[TableStatus]) -> None:
    """`status`: the table of tables, each with its state (error, PAUSED or active)."""
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
    open_engine(ctx, read_only=True)  # the catalog answers (a missing SQLite file is an error) before anything starts
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
