"""Data expiration (issue 20) on real tables: pyiceberg appends, the engine's plan, Spark's rewrite,
the two-phase commit, recovery; every table read back by pyiceberg and DuckDB against the rows
written minus exactly those past retention. `now` is the engine's clock, not the system's."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse

import pytest
from dagster import instance_for_test
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table.snapshots import Operation
from pyiceberg.typedef import Record
from pyiceberg.types import LongType
from sqlalchemy import update
from sqlalchemy.orm import Session

from compaction_assets import faults
from compaction_assets.commit.consistency import check_partitions
from compaction_assets.commit.ledger import AttemptRow, Status
from compaction_assets.commit.recovery import recover
from compaction_assets.commit.two_phase import ATTEMPT_ID_PROPERTY, TASK_ID_PROPERTY
from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions, table_job
from compaction_assets.defs.naming import op_name
from compaction_assets.errors import ConfigError
from compaction_assets.lake.appends import append_fragments
from compaction_assets.planning.expiration import ExpireRule, Verdict
from compaction_assets.planning.planner import EXPIRE_BENEFIT, Kind
from compaction_assets.planning.tick import EXPIRE_REPLAN_SECONDS
from tests.lakekit.expiry import (
    CUTOFF,
    DAY,
    EXPIRE,
    MIXED,
    NEW,
    NOW_MS,
    OLD,
    Writer,
    make_table,
    read,
    read_duckdb,
)
from tests.lakekit.oracle import row_key
from tests.lakekit.sensor_ticks import tick


def no_spark():
    raise AssertionError("a metadata-only expiration must not start Spark")


def test_the_plan_decides_each_file_from_its_bounds_and_null_count(lake, clocked):
    writer = Writer()
    table = make_table(lake, writer, MIXED)
    files = {f["file_path"]: f for f in table.inspect.files().to_pylist()}
    by_first_id = {f["readable_metrics"]["id"]["lower_bound"]: p for p, f in files.items()}

    plans = {p.partition_key: p for p in clocked().plan("ns.ev").partitions}

    old, mixed, new = plans["region=old"], plans["region=mixed"], plans["region=new"]
    assert old.kind == Kind.EXPIRE and not old.groups and len(old.drop_paths) == 3
    assert "whole partition past retention" in old.reason and old.expired_rows == 5
    assert mixed.kind == Kind.EXPIRE
    first = {n: by_first_id[n] for n in (6, 8, 12, 14)}  # first ids of the mixed files, in order
    assert mixed.drop_paths == (first[6],)
    assert sorted(mixed.source_paths) == sorted([first[6], first[8], first[14]])  # the NEW-only file is kept
    assert "1 file(s) (2 rows) dropped by metadata; 2 file(s) (7 rows, ~" in mixed.reason
    assert "ts < 2024-05-31T00:00:00.000+00:00 (now - retention 86400000 ms)" in mixed.reason
    assert new.kind is None and "ts <" not in new.reason
    assert old.benefit > EXPIRE_BENEFIT and mixed.benefit > EXPIRE_BENEFIT  # ahead of any fragmentation
    assert [p.partition_key for p in clocked().plan("ns.ev").to_compact][:2] in (
        ["region=old", "region=mixed"],
        ["region=mixed", "region=old"],
    )


def test_whole_files_go_unread_the_rest_is_rewritten_and_nulls_stay(lake, clocked):
    writer = Writer()
    table = make_table(lake, writer, MIXED)
    tplan = clocked().plan("ns.ev")
    dropped = [path for p in tplan.partitions for path in p.drop_paths]
    assert len(dropped) == 4
    for path in dropped:  # nothing may read them: reading a missing file fails the rewrite
        Path(urlparse(path).path).unlink()
    parent = table.current_snapshot().snapshot_id

    outcomes = {o.partition_key: o for o in clocked().compact("ns.ev")}

    old, mixed = outcomes["region=old"], outcomes["region=mixed"]
    assert (old.status, old.kind, old.files_dropped, old.rows_expired, old.groups) == ("committed", "expire", 3, 5, 0)
    assert (mixed.status, mixed.kind, mixed.files_dropped) == ("committed", "expire", 1), mixed.reason
    assert mixed.rows_expired == 2 + 2 + 2 and mixed.files_after == 2  # the kept file and one rewritten
    assert outcomes["region=new"].status == "skipped"
    after = lake.table("ns.ev")
    assert read(after) == writer.kept() and read_duckdb(after) == writer.kept()
    assert sum(writer.kept().values()) == len(writer.rows) - 11
    snapshot = after.current_snapshot()
    assert snapshot.parent_snapshot_id == parent  # both partitions in one commit
    assert snapshot.summary.operation == Operation.OVERWRITE
    attempts = lake.engine.ledger.attempts(table_name="ns.ev")
    assert {a.status for a in attempts} == {Status.COMMITTED} and len(attempts) == 2
    assert set(snapshot.summary[ATTEMPT_ID_PROPERTY].split(",")) == {a.attempt_id for a in attempts}
    assert set(snapshot.summary[TASK_ID_PROPERTY].split(",")) == {a.task_id for a in attempts}
    assert sorted((a.rows_in, a.rows_out, a.rows_expired) for a in attempts) == [(5, 0, 5), (9, 3, 6)]
    assert int(snapshot.summary["deleted-records"]) - int(snapshot.summary["added-records"]) == 11
    tasks = {a.partition_key: a.task_id for a in attempts}
    assert all(r.passed for r in check_partitions(after, lake.engine.ledger, tasks, 60).values())
    assert clocked().plan("ns.ev").to_compact == []  # nothing left past retention


def test_an_expiration_that_only_drops_files_is_a_delete_snapshot_without_spark(lake, clocked):
    writer = Writer()
    make_table(lake, writer, {"old": MIXED["old"], "new": MIXED["new"]})

    [old] = [o for o in clocked(spark=no_spark).compact("ns.ev") if o.status != "skipped"]

    assert (old.status, old.partition_key, old.rows_expired) == ("committed", "region=old", 5)
    after = lake.table("ns.ev")
    assert after.current_snapshot().summary.operation == Operation.DELETE
    assert read(after) == writer.kept() and read_duckdb(after) == writer.kept()


def test_rows_appended_while_it_runs_are_kept_even_past_retention(lake, clocked):
    writer = Writer()
    make_table(lake, writer, MIXED)
    late = []

    def append_old_rows() -> None:  # another writer commits between our precommit and commit
        late.extend(writer.files("mixed", [OLD - DAY, OLD]) + writer.files("old", [OLD]))
        append_fragments(lake.table("ns.ev"), late)

    faults.arm("after_prepare", append_old_rows)
    try:
        outcomes = clocked().compact("ns.ev")
    finally:
        faults.disarm()

    assert late and {o.status for o in outcomes} == {"committed", "skipped"}
    late_ids = {r["id"] for t in late for r in t.to_pylist()}
    expected = writer.kept() + Counter(row_key(r) for r in writer.rows if r["id"] in late_ids)
    after = lake.table("ns.ev")
    assert read(after) == expected and read_duckdb(after) == expected
    assert clocked().plan("ns.ev").to_compact  # they expire with the next run


@pytest.mark.parametrize(("region", "operation"), [("old", Operation.DELETE), ("mixed", Operation.OVERWRITE)])
def test_a_crash_between_prepare_and_commit_is_recommitted_with_its_operation(lake, region, operation, clocked):
    writer = Writer()
    make_table(lake, writer, {region: MIXED[region]})
    faults.arm("after_prepare")
    try:
        with pytest.raises(faults.InjectedCrash):
            clocked().compact("ns.ev")
    finally:
        faults.disarm()
    assert lake.engine.ledger.counts() == {"PREPARED": 1}
    assert read(lake.table("ns.ev")) == Counter(row_key(r) for r in writer.rows)  # nothing changed yet

    report = recover(lake.catalog, lake.engine.ledger, 0)

    assert len(report.recommitted) == 1 and not report.errors
    after = lake.table("ns.ev")
    [attempt] = lake.engine.ledger.attempts(table_name="ns.ev")
    assert (attempt.status, attempt.rows_expired) == (Status.COMMITTED, len(writer.rows) - sum(writer.kept().values()))
    summary = after.current_snapshot().summary
    assert summary.operation == operation
    assert (summary[ATTEMPT_ID_PROPERTY], summary[TASK_ID_PROPERTY]) == (attempt.attempt_id, attempt.task_id)
    assert read(after) == writer.kept() and read_duckdb(after) == writer.kept()
    report = check_partitions(after, lake.engine.ledger, {attempt.partition_key: attempt.task_id}, 60)
    assert all(r.passed for r in report.values()), report


BASE_MS = int(datetime(CUTOFF.year, CUTOFF.month, CUTOFF.day, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("column", "cutoff", "clock_ms"),
    [
        ("ts_local", CUTOFF.replace(tzinfo=None), NOW_MS),
        ("day", CUTOFF.date(), NOW_MS + 12 * 3_600_000),  # the cutoff's own day is kept: not wholly passed
        ("ms", int(CUTOFF.timestamp() * 1000), NOW_MS),
        ("ms_int", 0, NOW_MS - BASE_MS),  # epoch millis that fit an int: the clock moved back to match
    ],
)
def test_each_accepted_type_is_compared_in_its_own_unit(lake, column, cutoff, clock_ms, clocked):
    writer = Writer()
    layout = {"mixed": [[OLD - DAY, OLD], [OLD - 2 * DAY, NEW, None, OLD + timedelta(hours=4)]]}
    make_table(lake, writer, layout, **{**EXPIRE, "compaction.expire.field": column})
    [outcome] = clocked(now_ms=clock_ms).compact("ns.ev")

    assert outcome.status == "committed" and outcome.kind == "expire", outcome.reason
    expected = writer.kept(column, cutoff)
    assert read(lake.table("ns.ev")) == expected and read_duckdb(lake.table("ns.ev")) == expected
    assert outcome.rows_expired == len(writer.rows) - sum(expected.values()) > 0


def test_a_column_of_another_type_is_a_config_error_naming_table_and_column(lake, clocked):
    make_table(
        lake, Writer(), {"new": [[NEW]]}, **{"compaction.expire.field": "region", "compaction.expire.retention-ms": "1"}
    )
    with pytest.raises(ConfigError, match=r"table 'ns.ev': compaction.expire.field='region' names a string column"):
        clocked().plan("ns.ev")


def test_a_renamed_column_is_followed_by_field_id_and_a_missing_one_stops_only_this_tier(lake, clocked):
    writer = Writer()
    table = make_table(lake, writer, {"old": MIXED["old"], "many": [[NEW]] * 6, "both": [[OLD]] + [[NEW]] * 5})
    with table.update_schema() as update:
        update.rename_column("ts", "event_ts")

    plans = {p.partition_key: p for p in clocked().plan("ns.ev").partitions}
    assert "column 'ts' (compaction.expire.field) is not in the current schema" in plans["region=old"].reason
    assert plans["region=old"].kind is None
    assert plans["region=many"].kind == plans["region=both"].kind == Kind.MINOR  # the other kinds plan as usual

    with lake.table("ns.ev").transaction() as txn:
        txn.set_properties({"compaction.expire.field": "event_ts"})
    plans = {p.partition_key: p for p in clocked().plan("ns.ev").partitions}
    assert plans["region=old"].kind == Kind.EXPIRE and len(plans["region=old"].drop_paths) == 3
    assert plans["region=both"].kind == Kind.EXPIRE  # first in precedence: its fragments wait for the next run
    assert plans["region=many"].kind == Kind.MINOR


def test_plan_and_expire_dry_run_show_what_would_go_and_expire_runs_only_that(lake):
    """The real command, in its own process, on the system clock: rows a week old go."""
    writer = Writer()
    week_ago = datetime.now(UTC) - timedelta(days=7)
    layout = {
        "old": [[week_ago], [week_ago - DAY]],
        "mixed": [[week_ago, datetime.now(UTC) + DAY]],
        "many": [[datetime.now(UTC) + DAY]] * 6,
    }
    make_table(lake, writer, layout)

    plan = lake.cli("plan", "ns.ev")
    assert plan.returncode == 0, plan.stderr
    assert "expire ~2 row(s): 2 file(s) dropped unread, 0 file(s) rewritten" in plan.stdout
    assert "whole partition past retention" in plan.stdout
    assert "data expiration: expires rows where ts < " in plan.stdout
    # the straddling file's expired rows are estimated from its bounds: 3/4 of [week ago, tomorrow]
    assert "expire ~2 row(s): 0 file(s) dropped unread, 1 file(s) rewritten in 1 group(s)" in plan.stdout
    dry = lake.cli("expire", "ns.ev", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would expire rows where ts < " in dry.stdout and "(now - retention 86400000 ms)" in dry.stdout
    assert dry.stdout.count("  drop     ") == 2 and dry.stdout.count("  rewrite  ") == 1
    assert "2 of 3 partition(s) to expire, ~4 row(s) (estimated)" in dry.stdout
    assert len(lake.table("ns.ev").snapshots()) == 1  # the dry run changed nothing

    ran = lake.cli("expire", "ns.ev", "--partition", "region=old")
    assert ran.returncode == 0, ran.stderr
    assert "ns.ev [region=old]: committed expire" in ran.stdout and "2 row(s) past retention expired" in ran.stdout
    after = lake.table("ns.ev")
    assert after.current_snapshot().summary.operation == Operation.DELETE
    assert len(after.inspect.files()) == 1 + 6  # mixed and many untouched: only the expiration ran


def test_the_asset_reports_kind_expire_its_check_passes_and_still_catches_a_row_lost(lake):
    """Materialising a partition runs its expiration (the system clock: rows a week old go); the
    blocking check passes on the ledger's accounting, and fails once a row is unaccounted for."""
    writer = Writer()
    week_ago, tomorrow = datetime.now(UTC) - timedelta(days=7), datetime.now(UTC) + DAY
    make_table(lake, writer, {"mixed": [[week_ago], [week_ago, None, tomorrow]]})
    defs = build_definitions(load_config(lake.config_path))
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("lake__ns__ev", ["region=mixed"])
        result = table_job(defs, "ns.ev").execute_in_process(instance=instance, partition_key="region=mixed")

    assert result.success
    [event] = result.asset_materializations_for_node(op_name("default", "ns.ev"))
    meta = {k: v.value for k, v in event.metadata.items()}
    assert (meta["status"], meta["kind"], meta["rows_expired"], meta["files_dropped"]) == ("committed", "expire", 2, 1)
    [check] = result.get_asset_check_evaluations()
    assert check.passed
    after = lake.table("ns.ev")
    assert read(after) == writer.kept(cutoff=datetime.now(UTC) - DAY)
    [attempt] = lake.engine.ledger.attempts(table_name="ns.ev")
    assert after.current_snapshot().summary.operation == Operation.OVERWRITE

    with Session(lake.engine.ledger._engine) as session, session.begin():  # one expired row unaccounted for
        session.execute(update(AttemptRow).values(rows_expired=attempt.rows_expired - 1))
    [report] = check_partitions(after, lake.engine.ledger, {"region=mixed": attempt.task_id}, 60).values()
    assert not report.passed
    assert "rows in 4 != rows out 2 + rows expired 1" in report.problems[0]


def test_the_sensor_plans_an_unchanged_table_again_once_time_may_have_moved_rows_past_retention(lake):
    """Other tables are planned again only when they change; one with expiration on also every
    EXPIRE_REPLAN_SECONDS, since rows pass the cutoff with no commit at all."""
    make_table(lake, Writer(), {"new": [[datetime.now(UTC)]]})
    with instance_for_test() as instance:
        first = tick(lake, instance)
        assert first.asset_events  # planned: an observation per partition
        assert json.loads(first.cursor)["expiring"] == {"ns.ev": pytest.approx(time.time(), abs=60)}

        again = tick(lake, instance, cursor=first.cursor)
        assert again.asset_events == []  # unchanged and planned a moment ago

        cursor = json.loads(first.cursor)
        cursor["expiring"]["ns.ev"] -= EXPIRE_REPLAN_SECONDS
        later = tick(lake, instance, cursor=json.dumps(cursor))
        assert later.asset_events  # planned again, the table unchanged


def _file(records: int, lower: int | None, upper: int | None, nulls: int | None, width: int = 8) -> DataFile:
    """A data file's manifest statistics of field 6 (ms, a long)."""

    def encoded(value: int | None) -> dict[int, bytes]:
        return {} if value is None else {6: value.to_bytes(width, "little", signed=True)}

    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path="s3://b/f.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=records,
        file_size_in_bytes=1000,
        lower_bounds=encoded(lower),
        upper_bounds=encoded(upper),
        null_value_counts={} if nulls is None else {6: nulls},
    )


RULE = ExpireRule(6, "ms", LongType(), cutoff=100, cutoff_ms=100, retention_ms=1)


@pytest.mark.parametrize(
    ("data_file", "verdict"),
    [
        pytest.param(_file(5, 10, 99, 0), Verdict.DROP, id="upper below the cutoff, no NULLs: dropped unread"),
        pytest.param(_file(5, 10, 99, 1), Verdict.REWRITE, id="upper below the cutoff but a NULL: rewritten"),
        pytest.param(_file(5, 10, 99, None), Verdict.REWRITE, id="NULL count unknown: rewritten"),
        pytest.param(_file(5, 100, 200, 0), Verdict.KEEP, id="lower at the cutoff: kept"),
        pytest.param(_file(5, 99, 200, 0), Verdict.REWRITE, id="straddling the cutoff: rewritten"),
        pytest.param(_file(5, None, None, 5), Verdict.KEEP, id="only NULLs: kept"),
        pytest.param(_file(5, None, None, 0), Verdict.REWRITE, id="no bounds: rewritten"),
        pytest.param(_file(5, None, 99, 0), Verdict.DROP, id="no lower bound, upper below: dropped"),
        pytest.param(_file(5, 10, 99, 0, width=4), Verdict.DROP, id="int bounds of a column promoted to long"),
    ],
)
def test_a_file_is_judged_by_its_bounds_and_null_count(data_file, verdict):
    assert RULE.verdict(data_file) == verdict
