"""Attacks on the object-storage paths (moto's S3 server on 127.0.0.1, real Spark, real catalog)."""

from __future__ import annotations

import os
import time
from urllib.parse import urlparse

import pyarrow.parquet as pq
import pytest
import yaml

from compaction_assets.config import load_config
from compaction_assets.engine import Engine
from compaction_assets.errors import ConfigError
from compaction_assets.lake.appends import append_fragments
from compaction_assets.lake.digest import row_hashes, rows_digest
from compaction_assets.lake.files import live_files
from compaction_assets.redact import is_secret_key
from compaction_tools.local_s3 import ACCESS_KEY, SECRET_KEY
from compaction_tools.reliability import check_invariants
from tests.conftest import BY_REGION, SCHEMA, batch, create_fragmented, write_config


def _keys(s3, prefix: str = "") -> set[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def _key(location: str) -> str:
    return urlparse(location).path.lstrip("/")


def _fragmented_at(lake, name: str, location: str, regions: dict[str, int], rows: int = 20):  # noqa: ANN001, ANN202
    create_fragmented(lake, name, regions, rows=rows, location=location)
    return lake.table(name)


def _gc_everything(lake, name: str) -> None:  # noqa: ANN001
    table = lake.table(name)
    with table.transaction() as txn:
        txn.set_properties(
            {
                "history.expire.max-snapshot-age-ms": "0",
                "history.expire.min-snapshots-to-keep": "1",
                "compaction.gc.orphan-grace-ms": "0",
            }
        )
    time.sleep(1.1)  # kept: time must pass; moto's LastModified has whole seconds
    lake.engine.gc(name)


@pytest.mark.parametrize("spelling", ["s3a", "trailing-slash"])
def test_table_location_spellings_compact_recover_and_gc(s3_lake, s3_server, spelling):
    warehouse = s3_lake.catalog.properties["warehouse"]
    base = f"{warehouse}/odd-{spelling}"
    location = {"s3a": base.replace("s3://", "s3a://"), "trailing-slash": base + "/"}[spelling]
    table = _fragmented_at(s3_lake, "ns.t", location, {"eu": 6, "a b/%+=é?#": 6})
    oracle = row_hashes(table.scan().to_arrow().to_pylist())
    before = rows_digest(table)

    outcomes = [o for o in s3_lake.engine.compact("ns.t") if o.status == "committed"]
    assert len(outcomes) == 2 and {o.engine for o in outcomes} == {"polars"}, outcomes
    table = s3_lake.table("ns.t")
    assert rows_digest(table) == before
    live = {_key(f.path) for f in live_files(table)}
    _gc_everything(s3_lake, "ns.t")
    remaining = _keys(s3_server, _key(base))
    assert live <= remaining, live - remaining
    assert rows_digest(s3_lake.table("ns.t")) == before
    report = check_invariants(s3_lake.engine, "ns.t", oracle)
    assert report.ok, report


@pytest.mark.parametrize("crash_at", ["worker_mid_group", "after_iceberg_commit", "after_rewrite"])
def test_crash_on_s3_then_recover_and_gc_keeps_every_row(s3_lake, s3_server, crash_at):
    warehouse = s3_lake.catalog.properties["warehouse"]
    table = _fragmented_at(s3_lake, "ns.t", f"{warehouse}/crash", {"eu": 8, "a%b c+d": 8})
    oracle = row_hashes(table.scan().to_arrow().to_pylist())

    crashed = s3_lake.cli("-v", "compact", "ns.t", crash_at=crash_at)  # dies, or its rewrite job fails
    recovered = s3_lake.cli("-v", "recover")
    assert recovered.returncode == 0, recovered.stderr
    for text in (crashed.stdout, crashed.stderr, recovered.stdout, recovered.stderr):  # Spark's error texts too
        assert ACCESS_KEY not in text and SECRET_KEY not in text
    _gc_everything(s3_lake, "ns.t")
    again = s3_lake.cli("-v", "compact", "ns.t")
    assert again.returncode == 0, again.stderr
    _gc_everything(s3_lake, "ns.t")
    table = s3_lake.table("ns.t")
    live = {_key(f.path) for f in live_files(table)}
    assert live <= _keys(s3_server, _key(warehouse))
    report = check_invariants(s3_lake.engine, "ns.t", oracle)
    assert report.ok, report


@pytest.mark.parametrize("suffix", ["?copy.parquet", "#copy.parquet"])
def test_gc_of_an_orphan_whose_key_has_a_query_or_fragment_char_keeps_the_live_file(s3_lake, s3_server, suffix):
    """An orphan object `<live key>?copy.parquet` under the table: pyiceberg's FileIO parses the
    location with urlparse, which drops `?...`/`#...`, so deleting the orphan deleted the live file."""
    warehouse = s3_lake.catalog.properties["warehouse"]
    table = _fragmented_at(s3_lake, "ns.t", f"{warehouse}/q", {"eu": 3})
    before = rows_digest(table)
    live = sorted(_key(f.path) for f in live_files(table))
    orphan = live[0] + suffix
    s3_server.client().put_object(Bucket=s3_server.bucket, Key=orphan, Body=b"junk")

    _gc_everything(s3_lake, "ns.t")

    remaining = _keys(s3_server, _key(warehouse))
    assert set(live) <= remaining, set(live) - remaining  # no live file deleted
    assert orphan not in remaining  # the orphan itself is what GC deletes
    assert rows_digest(s3_lake.table("ns.t")) == before


def test_gc_of_a_local_orphan_named_like_a_query_keeps_the_live_file(lake):
    """The same on a local warehouse: `file:///.../x.parquet?copy.parquet` parsed by urlparse is x.parquet."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    append_fragments(table, [batch(i * 20, 20, "eu") for i in range(3)])
    table = lake.table("ns.t")
    before = rows_digest(table)
    live = sorted(urlparse(f.path).path if "://" in f.path else f.path for f in live_files(table))
    with open(live[0] + "?copy.parquet", "wb") as orphan:
        orphan.write(b"junk")

    _gc_everything(lake, "ns.t")

    assert all(os.path.exists(p) for p in live)
    assert not os.path.exists(live[0] + "?copy.parquet")
    assert rows_digest(lake.table("ns.t")) == before


def test_a_data_path_property_with_a_trailing_slash_compacts_on_s3(s3_lake):
    """Java's location providers strip a trailing `/` of write.data.path (LocationUtil.stripTrailingSlash);
    joined as is, the output folder is `data//region=eu`, an object key pyarrow and Polars both refuse."""
    warehouse = s3_lake.catalog.properties["warehouse"]
    table = _fragmented_at(s3_lake, "ns.t", f"{warehouse}/dp", {"eu": 6})
    before = rows_digest(table)
    with table.transaction() as txn:
        txn.set_properties({"write.data.path": f"{warehouse}/dp/data/"})

    [outcome] = s3_lake.engine.compact("ns.t")

    assert outcome.status == "committed", outcome.reason
    table = s3_lake.table("ns.t")
    assert rows_digest(table) == before
    assert all("//" not in f.path.split("://", 1)[1] for f in live_files(table))


def test_polars_signs_with_the_s3_keys_pyiceberg_uses_when_client_keys_differ(tmp_path, spark, s3_with_auth):
    """pyiceberg takes s3.access-key-id before client.access-key-id (get_first_property_value); the
    Polars options took whichever came last in the properties, so Polars signed with other keys
    than the FileIO: on a store that checks them it failed and every group fell back."""
    properties = {
        **s3_with_auth.catalog_properties(f"sqlite:///{tmp_path / 'catalog.db'}"),
        "client.access-key-id": "AKIDCLIENTONLY0000",  # the catalog client's, not valid for this store
        "client.secret-access-key": "client-only-secret-0000",
    }
    config = write_config(tmp_path, catalog={"name": "lake", "properties": properties})
    doc = yaml.safe_load(config.read_text())
    doc["catalog"]["properties"] = properties  # in the user's order: s3.* first, as written above
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    engine = Engine(load_config(config), spark=lambda: spark)
    try:
        engine.catalog.create_namespace("ns")
        table = engine.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
        append_fragments(table, [batch(i * 20, 20, "eu") for i in range(6)])
        before = rows_digest(engine.catalog.load_table("ns.t"))

        [outcome] = engine.compact("ns.t")

        assert outcome.status == "committed" and outcome.engine == "polars", (outcome.engine, outcome.reason)
        assert rows_digest(engine.catalog.load_table("ns.t")) == before
    finally:
        engine.ledger.dispose()


def test_files_added_under_an_s3a_spelling_compact_and_gc_keeps_live_ones(s3_lake, s3_server):
    """A table at s3:// whose manifests also hold s3a:// paths (another engine's writer, add_files):
    the rewrite reads both, GC matches listings to manifests across the spellings."""
    warehouse = s3_lake.catalog.properties["warehouse"]
    table = _fragmented_at(s3_lake, "ns.t", f"{warehouse}/mixed", {"eu": 4})
    extra = []
    for k in range(4):
        path = f"{warehouse}/mixed/data/region=eu/added-{k}.parquet"
        with table.io.new_output(path).create() as stream:
            pq.write_table(batch(1000 + k * 20, 20, "eu").cast(table.schema().as_arrow()), stream)
        extra.append(path.replace("s3://", "s3a://"))
    table.add_files(extra)
    table = s3_lake.table("ns.t")
    oracle = row_hashes(table.scan().to_arrow().to_pylist())
    assert any(f.path.startswith("s3a://") for f in live_files(table))

    [outcome] = s3_lake.engine.compact("ns.t")

    assert outcome.status == "committed", outcome.reason
    _gc_everything(s3_lake, "ns.t")
    table = s3_lake.table("ns.t")
    assert {_key(f.path) for f in live_files(table)} <= _keys(s3_server, _key(warehouse))
    assert not {_key(p) for p in extra} & _keys(s3_server, _key(warehouse))  # replaced, expired, deleted
    report = check_invariants(s3_lake.engine, "ns.t", oracle)
    assert report.ok, report


def test_gc_killed_after_expiry_on_s3_then_gc_again_deletes_the_rest_and_keeps_live_files(s3_lake, s3_server):
    warehouse = s3_lake.catalog.properties["warehouse"]
    table = _fragmented_at(s3_lake, "ns.t", f"{warehouse}/gck", {"eu": 6, "us": 6})
    oracle = row_hashes(table.scan().to_arrow().to_pylist())
    replaced = {_key(f.path) for f in live_files(table)}
    assert all(o.status == "committed" for o in s3_lake.engine.compact("ns.t"))
    table = s3_lake.table("ns.t")
    with table.transaction() as txn:
        txn.set_properties(
            {
                "history.expire.max-snapshot-age-ms": "0",
                "history.expire.min-snapshots-to-keep": "1",
                "compaction.gc.orphan-grace-ms": "0",
            }
        )
    time.sleep(1.1)  # kept: time must pass; moto's LastModified has whole seconds

    killed = s3_lake.cli("-v", "gc", "ns.t", crash_at="gc_after_expire")
    assert killed.returncode == 137, killed.stderr
    assert replaced <= _keys(s3_server, _key(warehouse))  # expired, not yet deleted
    again = s3_lake.cli("-v", "gc", "ns.t")
    assert again.returncode == 0, again.stderr

    remaining = _keys(s3_server, _key(warehouse))
    assert not replaced & remaining  # now orphans: deleted
    assert {_key(f.path) for f in live_files(s3_lake.table("ns.t"))} <= remaining
    report = check_invariants(s3_lake.engine, "ns.t", oracle)
    assert report.ok, report


def test_gc_with_an_orphan_whose_key_has_an_empty_segment(s3_lake, s3_server):
    """`<table>//data/x.parquet` (an old Java writer's spelling under a trailing-slash location) is a
    real object key pyarrow's S3 filesystem refuses ("Empty path component"), so GC cannot delete it;
    it failed on it (ArrowInvalid, after expiring), and so on every later run: it must skip it, and
    delete the other orphans and keep everything live."""
    warehouse = s3_lake.catalog.properties["warehouse"]
    table = _fragmented_at(s3_lake, "ns.t", f"{warehouse}/empty", {"eu": 3})
    before = rows_digest(table)
    live = {_key(f.path) for f in live_files(table)}
    odd = f"{_key(warehouse)}/empty//data/region=eu/orphan.parquet"
    plain = f"{_key(warehouse)}/empty/data/region=eu/orphan.parquet"
    for key in (odd, plain):
        s3_server.client().put_object(Bucket=s3_server.bucket, Key=key, Body=b"junk")

    _gc_everything(s3_lake, "ns.t")

    remaining = _keys(s3_server, _key(warehouse))
    assert live <= remaining and plain not in remaining
    assert rows_digest(s3_lake.table("ns.t")) == before


def test_a_client_access_key_id_is_a_credential_in_config_errors(tmp_path):
    """`client.access-key-id` (pyiceberg's store-wide name for s3.access-key-id) was not taken for a
    credential: a config error showed its value; s3.access-key-id's is hidden."""
    for key in ("s3.access-key-id", "client.access-key-id"):
        properties = {"type": "sql", "uri": "sqlite:///c.db", key: 424242424242, "s3.region": ["eu"]}
        config = write_config(tmp_path, catalog={"name": "lake", "properties": properties})
        with pytest.raises(ConfigError) as raised:
            load_config(config)
        assert key in str(raised.value) and "424242424242" not in str(raised.value), str(raised.value)
    assert is_secret_key("client.access-key-id") and is_secret_key("client.session-token")
