"""Pause Python's cyclic garbage collector around bursts of allocation.

Decoding or writing a manifest of thousands of entries allocates hundreds of thousands of small
objects, none of them cyclic garbage, and every few hundred allocations the collector walks the
young objects again; the older generations' sweeps walk every live object of the process (a
long-lived driver holds millions). Measured on a 5,000-entry manifest: decoded in 0.17-0.24 s
with the collector on, 0.075 s with it paused. Reference counting still frees everything that is
not cyclic while it is paused.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _State:
    lock = threading.Lock()
    depth = 0  # blocks inside gc_paused, over all threads
    was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector is off for the block; nested and concurrent blocks turn it back on when the
    last one exits, and only if it was on when the first one entered."""
    with _State.lock:
        if _State.depth == 0:
            _State.was_enabled = gc.isenabled()
            gc.disable()
        _State.depth += 1
    try:
        yield
    finally:
        with _State.lock:
            _State.depth -= 1
            if _State.depth == 0 and _State.was_enabled:
                gc.enable()
