"""Which process owns an attempt, beyond host name and pid: on Linux, the PID namespace the pid
belongs to and the process's start time. The same host name does not mean the same pid space
(containers with the host's network, Kubernetes hostNetwork), and a pid is reused once its
process is gone; either way `kill(pid, 0)` alone would call a live owner dead or a dead one alive."""

from __future__ import annotations

import os


def process_identity(pid: int | None = None) -> str | None:
    """'<pid namespace>@<start time in clock ticks>' of `pid` (default: this process) as this
    process sees it, or None where /proc does not tell (not Linux, or not readable)."""
    namespace = _namespace()
    start = _start_time(pid or os.getpid())
    return f"{namespace}@{start}" if namespace and start else None


def judged_gone(recorded: str | None, pid: int) -> bool | None:
    """Whether the process recorded as `recorded` with `pid` is gone: True if its pid is free or
    now another process's (a different start time); False if it runs; None if this process cannot
    tell (another PID namespace, or nothing recorded or readable): judge by the heartbeat then."""
    namespace, _, start = (recorded or "").partition("@")
    if not recorded or namespace != _namespace():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # exists, another user's
    now = _start_time(pid)
    return None if now is None else now != start


def _namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (after the parenthesised command name, which may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
