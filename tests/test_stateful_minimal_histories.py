"""Histories the model-based test (tests/test_stateful.py) found failing, kept as explicit tests.

Each replays the minimal history Hypothesis printed, step by step on the same state machine, with
every invariant checked after every step. Each was an issue 15 defect when found; the reason
stays in its docstring or name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.stateful.machine import TableHistory


@contextmanager
def history(spark, tmp_path) -> Iterator[TableHistory]:
    TableHistory.spark, TableHistory.root = spark, tmp_path
    machine = TableHistory()
    try:
        yield machine
    finally:
        machine.teardown()


def step(machine: TableHistory, rule: str, **arguments) -> None:
    """One rule, then every invariant, as Hypothesis runs them."""
    getattr(machine, rule)(**arguments)
    machine.rows_equal_the_oracle()
    machine.every_referenced_file_exists()
    machine.partitions_match_their_rows()


def test_gc_keeps_a_live_file_added_as_file_colon_path(spark, tmp_path):
    with history(spark, tmp_path) as machine:
        step(machine, "seed_rows", region=None, files=2)
        step(machine, "add_files", region="a/b", spelling="file1")
        step(machine, "our_gc")


def test_gc_keeps_a_live_file_added_as_plain_path(spark, tmp_path):
    with history(spark, tmp_path) as machine:
        step(machine, "seed_rows", region=None, files=2)
        step(machine, "add_files", region="a/b", spelling="plain")
        step(machine, "our_gc")


def test_position_delete_and_append_landing_inside_our_commit(spark, tmp_path):
    """r1: the delete is not the head any more when our commit retries."""
    with history(spark, tmp_path) as machine:
        step(machine, "seed_rows", region="eu", files=4)
        step(
            machine,
            "compact_while_another_engine_commits",
            kind="position_delete+append",
            at="in_commit",
            region="eu",
            pick=0,
        )


def test_recovery_after_the_compaction_snapshot_was_expired(spark, tmp_path):
    """r2: crash after the Iceberg commit, a writer appends, another engine expires, then recovery."""
    with history(spark, tmp_path) as machine:
        step(machine, "seed_rows", region="eu", files=3)
        step(machine, "compact_and_crash", point="after_iceberg_commit", region="eu", pick=None, roll_back=False)
        step(machine, "append", region="us", files=1, rows=1)
        step(machine, "expire_snapshots_by_another_engine")
        step(machine, "recover")


def test_null_and_the_string_null_stay_apart(spark, tmp_path):
    """r3."""
    with history(spark, tmp_path) as machine:
        step(machine, "seed_rows", region=None, files=2)
        step(machine, "append", region="null", files=2, rows=2)
        step(machine, "compact", pick=None)


def test_partition_spec_gains_a_field_between_precommit_and_commit(spark, tmp_path):
    """r4 add."""
    with history(spark, tmp_path) as machine:
        step(machine, "seed_rows", region="eu", files=3)
        step(
            machine, "compact_while_another_engine_commits", kind="spec_change", at="after_prepare", region="eu", pick=1
        )
        step(machine, "recover")


def test_partition_spec_loses_a_field_between_precommit_and_commit(spark, tmp_path):
    """r4 remove: the spec drops region between precommit and commit. Passes today."""
    with history(spark, tmp_path) as machine:
        step(machine, "seed_rows", region="eu", files=3)
        step(
            machine, "compact_while_another_engine_commits", kind="spec_change", at="after_prepare", region="eu", pick=0
        )
        step(machine, "recover")


def test_partition_spec_swaps_fields_between_precommit_and_commit(spark, tmp_path):
    """r4 replace: region out, cat in, in one spec update between precommit and commit."""
    with history(spark, tmp_path) as machine:
        step(machine, "seed_rows", region="eu", files=3)
        step(
            machine, "compact_while_another_engine_commits", kind="spec_change", at="after_prepare", region="eu", pick=2
        )
        step(machine, "recover")


def test_equality_delete_landing_inside_our_commit(spark, tmp_path):
    """Defect 1, second half: an equality delete committed after the base must still apply to the
    rewritten rows (base data sequence number), or the commit must back off. Passes today (backs off)."""
    with history(spark, tmp_path) as machine:
        step(machine, "seed_rows", region="eu", files=3)
        step(
            machine, "compact_while_another_engine_commits", kind="equality_delete", at="in_commit", region="eu", pick=0
        )


def test_recovery_of_a_prepared_attempt_after_the_spec_changed(spark, tmp_path):
    """Found by the machine: crash after precommit, another engine swaps the spec, recovery."""
    with history(spark, tmp_path) as machine:
        step(machine, "seed_rows", region="null", files=4)
        step(machine, "compact_and_crash", point="after_prepare", region="eu", pick=11, roll_back=False)
        step(machine, "evolve_spec", which=2)
        step(machine, "recover")
