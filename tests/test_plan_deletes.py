"""Delete-aware planning on real tables: real Parquet data files, real position- and equality-delete
files committed into real delete manifests (compaction_assets.lake.delete_files, as another engine
would), a real SQLite catalog and ledger. No Spark: the plan and the rewrite job the driver builds
from it are inspected (which deletes each source must have applied, by the spec's rule)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.typedef import Record

from compaction_assets.cli import main
from compaction_assets.commit.ledger import Status
from compaction_assets.engine import begin, run
from compaction_assets.engine.begin import Work
from compaction_assets.execution.worker import GroupOutcome, RewriteJob
from compaction_assets.lake.delete_files import commit_delete_files, equality_delete_file, position_delete_file
from compaction_assets.lake.files import live_files
from compaction_assets.planning.model import Kind
from compaction_tools.demo import append_fragments
from tests.conftest import SCHEMA, Lake, batch, create_fragmented, make_lake
from tests.foreign_deletes import commit_deletes, position_delete


@pytest.fixture
def lake(tmp_path: Path) -> Iterator[Lake]:
    with make_lake(tmp_path, spark=None) as lake:  # planning and job building need no Spark
        yield lake


def region_files(table, region: str) -> list[DataFile]:
    key = f"region={region}"
    data = (f.data_file for f in live_files(table) if f.partition_key == key and not f.is_delete)
    return sorted(data, key=lambda f: f.file_path)


def build_job(lake: Lake, name: str) -> tuple[RewriteJob, list[Work]]:
    """The rewrite job Engine.compact would hand to Spark (its attempts begun in the ledger)."""
    engine = lake.engine
    table = lake.table(name)
    tplan, files = engine._plan(table, name, None)
    work: list[Work] = []
    todo = [p for p in tplan.to_compact if not p.is_tier]
    return begin.build_job(
        engine.ledger, engine.config, table, name, tplan, files, todo, (None, len(todo)), work, []
    ), work


def group_of(job: RewriteJob, path: str):
    [group] = [g for g in job.groups if any(s.path == path for s in g.sources)]
    return group


def test_position_and_equality_deletes_are_planned_and_listed_per_source(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 10, "asia": 2})
    eu, asia = region_files(table, "eu"), region_files(table, "asia")
    commit_delete_files(table, [position_delete_file(table, eu[0], [0, 1, 2])])
    table = lake.table("ns.t")
    # 30 of asia's 100 rows: ratio 0.3 passes delete-ratio-threshold=0.2 (its 2 files are too few to compact)
    doomed = [{"id": i} for i in range(500, 530)]
    commit_delete_files(table, [equality_delete_file(table, 0, asia[0].partition, ["id"], doomed)])
    table = lake.table("ns.t")
    append_fragments(table, [batch(10_000, 50, "asia")])  # after the equality delete: it does not apply here
    table = lake.table("ns.t")
    late = next(f for f in region_files(table, "asia") if f.file_path not in {a.file_path for a in asia})

    plan = {p.partition_key: p for p in lake.engine.plan("ns.t").partitions}

    eu_plan, asia_plan = plan["region=eu"], plan["region=asia"]
    assert eu_plan.kind == Kind.MINOR and len(eu_plan.source_paths) == 10
    assert (eu_plan.stats.position_delete_files, eu_plan.stats.deleted_rows) == (1, 3)
    assert "1 position-delete and 0 equality-delete file(s) apply to 1 of 10 data file(s)" in eu_plan.reason
    assert asia_plan.kind == Kind.MAJOR
    assert (asia_plan.stats.equality_delete_files, asia_plan.stats.data_files_with_deletes) == (1, 2)
    assert asia_plan.stats.delete_ratio == pytest.approx(30 / 150)
    assert "delete-ratio-threshold=0.2" in asia_plan.reason
    assert sorted(asia_plan.source_paths) == sorted([*(f.file_path for f in asia), late.file_path])  # + fragment

    job, work = build_job(lake, "ns.t")

    eu_group = group_of(job, eu[0].file_path)
    [pos] = eu_group.deletes
    assert (pos.content, pos.records, pos.equality_ids) == (int(DataFileContent.POSITION_DELETES), 3, None)
    assert {s.path: s.deletes for s in eu_group.sources}[eu[0].file_path] == [0]
    assert all(not s.deletes for s in eu_group.sources if s.path != eu[0].file_path)
    assert eu_group.polars is True  # the Polars path applies deletes too (polars_deletes)
    asia_group = group_of(job, asia[0].file_path)
    [eq] = asia_group.deletes
    assert (eq.content, eq.records, eq.equality_ids) == (int(DataFileContent.EQUALITY_DELETES), 30, [1])
    assert {s.path: s.deletes for s in asia_group.sources} == {
        asia[0].file_path: [0],
        asia[1].file_path: [0],
        late.file_path: [],  # data sequence number not below the delete's
    }
    assert sorted(len(w.deletes) for w in work) == [1, 1]
    assert RewriteJob.from_json(job.to_json()) == job  # what the workers receive


def test_file_scoped_position_deletes_count_for_their_file_only(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 3, "us": 3})
    eu = region_files(table, "eu")
    commit_delete_files(table, [position_delete_file(table, eu[0], [i]) for i in range(5)])  # 5 on one file

    plans = {p.partition_key: p for p in lake.engine.plan("ns.t").partitions}

    eu_plan = plans["region=eu"]
    assert eu_plan.kind == Kind.MAJOR  # delete-file-threshold=5 fired; its 2 fragments packed along
    assert "1 file(s) with >= delete-file-threshold=5 delete files" in eu_plan.reason
    assert sorted(eu_plan.source_paths) == sorted(f.file_path for f in eu)
    assert plans["region=us"].kind is None and "deletes: none apply" in plans["region=us"].reason

    job, _ = build_job(lake, "ns.t")
    [group] = job.groups
    assert len(group.deletes) == 5
    assert {s.path: s.deletes for s in group.sources} == {
        eu[0].file_path: [0, 1, 2, 3, 4],
        eu[1].file_path: [],
        eu[2].file_path: [],
    }


def big_files_table(lake: Lake, files: int):
    """A table whose data files are over its target size (16 KiB): no size trigger picks them; its
    delete files are small beside it."""
    table = create_fragmented(lake, "ns.t", {"eu": files}, rows=2000)
    with table.transaction() as txn:
        txn.set_properties({"compaction.target-file-size-bytes": str(16 * 1024)})
    table = lake.table("ns.t")
    assert all(f.size > 16 * 1024 for f in live_files(table))
    return table


def test_equality_deletes_are_converted_when_the_tier_is_cheaper(lake):
    table = big_files_table(lake, 3)
    eu = region_files(table, "eu")
    for i in range(3):  # three commits: each delete applies to every file (3 < delete-file-threshold)
        commit_delete_files(table, [equality_delete_file(table, 0, eu[0].partition, ["id"], [{"id": i}])])
        table = lake.table("ns.t")

    [plan] = lake.engine.plan("ns.t").partitions

    assert plan.kind == Kind.CONVERT_EQUALITY_DELETES and plan.groups == ()
    deletes = sorted(f.path for f in live_files(table) if f.is_delete)
    assert sorted(plan.delete_paths) == deletes
    assert plan.covered_data_paths == tuple(f.file_path for f in eu)
    assert "equality-delete-file-threshold=3" in plan.reason


def test_small_position_delete_files_are_combined_when_no_rewrite_is_due(lake):
    table = big_files_table(lake, 5)
    eu = region_files(table, "eu")
    commit_delete_files(table, [position_delete_file(table, f, [0]) for f in eu])  # one per file

    [plan] = lake.engine.plan("ns.t").partitions

    assert plan.kind == Kind.REWRITE_POSITION_DELETES
    assert len(plan.delete_paths) == 5 and plan.covered_data_paths == tuple(f.file_path for f in eu)
    assert "position-delete-file-threshold=5" in plan.reason

    with lake.table("ns.t").transaction() as txn:  # a table property raises the bar
        txn.set_properties({"compaction.position-delete-file-threshold": "6"})
    [plan] = lake.engine.plan("ns.t").partitions
    assert plan.kind is None and "fewer than position-delete-file-threshold=6" in plan.reason


# Moved from test_rewrite_commit.py, where they asserted the old "left alone" rule.
def test_a_global_delete_file_applies_to_every_partition_and_the_rewrite_lists_it(lake):
    """A delete file of an unpartitioned spec applies to the data files of every partition."""
    table = lake.catalog.create_table("ns.t", schema=SCHEMA)  # spec 0: unpartitioned
    with table.update_spec() as update:
        update.add_identity("region")  # spec 1
    table = lake.table("ns.t")
    append_fragments(table, [batch(i * 50, 50, "eu") for i in range(10)])
    table = lake.table("ns.t")
    commit_deletes(table, [position_delete(table, region_files(table, "eu")[0], [0], spec_id=0, partition=Record())])

    plan = lake.engine.plan("ns.t")

    [eu] = plan.to_compact
    assert eu.partition_key == "region=eu" and eu.kind == Kind.MINOR
    assert (eu.stats.position_delete_files, eu.stats.data_files_with_deletes) == (1, 10)  # no bounds: every file
    job, _ = build_job(lake, "ns.t")
    [group] = job.groups
    assert len(group.deletes) == 1 and all(s.deletes == [0] for s in group.sources)


def test_a_delete_file_of_another_spec_with_an_equal_partition_tuple_does_not_apply(lake):
    """The spec's exact rule: same spec id and tuple (the commit's conflict check stays wider)."""
    table = create_fragmented(lake, "ns.t", {"eu": 10})
    with table.update_spec() as update:
        update.rename_field("region", "reg")  # spec 1: same tuple, key "reg=eu"
    table = lake.table("ns.t")
    victim = sorted((f.data_file for f in live_files(table)), key=lambda f: f.file_path)[0]
    commit_deletes(table, [position_delete(table, victim, [0], spec_id=1, partition=Record("eu"))])

    plan = lake.engine.plan("ns.t")

    [eu] = plan.to_compact  # files of the older spec: rewritten into the current one, which has no deletes
    assert eu.partition_key == "spec-0:region=eu" and eu.kind == Kind.OLD_SPEC
    assert eu.stats.applying_delete_files == 0 and "deletes: none apply" in eu.reason


def test_a_file_scoped_position_delete_is_applied_and_the_other_partitions_compact_as_before(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 10, "us": 10})
    victim = region_files(table, "eu")[0]
    commit_deletes(table, [position_delete(table, victim, [0], referenced=True)])

    plan = lake.engine.plan("ns.t")

    assert sorted(p.partition_key for p in plan.to_compact) == ["region=eu", "region=us"]
    by_key = {p.partition_key: p for p in plan.partitions}
    assert by_key["region=eu"].stats.data_files_with_deletes == 1
    assert by_key["region=us"].stats.applying_delete_files == 0
    job, _ = build_job(lake, "ns.t")
    assert [s.path for g in job.groups for s in g.sources if s.deletes] == [victim.file_path]


def test_plan_command_prints_the_delete_load(lake):
    table = create_fragmented(lake, "ns.t", {"eu": 10, "us": 3})
    us = region_files(table, "us")
    commit_delete_files(table, [equality_delete_file(table, 0, us[0].partition, ["id"], [{"id": 500}, {"id": 501}])])

    shown = CliRunner().invoke(main, ["plan", "ns.t"], env={"COMPACTION_CONFIG": str(lake.config_path)})

    assert shown.exit_code == 0, shown.output
    header = next(line for line in shown.output.splitlines() if line.startswith("partition"))
    assert header.split()[:11] == [
        "partition", "files", "bytes", "frag", "under", "posdel", "eqdel", "deleted", "ratio", "amp", "plan",
    ]  # fmt: skip
    us_line = next(line for line in shown.output.splitlines() if line.startswith("region=us"))
    assert us_line.split()[5:10] == ["0", "1", "2", "0.01", "1.03"]
    assert "1 equality-delete file(s) apply to 3 of 3 data file(s)" in us_line
    doc = json.loads(
        CliRunner().invoke(main, ["plan", "ns.t", "--json"], env={"COMPACTION_CONFIG": str(lake.config_path)}).output
    )
    [us_doc] = [p for p in doc["partitions"] if p["partition"] == "region=us"]
    assert (us_doc["stats"]["equality_delete_files"], us_doc["stats"]["deleted_rows"]) == (1, 2)


@pytest.mark.parametrize(
    ("rows_read", "rows_deleted", "reason"),
    [
        pytest.param(
            299, 0, "row count mismatch: the sources hold 300 rows to read, read 299", id="a source read short"
        ),
        pytest.param(
            300,
            3,
            "row count mismatch: read 300 rows, deletes removed 3, expiration dropped 0, wrote 0",
            id="written != live",
        ),
    ],
)
def test_prepare_checks_rows_read_and_rows_written_against_the_deletes(lake, rows_read, rows_deleted, reason):
    """The driver's check of what a worker reports (a stand-in GroupOutcome here; the worker's own
    tests cover what it writes): the attempt fails and ends FAILED with the reason."""
    table = create_fragmented(lake, "ns.t", {"eu": 6})
    commit_delete_files(table, [position_delete_file(table, region_files(table, "eu")[0], [0, 1, 2])])
    job, [item] = build_job(lake, "ns.t")
    [group] = job.groups
    assert sum(s.records for s in group.sources) == item.attempt.rows_in == 300

    outcome = run.prepare(
        lake.table("ns.t"),
        lake.engine.ledger,
        item,
        [GroupOutcome(0, [], None, rows_read, 0, rows_deleted=rows_deleted)],
    )

    assert (outcome.status, outcome.reason) == ("failed", reason)
    assert (outcome.deletes_applied, outcome.rows_deleted, outcome.delete_files_removed) == (1, rows_deleted, 0)
    [attempt] = lake.engine.ledger.attempts(table_name="ns.t")
    assert (attempt.status, attempt.reason) == (Status.FAILED, reason)
