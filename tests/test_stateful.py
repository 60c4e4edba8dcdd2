"""The model-based test (issue 15): random table histories against an oracle; see tests/stateful.

CI runs a bounded, reproducible budget (derandomized). A long run, for as long as you like:

    STATEFUL_MINUTES=30 STATEFUL_SEED=7 pytest tests/test_stateful.py -p no:cacheprovider -s

runs histories until the time is up and prints what it exercised and found (histories, steps, rules,
crashes, races, rows checked; rows lost, duplicated, resurrected).
"""

import os
import time

from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.stateful.machine import FIGURES, TableHistory

CI = settings(
    max_examples=int(os.environ.get("STATEFUL_EXAMPLES", "8")),
    stateful_step_count=int(os.environ.get("STATEFUL_STEPS", "12")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)


def _machine(spark, root):
    TableHistory.spark, TableHistory.root = spark, root
    return TableHistory


def test_random_table_histories_keep_every_row(spark, tmp_path):
    machine = _machine(spark, tmp_path)
    minutes = float(os.environ.get("STATEFUL_MINUTES", "0"))
    try:
        if not minutes:
            run_state_machine_as_test(machine, settings=CI)
            return
        long = settings(
            CI, derandomize=False, max_examples=4, stateful_step_count=int(os.environ.get("STATEFUL_STEPS", "25"))
        )
        started, chunk = time.monotonic(), 0
        while time.monotonic() - started < minutes * 60:
            seeded = seed(int(os.environ.get("STATEFUL_SEED", "0")) * 100_003 + chunk)(lambda: machine())
            run_state_machine_as_test(seeded, settings=long)
            chunk += 1
    finally:
        print(f"\nstateful figures:\n{FIGURES.summary()}")
