"""The planner is pure: file statistics in, rewrite groups out."""

import random
from dataclasses import dataclass

import pytest

from compaction_assets.config import PolicyConfig
from compaction_assets.errors import ConfigError
from compaction_assets.planning.model import DeleteMap, Kind, read_amplification
from compaction_assets.planning.planner import plan_partition, plan_table
from compaction_assets.planning.policy import Policy, resolve_policy
from tests.lakekit.plan_files import KB, POLICY, F, eq_delete, fragments, pos_delete


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
    # four bins by first-fit; balanced, the tenth file no longer sits alone (and unrewritten)
    assert sorted(len(g.paths) for g in plan.groups) == [2, 2, 3, 3]
    assert all(g.bytes <= 1000 * KB for g in plan.groups)


def test_fragments_with_deletes_are_compacted_with_their_deletes_applied():
    files = fragments(20)
    plan = plan_partition("p=1", [*files, pos_delete("d", files[3].path, records=2)], POLICY, current_spec_id=0)
    assert plan.kind == Kind.MINOR and len(plan.source_paths) == 20
    assert "minor: 20 fragment(s) >= min_input_files=5; 1 file(s) get their deletes applied" in plan.reason
    assert (
        "deletes: 1 position-delete and 0 equality-delete file(s) apply to 1 of 20 data file(s), ~2 row(s) deleted "
        "(estimated from their record counts), deleted-row ratio 0.01, read amplification 1.02" in plan.reason
    )


def test_a_delete_file_that_applies_to_no_file_of_the_partition_is_no_obstacle():
    # a position delete naming a file of another partition, counted under this key
    files = [*fragments(20), pos_delete("d", "s3://b/t/p=2/x.parquet")]
    plan = plan_partition("p=1", files, POLICY, current_spec_id=0)
    assert plan.worth_compacting and plan.stats.applying_delete_files == 0
    assert plan.stats.delete_files == 1 and "deletes: none apply" in plan.reason


def test_old_spec_and_in_flight_files_are_no_minor_candidates():
    old = [F(f"old{i}", 10 * KB, spec_id=1) for i in range(10)]
    current = fragments(6)
    plan = plan_partition("p=1", old + current, POLICY, current_spec_id=0, in_flight={current[0].path})
    assert plan.kind == Kind.MINOR
    assert set(plan.source_paths) == {f.path for f in current[1:]}


def old_spec(n: int, size: int = 10 * KB, key: str = "p=1", spec_id: int = 1) -> list[F]:
    return [F(f"s3://b/t/old/{key}/f{i:04d}.parquet", size, partition_key=key, spec_id=spec_id) for i in range(n)]


@pytest.mark.parametrize(
    ("files", "in_flight", "groups"),
    [
        (old_spec(1), 0, [1]),  # one file is enough: the point is the spec
        (old_spec(1, 900 * KB), 0, [1]),  # whatever its size
        (old_spec(10, 1000 * KB), 0, [4, 3, 3]),  # groups of at most max_group_bytes (4000 KB), balanced
        (old_spec(3), 1, [2]),  # a file a running attempt holds waits
    ],
    ids=["single_small_file", "single_large_file", "groups_within_max_group_bytes", "in_flight_skipped"],
)
def test_a_partition_of_an_older_spec_is_rewritten_into_the_current_one(files, in_flight, groups):
    plan = plan_partition("spec-1:p=1", files, POLICY, current_spec_id=2, in_flight={f.path for f in files[:in_flight]})
    assert plan.kind == Kind.OLD_SPEC and plan.worth_compacting
    assert sorted((len(g.paths) for g in plan.groups), reverse=True) == groups
    assert all(g.data_bytes <= POLICY.max_group_bytes for g in plan.groups)
    assert plan.reason.startswith(f"old-spec: {sum(groups)} file(s) of spec 1, not the current spec 2: rewritten into")


def test_old_spec_plans_nothing_when_all_held_or_turned_off():
    files = old_spec(3)
    held = plan_partition("spec-1:p=1", files, POLICY, current_spec_id=2, in_flight={f.path for f in files})
    assert not held.worth_compacting and "all held by a running attempt" in held.reason
    off = Policy(target_file_size_bytes=800 * KB, rewrite_old_specs=False)
    plan = plan_partition("spec-1:p=1", files, off, current_spec_id=2)
    assert not plan.worth_compacting and "compaction.rewrite-old-specs=false" in plan.reason
    assert resolve_policy("ns.t", PolicyConfig(), {"compaction.rewrite-old-specs": "false"}).rewrite_old_specs is False


def test_old_spec_ranks_below_fragmentation_of_a_similar_size_and_applies_deletes():
    fragmented = fragments(10, key="p=frag")
    old = old_spec(10, key="p=old")
    deletes = [pos_delete("old-pos", old[0].path, key="p=old", spec_id=1)]
    plans = plan_table([*fragmented, *old, *deletes], POLICY, current_spec_id=0)
    assert [(p.partition_key, p.kind) for p in plans] == [("p=frag", Kind.MINOR), ("p=old", Kind.OLD_SPEC)]
    assert 0 < plans[1].benefit < plans[0].benefit
    assert "1 file(s) get their deletes applied" in plans[1].reason


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
    assert plans["spec-1:r=null"].kind == Kind.OLD_SPEC
    assert sorted(plans["spec-1:r=null"].source_paths) == [f"o{i}" for i in range(6)]


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


# merge-on-read: delete triggers, thresholds, tiers, ranking. Big files (700 KB) are neither
# fragments nor undersized, so only the delete rules can pick them.
def big(n: int, key: str = "p=1", records: int = 1000, **kw) -> list[F]:
    return [F(f"s3://b/t/{key}/big{i}.parquet", 700 * KB, records, partition_key=key, **kw) for i in range(n)]


def test_read_amplification_is_rows_decoded_per_live_row():
    assert read_amplification(1000, 0) == 1.0
    assert read_amplification(1000, 200) == pytest.approx(1200 / 800)
    assert read_amplification(10, 50) == 60.0  # more delete rows than rows: live estimate floors at 1


@pytest.mark.parametrize(
    ("deletes_on_first", "properties", "rewritten"),
    [
        pytest.param(5, {}, 1, id="a file with delete-file-threshold=5 delete files is rewritten alone"),
        pytest.param(4, {}, 0, id="one delete file fewer: nothing"),
        pytest.param(4, {"compaction.delete-file-threshold": "4"}, 1, id="the table property lowers the threshold"),
    ],
)
def test_delete_file_threshold(deletes_on_first, properties, rewritten):
    data = big(3)
    deletes = [pos_delete(f"d{i}", data[0].path) for i in range(deletes_on_first)]
    policy = resolve_policy("t", PolicyConfig(target_file_size_bytes=800 * KB, max_group_bytes=4000 * KB), properties)
    plan = plan_partition("p=1", [*data, *deletes], policy, current_spec_id=0)
    assert len(plan.source_paths) == rewritten
    if rewritten:
        assert plan.kind == Kind.MAJOR and plan.source_paths == [data[0].path]  # a group of one: it sheds deletes
        assert f"1 file(s) with >= delete-file-threshold={policy.delete_file_threshold} delete files" in plan.reason
    else:
        assert plan.kind is None
        assert "no delete trigger: at most 4 delete file(s) on a candidate file (delete-file-threshold=5)" in (
            plan.reason
        )


def test_table_properties_win_over_compaction_yaml_for_the_delete_keys():
    configured = PolicyConfig(
        delete_file_threshold=3,
        delete_ratio_threshold=0.5,
        equality_delete_file_threshold=7,
        position_delete_file_threshold=9,
    )
    assert resolve_policy("t", configured, {}) == Policy(
        delete_file_threshold=3,
        delete_ratio_threshold=0.5,
        equality_delete_file_threshold=7,
        position_delete_file_threshold=9,
    )
    props = {
        "compaction.delete-file-threshold": "2",
        "compaction.delete-ratio-threshold": "0.1",
        "compaction.equality-delete-file-threshold": "4",
        "compaction.position-delete-file-threshold": "6",
    }
    assert resolve_policy("t", configured, props) == Policy(
        delete_file_threshold=2,
        delete_ratio_threshold=0.1,
        equality_delete_file_threshold=4,
        position_delete_file_threshold=6,
    )
    with pytest.raises(ConfigError, match="delete_ratio_threshold must be in"):
        resolve_policy("t", PolicyConfig(), {"compaction.delete-ratio-threshold": "1.5"})
    with pytest.raises(ConfigError, match="position_delete_file_threshold must be at least 2"):
        resolve_policy("t", PolicyConfig(), {"compaction.position-delete-file-threshold": "1"})


def test_delete_ratio_threshold_rewrites_every_file_a_delete_applies_to():
    old = big(4, data_sequence_number=1)
    newer = F("s3://b/t/p=1/newer.parquet", 700 * KB, 1000, data_sequence_number=3)  # written after the delete
    delete = eq_delete("eq", records=1000, seq=2)  # 1000 of 5000 rows: ratio 0.2
    plan = plan_partition("p=1", [*old, newer, delete], POLICY, current_spec_id=0)
    assert plan.kind == Kind.MAJOR
    assert sorted(plan.source_paths) == sorted(f.path for f in old)
    # packed by the target size (1 MiB): two 700 KiB files would not fit one target file anyway
    assert [len(g.paths) for g in plan.groups] == [1, 1, 1, 1]
    assert "deleted-row ratio 0.20 >= delete-ratio-threshold=0.2: its 4 file(s) with deletes" in plan.reason
    assert "apply to 4 of 5 data file(s), ~1000 row(s) deleted" in plan.reason

    below = plan_partition("p=1", [*old, newer, eq_delete("eq", records=900)], POLICY, current_spec_id=0)
    assert below.kind is None
    assert "deleted-row ratio 0.18 (delete-ratio-threshold=0.2)" in below.reason
    assert "1 equality-delete file(s) of this partition alone, fewer than equality-delete-file-threshold=3" in (
        below.reason
    )


def test_delete_triggered_files_are_packed_with_the_fragments():
    data = big(1)
    frags = fragments(2)
    deletes = [pos_delete(f"d{i}", data[0].path) for i in range(5)]
    plan = plan_partition("p=1", [*data, *frags, *deletes], POLICY, current_spec_id=0)
    assert plan.kind == Kind.MAJOR
    assert sorted(plan.source_paths) == sorted([data[0].path, *(f.path for f in frags)])
    assert "rewritten, packed with 2 fragment(s); 1 file(s) get their deletes applied" in plan.reason


def test_sequence_numbers_decide_which_deletes_apply():
    data = big(1, data_sequence_number=2)
    same_seq_pos = pos_delete("pos", data[0].path, seq=2)  # applies: data seq <= delete seq
    same_seq_eq = eq_delete("eq", seq=2)  # does not: equality needs data seq < delete seq
    [plan] = plan_table([*data, same_seq_pos, same_seq_eq], POLICY, current_spec_id=0)
    assert (plan.stats.position_delete_files, plan.stats.equality_delete_files) == (1, 0)


def test_a_global_delete_applies_to_every_partition_and_is_never_a_tier_input():
    a, b = big(2, key="p=a"), big(2, key="p=b")
    globals_ = [eq_delete(f"g{i}", key="", spec_id=1) for i in range(3)]  # spec 1: unpartitioned
    plans = {p.partition_key: p for p in plan_table([*a, *b, *globals_], POLICY, current_spec_id=0)}
    assert plans["p=a"].stats.equality_delete_files == plans["p=b"].stats.equality_delete_files == 3
    assert all(p.kind is None for p in plans.values())  # 3 >= equality threshold, but none of them scoped
    assert "0 equality-delete file(s) of this partition alone" in plans["p=a"].reason


def test_an_unpartitioned_tables_deletes_are_tier_inputs():
    data = big(3, key="", column_sizes=((1, 10 * KB), (2, 690 * KB)))
    deletes = [eq_delete(f"eq{i}", key="") for i in range(3)]
    [plan] = plan_table([*data, *deletes], POLICY, current_spec_id=0)
    assert plan.kind == Kind.CONVERT_EQUALITY_DELETES and plan.delete_paths == ("eq0", "eq1", "eq2")


def test_convert_equality_deletes_when_reading_the_keys_is_far_cheaper_than_a_rewrite():
    sizes = ((1, 10 * KB), (2, 690 * KB))  # the key column (field 1) is a small share of each file
    data = big(3, column_sizes=sizes)
    deletes = [eq_delete(f"eq{i}", records=10) for i in range(3)]
    plan = plan_partition("p=1", [*data, *deletes], POLICY, current_spec_id=0)
    assert plan.kind == Kind.CONVERT_EQUALITY_DELETES and plan.worth_compacting and not plan.groups
    assert plan.delete_paths == ("eq0", "eq1", "eq2")
    assert plan.covered_data_paths == tuple(sorted(f.path for f in data))
    assert f"reads {30 * KB} B of key columns, < 0.25 of a rewrite's {2100 * KB} B" in plan.reason
    assert plan.benefit > 0

    unknown_sizes = plan_partition("p=1", [*big(3), *deletes], POLICY, current_spec_id=0)  # key bytes = file size
    assert unknown_sizes.kind is None
    assert f"would read {2100 * KB} B of key columns, not < 0.25" in unknown_sizes.reason
    two = plan_partition("p=1", [*data, *deletes[:2]], POLICY, current_spec_id=0)
    assert two.kind is None and "fewer than equality-delete-file-threshold=3" in two.reason


def test_rewrite_position_deletes_combines_small_position_delete_files():
    data = big(5)
    deletes = [pos_delete(f"pos{i}", f.path) for i, f in enumerate(data)]  # one per file: no file has 5
    plan = plan_partition("p=1", [*data, *deletes], POLICY, current_spec_id=0)
    assert plan.kind == Kind.REWRITE_POSITION_DELETES and not plan.groups
    assert plan.delete_paths == tuple(f"pos{i}" for i in range(5))
    assert set(plan.covered_data_paths) == {f.path for f in data}
    assert "5 small position-delete file(s) >= position-delete-file-threshold=5" in plan.reason

    four = plan_partition("p=1", [*data, *deletes[:4]], POLICY, current_spec_id=0)
    assert four.kind is None and "4 small position-delete file(s)" in four.reason
    busy = plan_partition("p=1", [*data, *deletes], POLICY, current_spec_id=0, in_flight={data[0].path})
    assert busy.kind is None and "a running attempt holds" in busy.reason


def test_a_data_rewrite_wins_over_the_tiers():
    data = big(3, column_sizes=((1, 10 * KB), (2, 690 * KB)))
    deletes = [eq_delete(f"eq{i}", records=10) for i in range(5)]  # 5 apply to every file
    plan = plan_partition("p=1", [*data, *deletes], POLICY, current_spec_id=0)
    assert plan.kind == Kind.MAJOR and len(plan.source_paths) == 3


def test_a_partition_drowning_in_deletes_outranks_one_with_a_few_small_files():
    small = fragments(5, 90 * KB, key="p=small")
    drowning = big(4, key="p=cdc")
    deletes = [eq_delete("cdc-eq", records=2000, key="p=cdc")]  # half the rows: read amplification 3
    plans = plan_table([*small, *drowning, *deletes], POLICY, current_spec_id=0)
    assert [(p.partition_key, p.kind) for p in plans] == [("p=cdc", Kind.MAJOR), ("p=small", Kind.MINOR)]
    cdc = plans[0]
    assert cdc.stats.read_amplification == pytest.approx(3.0)
    assert "read amplification 3.00" in cdc.reason
    assert plans[0].benefit > plans[1].benefit


def test_delete_map_is_the_spec_rule_both_ways():
    data = big(2)
    deletes = [pos_delete("pos", data[0].path), eq_delete("eq")]
    dmap = DeleteMap.of([*data, *deletes])
    assert [d.path for d in dmap.for_data(data[0].path)] == ["eq", "pos"]
    assert [d.path for d in dmap.for_data(data[1].path)] == ["eq"]
    assert dmap.by_delete == {"pos": {data[0].path}, "eq": {data[0].path, data[1].path}}
