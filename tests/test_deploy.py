"""deploy/: Dagster and the lake on a real PostgreSQL, credentials only from the environment."""

import shutil
import uuid

import pytest
import sqlalchemy
from dagster import build_sensor_context
from dagster._core.instance import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.engine import Engine
from compaction_assets.lake.digest import rows_digest
from tests.conftest import PG_URL, REPO, Lake, batch, create_fragmented, postgres_unreachable


@pytest.fixture
def fresh_database():
    if reason := postgres_unreachable():
        pytest.skip(reason)
    name = f"ca_deploy_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    yield name
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f"DROP DATABASE {name} WITH (FORCE)"))
    admin.dispose()


def test_deployment_runs_on_postgres(fresh_database, tmp_path, monkeypatch, spark):
    url = sqlalchemy.engine.make_url(PG_URL)
    for prefix in ("LAKE", "DAGSTER"):
        monkeypatch.setenv(f"{prefix}_PG_USER", url.username or "postgres")
        monkeypatch.setenv(f"{prefix}_PG_PASSWORD", url.password or "")
        monkeypatch.setenv(f"{prefix}_PG_HOST", url.host or "127.0.0.1")
        monkeypatch.setenv(f"{prefix}_PG_PORT", str(url.port or 5432))
        monkeypatch.setenv(f"{prefix}_PG_DB", fresh_database)
    monkeypatch.setenv("LAKE_WAREHOUSE", f"file://{tmp_path / 'warehouse'}")
    config = load_config(REPO / "deploy" / "compaction.yaml")
    assert config.catalog.properties["uri"].startswith("postgresql+psycopg://")
    engine = Engine(config, spark=lambda: spark)
    engine.catalog.create_namespace("ns")
    table = create_fragmented(Lake(tmp_path, REPO / "deploy" / "compaction.yaml", engine), "ns.t", {"eu": 10})
    before = rows_digest(table)

    [outcome] = engine.compact("ns.t")

    assert outcome.status == "committed"
    assert rows_digest(engine.catalog.load_table("ns.t")) == before
    assert engine.ledger.counts() == {"COMMITTED": 1}  # the ledger lives in PostgreSQL
    with sqlalchemy.create_engine(config.state_uri).connect() as conn:
        assert conn.execute(sqlalchemy.text("select count(*) from compaction_attempts")).scalar() == 1

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
    assert "postgres" in type(instance.run_storage).__module__
    engine.catalog.load_table("ns.t").append(batch(10_000, 5, "eu"))
    defs = build_definitions(config)
    resources = {"compaction": CompactionResource(config_path=config.source)}
    context = build_sensor_context(instance=instance, definitions=defs, resources=resources)
    result = defs.get_sensor_def("fragmentation_sensor")(context)
    assert result.cursor  # the tick ran against the PostgreSQL instance
    limits = {p.name: p.limit for p in instance.event_log_storage.get_pool_limits()}
    assert limits == {"compaction-high": 2, "compaction-default": 1}
    instance.dispose()
    engine.ledger.dispose()
    engine.catalog.engine.dispose()
