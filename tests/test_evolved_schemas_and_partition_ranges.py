"""Attacks on issue 19's change (Polars/bulk paths for typed and nested columns, runs over ranges of
partitions, the sensor's replay of deferred partitions). Each test states what it expects a
correct tool to do. Written by an outside attack (issue 19); the five that failed then are kept as
regression cases of the fixes (named in each docstring), the rest as attacks that held."""

import json
from collections import Counter
from decimal import Decimal

import pyarrow as pa
from dagster import DagsterRunStatus, DeleteDynamicPartitionsRequest
from dagster._core.test_utils import create_run_for_test
from pyiceberg.expressions import EqualTo
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from compaction_assets.lake.appends import append_fragments
from compaction_assets.lake.digest import rows_digest
from tests.conftest import batch
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.sensor_ticks import requested, set_scheduling, tick

# --- sensor: replay of deferred partitions -------------------------------------------------------


def test_a_table_paused_while_its_partition_waits_gets_no_request(queued_lake, instance):
    """`pause` is a table property: a new metadata file, the same snapshot. The sensor's replay of an
    unchanged table's deferred partitions keys on the snapshot id only, so the paused table's
    waiting partition was requested as if nothing had changed (fixed: a new metadata file on the
    same snapshot is planned again)."""
    set_scheduling(queued_lake, max_partitions_per_run=1)  # a run per partition: ns.flat is deferred
    first = tick(queued_lake, instance)
    assert ("ns.flat", "") not in requested(first)
    assert "ns.flat|" in json.loads(first.cursor)["waiting"]

    queued_lake.engine.set_enabled("ns.flat", False)  # what `compaction-assets pause ns.flat` does

    again = tick(queued_lake, instance, cursor=first.cursor)  # the queue has room now
    assert ("ns.flat", "") not in requested(again), "a paused table was requested a compaction run"


# --- sensor: a range run whose first key vanished -------------------------------------------------


def test_a_range_run_whose_first_partition_vanished_still_holds_the_rest(queued_lake, instance):
    """A queued run over a range of sales.orders' partitions; the range's first partition then loses
    all its rows (another engine's delete), so the sensor deletes its dynamic partition. The run
    still covers the others (it is queued or running), but runs_in_flight drops the whole range
    once its start key is gone: at the table's next append, a second run over the same partitions
    was requested (two in-flight runs per partition). Fixed: the sensor keeps a key an in-flight
    run covers, and a range whose end is gone holds every key of the table."""
    name = "lake__sales__orders"
    first = tick(queued_lake, instance)
    for r in first.dynamic_partitions_requests:  # what the daemon does with the tick's requests
        instance.add_dynamic_partitions(r.partitions_def_name, list(r.partition_keys))
    order = list(instance.get_dynamic_partitions(name))
    assert set(order) == {"region=eu", "region=us", "region=apac"}
    tags = {
        "compaction/queue": "high",
        "compaction/table": "sales.orders",
        "dagster/asset_partition_range_start": order[0],
        "dagster/asset_partition_range_end": order[-1],
    }
    create_run_for_test(instance, job_name="compact__sales__orders", status=DagsterRunStatus.STARTED, tags=tags)

    table = queued_lake.table("sales.orders")
    table.delete(EqualTo("region", order[0].split("=", 1)[1]))  # whole files: the partition is gone

    second = tick(queued_lake, instance, cursor=first.cursor)
    assert not any(t == "sales.orders" for t, _ in requested(second, instance))
    for r in second.dynamic_partitions_requests:
        if isinstance(r, DeleteDynamicPartitionsRequest):
            for key in r.partition_keys:
                instance.delete_dynamic_partition(r.partitions_def_name, key)
    assert order[0] in instance.get_dynamic_partitions(name)  # kept while the run covers it
    remaining = order[1].split("=", 1)[1]
    queued_lake.table("sales.orders").append(batch(90_000, 5, remaining))  # a streaming writer goes on

    third = tick(queued_lake, instance, cursor=second.cursor)
    overlapping = {p for t, p in requested(third, instance) if t == "sales.orders"}
    assert not overlapping, f"partitions {sorted(overlapping)} requested again while a run covering them runs"


# --- Polars / bulk Arrow: nested schema evolution, by content in pyiceberg and DuckDB -------------

POINT_V1 = StructType(
    NestedField(11, "x", IntegerType(), required=False),
    NestedField(12, "y", IntegerType(), required=False),
)
SCHEMA_V1 = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "point", POINT_V1, required=False),
    NestedField(3, "tags", ListType(21, IntegerType(), element_required=False), required=False),
    NestedField(4, "attrs", MapType(31, StringType(), 32, IntegerType(), value_required=False), required=False),
    NestedField(5, "amount", DecimalType(9, 2), required=False),
    NestedField(6, "at", TimestamptzType(), required=False),
)


UTC_US = pa.timestamp("us", "UTC")


def _rows(table, start: int, count: int, evolved: bool) -> pa.Table:
    schema = table.schema().as_arrow()
    rows = []
    for i in range(start, start + count):
        point = None if i % 7 == 0 else {"x": None if i % 5 == 0 else i, "y": -i}
        if evolved and point is not None:
            point = {"px": point["x"], "y": point["y"], "z": f"z{i}" if i % 3 else None}
        rows.append(
            {
                "id": i,
                "point": point,
                "tags": None if i % 4 == 0 else ([] if i % 4 == 1 else [i, None, -i]),
                "attrs": None if i % 6 == 0 else ([] if i % 6 == 1 else [("b", i), ("a", None), ("c", -i)]),
                "amount": None if i % 9 == 0 else Decimal(i * 37 - 5000) / 100,
                "at": None if i % 8 == 0 else pa.scalar(1_700_000_000_000_000 + i * 1_000_003, UTC_US).as_py(),
            }
        )
    return pa.Table.from_pylist(rows, schema=schema)


def _duck(table) -> Counter:
    def norm(v):
        if isinstance(v, dict):
            return tuple(sorted((k, norm(x)) for k, x in v.items()))
        if isinstance(v, list):
            return tuple(norm(x) for x in v)
        return repr(v)

    return Counter(norm(r) for r in duckdb_rows(table))


def test_nested_evolution_reads_the_same_after_compaction(lake):
    """Files of three schemas: point.x renamed to px, a struct child z added, the list element and
    map value promoted int -> long, the decimal widened 9 -> 18, then files of the newest schema
    first in the group. pyiceberg and DuckDB must read the same multiset before and after."""
    props = {"compaction.target-file-size-bytes": str(64 << 20)}
    table = lake.catalog.create_table("ns.nested", schema=SCHEMA_V1, properties=props)
    append_fragments(table, [_rows(table, k * 40, 40, False) for k in range(3)])
    table = lake.table("ns.nested")
    with table.update_schema() as update:
        update.rename_column(("point", "x"), "px")
        update.add_column(("point", "z"), StringType())
        update.update_column(("tags", "element"), LongType())
        update.update_column(("attrs", "value"), LongType())
        update.update_column("amount", DecimalType(18, 2))
    table = lake.table("ns.nested")

    def evolved(start):
        t = _rows(table, start, 40, True)
        return t

    append_fragments(table, [evolved(1000 + k * 40) for k in range(3)])
    table = lake.table("ns.nested")
    before, duck_before = rows_digest(table), _duck(table)

    outcomes = lake.engine.compact("ns.nested")

    assert [o.status for o in outcomes] == ["committed"], [o.reason for o in outcomes]
    assert outcomes[0].engine == "arrow"  # Polars refused the mixed group, the per-file path projected it
    table = lake.table("ns.nested")
    assert rows_digest(table) == before
    assert _duck(table) == duck_before


def test_new_schema_files_only_take_polars_and_keep_nested_values(lake):
    """Only files of the evolved schema (renamed struct child, added child): the fast path is
    allowed; values of every nested field must survive, in pyiceberg and DuckDB."""
    props = {"compaction.target-file-size-bytes": str(64 << 20)}
    table = lake.catalog.create_table("ns.nested2", schema=SCHEMA_V1, properties=props)
    with table.update_schema() as update:
        update.rename_column(("point", "x"), "px")
        update.add_column(("point", "z"), StringType())
    table = lake.table("ns.nested2")
    append_fragments(table, [_rows(table, k * 40, 40, True) for k in range(6)])
    table = lake.table("ns.nested2")
    before, duck_before = rows_digest(table), _duck(table)

    [outcome] = lake.engine.compact("ns.nested2")

    assert outcome.status == "committed", outcome.reason
    assert outcome.engine == "polars"
    table = lake.table("ns.nested2")
    assert rows_digest(table) == before
    assert _duck(table) == duck_before


# --- one commit for many partitions, with other writers landing inside it -------------------------


def test_one_commit_of_many_partitions_with_foreign_changes_inside_it(lake, monkeypatch):
    """Three partitions compacted in one job and one commit; inside the commit another engine
    deletes rows of one eu file (position deletes), drops the whole apac partition and appends to us.
    No deleted row may come back, no live one go; the per-partition checks must then pass."""
    import pyarrow.parquet as pq

    from compaction_assets.commit import two_phase
    from compaction_assets.commit.consistency import check_partitions
    from tests.conftest import create_fragmented
    from tests.foreign_deletes import commit_deletes, position_delete

    table = create_fragmented(lake, "ns.t", {"eu": 6, "us": 6, "apac": 6}, rows=20)
    victim = next(f for f in table.inspect.files().to_pylist() if f["partition"]["region"] == "eu")
    victim_file = next(t.file for t in table.scan().plan_files() if t.file.file_path == victim["file_path"])
    deleted_ids = set(pq.read_table(victim["file_path"].removeprefix("file://"), columns=["id"])["id"].to_pylist()[:3])
    real, raced, expected = two_phase._commit_once, [], {}

    def racing(table_, attempts, live):
        if not raced:
            raced.append(True)
            other = lake.table("ns.t")
            commit_deletes(other, [position_delete(other, victim_file, [0, 1, 2])])
            lake.table("ns.t").delete(EqualTo("region", "apac"))
            lake.table("ns.t").append(batch(70_000, 5, "us"))
            expected["digest"] = rows_digest(lake.table("ns.t"))
            expected["duck"] = _duck(lake.table("ns.t"))
        real(table_, attempts, live)

    monkeypatch.setattr(two_phase, "_commit_once", racing)
    outcomes = lake.engine.compact("ns.t")

    assert raced
    table = lake.table("ns.t")
    ids = {r["id"] for r in table.scan().to_arrow().to_pylist()}
    assert not ids & deleted_ids, "position-deleted rows came back"
    assert not any(r["region"] == "apac" for r in table.scan().to_arrow().to_pylist()), "apac rows came back"
    assert rows_digest(table) == expected["digest"]
    assert _duck(table) == expected["duck"]
    tasks = {o.partition_key: o.task_id for o in outcomes}
    reports = check_partitions(table, lake.engine.ledger, tasks, 3600)
    assert all(r.passed for r in reports.values()), {k: r.problems for k, r in reports.items()}


# --- Polars: a group split into several outputs whose later chunk has another column order -------


def _write_ordered(table, name: str, start: int, rows: int, order: list[str]):
    """A data file at a chosen path (so the group's path order is chosen), columns in `order`,
    with the table's field ids, as another Iceberg writer (or an older schema) leaves it."""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    ids = {"id": 1, "a": 2, "b": 3}
    types = {"id": pa.int64(), "a": pa.string(), "b": pa.string()}
    values = {
        "id": list(range(start, start + rows)),
        "a": [f"A-{i:06d}-{(i * 2654435761) % 2**32:010d}" for i in range(start, start + rows)],
        "b": [f"B-{i:06d}-{(i * 40503) % 2**31:010d}" for i in range(start, start + rows)],
    }
    schema = pa.schema(
        [pa.field(c, types[c], nullable=True, metadata={b"PARQUET:field_id": str(ids[c]).encode()}) for c in order]
    )
    path = f"{table.location()}/data/{name}.parquet"
    import os

    os.makedirs(os.path.dirname(path.removeprefix("file://")), exist_ok=True)
    pq.write_table(pa.table({c: values[c] for c in order}, schema=schema), path.removeprefix("file://"))
    return parquet_file_to_data_file(table.io, table.metadata, path)


def test_polars_chunks_of_an_older_column_order_keep_their_columns(lake):
    """A column move (`b` before `a`, same field ids, same names): files of the new order sort
    first in the group, so Polars is allowed (its first file is the table's order). The group is
    split into several output files; a later chunk holds only files of the old order, and its
    physical names were mapped onto the target's names by position: `a` and `b` traded values.
    Fixed: a chunk whose Polars schema differs from the first chunk's sends the group to Arrow."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "a", StringType(), required=False),
        NestedField(3, "b", StringType(), required=False),
    )
    table = lake.catalog.create_table("ns.moved", schema=schema)
    old = [_write_ordered(table, f"b-old-{k:02d}", 1000 * k, 200, ["id", "a", "b"]) for k in range(15)]
    with table.transaction() as txn, txn.update_snapshot().fast_append() as append:
        for f in old:
            append.append_data_file(f)
    table = lake.table("ns.moved")
    with table.update_schema() as update:
        update.move_before("b", "a")
    table = lake.table("ns.moved")
    assert [f.name for f in table.schema().fields] == ["id", "b", "a"]
    new = [_write_ordered(table, f"a-new-{k:02d}", 100_000 + 1000 * k, 200, ["id", "b", "a"]) for k in range(5)]
    with table.transaction() as txn, txn.update_snapshot().fast_append() as append:
        for f in new:
            append.append_data_file(f)
    table = lake.table("ns.moved")
    sizes = [f["file_size_in_bytes"] for f in table.inspect.files().to_pylist()]
    # each file undersized but no fragment (target/8 < size < 0.75 target): one major group packed
    # up to max_group_bytes, written as ~5 output files, so Polars scans it in ~5 chunks of 4 files
    target = 4 * sum(sizes) // len(sizes)
    with table.transaction() as txn:
        txn.set_properties({"compaction.target-file-size-bytes": str(target)})
    table = lake.table("ns.moved")
    before, duck_before = rows_digest(table), _duck(table)
    pairs_before = {r["id"]: (r["a"], r["b"]) for r in table.scan().to_arrow().to_pylist()}

    [outcome] = lake.engine.compact("ns.moved")

    assert outcome.status == "committed", outcome.reason
    assert outcome.engine == "arrow"  # Polars gave the group up
    table = lake.table("ns.moved")
    pairs_after = {r["id"]: (r["a"], r["b"]) for r in table.scan().to_arrow().to_pylist()}
    swapped = [i for i in pairs_before if pairs_after.get(i) != pairs_before[i]]
    if swapped:
        first = swapped[0]
        raise AssertionError(
            f"{len(swapped)} row(s) changed, e.g. id {first}: {pairs_before[first]} -> {pairs_after.get(first)}"
        )
    assert rows_digest(table) == before
    assert _duck(table) == duck_before


# --- a run over a range whose first partition vanished before it started ------------------------


def test_a_range_run_whose_first_partition_vanished_before_it_started(lake):
    """The sensor asks one run for r00..r02 (launched, starting); before it runs, another engine deletes every
    row of r00 and the next tick deletes r00's dynamic partition (the run is in flight, so r01/r02
    are not asked again). The run then cannot resolve its range (DagsterInvalidInvocationError) and
    compacts nothing; on the next tick (table unchanged) r01 and r02 are not requested either:
    they stayed fragmented until some writer committed to the table again. Fixed: the sensor
    keeps r00's dynamic partition while the run covers it, so the run starts and compacts."""
    from dagster import DagsterRunStatus, build_sensor_context, instance_for_test

    from compaction_assets.config import load_config
    from compaction_assets.defs.build import build_definitions, table_job
    from compaction_assets.defs.resources import CompactionResource
    from tests.conftest import create_fragmented

    create_fragmented(lake, "ns.t", {"r00": 6, "r01": 6, "r02": 6}, rows=10)
    with instance_for_test() as inst:
        defs = build_definitions(load_config(lake.config_path))
        resources = {"compaction": CompactionResource(config_path=str(lake.config_path))}
        sensor = defs.get_sensor_def("fragmentation_sensor")

        def tick_(cursor=None):
            return sensor(build_sensor_context(instance=inst, definitions=defs, resources=resources, cursor=cursor))

        first = tick_()
        [request] = first.run_requests
        assert request.tags.get("dagster/asset_partition_range_start") == "region=r00"
        for r in first.dynamic_partitions_requests:
            inst.add_dynamic_partitions(r.partitions_def_name, r.partition_keys)
        queued = create_run_for_test(inst, job_name="__ASSET_JOB", status=DagsterRunStatus.STARTING, tags=request.tags)

        lake.table("ns.t").delete(EqualTo("region", "r00"))
        second = tick_(first.cursor)
        assert second.run_requests == []  # r01, r02: in the queued run
        for r in second.dynamic_partitions_requests:
            if isinstance(r, DeleteDynamicPartitionsRequest):
                for key in r.partition_keys:
                    inst.delete_dynamic_partition(r.partitions_def_name, key)

        error = None
        try:  # the queued run starts now (same tags)
            result = table_job(defs, "ns.t").execute_in_process(instance=inst, tags=request.tags, raise_on_error=False)
            error = None if result.success else "run failed"
        except Exception as exc:  # noqa: BLE001 - reported below
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        inst.delete_run(queued.run_id)  # it ended (failed): no longer in flight
        files = Counter(f["partition"]["region"] for f in lake.table("ns.t").inspect.files().to_pylist())
        if files == {"r01": 1, "r02": 1}:
            return  # the run compacted what was left of its range: fine
        third = tick_(second.cursor)
        asked = {
            (r.tags.get("dagster/asset_partition_range_start"), r.tags.get("dagster/asset_partition_range_end"))
            for r in third.run_requests
        } | {(r.partition_key, r.partition_key) for r in third.run_requests if r.partition_key}
        assert asked, (
            f"r01/r02 left fragmented ({dict(files)}) and not requested again; the range run: {error}; "
            f"the tick: {third.skip_reason.skip_message if third.skip_reason else ''}"
        )


def test_polars_chunks_of_a_dropped_column_do_not_fill_the_added_one(lake):
    """The commonest evolution: column `d` dropped, column `e` (new field id, same type) added.
    Files of the new schema sort first and fill the first Polars chunk; the second holds only files
    of the old schema,
    whose columns (id, a, d) are renamed by position onto (id, a, e): the dropped column's values
    land in `e`, which must read NULL for those rows (they did not, before the fix of the chunk
    schema check: see the column-order test)."""
    import os

    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "a", StringType(), required=False),
        NestedField(3, "d", StringType(), required=False),
    )
    table = lake.catalog.create_table("ns.dropadd", schema=schema)

    def write(tbl, name, start, columns):
        ids = {"id": 1, "a": 2, "d": 3, "e": 4}
        values = {
            "id": list(range(start, start + 200)),
            "a": [f"A-{i:06d}-{(i * 2654435761) % 2**32:010d}" for i in range(start, start + 200)],
            "d": [f"D-{i:06d}-{(i * 40503) % 2**31:010d}" for i in range(start, start + 200)],
            "e": [f"EEEE-{i:06d}-{(i * 7919) % 2**31:010d}" for i in range(start, start + 200)],
        }
        types = {"id": pa.int64()}
        arrow = pa.schema(
            [
                pa.field(c, types.get(c, pa.string()), metadata={b"PARQUET:field_id": str(ids[c]).encode()})
                for c in columns
            ]
        )
        path = f"{tbl.location()}/data/{name}.parquet"
        os.makedirs(os.path.dirname(path.removeprefix("file://")), exist_ok=True)
        pq.write_table(pa.table({c: values[c] for c in columns}, schema=arrow), path.removeprefix("file://"))
        return parquet_file_to_data_file(tbl.io, tbl.metadata, path)

    def commit(tbl, files):
        with tbl.transaction() as txn, txn.update_snapshot().fast_append() as append:
            for f in files:
                append.append_data_file(f)

    commit(table, [write(table, f"b-old-{k:02d}", 1000 * k, ["id", "a", "d"]) for k in range(5)])
    table = lake.table("ns.dropadd")
    with table.update_schema() as update:
        update.delete_column("d")
        update.add_column("e", StringType())
    table = lake.table("ns.dropadd")
    assert [(f.field_id, f.name) for f in table.schema().fields] == [(1, "id"), (2, "a"), (4, "e")]
    commit(table, [write(table, f"a-new-{k:02d}", 100_000 + 1000 * k, ["id", "a", "e"]) for k in range(5)])
    table = lake.table("ns.dropadd")
    sizes = [f["file_size_in_bytes"] for f in table.inspect.files().to_pylist()]
    with (
        table.transaction() as txn
    ):  # undersized, no fragments: one group, 2 outputs (chunks of 5 files; new files a little larger)
        txn.set_properties({"compaction.target-file-size-bytes": str(5 * sum(sizes) // len(sizes))})
    table = lake.table("ns.dropadd")
    before, duck_before = rows_digest(table), _duck(table)
    nulls_before = sum(r["e"] is None for r in table.scan().to_arrow().to_pylist())
    assert nulls_before == 1000

    [outcome] = lake.engine.compact("ns.dropadd")

    assert outcome.status == "committed", outcome.reason
    assert outcome.engine == "arrow"  # Polars gave the group up
    table = lake.table("ns.dropadd")
    nulls_after = sum(r["e"] is None for r in table.scan().to_arrow().to_pylist())
    duck_nulls = sum(r["e"] is None for r in duckdb_rows(table))
    assert (nulls_after, duck_nulls) == (nulls_before, nulls_before), (
        f"old rows now carrying the dropped column in e: {nulls_before - nulls_after} in pyiceberg, "
        f"{nulls_before - duck_nulls} in DuckDB"
    )
    assert rows_digest(table) == before
    assert _duck(table) == duck_before


def test_crash_after_the_one_commit_of_many_partitions_then_recover(lake):
    """Three partitions in one commit; the process dies right after the Iceberg commit (every
    attempt still PREPARED). recover must mark each COMMITTED from the one snapshot, commit nothing
    again, and every partition's check must pass."""
    from compaction_assets.commit.consistency import check_partitions
    from compaction_assets.commit.ledger import Status
    from tests.conftest import create_fragmented

    table = create_fragmented(lake, "ns.t", {"eu": 6, "us": 6, "apac": 6}, rows=20)
    before, duck_before = rows_digest(table), _duck(table)
    assert lake.cli("compact", "ns.t", crash_at="after_iceberg_commit").returncode == 137
    snapshots = len(lake.table("ns.t").metadata.snapshots)

    report = lake.engine.recover()

    assert not report.errors
    table = lake.table("ns.t")
    attempts = lake.engine.ledger.attempts(table_name="ns.t")
    assert sorted((a.partition_key, a.status) for a in attempts) == [
        (f"region={r}", Status.COMMITTED) for r in ("apac", "eu", "us")
    ]
    assert len(table.metadata.snapshots) == snapshots
    assert rows_digest(table) == before
    assert _duck(table) == duck_before
    reports = check_partitions(table, lake.engine.ledger, {a.partition_key: a.task_id for a in attempts}, 3600)
    assert all(r.passed for r in reports.values()), {k: r.problems for k, r in reports.items()}
