"""Whole-footprint memory and a busy machine, for the bench (issue 36 points 2 and 3).

`TreePeak` samples, in a thread, the resident memory summed over every process doing one
contender's work (ours: our engine's process, its Spark JVM and the JVM's Python workers; Iceberg
Java: the server's Python driver and its JVM) and keeps the largest sum seen over the run, twice:
RSS summed (`peak`), which counts a page shared by several processes (the same libarrow mapped
in our driver and both workers, a forked worker's copy-on-write pages) once per process, and PSS
summed (`peak_pss`, Linux's proportional set size: a shared page split among its sharers), the
memory the tree holds. Processes are found by walking the process tree at every sample, through
psutil if installed, else /proc.

`background_load` runs N CPU-bound processes (a busy loop each) while a block runs, so every
contender is timed on the same busy machine; they are killed by pid when the block ends.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from compaction_assets.process_groups import descendants

try:  # optional: the /proc walk below does the same on Linux
    import psutil
except ImportError:  # pragma: no cover - depends on the environment
    psutil = None

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# The sampler shares the machine with the contender it measures, and what it reads has a price:
# walking the process tree reads every process's /proc stat (4 ms), and a process's PSS makes the
# kernel walk its page tables (1-6 ms each; 24 ms for ours' driver, JVM and three Python workers).
# Both at every 50 ms sample took 37% of a core from ours (the most processes), 2% from pyarrow.
# So: RSS (0.05 ms a process) every INTERVAL_S, the tree walked again every WALK_INTERVAL_S (Spark
# starts a Python worker per task: seconds apart), PSS only near the RSS peak and at most every
# PSS_INTERVAL_S (and at the end): 12% of a core for ours at its peak (measured over 5 s).
INTERVAL_S = 0.05
WALK_INTERVAL_S = 0.2
PSS_INTERVAL_S = 0.5
PSS_NEAR_PEAK = 0.9  # PSS is taken when the RSS sum is at least this share of its peak so far


def _rss(pid: int) -> int:
    """A process's resident bytes now; 0 if it is gone."""
    if psutil is not None:
        try:
            return psutil.Process(pid).memory_info().rss
        except psutil.Error:
            return 0
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _pss(pid: int) -> int:
    """A process's proportional set size now (bytes; Linux /proc/PID/smaps_rollup); 0 if unknown."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            return next(int(line.split()[1]) * 1024 for line in rollup if line.startswith("Pss:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return 0


def tree_pids(trees: Iterable[int], singles: Iterable[int] = ()) -> set[int]:
    """The pids of every process in the trees rooted at `trees`, and `singles` (without their children)."""
    pids = set(singles)
    roots = list(trees)
    if psutil is not None:
        for root in roots:
            try:
                process = psutil.Process(root)
                pids.add(root)
                pids.update(child.pid for child in process.children(recursive=True))
            except psutil.Error:
                continue
        return pids
    for root in roots:
        pids.update(descendants(root))
    return pids


def tree_rss_pss(trees: Iterable[int], singles: Iterable[int] = ()) -> tuple[int, int]:
    """RSS and PSS, each summed over `tree_pids(trees, singles)` now (bytes)."""
    pids = tree_pids(trees, singles)
    return sum(_rss(pid) for pid in pids), sum(_pss(pid) for pid in pids)


class TreePeak:
    """The largest RSS summed over `tree_pids(trees, singles)` sampled every INTERVAL_S while the
    block runs (`peak`, bytes), and the largest PSS summed taken near those peaks (`peak_pss`;
    see PSS_INTERVAL_S). Short-lived peaks between two samples are missed: lower bounds."""

    def __init__(self, trees: Iterable[int], singles: Iterable[int] = ()) -> None:
        self.trees, self.singles = list(trees), list(singles)
        self.peak = self.peak_pss = 0
        self._pids: set[int] = set()
        self._walked = self._pss_at = -math.inf
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="tree-peak-rss", daemon=True)

    def _take(self, last: bool = False) -> None:
        now = time.monotonic()
        if last or now - self._walked >= WALK_INTERVAL_S:
            self._pids, self._walked = tree_pids(self.trees, self.singles), now
        rss = sum(_rss(pid) for pid in self._pids)
        self.peak = max(self.peak, rss)
        if last or (rss >= PSS_NEAR_PEAK * self.peak and now - self._pss_at >= PSS_INTERVAL_S):
            self.peak_pss, self._pss_at = max(self.peak_pss, sum(_pss(pid) for pid in self._pids)), now

    def _sample(self) -> None:
        while True:
            self._take()
            if self._stop.wait(INTERVAL_S):
                break

    def __enter__(self) -> TreePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take(last=True)


BUSY_LOOP = "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nwhile True:\n    pass\n"


@contextmanager
def background_load(processes: int) -> Iterator[list[int]]:
    """`processes` busy-loop Python processes for the block's duration (their pids); each is
    killed by its pid at the end, also when the block fails."""
    started: list[subprocess.Popen] = []
    try:
        for _ in range(processes):
            started.append(subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL))
        yield [p.pid for p in started]
    finally:
        for process in started:
            process.kill()
        for process in started:
            process.wait(10)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as `uptime` shows them."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())
