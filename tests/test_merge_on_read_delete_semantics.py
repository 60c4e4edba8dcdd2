"""Outside review of merge-on-read compaction: regressions for the problems it found."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO, schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestEntry, ManifestEntryStatus, write_manifest
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.transforms import VoidTransform
from pyiceberg.typedef import EMPTY_DICT, Record
from pyiceberg.types import DoubleType, LongType, NestedField, UUIDType

from compaction_assets.execution.delete_tiers import TierJob, convert_equality_deletes
from compaction_assets.execution.deletes import GroupDeletes
from compaction_assets.iceberg_compat.arrow import dataframe_to_data_files
from compaction_assets.lake.delete_files import (
    _AddDeleteFiles,
    commit_delete_files,
    equality_delete_file,
    position_delete_rows,
)
from compaction_assets.lake.deletes import ApplyingDeletes, global_spec_ids
from compaction_assets.lake.files import live_files
from compaction_assets.planning.model import DeleteMap, Kind
from compaction_tools.demo import append_fragments
from tests.conftest import BY_REGION, SCHEMA, Lake, batch, create_fragmented
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.files import data_of, kinds, rows
from tests.lakekit.spec_reader import spec_rows


def test_an_equality_delete_on_zero_keeps_negative_zero_and_nan_payloads_all_match(tmp_path: Path):
    """Java (Double.compare, as the convert tier) does not match -0.0 with 0.0; every NaN is one key."""
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "x", DoubleType(), required=False))
    path = str(tmp_path / "eq.parquet")
    x = pa.field("x", pa.float64(), metadata={b"PARQUET:field_id": b"2"})
    pq.write_table(pa.table([pa.array([0.0, float("nan")])], schema=pa.schema([x])), path)
    source = SimpleNamespace(path=str(tmp_path / "data.parquet"), deletes=[0])
    delete = SimpleNamespace(path=path, content=DataFileContent.EQUALITY_DELETES, equality_ids=[2])
    deletes = GroupDeletes(PyArrowFileIO(), schema, None, [source], [delete])
    odd_nan = np.array([0x7FF8000000000001], dtype=np.uint64).view(np.float64)[0]
    batch = pa.record_batch([pa.array([1, 2, 3, 4, 5]), pa.array([0.0, -0.0, 1.0, odd_nan, None])], names=["id", "x"])

    kept = deletes.apply(source, 0, batch)

    assert kept.column("id").to_pylist() == [2, 3, 5]


def _all_rows(table) -> list[dict]:  # noqa: ANN001
    """Every row of every live data file, deletes not applied."""
    return [
        r
        for f in live_files(table)
        if not f.is_delete
        for r in pq.read_table(f.path.removeprefix("file://")).to_pylist()
    ]


def test_a_partition_whose_every_row_is_deleted_is_compacted_to_nothing(lake: Lake):
    table = create_fragmented(lake, "ns.t", {"eu": 6, "us": 1})
    eu = data_of(table, "eu")
    commit_delete_files(table, [equality_delete_file(table, 0, eu[0].partition, ["region"], [{"region": "eu"}])])
    table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    assert sum(expected.values()) == 50

    outcomes = {o.partition_key: o for o in lake.engine.compact("ns.t")}

    assert outcomes["region=eu"].status == "committed", outcomes["region=eu"].reason
    after = lake.table("ns.t")
    assert rows(spec_rows, after) == expected
    assert kinds(after) == Counter({"DATA": 1})


def test_a_global_equality_delete_of_the_unpartitioned_spec_applies_across_partitions(lake: Lake):
    """Table created unpartitioned (spec 0), then partitioned by region: a delete of spec 0 is global."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA)
    with table.update_spec() as update:
        update.add_identity("region")
    table = lake.table("ns.t")
    append_fragments(table, [batch(i * 50, 50, "eu") for i in range(6)] + [batch(300, 50, "us")])
    table = lake.table("ns.t")
    commit_delete_files(
        table, [equality_delete_file(table, 0, Record(), ["id"], [{"id": 3}, {"id": 120}, {"id": 310}])]
    )
    table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    assert sum(expected.values()) == 7 * 50 - 3

    outcomes = {o.partition_key: o for o in lake.engine.compact("ns.t")}

    assert outcomes["region=eu"].status == "committed", outcomes["region=eu"].reason
    after = lake.table("ns.t")
    assert rows(spec_rows, after) == expected
    assert rows(duckdb_rows, after) == expected
    assert kinds(after)["EQUALITY_DELETES"] == 1  # it still applies to the us file


def test_an_equality_delete_of_an_all_void_spec_is_global_as_in_java(lake: Lake):
    """A v1 table's dropped partition field becomes a void transform; Java's PartitionSpec.isUnpartitioned
    is true for a spec of void fields only, so DeleteFileIndex applies its equality deletes to every data
    file (the spec's "unpartitioned spec"). Removing it as dangling after rewriting the void-spec files
    would bring back the rows it deletes in the older spec's files."""
    table = lake.catalog.create_table(
        "ns.t",
        schema=SCHEMA,
        partition_spec=BY_REGION,
        # the older spec's files stay (no old-spec rewrite), so the delete must stay for them
        properties={"format-version": "1", "compaction.rewrite-old-specs": "false"},
    )
    append_fragments(table, [batch(0, 50, "eu"), batch(50, 50, "us")])
    table = lake.table("ns.t")
    with table.update_spec() as update:
        update.remove_field("region")
    table = lake.table("ns.t")
    with table.transaction() as txn:
        txn.upgrade_table_version(2)
    table = lake.table("ns.t")
    void = table.spec()
    assert [f.transform for f in void.fields] == [VoidTransform()]
    append_fragments(table, [batch(100 + i * 50, 50, "eu") for i in range(6)])
    table = lake.table("ns.t")
    doomed = [3, 60, 120, 310]  # two rows of the old spec's files, two of the void spec's
    commit_delete_files(
        table, [equality_delete_file(table, void.spec_id, Record(None), ["id"], [{"id": i} for i in doomed])]
    )
    table = lake.table("ns.t")

    [eq] = [f for f in live_files(table) if f.is_delete]
    old = {f.path for f in live_files(table) if not f.is_delete and f.data_file.spec_id == 0}
    planned = DeleteMap.of(live_files(table), global_spec_ids(table.metadata.specs().values()))
    assert old <= planned.by_delete[eq.path]  # the planner sees it apply to the old spec's files too

    outcomes = lake.engine.compact("ns.t")

    assert any(o.status == "committed" for o in outcomes), [(o.partition_key, o.status, o.reason) for o in outcomes]
    after = lake.table("ns.t")
    old_spec = [f for f in live_files(after) if not f.is_delete and f.data_file.spec_id == 0]
    assert len(old_spec) == 2  # left alone (an older spec), holding rows 3 and 60
    assert kinds(after)["EQUALITY_DELETES"] == 1  # so the delete still applies to them


class _RowDelta(_AddDeleteFiles):
    """Data files and delete files in one snapshot (a Flink upsert checkpoint: equal sequence numbers)."""

    def __init__(self, data: list, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self._data = data

    def snapshot_summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        deletes = list(self.added_files)
        self.added_files.extend(self._data)  # pyiceberg's collector counts the data files too
        try:
            return super().snapshot_summary(snapshot_properties)
        finally:
            self.added_files[:] = deletes

    def manifests(self) -> list:
        manifests = super().manifests()
        metadata = self.table_metadata
        writer = write_manifest(
            format_version=2,
            spec=metadata.specs()[self._data[0].spec_id],
            schema=metadata.schema(),
            output_file=self.new_manifest_output(),
            snapshot_id=self.snapshot_id,
            avro_compression=self.compression,
        )
        with writer:
            for data_file in self._data:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED, snapshot_id=self.snapshot_id, data_file=data_file
                    )
                )
        return [*manifests, writer.to_manifest_file()]


def upsert(table, rows: pa.Table, deletes: list, own_positions: list[int] = ()) -> None:  # noqa: ANN001
    """Commit `rows` as new data files and `deletes` in one snapshot (with `own_positions`: also a
    position delete of those rows of the first new file, as Flink writes for a key updated twice)."""
    data = list(dataframe_to_data_files(table.metadata, rows, table.io))
    for data_file in data:
        data_file.spec_id = table.spec().spec_id
    if own_positions:
        paths = [data[0].file_path] * len(own_positions)
        deletes = [*deletes, position_delete_rows(table, data[0].spec_id, data[0].partition, paths, own_positions)]
    txn = table.transaction()
    producer = _RowDelta(data, operation=Operation.OVERWRITE, transaction=txn, io=table.io)
    for delete_file in deletes:
        producer.append_data_file(delete_file)
    with producer:
        pass
    txn.commit_transaction()


def test_an_upsert_keeps_the_rows_committed_with_its_equality_delete(lake: Lake):
    """Flink upserts: the equality delete and the new rows share a sequence number, so it deletes the
    old rows only. A rewrite must keep the new ones."""
    table = create_fragmented(lake, "ns.t", {"eu": 6})
    eu = data_of(table, "eu")
    new = batch(0, 5, "eu").set_column(2, "payload", pa.array([f"new-{i}" for i in range(5)]))
    upsert(table, new, [equality_delete_file(table, 0, eu[0].partition, ["id"], [{"id": i} for i in range(5)])])
    table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    assert sum(expected.values()) == 300 and sum(1 for r in expected if "new-" in str(r)) == 5

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed", outcome.reason
    after = lake.table("ns.t")
    assert rows(spec_rows, after) == expected


def test_converting_upsert_deletes_keeps_the_rows_committed_with_them(lake: Lake):
    table = create_fragmented(lake, "ns.t", {"eu": 3}, rows=2000)
    with table.transaction() as txn:  # files over the target: no size trigger
        txn.set_properties({"compaction.target-file-size-bytes": str(16 * 1024)})
    table = lake.table("ns.t")
    eu = data_of(table, "eu")
    for keys in ([1, 2], [2, 2500], [5999, 1]):  # each checkpoint: old rows deleted, new rows with the keys
        new = pa.concat_tables([batch(k, 1, "eu") for k in keys])
        new = new.set_column(2, "payload", pa.array([f"new-{k}" for k in keys]))
        upsert(table, new, [equality_delete_file(table, 0, eu[0].partition, ["id"], [{"id": k} for k in keys])])
        table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    [plan] = lake.engine.plan("ns.t").partitions
    assert plan.kind == Kind.CONVERT_EQUALITY_DELETES, plan.reason

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed", outcome.reason
    after = lake.table("ns.t")
    assert rows(spec_rows, after) == expected


def test_an_equality_delete_on_a_uuid_key_is_applied(tmp_path: Path):
    """CDC tables are often keyed on a uuid: pyiceberg reads it as Arrow's uuid extension type,
    which has no compute kernels of its own. The rewrite failed the group."""
    schema = Schema(NestedField(1, "id", UUIDType(), required=False), NestedField(2, "n", LongType(), required=False))
    path = str(tmp_path / "eq.parquet")
    keys = Schema(*schema.fields)
    one, two = uuid.UUID(int=1).bytes, uuid.UUID(int=2).bytes
    pq.write_table(pa.table([pa.array([one, None], pa.uuid()), pa.array([7, 8])], schema=schema_to_pyarrow(keys)), path)
    source = SimpleNamespace(path=str(tmp_path / "data.parquet"), deletes=[0])
    delete = SimpleNamespace(path=path, content=DataFileContent.EQUALITY_DELETES, equality_ids=[1, 2])
    deletes = GroupDeletes(PyArrowFileIO(), schema, None, [source], [delete])
    batch = pa.record_batch(
        [pa.array([one, one, two, None, None], pa.uuid()), pa.array([7, 8, 7, 8, 7])],
        schema=schema_to_pyarrow(schema),
    )

    kept = deletes.apply(source, 0, batch)

    assert kept.column("n").to_pylist() == [8, 7, 7]


def test_converting_an_equality_delete_on_nan_matches_every_nan(tmp_path: Path):
    """Java matches float keys with Double.compare: every NaN (whatever its payload bits) is one
    key; -0.0 is not 0.0. The rewrite path agrees; converting must delete the same rows."""
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "x", DoubleType(), required=False))
    table = catalog.create_table("ns.t", schema=schema)
    odd_nan = np.array([0x7FF8000000000001], dtype=np.uint64).view(np.float64)[0]
    values = [0.0, -0.0, float("nan"), odd_nan, 1.0, None]
    table.append(pa.table({"id": pa.array(range(6), pa.int64()), "x": pa.array(values, pa.float64())}))
    table.refresh()
    commit_delete_files(table, [equality_delete_file(table, 0, Record(), ["x"], [{"x": 0.0}, {"x": float("nan")}])])
    table.refresh()
    files = live_files(table)
    data = [f for f in files if not f.is_delete]
    eq = [f for f in files if f.is_delete]
    job = TierJob.convert(data, eq, f"{table.location()}/data", "convert")

    outcome = convert_equality_deletes(table.metadata, table.io, job, 1 << 27)

    [written] = outcome.delete_files
    with table.io.new_input(written.file_path).open() as stream:
        positions = pq.read_table(stream).column("pos").to_pylist()
    assert positions == [0, 2, 3]  # 0.0, NaN and the other NaN; not -0.0
    catalog.engine.dispose()


def test_converting_an_equality_delete_on_a_uuid_key(tmp_path: Path):
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    schema = Schema(NestedField(1, "id", UUIDType(), required=False), NestedField(2, "n", LongType(), required=False))
    table = catalog.create_table("ns.t", schema=schema)
    keys = [uuid.UUID(int=i).bytes for i in range(4)]
    table.append(
        pa.table([pa.array([*keys, None], pa.uuid()), pa.array(range(5), pa.int64())], schema=schema_to_pyarrow(schema))
    )
    table.refresh()
    commit_delete_files(table, [equality_delete_file(table, 0, Record(), ["id"], [{"id": keys[1]}, {"id": None}])])
    table.refresh()
    files = live_files(table)
    job = TierJob.convert(
        [f for f in files if not f.is_delete], [f for f in files if f.is_delete], f"{table.location()}/data", "c"
    )

    outcome = convert_equality_deletes(table.metadata, table.io, job, 1 << 27)

    [written] = outcome.delete_files
    with table.io.new_input(written.file_path).open() as stream:
        assert pq.read_table(stream).column("pos").to_pylist() == [1, 4]
    catalog.engine.dispose()


def _evolved(lake: Lake):  # noqa: ANN202
    """Created unpartitioned (spec 0), then partitioned by region: six small eu files, one us file."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA)
    with table.update_spec() as update:
        update.add_identity("region")
    table = lake.table("ns.t")
    append_fragments(table, [batch(i * 50, 50, "eu") for i in range(6)] + [batch(300, 50, "us")])
    return lake.table("ns.t")


def test_a_global_position_delete_naming_several_partitions_stays_for_the_files_left(lake: Lake):
    table = _evolved(lake)
    eu, us = data_of(table, "eu"), data_of(table, "us")
    paths = [eu[0].file_path, eu[2].file_path, us[0].file_path]
    written = position_delete_rows(table, 0, Record(), paths, [1, 2, 3])
    unbounded = DataFile.from_args(  # as a writer that kept no column metrics writes it
        content=written.content,
        file_path=written.file_path,
        file_format=written.file_format,
        partition=written.partition,
        record_count=written.record_count,
        file_size_in_bytes=written.file_size_in_bytes,
    )
    unbounded.spec_id = written.spec_id
    bounded = position_delete_rows(table, 0, Record(), [eu[1].file_path, us[0].file_path], [4, 5])
    commit_delete_files(table, [unbounded, bounded])
    table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    assert sum(expected.values()) == 350 - 5

    outcomes = {o.partition_key: o for o in lake.engine.compact("ns.t")}

    assert outcomes["region=eu"].status == "committed", outcomes["region=eu"].reason
    after = lake.table("ns.t")
    assert rows(spec_rows, after) == expected
    assert rows(duckdb_rows, after) == expected
    assert kinds(after)["POSITION_DELETES"] == 2  # both still name the us file


def test_combining_global_position_deletes_keeps_their_rows(lake: Lake):
    """Position-delete files of an older unpartitioned spec (global) that name one partition's files only."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA)
    with table.update_spec() as update:
        update.add_identity("region")
    table = lake.table("ns.t")
    append_fragments(table, [batch(i * 2000, 2000, "eu") for i in range(3)] + [batch(6000, 2000, "us")])
    table = lake.table("ns.t")
    with table.transaction() as txn:  # files over the target: no size trigger
        txn.set_properties(
            {"compaction.target-file-size-bytes": str(16 * 1024), "compaction.delete-file-threshold": "100"}
        )
    table = lake.table("ns.t")
    eu = data_of(table, "eu")
    for i in range(5):  # five commits, each a small global position delete naming eu files
        paths = [eu[i % 3].file_path, eu[(i + 1) % 3].file_path]
        commit_delete_files(table, [position_delete_rows(table, 0, Record(), paths, [i, i + 100])])
        table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    assert sum(expected.values()) == 8000 - 10

    assert all(o.kind is None for o in lake.engine.compact("ns.t"))  # never a tier: they are not eu's own

    after = lake.table("ns.t")
    assert rows(spec_rows, after) == expected
    assert rows(duckdb_rows, after) == expected


def test_a_position_delete_of_rows_committed_with_it_is_applied(lake: Lake):
    """Flink: a key inserted and updated again in one checkpoint gets a position delete naming the
    checkpoint's own data file (same sequence number: it applies)."""
    table = create_fragmented(lake, "ns.t", {"eu": 6})
    eu = data_of(table, "eu")
    new = pa.concat_tables([batch(0, 3, "eu"), batch(0, 3, "eu")])
    new = new.set_column(2, "payload", pa.array([f"v{i}" for i in range(6)]))
    eq = equality_delete_file(table, 0, eu[0].partition, ["id"], [{"id": i} for i in range(3)])
    upsert(table, new, [eq], own_positions=[0, 1, 2])  # the first versions of ids 0-2 are superseded
    table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    assert sum(expected.values()) == 300 and sum(1 for r in expected if "'v" in str(r)) == 3

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed", outcome.reason
    after = lake.table("ns.t")
    assert rows(spec_rows, after) == expected
    assert kinds(after) == Counter({"DATA": 1})


def test_a_global_delete_still_applying_to_a_file_in_a_restated_manifest_stays(lake: Lake):
    """eu's big file, left alone by the first compaction, is restated (EXISTING) in its manifest;
    the second compaction (us) must still see it when deciding that the global delete dangles."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA)
    with table.update_spec() as update:
        update.add_identity("region")
    table = lake.table("ns.t")
    eu = [batch(i * 50, 50, "eu") for i in range(6)]
    us = [batch(300 + i * 50, 50, "us") for i in range(6)]
    append_fragments(table, [*eu, batch(10_000, 10_000, "eu"), *us])
    table = lake.table("ns.t")
    doomed = [{"id": i} for i in (3, 10_001, 310)]
    commit_delete_files(table, [equality_delete_file(table, 0, Record(), ["id"], doomed)])
    table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    assert sum(expected.values()) == 10_600 - 3

    first = {o.partition_key: o for o in lake.engine.compact("ns.t", partition="region=eu")}
    second = {o.partition_key: o for o in lake.engine.compact("ns.t", partition="region=us")}

    assert first["region=eu"].status == "committed", first["region=eu"].reason
    assert second["region=us"].status == "committed", second["region=us"].reason
    after = lake.table("ns.t")
    assert rows(spec_rows, after) == expected
    assert kinds(after)["EQUALITY_DELETES"] == 1  # it still applies to eu's big file


def test_a_null_partition_with_both_kinds_of_deletes_and_null_keys(lake: Lake):
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    parts = []
    for i in range(6):
        part = batch(i * 50, 50, "x").set_column(1, "region", pa.nulls(50, pa.string()))
        payload = part.column("payload").to_pylist()
        payload[7] = None
        parts.append(part.set_column(2, "payload", pa.array(payload, pa.string())))
    append_fragments(table, parts)
    table = lake.table("ns.t")
    data = sorted((f.data_file for f in live_files(table) if not f.is_delete), key=lambda f: f.file_path)
    assert data[0].partition[0] is None
    commit_delete_files(table, [position_delete_rows(table, 0, data[0].partition, [data[1].file_path], [3])])
    table = lake.table("ns.t")
    keys = [
        {"region": None, "payload": None},
        {"region": None, "payload": f"{60:08d}-{(60 * 2654435761) % 2**32:010d}"},
    ]
    commit_delete_files(table, [equality_delete_file(table, 0, data[0].partition, ["region", "payload"], keys)])
    table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    assert sum(expected.values()) == 300 - 1 - 6 - 1

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "committed", outcome.reason
    after = lake.table("ns.t")
    assert rows(spec_rows, after) == expected
    assert kinds(after) == Counter({"DATA": 1})


def test_an_equality_delete_on_a_dropped_column_is_refused_at_planning(lake: Lake):
    """The rewrite cannot apply it (the key is gone from the current schema): the plan should say
    so instead of starting an attempt that fails on every run."""
    table = create_fragmented(lake, "ns.t", {"eu": 6})
    eu = data_of(table, "eu")
    commit_delete_files(table, [equality_delete_file(table, 0, eu[0].partition, ["amount"], [{"amount": 0.25}])])
    table = lake.table("ns.t")
    with table.update_schema() as update:
        update.delete_column("amount")
    table = lake.table("ns.t")

    [outcome] = lake.engine.compact("ns.t")

    assert outcome.status == "skipped", (outcome.status, outcome.reason)


def test_an_equality_delete_of_partition_zero_does_not_apply_to_partition_negative_zero():
    """Partitions x=0.0 and x=-0.0 are two (the planner groups by bits; Java compares with
    Double.compare): a delete of one must not delete rows of the other."""

    def entry(content: DataFileContent, value: float, path: str, seq: int) -> SimpleNamespace:
        data_file = DataFile.from_args(
            content=content,
            file_path=path,
            file_format=FileFormat.PARQUET,
            partition=Record(value),
            record_count=1,
            file_size_in_bytes=1,
        )
        data_file.spec_id = 0
        return SimpleNamespace(data_file=data_file, data_sequence_number=seq)

    eq = entry(DataFileContent.EQUALITY_DELETES, 0.0, "eq.parquet", 5)
    zero = entry(DataFileContent.DATA, 0.0, "zero.parquet", 1)
    negative_zero = entry(DataFileContent.DATA, -0.0, "negative-zero.parquet", 1)
    index = ApplyingDeletes([eq])

    assert index.for_data_file(zero) == [eq]
    assert index.for_data_file(negative_zero) == []


@pytest.mark.parametrize("crash_at", ["after_prepare", "after_iceberg_commit"])
def test_a_conversion_killed_before_or_after_its_commit_is_recovered(lake: Lake, crash_at: str):
    table = create_fragmented(lake, "ns.t", {"eu": 3}, rows=2000)
    with table.transaction() as txn:  # files over the target: no size trigger
        txn.set_properties({"compaction.target-file-size-bytes": str(16 * 1024)})
    table = lake.table("ns.t")
    eu = data_of(table, "eu")
    for ids in ([1, 2], [2500, 3000], [5999]):
        commit_delete_files(table, [equality_delete_file(table, 0, eu[0].partition, ["id"], [{"id": i} for i in ids])])
        table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    [plan] = lake.engine.plan("ns.t").partitions
    assert plan.kind == Kind.CONVERT_EQUALITY_DELETES, plan.reason

    assert lake.cli("compact", "ns.t", crash_at=crash_at).returncode == 137
    lake.engine.recover()

    after = lake.table("ns.t")
    assert rows(spec_rows, after) == expected
    assert rows(duckdb_rows, after) == expected
    outcomes = lake.engine.compact("ns.t")  # a second run: converts (again) or has nothing to do
    assert all(o.status in ("committed", "skipped") for o in outcomes), [(o.status, o.reason) for o in outcomes]
    assert rows(spec_rows, lake.table("ns.t")) == expected
