"""The planner is pure: file statistics in, rewrite groups out."""

import random
from dataclasses import dataclass

import pytest

from compaction_assets.planning.planner import Kind, plan_partition, plan_table
from compaction_assets.planning.policy import Policy

KB = 1024
POLICY = Policy(target_file_size_bytes=800 * KB, max_group_bytes=4000 * KB)  # fragment <= 100 KB, undersized < 600 KB


@dataclass(frozen=True)
class F:
    path: str
    size: int
    record_count: int = 10
    spec_id: int = 0
    is_delete: bool = False
    partition_key: str = "p=1"
    added_at_ms: int = 0

    @property
    def data_bytes(self) -> int:
        return self.size

    @property
    def partition_id(self) -> tuple:
        return self.spec_id, self.partition_key


def fragments(n: int, size: int = 10 * KB, key: str = "p=1") -> list[F]:
    return [F(f"s3://b/t/{key}/f{i:04d}.parquet", size, partition_key=key) for i in range(n)]


def test_minor_bin_packs_fragments_into_target_size_groups():
    plan = plan_partition("p=1", fragments(200), POLICY, current_spec_id=0)
    assert plan.kind == Kind.MINOR
    assert sum(len(g.paths) for g in plan.groups) == 200
    assert all(g.bytes <= POLICY.target_file_size_bytes for g in plan.groups)
    assert len(plan.groups) == 3  # 2000 KB in groups of at most 800 KB
    assert plan.benefit > 0


def test_under_min_input_files_yields_nothing_with_reason():
    plan = plan_partition("p=1", fragments(4), POLICY, current_spec_id=0)
    assert not plan.worth_compacting
    assert "min_input_files=5" in plan.reason


def test_major_rewrites_undersized_when_too_few_fragments():
    files = [F(f"f{i}", 300 * KB) for i in range(6)] + [F("big", 900 * KB)]
    plan = plan_partition("p=1", files, POLICY, current_spec_id=0)
    assert plan.kind == Kind.MAJOR
    assert sorted(plan.source_paths) == sorted(f"f{i}" for i in range(6))  # the full-size file is left alone


def test_groups_never_exceed_max_group_bytes():
    policy = Policy(target_file_size_bytes=800 * KB, max_group_bytes=1000 * KB)
    plan = plan_partition("p=1", [F(f"f{i}", 300 * KB) for i in range(10)], policy, current_spec_id=0)
    assert plan.kind == Kind.MAJOR
    assert [len(g.paths) for g in plan.groups] == [3, 3, 3]  # the tenth file alone is not worth a group
    assert all(g.bytes <= 1000 * KB for g in plan.groups)


def test_a_file_a_delete_file_can_apply_to_leaves_the_partition_alone():
    files = fragments(20)
    plan = plan_partition("p=1", files, POLICY, current_spec_id=0, with_deletes={files[3].path})
    assert not plan.worth_compacting
    assert "delete files can apply to 1 file(s)" in plan.reason


def test_a_delete_file_that_applies_to_no_file_of_the_partition_is_no_obstacle():
    # e.g. a position delete that references a file of another partition, counted under this key
    plan = plan_partition("p=1", [*fragments(20), F("d", 1 * KB, is_delete=True)], POLICY, current_spec_id=0)
    assert plan.worth_compacting


def test_old_spec_and_in_flight_files_are_not_candidates():
    old = [F(f"old{i}", 10 * KB, spec_id=1) for i in range(10)]
    current = fragments(6)
    plan = plan_partition("p=1", old + current, POLICY, current_spec_id=0, in_flight={current[0].path})
    assert plan.kind == Kind.MINOR
    assert set(plan.source_paths) == {f.path for f in current[1:]}
    nothing = plan_partition("p=1", old, POLICY, current_spec_id=0)
    assert not nothing.worth_compacting and "older spec" in nothing.reason


def test_paused_table_plans_nothing():
    plan = plan_partition("p=1", fragments(50), Policy(enabled=False), current_spec_id=0)
    assert not plan.worth_compacting and "paused" in plan.reason


def test_plan_is_deterministic_and_ranked_by_benefit():
    files = fragments(60, key="p=a") + fragments(8, 90 * KB, key="p=b") + fragments(3, key="p=c")
    shuffled = files[:]
    random.Random(1).shuffle(shuffled)
    first = plan_table(files, POLICY, current_spec_id=0)
    second = plan_table(shuffled, POLICY, current_spec_id=0)
    assert first == second
    assert [p.partition_key for p in first if p.worth_compacting] == ["p=a", "p=b"]
    assert first[0].benefit > first[1].benefit


@dataclass(frozen=True)
class Typed(F):
    """A file whose partition id is its typed tuple, rendered into a key by the caller."""

    values: tuple = ()

    @property
    def partition_id(self) -> tuple:
        return self.spec_id, self.values


def test_files_are_grouped_by_typed_partition_and_spec_not_by_key():
    null = [Typed(f"n{i}", 10 * KB, partition_key="r=N", values=(None,)) for i in range(6)]
    text = [Typed(f"t{i}", 10 * KB, partition_key="r=null", values=("null",)) for i in range(6)]
    old = [Typed(f"o{i}", 10 * KB, spec_id=1, partition_key="spec-1:r=null", values=("null",)) for i in range(6)]
    plans = {p.partition_key: p for p in plan_table([*null, *text, *old], POLICY, current_spec_id=0)}
    assert {k: set(p.stats.spec_ids) for k, p in plans.items()} == {"r=N": {0}, "r=null": {0}, "spec-1:r=null": {1}}
    assert sorted(plans["r=null"].source_paths) == [f"t{i}" for i in range(6)]
    assert not plans["spec-1:r=null"].worth_compacting and "older spec" in plans["spec-1:r=null"].reason


def test_two_partitions_sharing_a_key_is_an_error_not_a_merge():
    files = [
        Typed("a", 10 * KB, partition_key="r=null", values=(None,)),
        Typed("b", 10 * KB, partition_key="r=null", values=("null",)),
    ]
    with pytest.raises(ValueError, match="partition key 'r=null' names 2 different partitions"):
        plan_table(files, POLICY, current_spec_id=0)


def test_a_refused_table_plans_nothing_with_the_reason_and_keeps_its_stats():
    [plan] = plan_table(fragments(50), POLICY, current_spec_id=0, refused="format-version 3 tables are not compacted")
    assert not plan.worth_compacting and plan.reason == "format-version 3 tables are not compacted"
    assert plan.stats.data_files == 50 and plan.stats.fragments == 50
