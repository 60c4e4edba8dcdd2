"""Landing another writer's commit at one of our commit's race points (shared by the stateful
machine, the Java race histories and the regression tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pyiceberg.table import Table

from compaction_assets import faults


@contextmanager
def in_commit(action: Callable[[], None], must_fire: bool = False) -> Iterator[None]:
    """Run `action` once, as our next commit reaches the catalog: after its checks and manifests,
    before the pointer swap. `must_fire`: fail if no commit got there."""
    original = Table._do_commit
    fired: list[bool] = []

    def racing(table: Table, *args: Any, **kwargs: Any) -> None:
        if not fired:
            fired.append(True)
            action()
        original(table, *args, **kwargs)

    Table._do_commit = racing  # type: ignore[method-assign]
    try:
        yield
    finally:
        Table._do_commit = original  # type: ignore[method-assign]
    assert fired or not must_fire, "no commit reached the catalog"


@contextmanager
def raced(at: str, action: Callable[[], None]) -> Iterator[None]:
    """Run `action` once at `at` of our next compaction: "after_prepare" or "in_commit"."""
    if at != "after_prepare":
        with in_commit(action):
            yield
        return
    faults.arm("after_prepare", action)
    try:
        yield
    finally:
        faults.disarm()
