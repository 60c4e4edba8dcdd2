"""The planner's full-optimizing and split decisions (pure: file statistics and a clock in, plans out)."""

from __future__ import annotations

import pytest

from compaction_assets.planning.model import FullClock, Kind
from compaction_assets.planning.planner import plan_partition, plan_table
from compaction_assets.planning.policy import Policy
from tests.lakekit.plan_files import KB, POLICY, F, fragments, pos_delete

HOUR = 3_600_000
FULL = Policy(target_file_size_bytes=800 * KB, max_group_bytes=4000 * KB, full_trigger_interval_ms=HOUR)
NOW = 10 * HOUR


def sized(*sizes_kb: int, key: str = "p=1") -> list[F]:
    return [F(f"s3://b/t/{key}/g{i:03d}.parquet", kb * KB, 100, partition_key=key) for i, kb in enumerate(sizes_kb)]


@pytest.mark.parametrize(
    ("last_full_ms", "kind", "says"),
    [
        pytest.param(None, Kind.FULL, "full: due (never fully rewritten)", id="never-fully-rewritten-is-due"),
        pytest.param(NOW - HOUR, Kind.FULL, "last full rewrite 3600s ago", id="interval-passed-is-due"),
        pytest.param(NOW - HOUR + 1000, None, "full: next due in 1s", id="within-interval-waits"),
    ],
)
def test_full_is_due_by_the_interval_since_the_last_full_rewrite(last_full_ms, kind, says):
    files = sized(300, 300, 300)  # three undersized files: fewer than min_input_files, no other trigger
    clock = FullClock(NOW, {} if last_full_ms is None else {"p=1": last_full_ms})
    plan = plan_partition("p=1", files, FULL, current_spec_id=0, clock=clock)
    assert plan.kind == kind and says in plan.reason, plan.reason
    if kind == Kind.FULL:
        assert sorted(plan.source_paths) == sorted(f.path for f in files)
        assert [g.expected_outputs for g in plan.groups] == [1]  # 900 KB: one file of about the target


def test_full_is_off_without_an_interval_or_a_clock():
    files = sized(300, 300, 300)
    assert plan_partition("p=1", files, POLICY, 0, clock=FullClock(NOW)).kind is None
    assert plan_partition("p=1", files, FULL, 0).kind is None


@pytest.mark.parametrize(
    "files",
    [
        pytest.param(sized(300), id="a-single-small-file"),
        pytest.param(sized(2000), id="a-single-oversized-file-is-the-splits"),
        pytest.param(sized(800, 790, 810), id="files-of-the-target-size"),
    ],
)
def test_an_already_optimal_partition_is_not_fully_rewritten(files):
    plan = plan_partition("p=1", files, FULL, 0, clock=FullClock(NOW))
    assert plan.kind != Kind.FULL and "already optimal" in plan.reason, plan.reason


def test_a_single_file_with_deletes_applying_is_fully_rewritten():
    [data] = sized(800)
    plan = plan_partition("p=1", [data, pos_delete("d", data.path, records=3)], FULL, 0, clock=FullClock(NOW))
    assert plan.kind == Kind.FULL and "1 file(s) get their deletes applied" in plan.reason
    assert plan.benefit > 0  # its delete file goes and reads are saved, though no data file is removed


def test_full_wins_over_minor_and_takes_every_file_in_groups_of_max_group_bytes():
    files = [*fragments(20), *sized(700, 700, 700, 700, 700, 700)]
    minor = plan_partition("p=1", files, FULL, 0, clock=FullClock(NOW, {"p=1": NOW}))
    assert minor.kind == Kind.MINOR and "full: next due in 3600s" in minor.reason
    full = plan_partition("p=1", files, FULL, 0, clock=FullClock(NOW))
    assert full.kind == Kind.FULL and len(full.source_paths) == 26
    assert all(g.data_bytes <= FULL.max_group_bytes for g in full.groups) and len(full.groups) == 2


def test_full_waits_while_a_file_of_the_partition_is_in_flight_and_leaves_old_spec_files_alone():
    files = sized(300, 300, 300)
    busy = plan_partition("p=1", files, FULL, 0, in_flight={files[0].path}, clock=FullClock(NOW))
    assert busy.kind is None and "held by a running attempt: waits" in busy.reason
    old = [F(f"old{i}", 300 * KB, spec_id=1) for i in range(3)]
    assert plan_partition("p=1", old, FULL, current_spec_id=0, clock=FullClock(NOW)).kind == Kind.OLD_SPEC  # not full


def test_a_full_plan_ranks_below_a_minor_plan_of_the_same_files():
    """Full is hygiene: the same fragments under full optimizing score FULL_WEIGHT of a minor plan."""
    files = fragments(20)
    minor = plan_partition("p=1", files, FULL, 0, clock=FullClock(NOW, {"p=1": NOW}))
    full = plan_partition("p=1", files, FULL, 0, clock=FullClock(NOW))
    assert (minor.kind, full.kind) == (Kind.MINOR, Kind.FULL)
    assert full.benefit == pytest.approx(0.5 * minor.benefit)
    plans = plan_table(
        [*fragments(20, key="p=a"), *fragments(20, key="p=b")], FULL, 0, clock=FullClock(NOW, {"p=a": NOW})
    )
    assert [(p.partition_key, p.kind) for p in plans] == [("p=a", Kind.MINOR), ("p=b", Kind.FULL)]


@pytest.mark.parametrize(
    ("data_kb", "outputs"),
    [
        pytest.param(3200, 4, id="4x-target-is-4-files"),
        pytest.param(3300, 4, id="a-small-remainder-is-spread-over-the-others"),
        pytest.param(3900, 5, id="a-remainder-not-undersized-is-a-file-of-its-own"),
        pytest.param(1500, 2, id="just-over-the-limit"),
        pytest.param(3700, 5, id="spreading-would-exceed-1.1x-target"),
    ],
)
def test_an_oversized_file_is_a_group_of_its_own_written_into_target_size_files(data_kb, outputs):
    files = sized(data_kb, 800, 20)  # 1440 KB is the default limit (1.8 x target)
    plan = plan_partition("p=1", files, POLICY, 0)
    assert plan.kind == Kind.SPLIT, plan.reason
    [group] = plan.groups
    assert group.paths == (files[0].path,) and group.expected_outputs == outputs
    assert f"split into {outputs} file(s)" in plan.reason
    assert group.records == 100


def test_max_file_size_bytes_sets_the_split_limit_and_each_oversized_file_is_its_own_group():
    files = sized(1200, 1300, 700)
    assert plan_partition("p=1", files, POLICY, 0).kind is None  # under 1.8 x 800 KB
    policy = Policy(target_file_size_bytes=800 * KB, max_group_bytes=4000 * KB, max_file_size_bytes=1000 * KB)
    plan = plan_partition("p=1", files, policy, 0)
    assert plan.kind == Kind.SPLIT
    assert [(g.paths, g.expected_outputs) for g in plan.groups] == [((files[0].path,), 2), ((files[1].path,), 2)]


def test_fragments_go_before_a_split():
    files = [*fragments(10), *sized(4000)]
    plan = plan_partition("p=1", files, POLICY, 0)
    assert plan.kind == Kind.MINOR and sized(4000)[0].path not in plan.source_paths


def test_a_split_ranks_below_a_plan_that_removes_files():
    files = [*sized(3200, key="p=big"), *fragments(5, 90 * KB, key="p=small")]
    plans = plan_table(files, POLICY, 0)
    assert [(p.partition_key, p.kind) for p in plans] == [("p=small", Kind.MINOR), ("p=big", Kind.SPLIT)]
    assert plans[1].benefit == pytest.approx(0.1 * 3 / (3200 / 1024))


def test_full_clock_next_due_is_the_earliest_future_due_time():
    clock = FullClock(NOW, {"a": NOW - HOUR, "b": NOW - 1000, "c": NOW - 2000})
    assert clock.next_due_ms(["a", "b", "c", "d"], HOUR) == NOW - 2000 + HOUR
    assert clock.next_due_ms(["a", "d"], HOUR) is None


def test_a_file_of_fewer_rows_than_outputs_splits_into_at_most_a_row_each():
    [wide] = [F("s3://b/t/p=1/wide.parquet", 3200 * KB, 2)]
    plan = plan_partition("p=1", [wide], POLICY, 0)
    assert plan.kind == Kind.SPLIT and [g.expected_outputs for g in plan.groups] == [2]
    single = plan_partition("p=1", [F("s3://b/t/p=1/one.parquet", 3200 * KB, 1)], POLICY, 0)
    assert single.kind is None and "too little column data or rows to split" in single.reason
