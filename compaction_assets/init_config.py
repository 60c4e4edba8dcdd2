"""`compaction-assets init`: a commented compaction.yaml for an existing catalog.

Connects to the catalog (a pyiceberg SQL catalog on SQLite or PostgreSQL, or a REST catalog),
lists its tables with their file counts and average file sizes, and writes a config that maps the
fragmented ones (many files, small on average) to a `high` queue and everything else to
`default`. A password in the catalog URI is never written: the file reads it from
$COMPACTION_CATALOG_PASSWORD instead.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import sqlalchemy
import yaml

from compaction_assets import redact
from compaction_assets.config import CatalogConfig, parse_config
from compaction_assets.errors import CatalogError, CompactionError
from compaction_assets.lake.catalog import open_catalog

CATALOG_PASSWORD_ENV = "COMPACTION_CATALOG_PASSWORD"
FRAGMENTED_AVG_BYTES = 32 * 1024**2  # a table whose data files average below this, with at least
FRAGMENTED_MIN_FILES = 10  # this many of them, goes to the `high` queue


@dataclass(frozen=True)
class FoundTable:
    name: str
    data_files: int = 0
    total_bytes: int = 0
    error: str | None = None  # why its statistics could not be read

    @property
    def fragmented(self) -> bool:
        return self.data_files >= FRAGMENTED_MIN_FILES and self.total_bytes / self.data_files < FRAGMENTED_AVG_BYTES

    def describe(self) -> str:
        if self.error:
            return f"statistics not read: {self.error}"
        if not self.data_files:
            return "no data files"
        avg = _size(self.total_bytes // self.data_files)
        return f"{self.data_files} data files, avg {avg}" + (" -> high (fragmented)" if self.fragmented else "")


@dataclass(frozen=True)
class InitReport:
    path: Path
    catalog_name: str
    tables: list[FoundTable]
    env_needed: list[str]  # variables the written file reads (a password kept out of it)


def init_config(
    catalog_uri: str, output: Path, warehouse: str | None = None, name: str | None = None, force: bool = False
) -> InitReport:
    """Connect to the catalog at `catalog_uri`, list its tables, write `output`; refuses an existing
    file unless `force`. Raises CatalogError (credentials masked) if the catalog cannot be read."""
    output = output.resolve()
    if output.exists() and not force:
        raise CompactionError(f"{output} exists: not overwritten (pass --force to replace it)")
    redact.register("uri", catalog_uri)
    properties = _catalog_properties(catalog_uri, warehouse)
    name = _catalog_name(properties, name)
    tables = _tables(CatalogConfig(name=name, properties=properties))
    state = _state_uri(properties)
    parse_config(yaml.safe_load(_render(name, properties, state, tables)), base_dir=output.parent)  # it loads
    secret = urlsplit(catalog_uri).password if "://" in catalog_uri else None
    env_needed = [CATALOG_PASSWORD_ENV] if secret else []
    if secret:  # the file reads it from the environment; the URI's other parts stay readable
        properties["uri"] = properties["uri"].replace(f":{secret}@", f":${{{CATALOG_PASSWORD_ENV}}}@", 1)
        state = state.replace(f":{secret}@", f":${{{CATALOG_PASSWORD_ENV}}}@", 1)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(_render(name, properties, state, tables))
    return InitReport(output, name, tables, env_needed)


def _catalog_properties(uri: str, warehouse: str | None) -> dict[str, str]:
    """pyiceberg properties: `type: rest` for an http(s) URI, else a SQL catalog (SQLAlchemy URI);
    a relative SQLite path or local warehouse becomes absolute (against the working folder)."""
    if uri.startswith(("http://", "https://")):
        properties = {"type": "rest", "uri": uri}
    elif uri.startswith("sqlite:///"):
        path = uri.removeprefix("sqlite:///").split("?", 1)[0]
        db = Path(path).resolve()
        if not path or path == ":memory:" or not db.is_file():
            raise CatalogError(f"no SQLite catalog file at {redact.redact(uri)}: pass the URI of an existing catalog")
        properties = {"type": "sql", "uri": f"sqlite:///{db}"}
    elif "://" in uri:
        properties = {"type": "sql", "uri": uri}
    else:
        raise CatalogError(
            f"--catalog-uri {redact.redact(uri)!r} is not a URI: sqlite:///PATH, postgresql+psycopg://USER@HOST/DB "
            "or http(s)://REST-CATALOG"
        )
    if warehouse:
        local = warehouse.removeprefix("file://") if warehouse.startswith("file://") else warehouse
        properties["warehouse"] = warehouse if "://" in warehouse else f"file://{Path(local).resolve()}"
    return properties


def _catalog_name(properties: dict[str, str], name: str | None) -> str:
    """The name the tables were written under: a SQL catalog keeps rows per catalog name, so a
    wrong name would show no tables. Read from the database; `name` must be one of those found."""
    if properties["type"] != "sql":
        return name or "lake"
    where = redact.redact(properties["uri"])
    try:
        engine = sqlalchemy.create_engine(properties["uri"])
        try:
            with engine.connect() as conn:
                tables = set(sqlalchemy.inspect(conn).get_table_names())
                if "iceberg_tables" not in tables:
                    raise CatalogError(
                        f"{where} holds no Iceberg SQL catalog (no iceberg_tables table): "
                        "pass the URI the catalog's writers use"
                    )
                query = "SELECT DISTINCT catalog_name FROM iceberg_tables"
                found = sorted({row[0] for row in conn.execute(sqlalchemy.text(query))})
        finally:
            engine.dispose()
    except CatalogError:
        raise
    except Exception as exc:  # noqa: BLE001 - drivers raise many types for an unreachable database
        raise CatalogError(f"catalog at {where}: cannot connect: {redact.redact(_first_line(exc))}") from None
    if name and found and name not in found:
        raise CatalogError(f"catalog at {where} has no catalog named '{name}'; it holds {', '.join(found)}")
    if not name and len(found) > 1:
        raise CatalogError(f"catalog at {where} holds several catalogs ({', '.join(found)}): pick one with --name")
    return name or (found[0] if found else "lake")


def _tables(cfg: CatalogConfig) -> list[FoundTable]:
    """Every table with the file count and size of its current snapshot (its summary: no manifest read)."""
    catalog = open_catalog(cfg)
    try:
        names: set[str] = set()
        pending = list(catalog.list_namespaces())
        while pending:
            namespace = pending.pop()
            names.update(".".join(ident) for ident in catalog.list_tables(namespace))
            pending.extend(ns for ns in catalog.list_namespaces(namespace) if ns != namespace)
    except Exception as exc:  # noqa: BLE001 - any catalog's listing error
        raise CatalogError(f"catalog '{cfg.name}': cannot list its tables: {redact.redact(_first_line(exc))}") from None
    found = []
    for name in sorted(names):
        try:
            snapshot = catalog.load_table(name).current_snapshot()
        except Exception as exc:  # noqa: BLE001 - one unreadable table does not stop the listing
            found.append(FoundTable(name, error=redact.redact(_first_line(exc))[:200]))
            continue
        summary = snapshot.summary if snapshot and snapshot.summary else {}
        found.append(FoundTable(name, int(summary.get("total-data-files", 0)), int(summary.get("total-files-size", 0))))
    return found


def _state_uri(properties: dict[str, str]) -> str:
    """The ledger: beside a SQLite catalog, in a PostgreSQL catalog's database (its own table),
    else a SQLite file in .compaction/ beside the config."""
    uri = properties["uri"]
    if uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(uri.removeprefix('sqlite:///')).parent / 'compaction_state.db'}"
    if properties["type"] == "sql":
        return uri
    return "sqlite:///.compaction/compaction_state.db"


def _render(name: str, properties: dict[str, str], state: str, tables: list[FoundTable]) -> str:
    q = json.dumps  # a JSON string is a YAML string
    avg_limit = _size(FRAGMENTED_AVG_BYTES)
    fragmented = [t for t in tables if t.fragmented]
    width = max([len(t.name) for t in tables] or [0])
    listing = "".join(f"  #   {t.name:{width}}  {t.describe()}\n" for t in tables) or "  #   (none yet)\n"
    rules = "".join(f"  - {{match: {q(_fnmatch_literal(t.name))}, queue: high, priority: 10}}\n" for t in fragmented)
    props = "".join(f"    {k}: {q(v)}\n" for k, v in properties.items())
    return f"""\
# compaction.yaml for catalog '{name}', written by `compaction-assets init` on {dt.date.today()}:
# {len(tables)} table(s) found, {len(fragmented)} fragmented. Start the stack with `compaction-assets serve`.
# Relative paths resolve against this file's folder; ${{VAR}} reads the environment; unknown keys are errors.
catalog:                      # any pyiceberg catalog: load_catalog(name, **properties)
  name: {q(name)}
  properties:
{props}state:                        # the task ledger (SQLAlchemy URI; its own table compaction_attempts)
  uri: {q(state)}
spark:
  mode: connect               # connect: runs share one warm Spark that `serve` starts | local: a JVM per run
  master: "local[*]"          # or spark://HOST:PORT for a cluster
  remote: "sc://127.0.0.1:15002"  # 127.0.0.1 only; `serve --spark-port` overrides the port
  server_dir: .spark-connect  # the server's pid and logs
  conf: {{}}
queues:                       # one Dagster pool each (compaction-<name>): max_concurrent_runs at once
  - {{name: high, max_concurrent_runs: 2, capacity: 20}}      # fragmented tables first
  - {{name: default, max_concurrent_runs: 1, capacity: 100}}
tables:                       # first match wins; fnmatch on "namespace.table"
  # tables found (current snapshot; fragmented: >= {FRAGMENTED_MIN_FILES} files, average < {avg_limit}):
{listing}{rules}  - {{match: "*", queue: default, priority: 0}}
  # per-table policy: policy: {{target_file_size_bytes: 134217728, min_input_files: 5}} on a rule,
  # or Iceberg table properties compaction.* (they win)
"""


def _fnmatch_literal(name: str) -> str:
    """`name` as an fnmatch pattern matching only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
