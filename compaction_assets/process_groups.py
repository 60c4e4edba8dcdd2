"""Stop whole process sessions together: signal every member, wait, SIGKILL what outlives a grace.

The demo and `serve` start each long-lived part (dagster dev or the webserver and the daemon, the
run host, the Spark Connect JVM) in a session of its own, so a part and everything it started
(code servers, forked runs, Python workers) share one session id. Stopping signals every member
of every session at once and waits for all of them together: the slowest part's shutdown bounds
the stop, not the sum of all parts' (measured: 6-9 s one after the other on an idle machine,
17-41 s under load). Linux only (/proc).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

# SIGINT/SIGTERM first; after this long whatever is left gets SIGKILL. Measured on 2 cores at load
# 6-9: Dagster's daemon and webserver 3-4 s after SIGINT (5 s and more after SIGTERM), the run
# host 1-2 s; the Spark Connect JVM's shutdown hooks often need longer (it is then killed).
STOP_GRACE_S = 4.0
KILL_WAIT_S = 2.0


class Stop(BaseException):  # noqa: N818 - a signal, not an error
    """SIGINT or SIGTERM reached the process (see `signals_raise`)."""


@contextmanager
def signals_raise() -> Iterator[list[int]]:
    """Turn the first SIGINT or SIGTERM into `Stop` in the main thread (later ones are ignored, so a
    second Ctrl-C does not cut the clean stop short); yields the list that gets the signal number."""
    received: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        if not received:
            received.append(signum)
            raise Stop

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the command name: state ppid pgrp session ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def session_of(pid: int) -> int | None:
    """The session id of a live process, None if it is gone."""
    fields = _stat(pid)
    return int(fields[3]) if fields and fields[0] != "Z" else None


def session_members(sid: int) -> list[int]:
    """Live processes of session `sid`, leader first."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(entry.name)) and int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry.name))
    return sorted(members, key=lambda pid: pid != sid)


def descendants(root: int) -> list[int]:
    """`root` and every live process below it (by parent pid), whatever session they moved to."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(entry.name)) and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return [pid for pid in found if alive(pid)]


def _signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def stop_sessions(
    sessions: Iterable[tuple[int | None, int]], grace_s: float = STOP_GRACE_S, kill_wait_s: float = KILL_WAIT_S
) -> tuple[float, list[int]]:
    """Send each session's signal, (session id, signal) pairs (a None id is skipped), to every
    member at once, wait until all are gone, SIGKILL whatever is left after `grace_s`. Returns
    (seconds taken, pids still alive after the kill: empty unless a process is stuck in the
    kernel). The caller reaps its own children (a zombie counts as gone)."""
    signals = {sid: signum for sid, signum in sessions if sid is not None}
    sids = sorted(signals)
    began = time.monotonic()

    def members() -> list[int]:
        return [pid for sid in sids for pid in session_members(sid) if pid != os.getpid()]

    for sid, signum in signals.items():
        _signal_all(session_members(sid), signum)
    if not _gone_by(members, began + grace_s):
        _signal_all(members(), signal.SIGKILL)
        _gone_by(members, began + grace_s + kill_wait_s)
    return time.monotonic() - began, members()


def _gone_by(members: Callable[[], list[int]], deadline: float) -> bool:
    """Poll until `members()` is empty (True) or the monotonic `deadline` passes (False)."""
    while members():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True
