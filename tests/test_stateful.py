"""The model-based test (issue 15): random table histories against an oracle; see tests/stateful.

CI runs a bounded, reproducible budget: derandomized, 20 histories of 15 steps (~2-3 min on 2
cores; STATEFUL_EXAMPLES / STATEFUL_STEPS change it). A long run, for as long as you like:

    STATEFUL_MINUTES=30 STATEFUL_SEED=7 pytest tests/test_stateful.py -p no:cacheprovider -s

runs seeded chunks of histories (25 steps each) until the time is up and prints what it exercised
and found: histories, steps, per-rule counts, crashes and races injected, compaction outcomes, rows
checked, and rows lost / duplicated / resurrected. To explore past a known failure, STATEFUL_SKIP
turns steps into no-ops (see tests/stateful/machine.py); CI never sets it. A failure prints the
minimal history: keep it in tests/test_stateful_minimal_histories.py.

STATEFUL_STORAGE=s3 runs the same machine with each history's warehouse on the local S3 server
(moto, the session's `s3_server`); the default, local, keeps it in a local folder:

    STATEFUL_STORAGE=s3 STATEFUL_MINUTES=8 STATEFUL_SEED=3 pytest tests/test_stateful.py -p no:cacheprovider -s
"""

import os
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.stateful.machine import FIGURES, STORAGE, TableHistory

CI = settings(
    max_examples=int(os.environ.get("STATEFUL_EXAMPLES", "20")),
    stateful_step_count=int(os.environ.get("STATEFUL_STEPS", "15")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)


# a long run (STATEFUL_MINUTES) gets its minutes on top of the suite's default per-test timeout
@pytest.mark.timeout(900 + 60 * float(os.environ.get("STATEFUL_MINUTES", "0")))
def test_random_table_histories_keep_every_row(spark, tmp_path, request):
    TableHistory.spark, TableHistory.root = spark, tmp_path
    TableHistory.s3 = request.getfixturevalue("s3_server") if STORAGE == "s3" else None
    minutes = float(os.environ.get("STATEFUL_MINUTES", "0"))
    try:
        if not minutes:
            run_state_machine_as_test(TableHistory, settings=CI)
            return
        steps = int(os.environ.get("STATEFUL_STEPS", "25"))
        long = settings(CI, derandomize=False, max_examples=4, stateful_step_count=steps)
        first = int(os.environ.get("STATEFUL_SEED", "0")) * 100_003
        started, chunk = time.monotonic(), 0
        while time.monotonic() - started < minutes * 60:
            run_state_machine_as_test(seed(first + chunk)(lambda: TableHistory()), settings=long)
            chunk += 1
    finally:
        TableHistory.s3 = None
        print(f"\nstateful figures (storage={STORAGE}):\n{FIGURES.summary()}")


class MergeOnReadHistory(TableHistory):
    """TableHistory with only other engines' appends and deletes (equality and position), the
    merge-on-read tunings and our compaction, plain and raced: the full machine reached our Polars
    rewrite with equality deletes live once in its 20 histories. Schema and spec changes (which
    send groups to the Arrow path), sorting, expiry, rollbacks, GC, crashes and manifest rewrites
    are the other test's."""

    evolve_schema = evolve_spec = set_clustering = tune_expiration = expire_rows_now = None
    roll_back_main_by_another_engine = drop_data_file_by_another_engine = None
    expire_snapshots_by_another_engine = our_gc = our_gc_crashing = rewrite_manifests = None
    tune_full_optimizing = tune_max_file_size = compact_and_crash = None


def test_merge_on_read_histories_apply_equality_deletes_on_the_polars_path(spark, tmp_path):
    """Rows equal the oracle after every step, and the figures show equality deletes applied by the
    Polars rewrite (the uniform-key fast path among them: keys on `id` or `cat`, both integers)."""
    if STORAGE == "s3":
        return  # the histories above cover S3
    TableHistory.spark, TableHistory.root = spark, tmp_path
    before = Counter(FIGURES.outcomes)
    examples = int(os.environ.get("STATEFUL_MOR_EXAMPLES", "10"))
    run_state_machine_as_test(MergeOnReadHistory, settings=settings(CI, max_examples=examples, stateful_step_count=20))
    reached = Counter(FIGURES.outcomes) - before
    print(f"\nmerge-on-read histories: {dict(reached)}")
    assert reached["equality deletes live, deletes applied by polars"] >= 3, dict(reached)
