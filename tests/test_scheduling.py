"""Priority, ageing and back-pressure decisions (pure)."""

from compaction_assets.planning.scheduling import Candidate, benefit_points, decide, run_priority

NOW = 1_000_000.0


def cand(table: str, priority: int, benefit: float = 1.0, waited_minutes: float = 0, queue: str = "q", part="p=1"):
    return Candidate(table, part, queue, priority, benefit, NOW - waited_minutes * 60, 1)


def test_table_priority_dominates_benefit_and_benefit_breaks_ties():
    assert run_priority(cand("a", 1, benefit=0.0), NOW, 1) > run_priority(cand("b", 0, benefit=1e9), NOW, 1)
    assert run_priority(cand("a", 0, benefit=50), NOW, 1) > run_priority(cand("b", 0, benefit=0.5), NOW, 1)
    assert 0 <= benefit_points(0) < benefit_points(10) <= benefit_points(1e12) == 99


def test_ageing_lets_a_low_priority_partition_overtake():
    fresh_high = cand("high", 1)
    old_low = cand("low", 0, waited_minutes=240)
    assert run_priority(old_low, NOW, 1) > run_priority(fresh_high, NOW, 1)
    [first, second] = decide([fresh_high, old_low], {}, {"q": 1}, set(), NOW, 1)
    assert (first.candidate.table_name, first.requested) == ("low", True)
    assert (second.requested, second.reason) == (False, "queue 'q' is at capacity 1")


def test_full_queue_and_in_flight_partitions_get_no_request():
    decisions = decide(
        [cand("a", 0), cand("b", 0, queue="other"), cand("c", 0, queue="other", part="p=2")],
        {"q": 3},
        {"q": 3, "other": 5},
        {("b", "p=1")},
        NOW,
        1,
    )
    by_table = {d.candidate.table_name: d for d in decisions}
    assert not by_table["a"].requested and "capacity" in by_table["a"].reason
    assert not by_table["b"].requested and "already queued" in by_table["b"].reason
    assert by_table["c"].requested
