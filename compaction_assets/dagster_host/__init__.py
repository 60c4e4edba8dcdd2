"""Warm Dagster runs: a long-lived run host forks a child per run (see host.py, launcher.py)."""
