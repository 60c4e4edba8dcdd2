"""Format-version 3 tables are compacted (issue 34, part 4), keeping every row's row lineage, and what
does not handle v3 yet is refused with its reason (delete-file tiers, manifest rewrites). Tables
here are upgraded to v3 as Java does it (same manifests, metadata format-version 3 and next-row-id);
tests/interop/test_java_format_v3.py drives tables Iceberg Java wrote as v3, deletion vectors
included."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pyarrow.parquet as pq
import pytest
from dagster import build_sensor_context, instance_for_test
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyroaring import BitMap

from compaction_assets.commit.ledger import Status
from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions
from compaction_assets.defs.resources import CompactionResource
from compaction_assets.engine import TablePlan, begin
from compaction_assets.errors import InputFileError
from compaction_assets.execution.deletes import DV_MAGIC, _read_deletion_vector
from compaction_assets.execution.lineage import LAST_UPDATED_FIELD_ID, ROW_ID_FIELD_ID
from compaction_assets.execution.worker import DeleteSpec
from compaction_assets.lake.catalog import load_table
from compaction_assets.lake.delete_files import commit_delete_files, position_delete_file
from compaction_assets.lake.features import LINEAGE_NAME_REASON, V3_MANIFEST_REASON, V3_TIER_REASON
from compaction_assets.lake.files import live_files
from compaction_assets.planning.model import Kind
from compaction_assets.planning.planner import plan_table
from tests.conftest import create_fragmented, make_lake
from tests.lakekit.format_v3 import upgrade_to_v3


@pytest.fixture
def lake(tmp_path):
    with make_lake(tmp_path, spark=None) as lake:  # nothing here may start Spark
        yield lake


@pytest.fixture
def spark_lake(tmp_path, spark):
    with make_lake(tmp_path, spark) as lake:
        yield lake


def row_lineage(table) -> dict[int, tuple[int | None, int | None]]:
    """id -> (_row_id, _last_updated_sequence_number) as the spec has readers derive them: the file's
    column where not null, else first_row_id + position and the file's sequence number."""
    found = {}
    for f in live_files(table):
        if f.is_delete:
            continue
        with table.io.new_input(f.data_file.file_path).open() as stream:
            rows = pq.read_table(stream)
        by_id = {(c.metadata or {}).get(b"PARQUET:field_id"): c.name for c in rows.schema}
        ids = rows.column("id").to_pylist()
        ids_name, seqs_name = (by_id.get(str(i).encode()) for i in (ROW_ID_FIELD_ID, LAST_UPDATED_FIELD_ID))
        row_ids = rows.column(ids_name).to_pylist() if ids_name else [None] * len(ids)
        seqs = rows.column(seqs_name).to_pylist() if seqs_name else [None] * len(ids)
        for pos, (i, row_id, seq) in enumerate(zip(ids, row_ids, seqs, strict=True)):
            if row_id is None and f.first_row_id is not None:
                row_id = f.first_row_id + pos
            found[i] = (row_id, f.file_sequence_number if seq is None else seq)
    return found


def test_an_upgraded_v3_table_is_compacted_keeping_row_lineage(spark_lake):
    """Two compactions of a table upgraded to v3. The first commit's manifest list assigns row ids to
    every data manifest (the upgraded ones too, as the spec says); the second rewrites the other
    partition and merges the data manifests (the first's entries written again): every row keeps
    the row id and sequence number it had, the table's next-row-id stays above every id, and each
    snapshot says where its ids start."""
    lake = spark_lake
    create_fragmented(lake, "ns.t", {"eu": 8, "us": 8}, rows=20)
    table = upgrade_to_v3(lake, "ns.t")
    rows_before = sorted(r["id"] for r in table.scan().to_arrow().to_pylist())

    [eu] = [o for o in lake.engine.compact("ns.t", partition="region=eu") if o.status == "committed"]
    table = lake.table("ns.t")
    first = table.current_snapshot()
    assert first.summary.operation.value == "replace"
    # ids for our rows and for the upgraded manifests' still live rows, assigned by the manifest list
    assert first.first_row_id == 0 and first.added_rows >= 320
    assert table.metadata.next_row_id == first.added_rows
    lineage = row_lineage(table)
    assert sorted(lineage) == rows_before
    ids = [row_id for row_id, _ in lineage.values()]
    assert None not in ids and len(set(ids)) == len(ids) and max(ids) < table.metadata.next_row_id
    assert None not in [seq for _, seq in lineage.values()]

    with table.transaction() as txn:  # the second commit merges the data manifests (entries written again)
        txn.set_properties({"commit.manifest.min-count-to-merge": "2"})
    manifests_before = len(lake.table("ns.t").current_snapshot().manifests(table.io))
    [us] = [o for o in lake.engine.compact("ns.t") if o.status == "committed"]
    assert us.partition_key == "region=us"
    table = lake.table("ns.t")
    assert len(table.current_snapshot().manifests(table.io)) < manifests_before
    assert sorted(r["id"] for r in table.scan().to_arrow().to_pylist()) == rows_before
    assert row_lineage(table) == lineage  # both partitions: rewritten (us) and restated (eu)
    assert table.current_snapshot().first_row_id == first.added_rows
    assert table.metadata.next_row_id == first.added_rows + table.current_snapshot().added_rows
    assert len([f for f in live_files(table) if not f.is_delete]) == 2
    with open(table.metadata_location.removeprefix("file://")) as metadata:
        doc = json.load(metadata)
    assert doc["format-version"] == 3 and doc["next-row-id"] == table.metadata.next_row_id


def test_delete_tiers_and_manifest_rewrites_are_refused_on_v3_with_the_reason(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 3}, rows=20)
    eu = [f.data_file for f in live_files(table)]
    commit_delete_files(table, [position_delete_file(table, f, [0]) for f in eu])  # one per file
    with lake.table("ns.t").transaction() as txn:
        txn.set_properties({"compaction.position-delete-file-threshold": "2", "compaction.min-input-files": "100"})
    table = upgrade_to_v3(lake, "ns.t")

    [plan] = lake.engine.plan("ns.t").partitions

    assert plan.kind is None
    assert f"{Kind.REWRITE_POSITION_DELETES} not run: {V3_TIER_REASON}" in plan.reason
    assert lake.engine.plan("ns.t").manifests.reason.startswith(V3_MANIFEST_REASON)
    report = lake.engine.rewrite_manifests("ns.t")
    assert report.status == "skipped" and report.reason.startswith(V3_MANIFEST_REASON)


def test_a_v3_table_with_a_column_named_like_a_lineage_column_is_refused_with_the_reason(lake):
    """A rewrite writes row lineage as `_row_id` / `_last_updated_sequence_number`: a user column of
    that name made every Spark job of such a table fail (outside attack on issue 34); now refused."""
    create_fragmented(lake, "ns.t", {"eu": 4}, rows=10)
    with lake.table("ns.t").update_schema() as update:
        update.rename_column("payload", "_row_id")
    upgrade_to_v3(lake, "ns.t")

    [plan] = lake.engine.plan("ns.t").partitions

    assert plan.kind is None and LINEAGE_NAME_REASON.format(columns="_row_id") in plan.reason, plan.reason
    assert [o.status for o in lake.engine.compact("ns.t")] in ([], ["skipped"])
    assert len(live_files(lake.table("ns.t"))) == 4


def test_pause_resume_and_gc_commit_v3_metadata(lake):
    """pyiceberg 0.12 cannot write v3 metadata ("Writing V3 is not yet supported"): each of these
    failed on a v3 table before; now each commits v3 metadata that keeps next-row-id."""
    create_fragmented(lake, "ns.t", {"eu": 3}, rows=10)
    upgrade_to_v3(lake, "ns.t")
    for command in (["pause", "ns.t"], ["resume", "ns.t"], ["gc", "ns.t"]):
        done = lake.cli(*command)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    table = lake.table("ns.t")
    assert table.properties["compaction.enabled"] == "true"
    assert table.format_version == 3 and table.metadata.next_row_id == 0


def test_sensor_requests_a_run_for_a_v3_table(lake):
    create_fragmented(lake, "ns.t", {"eu": 10})
    upgrade_to_v3(lake, "ns.t")
    defs = build_definitions(load_config(lake.config_path))
    with instance_for_test() as instance:
        context = build_sensor_context(
            instance=instance,
            definitions=defs,
            resources={"compaction": CompactionResource(config_path=str(lake.config_path))},
        )
        result = defs.get_sensor_def("fragmentation_sensor")(context)
    assert [r.tags["compaction/table"] for r in result.run_requests] == ["ns.t"]


def test_a_failure_after_attempts_began_abandons_them(lake, monkeypatch):
    """The job cannot be built (here: the table metadata cannot be serialised for the workers): the
    attempt already begun for each partition ends FAILED with the error, none stays EXECUTING."""
    create_fragmented(lake, "ns.t", {"eu": 10, "us": 10})
    table = lake.table("ns.t")
    engine = lake.engine
    policy = engine.policy(table, "ns.t")
    plans = plan_table(live_files(table), policy, table.spec().spec_id)
    tplan = TablePlan("ns.t", table.current_snapshot().snapshot_id, policy, plans)
    files = {f.path: f for f in live_files(table)}

    def unserialisable(table):
        raise NotImplementedError("cannot serialise this metadata")

    monkeypatch.setattr("compaction_assets.execution.job.slim_metadata_json", unserialisable)
    with pytest.raises(NotImplementedError):
        begin.begin(
            engine.ledger,
            engine.config,
            load_table(engine.catalog, "ns.t"),
            "ns.t",
            tplan,
            files,
            tplan.to_compact,
            (None, len(tplan.to_compact)),
        )

    attempts = engine.ledger.attempts()
    assert len(attempts) == 2
    assert all(a.status == Status.FAILED and "could not start the rewrite" in a.reason for a in attempts)


def deletion_vector_blob(positions: list[int]) -> bytes:
    """A `deletion-vector-v1` blob as the spec (and Java) writes it."""
    by_key: dict[int, list[int]] = {}
    for p in positions:
        by_key.setdefault(p >> 32, []).append(p & 0xFFFFFFFF)
    vector = len(by_key).to_bytes(8, "little")
    for key in sorted(by_key):
        vector += key.to_bytes(4, "little") + BitMap(by_key[key]).serialize()
    body = DV_MAGIC + vector
    return len(body).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")


def test_a_deletion_vector_is_read_from_its_blob_and_checked(tmp_path):
    positions = [0, 3, 4, 99, 2**32 + 7]
    blob = deletion_vector_blob(positions)
    puffin = tmp_path / "dv.puffin"
    puffin.write_bytes(b"PFA1" + blob + b"trailing footer bytes")
    io = PyArrowFileIO()

    def spec(**changes) -> DeleteSpec:
        fields = dict(
            path=str(puffin),
            content=1,
            size=puffin.stat().st_size,
            records=len(positions),
            content_offset=4,
            content_size_in_bytes=len(blob),
            referenced_data_file="data.parquet",
        )
        return DeleteSpec(**{**fields, **changes})

    assert list(_read_deletion_vector(io, spec())) == positions
    assert _read_deletion_vector(io, spec()).dtype == np.int64
    with pytest.raises(InputFileError, match="entry says 4"):
        _read_deletion_vector(io, spec(records=4))
    with pytest.raises(InputFileError, match="no deletion-vector-v1 blob"):
        _read_deletion_vector(io, spec(content_offset=5))
    corrupt = bytearray(blob)
    corrupt[-6] ^= 0xFF
    puffin.write_bytes(b"PFA1" + bytes(corrupt))
    with pytest.raises(InputFileError, match="CRC"):
        _read_deletion_vector(io, spec())
