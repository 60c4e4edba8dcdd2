"""A fragmented demo lake on the embedded default: what streaming writers leave behind."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pyarrow as pa
import yaml
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestampType

from compaction_assets.config import CatalogConfig, CompactionConfig
from compaction_assets.errors import CompactionError
from compaction_assets.lake.appends import append_fragments, append_order_batches
from compaction_assets.redact import redact
from compaction_tools.demo_cdc import CDC_TABLE, create_cdc_table
from compaction_tools.local_s3 import LocalS3

DEMO_TABLES = ("demo.events", "sales.orders", "demo.metrics", "demo.users", CDC_TABLE)
MARKER_SUFFIX = ".demo-lake"  # beside the catalog's SQLite file: the demo created this catalog


class NotADemoLake(CompactionError):
    """The configured catalog is not one the demo created: the demo will not touch it."""


def claim_demo_catalog(cfg: CatalogConfig) -> Path:
    """The demo's SQLite catalog file: a new one (marked as the demo's now) or one marked earlier.

    Raises NotADemoLake, naming the catalog, for any other catalog: the demo replaces its tables,
    so it must never run on a lake that holds someone's real tables of the same names.
    """
    db = _sqlite_file(cfg.properties.get("uri", ""))
    where = f"catalog '{cfg.name}' ({redact(cfg.properties.get('uri', 'no uri'))})"
    if db is None:
        raise NotADemoLake(f"{where} is not a local SQLite catalog: the demo only runs on a catalog it creates")
    marker = db.with_name(db.name + MARKER_SUFFIX)
    if db.exists() and not marker.exists():
        raise NotADemoLake(
            f"{where} was not created by the demo; it only replaces tables in a lake it created. Point "
            f"--config at a config whose catalog file does not exist yet (or remove {db} if it is an old demo lake)"
        )
    db.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("created by `compaction-assets demo`, which may replace its tables\n")
    return db


def s3_demo_config(config: CompactionConfig, s3: LocalS3) -> Path:
    """`demo --s3`'s config, written beside `config` (so relative paths and .dagster_home stay the
    same): `config` with the warehouse in the local S3 server's bucket, reached through the catalog's
    s3.* properties, and a SQLite catalog and ledger of its own (`<catalog>-s3.db`,
    `compaction_state-s3.db`). The server keeps its objects in this process's memory: a catalog
    an earlier `demo --s3` left points at objects gone with that server, so the demo starts it
    afresh (only one it marked as its own; any other is refused by claim_demo_catalog)."""
    db = _sqlite_file(config.catalog.properties.get("uri", ""))
    if db is None:
        raise NotADemoLake(
            f"catalog '{config.catalog.name}' ({redact(config.catalog.properties.get('uri', 'no uri'))}) is not a "
            "local SQLite catalog: the demo only runs on a catalog it creates"
        )
    s3_db, state_db = db.with_name(f"{db.stem}-s3{db.suffix}"), db.with_name("compaction_state-s3.db")
    if s3_db.with_name(s3_db.name + MARKER_SUFFIX).exists():
        s3_db.unlink(missing_ok=True)
        state_db.unlink(missing_ok=True)
    source = Path(config.source)
    doc = yaml.safe_load(source.read_text())
    doc["catalog"] = {**doc["catalog"], "properties": s3.catalog_properties(f"sqlite:///{s3_db}", prefix="demo")}
    doc["state"] = {**(doc.get("state") or {}), "uri": f"sqlite:///{state_db}"}
    path = source.with_name("compaction.demo-s3.yaml")
    path.write_text(
        "# written by `compaction-assets demo --s3` for its local S3 server (gone when the demo stops)\n"
        + yaml.safe_dump(doc, sort_keys=False)
    )
    return path


def is_demo_catalog(catalog: Catalog) -> bool:
    db = _sqlite_file(catalog.properties.get("uri", ""))
    return db is not None and db.with_name(db.name + MARKER_SUFFIX).exists()


def _sqlite_file(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///") or uri.removeprefix("sqlite:///") in ("", ":memory:"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def create_demo_lake(catalog: Catalog, files_per_partition: int = 60, seed: int = 7) -> dict[str, int]:
    """(Re)create the demo tables in a catalog `claim_demo_catalog` marked; returns files per table."""
    if not is_demo_catalog(catalog):
        raise NotADemoLake(f"catalog '{catalog.name}' was not created by the demo: its tables are left alone")
    rng = random.Random(seed)
    for name in DEMO_TABLES:
        namespace = name.split(".")[0]
        catalog.create_namespace_if_not_exists(namespace)
        if catalog.table_exists(name):
            catalog.purge_table(name)
    written = {
        "demo.events": _events(catalog, files_per_partition, rng),
        "sales.orders": _orders(catalog, files_per_partition, rng),
        "demo.metrics": _metrics(catalog, files_per_partition, rng),
        "demo.users": _users(catalog, files_per_partition, rng),
        CDC_TABLE: create_cdc_table(catalog, max(2, files_per_partition // 3), rng),
    }
    return written


def _events(catalog: Catalog, n: int, rng: random.Random) -> int:
    schema = Schema(
        NestedField(1, "event_id", LongType(), required=False),
        NestedField(2, "ts", TimestampType(), required=False),
        NestedField(3, "kind", StringType(), required=False),
        NestedField(4, "value", DoubleType(), required=False),
    )
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=DayTransform(), name="ts_day"))
    table = catalog.create_table("demo.events", schema=schema, partition_spec=spec)
    start = dt.datetime(2024, 1, 1)
    batches = []
    for i in range(3 * n):
        day = start + dt.timedelta(days=i % 3)
        ts = [day + dt.timedelta(seconds=rng.randrange(86400)) for _ in range(50)]
        batches.append(
            pa.table(
                {
                    "event_id": pa.array(range(i * 50, i * 50 + 50), pa.int64()),
                    "ts": pa.array(ts, pa.timestamp("us")),
                    "kind": [rng.choice(["click", "view", "buy"]) for _ in range(50)],
                    "value": [rng.random() for _ in range(50)],
                }
            )
        )
    return append_fragments(table, batches)


def _orders(catalog: Catalog, n: int, rng: random.Random) -> int:
    schema = Schema(
        NestedField(1, "order_id", LongType(), required=False),
        NestedField(2, "region", StringType(), required=False),
        NestedField(3, "amount", DoubleType(), required=False),
    )
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"))
    table = catalog.create_table("sales.orders", schema=schema, partition_spec=spec)
    return append_order_batches(table, 3 * n, rng)


def _metrics(catalog: Catalog, n: int, rng: random.Random) -> int:
    schema = Schema(
        NestedField(1, "metric", StringType(), required=False),
        NestedField(2, "value", DoubleType(), required=False),
    )
    table = catalog.create_table("demo.metrics", schema=schema)
    batches = [
        pa.table({"metric": [f"m{rng.randrange(20)}" for _ in range(30)], "value": [rng.random() for _ in range(30)]})
        for _ in range(n)
    ]
    return append_fragments(table, batches)


def _users(catalog: Catalog, n: int, rng: random.Random) -> int:
    """Half the files written before `name` was renamed to `full_name` and `email` was added."""
    schema = Schema(
        NestedField(1, "user_id", LongType(), required=False),
        NestedField(2, "name", StringType(), required=False),
    )
    table = catalog.create_table("demo.users", schema=schema)
    half = n // 2
    before = [
        pa.table(
            {"user_id": pa.array(range(i * 20, i * 20 + 20), pa.int64()), "name": [f"user{i}-{j}" for j in range(20)]}
        )
        for i in range(half)
    ]
    written = append_fragments(table, before)
    with table.update_schema() as update:
        update.rename_column("name", "full_name")
        update.add_column("email", StringType())
    after = [
        pa.table(
            {
                "user_id": pa.array(range(i * 20, i * 20 + 20), pa.int64()),
                "full_name": [f"user{i}-{j}" for j in range(20)],
                "email": [f"u{i}.{j}@example.com" for j in range(20)],
            }
        )
        for i in range(half, n)
    ]
    return written + append_fragments(table, after)
