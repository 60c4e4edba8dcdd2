"""Catalog access through pyiceberg: open the configured catalog, load and list managed tables."""

from __future__ import annotations

import re
from pathlib import Path

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table
from requests.exceptions import ConnectionError as HTTPConnectionError
from requests.exceptions import Timeout
from sqlalchemy import select
from sqlalchemy.orm import Session

from compaction_assets.config import CatalogConfig, CompactionConfig
from compaction_assets.errors import CatalogError
from compaction_assets.redact import redact


class TableNotFound(CatalogError):
    """The catalog answered, and the table is not in it."""


def open_catalog(cfg: CatalogConfig) -> Catalog:
    """Load the catalog exactly as `pyiceberg.catalog.load_catalog(name, **properties)` would."""
    _ensure_local_dirs(cfg.properties)
    try:
        return load_catalog(cfg.name, **cfg.properties)
    except (HTTPConnectionError, Timeout) as exc:  # a REST catalog that is down: not urllib3's retry text
        raise CatalogError(
            f"catalog '{cfg.name}' at {redact(cfg.properties.get('uri', '?'))} unreachable: {_http_cause(exc)}; "
            "start the catalog server or fix catalog.properties.uri"
        ) from None
    except Exception as exc:  # pyiceberg raises many types for unreachable/misconfigured catalogs
        raise CatalogError(f"catalog '{cfg.name}': cannot open it: {exc}") from exc


def _http_cause(exc: Exception) -> str:
    """The root cause of a requests error in a few words (`Connection refused`, `Read timed out`)."""
    text = str(exc)
    if m := re.search(r"\[Errno -?\d+\] ([^\"')]+)", text):
        return m.group(1).strip()
    return "timed out" if isinstance(exc, Timeout) else type(exc).__name__


def load_table(catalog: Catalog, name: str) -> Table:
    """Load "namespace.table", with an error naming the table and the catalog if it is not there."""
    try:
        table = catalog.load_table(name)
    except (NoSuchTableError, NoSuchNamespaceError):
        raise TableNotFound(f"table '{name}' not found in catalog '{catalog.name}'") from None
    except Exception as exc:
        try:
            location = (metadata_locations(catalog) or {}).get(name) or ""
        except CatalogError:
            location = ""
        refuse_relative(name, location)
        where = f" (s3.endpoint {endpoint})" if (endpoint := catalog.properties.get("s3.endpoint")) else ""
        raise CatalogError(f"table '{name}': cannot load it from catalog '{catalog.name}'{where}: {exc}") from exc
    refuse_relative(name, table.location())
    return table


def refuse_relative(name: str, location: str) -> None:
    """`file://.lake/x` means a different file in every working folder (pyiceberg takes '.lake' for
    part of a relative path, pyarrow for a host): no process may compact or collect it."""
    if location.startswith("file://") and not location.startswith(("file:///", "file://localhost/")):
        raise CatalogError(
            f"table '{name}': its location {location} is a relative file URI (its writer's warehouse "
            "was file://<relative path>, read against each process's working folder); write tables "
            "with an absolute warehouse, file:///<absolute path>"
        )


def metadata_locations(catalog: Catalog) -> dict[str, str | None] | None:
    """Every table's current metadata file, "namespace.table" -> location, in one query: what
    changed since a tick is then known without loading any table. None for catalogs that have no
    such listing (REST, Glue, Hive): callers load tables one by one there."""
    if not isinstance(catalog, SqlCatalog):
        return None
    query = select(IcebergTables.table_namespace, IcebergTables.table_name, IcebergTables.metadata_location).where(
        IcebergTables.catalog_name == catalog.name
    )
    try:
        with Session(catalog.engine) as session:
            return {f"{ns}.{name}": location for ns, name, location in session.execute(query)}
    except Exception as exc:
        raise CatalogError(f"catalog '{catalog.name}': cannot list table versions: {exc}") from exc


def table_name(table: Table) -> str:
    """The dotted "namespace.table" name the config's `tables:` patterns match."""
    return ".".join(table.name())


def managed_tables(catalog: Catalog, config: CompactionConfig) -> list[str]:
    """Every table in the catalog whose name matches a `tables:` rule, sorted."""
    names: list[str] = []
    pending = list(catalog.list_namespaces())
    while pending:
        namespace = pending.pop()
        names.extend(".".join(ident) for ident in catalog.list_tables(namespace))
        pending.extend(ns for ns in catalog.list_namespaces(namespace) if ns != namespace)
    return sorted(n for n in set(names) if config.rule_for(n) is not None)


def managed_versions(catalog: Catalog, config: CompactionConfig) -> dict[str, str | None]:
    """Every managed table -> its current metadata file, in one query on SQL catalogs; elsewhere
    the names alone (-> None), listed namespace by namespace."""
    locations = metadata_locations(catalog)
    if locations is None:
        return dict.fromkeys(managed_tables(catalog, config))
    return {n: loc for n, loc in sorted(locations.items()) if config.rule_for(n) is not None}


def _ensure_local_dirs(properties: dict[str, str]) -> None:
    """The embedded default needs its SQLite folder and warehouse folder to exist."""
    uri = properties.get("uri", "")
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    warehouse = properties.get("warehouse", "")
    if warehouse.startswith("file://"):
        Path(warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
