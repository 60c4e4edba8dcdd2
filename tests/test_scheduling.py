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
    [first, second], _ = decide([fresh_high, old_low], {}, {"q": 1}, set(), NOW, 1)
    assert (first.candidate.table_name, first.requested) == ("low", True)
    assert (second.requested, second.reason) == (False, "queue 'q' is at capacity 1")


def test_full_queue_and_in_flight_partitions_get_no_request():
    decisions, _ = decide(
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


def test_a_tables_partitions_ride_in_runs_of_ranges_of_its_partition_order():
    order = [f"p={i}" for i in range(10)]
    due = [cand("t", 0, part=f"p={i}", benefit=100 - 10 * i) for i in (0, 1, 2, 5, 6, 9)] + [cand("u", 1, part="")]
    decisions, batches = decide(due, {}, {"q": 2}, {("t", "p=1")}, NOW, 1, max_partitions_per_run=5, order={"t": order})

    # u (priority 1) first; then t's range from p=0 (the highest benefit), cut short by p=1 (in flight).
    assert [(b.table_name, [c.partition_key for c in b.members]) for b in batches] == [
        ("u", [""]),
        ("t", ["p=0"]),
    ]
    assert batches[1].priority == max(run_priority(c, NOW, 1) for c in batches[1].members)
    by_key = {d.candidate.partition_key: d for d in decisions}
    assert by_key["p=0"].batch == 1 and by_key[""].batch == 0
    assert not by_key["p=1"].requested and "already queued" in by_key["p=1"].reason
    assert [by_key[k].requested for k in ("p=2", "p=5", "p=6", "p=9")] == [False] * 4  # over capacity 2
    assert "capacity" in by_key["p=9"].reason
    # A range spans at most max_partitions_per_run keys of the order, and none another run covers.
    _, sized = decide(due, {}, {"q": 99}, set(), NOW, 1, max_partitions_per_run=5, order={"t": order})
    assert [[c.partition_key for c in b.members] for b in sized if b.table_name == "t"] == [
        ["p=0", "p=1", "p=2"],
        ["p=5", "p=6", "p=9"],
    ]
    _, split = decide(due, {}, {"q": 99}, {("t", "p=1")}, NOW, 1, max_partitions_per_run=10, order={"t": order})
    assert [[c.partition_key for c in b.members] for b in split if b.table_name == "t"] == [
        ["p=0"],
        ["p=2", "p=5", "p=6", "p=9"],
    ]
    # One run per partition when runs hold one.
    _, single = decide(due, {}, {"q": 99}, set(), NOW, 1, max_partitions_per_run=1, order={"t": order})
    assert len(single) == len(due)
