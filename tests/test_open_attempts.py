"""Open attempts (issue 35): a crashed run's attempts are recovered by the next `compact` of the
table, a command that skips work because of open attempts says why and what to run, `recover`
commits a table's recoverable attempts in one snapshot, and two `compact` runs of one table claim
disjoint partitions. Crashes are real processes killed at a crash point (faults.py)."""

from __future__ import annotations

import os
import subprocess
import threading
from collections import Counter

import pytest
from pyiceberg.expressions import EqualTo

from compaction_assets.commit.ledger import OPEN, Claimed, Ledger, Status
from compaction_assets.commit.two_phase import ATTEMPT_ID_PROPERTY
from compaction_assets.faults import PAUSE_ENV
from compaction_assets.lake.digest import row_hashes
from compaction_tools.reliability import check_invariants
from tests.conftest import CLI, create_fragmented, data_files, postgres_schema


def oracle_of(table) -> Counter:
    return row_hashes(table.scan().to_arrow().to_pylist())


def assert_rows_kept(lake, oracle: Counter) -> None:
    report = check_invariants(lake.engine, "ns.t", oracle)
    assert report.ok, report


def test_the_next_compact_recovers_a_crashed_runs_attempts_and_plan_says_what_to_run(lake):
    """A `compact` killed after precommit left its partitions PREPARED. `plan` names the holder,
    says its process is gone and what to run; the next `compact` recommits them first (no
    `recover` needed) and exits 0, with nothing left open."""
    oracle = oracle_of(create_fragmented(lake, "ns.t", {"eu": 12, "us": 12}))
    assert lake.cli("compact", "ns.t", crash_at="before_commit").returncode == 137
    prepared = lake.engine.ledger.attempts(statuses=[Status.PREPARED])
    assert len(prepared) == 2

    plan = lake.cli("plan", "ns.t")

    assert plan.returncode == 0, plan.stderr
    assert "0 of 2 partition(s) to compact" in plan.stdout
    for attempt in prepared:
        [line] = [ln for ln in plan.stdout.splitlines() if attempt.attempt_id in ln]
        assert line.startswith(f"in flight: {attempt.partition_key}: 12 file(s) held by attempt")
        assert "is gone" in line and "compaction-assets recover" in line

    run = lake.cli("compact", "ns.t")

    assert run.returncode == 0, run.stderr
    assert "recovered 2 attempt(s)" in run.stderr and "2 recommitted" in run.stderr
    assert lake.engine.ledger.attempts(statuses=OPEN) == []
    assert {a.status for a in lake.engine.ledger.attempts()} == {Status.COMMITTED}
    assert len(data_files(lake.table("ns.t"))) == 2
    assert_rows_kept(lake, oracle)


def test_a_partition_a_live_run_holds_is_skipped_naming_the_holder(lake):
    """An open attempt of a live process (this one) is never recovered by `compact`; its
    partition is skipped with the holder, and the other partition is compacted."""
    table = create_fragmented(lake, "ns.t", {"eu": 12, "us": 12})
    eu = sorted(f["file_path"] for f in data_files(table) if f["partition"]["region"] == "eu")
    held = lake.engine.ledger.begin(
        "live-task", "ns.t", "region=eu", "minor", table.current_snapshot().snapshot_id, eu, ["/nowhere"], 600, 1
    )

    outcomes = {o.partition_key: o for o in lake.engine.compact("ns.t")}

    assert outcomes["region=us"].status == "committed"
    skipped = outcomes["region=eu"]
    assert skipped.status == "skipped"
    assert f"12 file(s) held by attempt {held.attempt_id} (EXECUTING" in skipped.reason
    assert f"process {os.getpid()}" in skipped.reason and "which is running" in skipped.reason
    assert lake.engine.ledger.get(held.attempt_id).status == Status.EXECUTING


def test_recover_commits_every_recoverable_attempt_of_a_table_in_one_snapshot(lake):
    """A run killed after precommit of 6 partitions: `recover` recommits them in one snapshot,
    not six. The checks stay per attempt: one whose sources another engine deleted meanwhile rolls
    back alone, the other five commit together."""
    regions = ["r0", "r1", "r2", "r3", "r4", "r5"]
    create_fragmented(lake, "ns.t", dict.fromkeys(regions, 8), rows=20)
    assert lake.cli("compact", "ns.t", crash_at="before_commit").returncode == 137
    assert len(lake.engine.ledger.attempts(statuses=[Status.PREPARED])) == 6
    lake.table("ns.t").delete(EqualTo("region", "r3"))  # another engine deletes a whole partition
    oracle = oracle_of(lake.table("ns.t"))
    snapshots = len(lake.table("ns.t").metadata.snapshots)

    run = lake.cli("recover")

    assert run.returncode == 0, run.stderr
    assert "5 recommitted, 1 rolled back" in run.stdout
    table = lake.table("ns.t")
    assert len(table.metadata.snapshots) == snapshots + 1
    committed = lake.engine.ledger.attempts(statuses=[Status.COMMITTED])
    assert sorted(table.current_snapshot().summary[ATTEMPT_ID_PROPERTY].split(",")) == sorted(
        a.attempt_id for a in committed
    )
    assert sorted(a.partition_key for a in committed) == [f"region={r}" for r in regions if r != "r3"]
    [rolled_back] = lake.engine.ledger.attempts(statuses=[Status.ROLLED_BACK])
    assert rolled_back.partition_key == "region=r3" and "no longer live" in rolled_back.reason
    assert len(data_files(table)) == 5
    assert_rows_kept(lake, oracle)


def test_two_compacts_of_one_table_started_together_claim_disjoint_partitions(lake):
    """Both runs plan before either begins (each pauses after planning), so both plan every
    partition; the ledger claim lets each partition go to one of them, the other skips it naming
    the holder. No partition is rewritten twice, no run fails, rows are kept."""
    regions = {f"r{i}": 6 for i in range(8)}
    oracle = oracle_of(create_fragmented(lake, "ns.t", regions, rows=20))
    env = {**os.environ, "COMPACTION_CONFIG": str(lake.config_path), PAUSE_ENV: "after_plan:6"}
    env.pop("COMPACTION_CRASH_AT", None)
    both = [
        subprocess.Popen([*CLI, "compact", "ns.t"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in both]

    assert [p.returncode for p in both] == [0, 0], outputs
    attempts = lake.engine.ledger.attempts()
    per_partition = Counter(a.partition_key for a in attempts)
    assert sorted(per_partition) == [f"region={r}" for r in regions]
    assert set(per_partition.values()) == {1}, per_partition  # each partition rewritten once
    assert {a.status for a in attempts} == {Status.COMMITTED}
    held = [ln for out, _ in outputs for ln in out.splitlines() if "the partition is held by attempt" in ln]
    assert len(held) == len(regions)  # each run names the holder of each partition it skipped
    assert len(data_files(lake.table("ns.t"))) == len(regions)
    assert_rows_kept(lake, oracle)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_claims_racing_on_one_partition_let_exactly_one_through(tmp_path, backend):
    """Eight ledgers (connection pools of their own, as processes have) claim one partition at
    the same moment, ten rounds: exactly one claim per round wins, the others name it."""
    if backend == "postgres":
        with postgres_schema() as url:
            _race_claims(url)
    else:
        _race_claims(f"sqlite:///{tmp_path}/state.db")


def _race_claims(url: str) -> None:
    ledgers = [Ledger(url) for _ in range(8)]
    try:
        for round_no in range(10):
            won, lost = _claim_round(ledgers, f"p={round_no}")
            assert len(won) == 1 and len(lost) == len(ledgers) - 1
            assert {exc.holder.attempt_id for exc in lost} == set(won)
    finally:
        for ledger in ledgers:
            ledger.dispose()


def _claim_round(ledgers: list[Ledger], partition: str) -> tuple[list[str], list[Claimed]]:
    """Every ledger claims `partition` (each with a source file of its own) at the same moment."""
    barrier = threading.Barrier(len(ledgers))
    won: list[str] = []
    lost: list[Claimed] = []

    def claim(ledger: Ledger, n: int) -> None:
        barrier.wait()
        try:
            won.append(
                ledger.begin(
                    f"{partition}-{n}", "ns.t", partition, "minor", 1, [f"{partition}-f{n}"], ["/x"], 1, 1, claim=True
                ).attempt_id
            )
        except Claimed as exc:
            lost.append(exc)

    threads = [threading.Thread(target=claim, args=(ledger, n)) for n, ledger in enumerate(ledgers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, lost


def test_a_claim_is_refused_only_on_a_held_partition_of_the_same_table(tmp_path):
    """A manifest rewrite (table-wide) holds no partition; another table's attempt on the same key
    does not count; an ended attempt frees its partition."""
    ledger = Ledger(f"sqlite:///{tmp_path}/state.db")
    try:
        ledger.begin("m", "ns.t", "", "rewrite-manifests", 1, ["m1.avro"], ["/x"], 1, 1, claim=True)
        first = ledger.begin("a", "ns.t", "", "minor", 1, ["a.parquet"], ["/x"], 1, 1, claim=True)  # unpartitioned
        ledger.begin("b", "ns.u", "", "minor", 1, ["b.parquet"], ["/x"], 1, 1, claim=True)  # another table
        with pytest.raises(Claimed) as refused:
            ledger.begin("c", "ns.t", "", "major", 1, ["c.parquet"], ["/x"], 1, 1, claim=True)
        assert refused.value.holder.attempt_id == first.attempt_id
        ledger.mark_failed(first.attempt_id, "done")
        ledger.begin("c", "ns.t", "", "major", 1, ["c.parquet"], ["/x"], 1, 1, claim=True)
    finally:
        ledger.dispose()
