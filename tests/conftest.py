"""Shared fixtures: one real local SparkSession per test session, a real SQLite pyiceberg catalog
and task ledger per test, and helpers that write real small Parquet files through pyiceberg; also
a throwaway Dagster `instance`, `clocked` engines (a fixed clock) and `s3_with_auth` (moto checking
signatures). Plain helpers shared between test modules live in tests/lakekit/ (polling:
tests/lakekit/waiting.py); no test module imports another."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy
import yaml
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from compaction_assets.config import SparkConfig, load_config
from compaction_assets.engine import Engine
from compaction_assets.execution.spark import spark_session
from compaction_tools.demo import append_fragments
from compaction_tools.local_s3 import LocalS3, local_s3
from tests.lakekit.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent


def venv_bin(name: str) -> str:
    """A console script installed beside the running interpreter (compaction-assets, dagster, ...)."""
    return str(Path(sys.executable).parent / name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CLI = [venv_bin("compaction-assets")]


@pytest.fixture(scope="session")
def spark():
    session = spark_session(SparkConfig(master="local[2]", conf={"spark.sql.shuffle.partitions": "2"}))
    try:  # the JVM is stopped on every way out: pytest runs this finalizer on Ctrl-C too
        session.sparkContext.setLogLevel("ERROR")
        yield session
    finally:
        session.stop()


@dataclass
class Lake:
    """A throwaway lake: config file, catalog, ledger and an engine on the shared Spark session."""

    root: Path
    config_path: Path
    engine: Engine

    @property
    def catalog(self):
        return self.engine.catalog

    def table(self, name: str) -> Table:
        return self.catalog.load_table(name)

    def cli(self, *args: str, crash_at: str | None = None, config: Path | None = None) -> subprocess.CompletedProcess:
        """Run the real `compaction-assets` command in its own process (its own JVM)."""
        env = {**os.environ, "COMPACTION_CONFIG": str(config or self.config_path)}
        env.pop("COMPACTION_CRASH_AT", None)
        if crash_at:
            env["COMPACTION_CRASH_AT"] = crash_at
        return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=300)


def write_config(root: Path, tables: list[dict] | None = None, **extra) -> Path:
    doc: dict = {
        "catalog": {
            "name": "lake",
            "properties": {"type": "sql", "uri": "sqlite:///catalog.db", "warehouse": "file://warehouse"},
        },
        "state": {"uri": "sqlite:///state.db"},
        "spark": {"mode": "local", "master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        "queues": [{"name": "default", "max_concurrent_runs": 1, "capacity": 10}],
        "tables": tables or [{"match": "*", "queue": "default", "policy": {"target_file_size_bytes": 64 * 1024}}],
        **extra,
    }
    path = root / "compaction.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# The PostgreSQL used by the PostgreSQL variants of the tests (trust auth on this machine's server).
PG_URL = os.environ.get("COMPACTION_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def postgres_unreachable() -> str | None:
    """Why PostgreSQL tests cannot run here, or None."""
    try:
        engine = sqlalchemy.create_engine(PG_URL, connect_args={"connect_timeout": 3})
        with engine.connect():
            pass
        engine.dispose()
    except Exception as exc:  # any driver or network error means: skip, and say why
        return f"PostgreSQL at {PG_URL} is unreachable ({type(exc).__name__}); start it to run these tests"
    return None


@contextmanager
def postgres_schema() -> Iterator[str]:
    """A fresh schema; yields a URL whose connections use it (search_path), dropped afterwards."""
    if reason := postgres_unreachable():
        pytest.skip(reason)
    schema = f"ca_test_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@contextmanager
def make_lake(root: Path, spark, backend: str = "sqlite", s3: LocalS3 | None = None) -> Iterator[Lake]:
    """A lake whose catalog and ledger live in SQLite files, or in a PostgreSQL schema; its
    warehouse in a local folder, or (with `s3`) under a fresh prefix of the local S3 server."""
    with ExitStack() as stack:
        extra = {}
        url = "sqlite:///catalog.db"
        if backend == "postgres":
            url = stack.enter_context(postgres_schema())
            extra["state"] = {"uri": url}
        properties = {"type": "sql", "uri": url, "warehouse": "file://warehouse"}
        if s3 is not None:
            properties = s3.catalog_properties(url, prefix=f"lake-{uuid.uuid4().hex[:10]}")
        if backend == "postgres" or s3 is not None:
            extra["catalog"] = {"name": "lake", "properties": properties}
        config_path = write_config(root, **extra)
        engine = Engine(load_config(config_path), spark=lambda: spark)
        stack.callback(engine.ledger.dispose)
        engine.catalog.create_namespace("ns")
        yield Lake(root, config_path, engine)
        if hasattr(engine.catalog, "engine"):
            engine.catalog.engine.dispose()


@pytest.fixture
def lake(tmp_path: Path, spark) -> Iterator[Lake]:
    with make_lake(tmp_path, spark) as lake:
        yield lake


@pytest.fixture(scope="session")
def s3_server() -> Iterator[LocalS3]:
    """moto's S3 server on 127.0.0.1 for the whole test session (each lake uses its own prefix)."""
    with local_s3() as s3:
        yield s3


@pytest.fixture
def s3_lake(tmp_path: Path, spark, s3_server: LocalS3) -> Iterator[Lake]:
    """A lake whose warehouse is on the local S3 server, reached through the catalog's s3.* properties."""
    with make_lake(tmp_path, spark, s3=s3_server) as lake:
        yield lake


SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "payload", StringType(), required=False),
    NestedField(4, "amount", DoubleType(), required=False),
)
BY_REGION = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"))


def batch(start: int, rows: int, region: str) -> pa.Table:
    """Rows with distinct ids and incompressible-ish payloads, so file sizes are meaningful."""
    ids = range(start, start + rows)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": [region] * rows,
            "payload": [f"{i:08d}-{(i * 2654435761) % 2**32:010d}" for i in ids],
            "amount": [i * 0.25 for i in ids],
        }
    )


def create_fragmented(
    lake: Lake, name: str, files_per_region: dict[str, int], rows: int = 50, location: str | None = None
) -> Table:
    """A table partitioned by region with the given number of small files per region (at `location`
    if given, else where the catalog puts it)."""
    table = lake.catalog.create_table(name, schema=SCHEMA, partition_spec=BY_REGION, location=location)
    batches, start = [], 0
    for region, count in files_per_region.items():
        for _ in range(count):
            batches.append(batch(start, rows, region))
            start += rows
    append_fragments(table, batches)
    table.refresh()
    return table


def data_files(table: Table) -> list[dict]:
    """The live data files of the current snapshot, as pyiceberg's files metadata table has them."""
    return table.inspect.files().to_pylist()


QUEUES = [
    {"name": "high", "max_concurrent_runs": 2, "capacity": 3},
    {"name": "default", "max_concurrent_runs": 1, "capacity": 2},
]
RULES = [
    {"match": "sales.*", "queue": "high", "priority": 10, "upstream": ["writers/orders_stream"]},
    {"match": "*", "queue": "default", "priority": 0},
]


@pytest.fixture
def queued_lake(tmp_path: Path, spark) -> Iterator[Lake]:
    """A lake with two queues: sales.orders (3 partitions, high), ns.events (2, default), ns.flat."""
    policy = {"target_file_size_bytes": 64 * 1024}
    rules = [{**r, "policy": policy} for r in RULES]
    config_path = write_config(
        tmp_path, tables=rules, queues=QUEUES, scheduling={"sensor_interval_seconds": 5, "recovery_interval_seconds": 5}
    )
    engine = Engine(load_config(config_path), spark=lambda: spark)
    for namespace in ("sales", "ns"):
        engine.catalog.create_namespace(namespace)
    lake = Lake(tmp_path, config_path, engine)
    create_fragmented(lake, "sales.orders", {"eu": 12, "us": 12, "apac": 12}, rows=20)
    create_fragmented(lake, "ns.events", {"eu": 10, "us": 10}, rows=20)
    flat = lake.catalog.create_table("ns.flat", schema=SCHEMA)
    append_fragments(flat, [batch(i * 10, 10, "x") for i in range(8)])
    yield lake
    engine.ledger.dispose()


@pytest.fixture
def s3_with_auth(tmp_path) -> Iterator[LocalS3]:
    """moto's server in a process of its own that checks request signatures (after its first 4
    requests, which create an IAM user with an access key and an allow-all policy, and the bucket)."""
    import boto3

    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4"}
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def listening() -> bool:
            assert server.poll() is None, "moto server did not start"
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        wait_until(listening, 30, interval=0.2, message="moto server did not start")
        anyone = LocalS3(endpoint=f"http://127.0.0.1:{port}", bucket="lake", access_key="setup", secret_key="setup")
        iam = boto3.client(
            "iam",
            endpoint_url=anyone.endpoint,
            region_name=anyone.region,
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="lake")
        key = iam.create_access_key(UserName="lake")["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="lake", PolicyName="all", PolicyDocument=json.dumps(policy))
        s3 = LocalS3(anyone.endpoint, "lake", access_key=key["AccessKeyId"], secret_key=key["SecretAccessKey"])
        s3.client().create_bucket(Bucket="lake")
        yield s3
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def clocked(lake: Lake, spark) -> Callable[..., Engine]:
    """Engines on the lake with the test's clock (NOW unless given) and the test session's Spark
    (unless another session factory is given)."""
    from tests.lakekit.expiry import NOW_MS  # imported here: lakekit's modules import this one

    session = spark

    def make(now_ms: int = NOW_MS, spark: Callable | None = None) -> Engine:
        factory = spark or (lambda: session)
        return Engine(lake.engine.config, lake.catalog, lake.engine.ledger, factory, clock=lambda: now_ms)

    return make


@pytest.fixture
def instance():
    """A throwaway Dagster instance (the sensor, asset and check tests)."""
    from dagster import instance_for_test  # imported here: most tests need no Dagster

    with instance_for_test() as instance:
        yield instance
