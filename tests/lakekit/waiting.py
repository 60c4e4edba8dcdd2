"""Waiting for a condition instead of sleeping a fixed time: poll it until a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.1,
    message: str | Callable[[], str] | None = None,
) -> T:
    """Call `predicate` every `interval` seconds until it returns something truthy, and return that;
    raise AssertionError once `timeout` seconds have passed, with `message` (or what it returns,
    read only then: e.g. a log's tail) or else "condition not met within N s". The predicate is
    called at least once, and once more at the deadline; an exception it raises propagates."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(text or f"condition not met within {timeout:g} s")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
