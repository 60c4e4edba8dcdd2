"""Histories the model-based test (tests/test_stateful.py) found failing, kept as explicit tests.

Each replays the minimal history Hypothesis printed, step by step on the same state machine, with
every invariant checked after every step. The xfail ones are issue 15 defects still open on this
branch: strict, so the test turns red (XPASS) the moment the fix lands and the marker must go.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

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


@pytest.mark.xfail(strict=True, reason="issue 15 defect 5: GC deletes a live file registered as file:/abs")
def test_gc_keeps_a_live_file_added_as_file_colon_path(spark, tmp_path):
    with history(spark, tmp_path) as machine:
        step(machine, "seed_rows", region=None, files=2)
        step(machine, "add_files", region="a/b", spelling="file1")
        step(machine, "our_gc")


@pytest.mark.xfail(strict=True, reason="issue 15 defect 5: GC deletes a live file registered as /abs")
def test_gc_keeps_a_live_file_added_as_plain_path(spark, tmp_path):
    with history(spark, tmp_path) as machine:
        step(machine, "seed_rows", region=None, files=2)
        step(machine, "add_files", region="a/b", spelling="plain")
        step(machine, "our_gc")
