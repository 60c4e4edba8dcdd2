"""Iceberg Java commits while we compact, and while an attempt sits PREPARED until recovery: seeded
histories (tests/interop/race.py). No row lost, duplicated or resurrected; each side's outcome counted.

A long run is a command, not CI: `INTEROP_RACE_SECONDS=1200 .venv/bin/pytest tests/interop/test_java_races.py -s`."""

from __future__ import annotations

import os
import time

from tests.interop.conftest import SharedLake
from tests.interop.race import run

SECONDS = float(os.environ.get("INTEROP_RACE_SECONDS", "0"))
SEED = int(os.environ.get("INTEROP_RACE_SEED", "20261127"))


def test_java_commits_racing_our_compactions_lose_no_row(shared_lake: SharedLake):
    if SECONDS:
        figures = run(shared_lake, range(SEED, SEED + 100_000), steps=8, deadline=time.monotonic() + SECONDS)
    else:
        figures = run(shared_lake, range(SEED, SEED + 3), steps=6)
    print(f"\ninterop race: seed={SEED} {figures.line()}")
    assert figures.lost == figures.duplicated == figures.resurrected == 0
    assert figures.our_commits > 0 and figures.java_commits > 0
