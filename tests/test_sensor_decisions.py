"""The fragmentation sensor's decisions (planning/tick.py), without Dagster: what a tick does with
each table, which partitions become candidates, what the cursor remembers, and what is requested."""

import pytest

from compaction_assets.config import TableRule
from compaction_assets.planning.model import PartitionStats
from compaction_assets.planning.scheduling import MANIFESTS_KEY
from compaction_assets.planning.tick import (
    EXPIRE_REPLAN_SECONDS,
    FragmentationCursor,
    Look,
    PlannedTable,
    Tick,
    candidate_benefits,
    catalog_change,
    observation_metadata,
)

NOW = 1_000_000.0
FP = "fingerprint"
RULE = TableRule(match="*", queue="default", priority=1)


def cursor(**kw) -> FragmentationCursor:
    """A cursor that last planned `t` at version v1 / snapshot 7, with `t|a` waiting since NOW - 60."""
    state = {
        "config": FP,
        "versions": {"t": "v1"},
        "snapshots": {"t": 7},
        "waiting": {"t|a": NOW - 60},
        "benefits": {"t|a": 2.0},
    }
    state.update(kw)
    return FragmentationCursor(**state)


@pytest.mark.parametrize(
    ("state", "rule", "present", "locations", "expected"),
    [
        ({}, None, {"t"}, {"t": "v1"}, Look.NO_RULE),
        ({}, RULE, set(), {"t": "v1"}, Look.DROPPED),
        ({}, RULE, {"t"}, {"t": "v1"}, Look.REPLAY),
        ({}, RULE, {"t"}, {"t": "v2"}, Look.LOAD),
        ({}, RULE, {"t"}, None, Look.LOAD),
        ({"versions": {}}, RULE, {"t"}, {"t": "v1"}, Look.LOAD),
        ({"config": "an older config"}, RULE, {"t"}, {"t": "v1"}, Look.LOAD),
        ({"benefits": {}}, RULE, {"t"}, {"t": "v1"}, Look.LOAD),
        ({"replan_at": {"t": NOW}}, RULE, {"t"}, {"t": "v1"}, Look.LOAD),
        ({"replan_at": {"t": NOW + 1}}, RULE, {"t"}, {"t": "v1"}, Look.REPLAY),
        ({"expiring": {"t": NOW - EXPIRE_REPLAN_SECONDS}}, RULE, {"t"}, {"t": "v1"}, Look.LOAD),
        ({"expiring": {"t": NOW - EXPIRE_REPLAN_SECONDS + 1}}, RULE, {"t"}, {"t": "v1"}, Look.REPLAY),
    ],
    ids=[
        "no-rule-is-skipped",
        "gone-from-the-catalog-is-dropped",
        "same-metadata-location-replays",
        "new-metadata-location-loads",
        "catalog-without-locations-loads",
        "never-planned-loads",
        "config-change-forgets-every-version",
        "waiting-partition-without-benefit-loads",
        "full-rewrite-due-loads",
        "full-rewrite-not-yet-due-replays",
        "expiration-planned-long-ago-loads",
        "expiration-planned-recently-replays",
    ],
)
def test_look_before_loading(state, rule, present, locations, expected):
    assert Tick(cursor(**state), FP, NOW).look("t", rule, present, locations) is expected


@pytest.mark.parametrize(
    ("partitioned", "snapshot_id", "location", "unpartitioned", "expected"),
    [
        (True, 7, "v1", False, Look.REPLAY),
        (True, 7, "v2", False, Look.PLAN),
        (True, 8, "v1", False, Look.PLAN),
        (True, 8, "v2", True, Look.RESPECCED),
        (False, 8, "v2", False, Look.RESPECCED),
        (False, 8, "v2", True, Look.PLAN),
    ],
    ids=[
        "same-snapshot-same-file-replays",
        "same-snapshot-new-metadata-file-plans",
        "new-snapshot-plans",
        "partitioned-asset-of-an-unpartitioned-table-waits-for-a-reload",
        "unpartitioned-asset-of-a-partitioned-table-waits-for-a-reload",
        "unpartitioned-asset-new-snapshot-plans",
    ],
)
def test_look_after_loading(partitioned, snapshot_id, location, unpartitioned, expected):
    tick = Tick(cursor(), FP, NOW)
    assert tick.after_load("t", partitioned, snapshot_id, location, unpartitioned) is expected
    assert tick.respecced == (["t"] if expected is Look.RESPECCED else [])


@pytest.mark.parametrize(
    ("partitioned", "worth", "manifests", "expected"),
    [
        (True, [("a", 1.0), ("b", 3.0)], None, {"a": 1.0, "b": 3.0}),
        (False, [("a", 1.0), ("b", 3.0)], None, {"": 3.0}),
        (True, [], 0.5, {MANIFESTS_KEY: 0.5}),
        (False, [], None, {}),
    ],
    ids=["partition-by-partition", "unpartitioned-asset-one-run-at-the-best", "manifests-when-due", "nothing"],
)
def test_candidate_benefits(partitioned, worth, manifests, expected):
    assert candidate_benefits(partitioned, worth, manifests) == expected


@pytest.mark.parametrize(
    ("tables", "left_out", "present", "expected"),
    [
        ({"t"}, set(), {"t"}, ([], [])),
        ({"t"}, set(), {"t", "u"}, (["u"], [])),
        ({"t", "u"}, set(), {"t"}, ([], ["u"])),
        ({"t"}, {"u"}, {"t", "u"}, ([], [])),
        ({"t"}, {"u"}, {"t"}, ([], ["u"])),
    ],
    ids=["unchanged", "new-table", "dropped-table", "left-out-table-still-there", "left-out-table-dropped"],
)
def test_catalog_change(tables, left_out, present, expected):
    assert catalog_change(tables, left_out, present) == expected


def test_a_replayed_table_offers_its_waiting_partitions_as_planned():
    tick = Tick(cursor(), FP, NOW)
    tick.replay("t", RULE, 7)
    [c] = tick.candidates
    assert (c.partition_key, c.benefit, c.waiting_since, c.snapshot_id, c.queue) == ("a", 2.0, NOW - 60, 7, "default")
    assert tick.unchanged == ["t"]


def test_a_planned_table_keeps_waiting_times_and_forgets_what_is_no_longer_worth_it():
    state = cursor(waiting={"t|a": NOW - 60, "t|gone": NOW - 30}, benefits={"t|a": 2.0, "t|gone": 1.0})
    tick = Tick(state, FP, NOW)
    tick.record(RULE, PlannedTable("t", 8, "v2", {"a": 5.0, "b": 1.0}, replan_at_ms=int(NOW * 1000) + 5000))
    assert {c.partition_key: c.waiting_since for c in tick.candidates} == {"a": NOW - 60, "b": NOW}
    assert state.waiting == {"t|a": NOW - 60, "t|b": NOW}
    assert state.benefits == {"t|a": 5.0, "t|b": 1.0}
    assert (state.snapshots["t"], state.versions["t"], state.replan_at["t"]) == (8, "v2", NOW + 5)
    assert "t" not in state.expiring
    Tick(state, FP, NOW).record(RULE, PlannedTable("t", 9, "v3", {}, expiring=True))  # the next tick
    assert state.waiting == {} and "t" not in state.replan_at and state.expiring["t"] == NOW


@pytest.mark.parametrize(
    ("capacity", "in_flight", "requested", "still_waiting"),
    [
        (5, set(), ["a"], []),
        (0, set(), [], ["a"]),
        (5, {("t", "a")}, [], []),
    ],
    ids=["requested-stops-waiting", "queue-full-keeps-waiting", "already-in-flight-stops-waiting"],
)
def test_decide_requests_within_capacity_and_updates_the_cursor(capacity, in_flight, requested, still_waiting):
    tick = Tick(cursor(), FP, NOW)
    tick.replay("t", RULE, 7)
    decision = tick.decide(1, {}, {"default": capacity}, in_flight, 1.0, 1, {})
    assert [m.partition_key for b in decision.batches for m in b.members] == requested
    assert [k.split("|")[1] for k in decision.cursor.waiting] == still_waiting
    assert decision.held is None
    assert decision.summary.startswith("evaluated 1 table(s): 0 planned, 1 unchanged; 1 partition(s) worth compacting")


def test_nothing_is_requested_while_spark_is_down_and_the_partitions_wait():
    tick = Tick(cursor(), FP, NOW)
    tick.replay("t", RULE, 7)
    decision = tick.decide(1, {}, {"default": 5}, set(), 1.0, 1, {}, spark_down="no server at sc://x")
    assert decision.held and "no server at sc://x" in decision.held
    assert (decision.decisions, decision.batches) == ([], [])
    assert decision.cursor.waiting == {"t|a": NOW - 60}


def test_the_cursor_round_trips_through_its_json():
    state = cursor(replan_at={"t": NOW}, expiring={"t": NOW})
    assert FragmentationCursor.parse(state.dump()) == state
    assert FragmentationCursor.parse(None) == FragmentationCursor()


def test_observation_metadata_names_the_fragmentation_and_delete_load():
    stats = PartitionStats("a", 4, 4000, 40, 3, 4, 1, 0, (0,), position_delete_files=1, read_amplification=1.23456)
    meta = observation_metadata(stats, paused=True)
    assert meta["data_files"] == 4 and meta["small_files"] == 4 and meta["avg_file_bytes"] == 1000
    assert meta["delete_files"] == 1 and meta["read_amplification"] == 1.235 and meta["paused"] is True
