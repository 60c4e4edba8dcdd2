"""Old partition specs in Dagster: an old spec's partition key is a dynamic partition of the table's
asset; materialising it rewrites its files into the current spec (materialisation `kind: old-spec`,
the blocking check passes); the next sensor tick drops the emptied key and adds the new ones."""

import logging
from collections import Counter

import pytest
from dagster import AddDynamicPartitionsRequest, DeleteDynamicPartitionsRequest, build_sensor_context
from pyiceberg.partitioning import PartitionSpec

from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions, table_job
from compaction_assets.defs.naming import op_name
from compaction_assets.defs.resources import CompactionResource
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.evolved_specs import (
    BY_REGION,
    SCHEMA,
    assert_partitions_match_rows,
    evolved_table,
    scan_rows,
    write_by_region,
)
from tests.lakekit.oracle import row_key

PARTITIONS = "lake__ns__t"


def _tick(lake, instance, cursor=None):  # noqa: ANN001, ANN202
    """One sensor tick; its dynamic-partition requests applied to the instance, as the daemon does."""
    defs = build_definitions(load_config(lake.config_path))
    context = build_sensor_context(
        instance=instance,
        cursor=cursor,
        definitions=defs,
        resources={"compaction": CompactionResource(config_path=str(lake.config_path))},
    )
    result = defs.get_sensor_def("fragmentation_sensor")(context)
    added, deleted = set(), set()
    for request in result.dynamic_partitions_requests:
        if isinstance(request, AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
            added |= set(request.partition_keys)
        elif isinstance(request, DeleteDynamicPartitionsRequest):
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)
            deleted |= set(request.partition_keys)
    return result, added, deleted


def test_old_spec_partition_materialises_as_old_spec_and_its_key_gives_way_to_the_new_ones(lake, instance):
    _, expected = evolved_table(lake)
    result, added, _ = _tick(lake, instance)
    old_keys = {"spec-0:region=eu", "spec-0:region=us", "spec-0:region=__HIVE_DEFAULT_PARTITION__"}
    assert added == old_keys
    requested = {r.partition_key or r.tags.get("dagster/asset_partition_range_start") for r in result.run_requests}
    assert requested and requested <= old_keys  # requested as any fragmented partition is

    defs = build_definitions(load_config(lake.config_path))
    run = table_job(defs, "ns.t").execute_in_process(
        instance=instance, partition_key="spec-0:region=eu", raise_on_error=False
    )
    assert run.success
    [event] = run.asset_materializations_for_node(op_name("default", "ns.t"))
    meta = {k: v.value for k, v in event.metadata.items()}
    assert event.partition == "spec-0:region=eu"
    assert meta["kind"] == "old-spec" and meta["status"] == "committed", meta
    assert (meta["data_files_before"], meta["data_files_after"]) == (2, 0)
    assert "in 4 partition(s) of spec 1" in meta["reason"]
    [check] = run.get_asset_check_evaluations()
    assert check.passed, check.metadata

    table = lake.table("ns.t")
    assert scan_rows(table) == expected
    assert Counter(row_key(r) for r in duckdb_rows(table)) == expected
    assert assert_partitions_match_rows(table, only_spec=table.spec().spec_id) == 4

    _, added, deleted = _tick(lake, instance, result.cursor)
    assert deleted == {"spec-0:region=eu"}  # no file has that key any more
    assert added == {
        "region=eu/cat=0",
        "region=eu/cat=1",
        "region=eu/cat=2",
        "region=eu/cat=__HIVE_DEFAULT_PARTITION__",
    }
    assert set(instance.get_dynamic_partitions(PARTITIONS)) == (old_keys - {"spec-0:region=eu"}) | added


def _logged_tick(lake, instance, defs):  # noqa: ANN001, ANN202
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    context = build_sensor_context(
        instance=instance,
        definitions=defs,
        resources={"compaction": CompactionResource(config_path=str(lake.config_path))},
    )
    context.log.addHandler(Collect())
    return defs.get_sensor_def("fragmentation_sensor")(context), "\n".join(lines)


@pytest.mark.parametrize("to_partitioned", [True, False], ids=["unpartitioned_to_partitioned", "and_back"])
def test_a_table_that_changes_between_partitioned_and_unpartitioned(lake, instance, monkeypatch, to_partitioned):
    """The asset was built for the other kind: the sensor asks for a reload and requests nothing for
    it meanwhile; after the reload the old spec's files are compacted (a partition key of their own,
    or the unpartitioned asset's one run, whose materialisations say which partition)."""
    monkeypatch.delenv("COMPACTION_DAGSTER_URL", raising=False)
    table = lake.catalog.create_table(
        "ns.t", schema=SCHEMA, partition_spec=PartitionSpec() if to_partitioned else BY_REGION
    )
    write_by_region(table, 0, files_per_region=2)
    stale = build_definitions(load_config(lake.config_path))
    with lake.table("ns.t").update_spec() as update:
        update.add_identity("region") if to_partitioned else update.remove_field("region")
    expected = scan_rows(lake.table("ns.t"))

    result, logs = _logged_tick(lake, instance, stale)
    became = "partitioned" if to_partitioned else "unpartitioned"
    assert f"ns.t: its partition spec became {became}; not compacted until the code location reloads" in logs
    assert "tables changed (partitioning changed: ns.t): reload code location" in logs
    assert not result.run_requests and not result.dynamic_partitions_requests

    result, _, _ = _tick(lake, instance)  # reloaded
    defs = build_definitions(load_config(lake.config_path))
    if to_partitioned:
        assert set(instance.get_dynamic_partitions(PARTITIONS)) == {"spec-0:"}
        [request] = result.run_requests
        assert request.partition_key == "spec-0:"
        run = table_job(defs, "ns.t").execute_in_process(instance=instance, partition_key="spec-0:")
    else:
        [request] = result.run_requests
        assert request.partition_key is None
        run = table_job(defs, "ns.t").execute_in_process(instance=instance)
    assert run.success
    events = run.asset_materializations_for_node(op_name("default", "ns.t"))
    metas = [{k: v.value for k, v in e.metadata.items()} for e in events]
    assert {m["kind"] for m in metas} == {"old-spec"} and {m["status"] for m in metas} == {"committed"}
    if not to_partitioned:
        assert {e.partition for e in events} == {None}
        assert {m["partition"] for m in metas} == {
            "spec-0:region=eu",
            "spec-0:region=us",
            "spec-0:region=__HIVE_DEFAULT_PARTITION__",
        }
    [check] = run.get_asset_check_evaluations()
    assert check.passed, check.metadata
    table = lake.table("ns.t")
    assert scan_rows(table) == expected
    assert Counter(row_key(r) for r in duckdb_rows(table)) == expected
    assert assert_partitions_match_rows(table) == 3  # a file per region, or per old partition
