"""The run host: imports Dagster and the project's heavy modules once, then forks a child per run.

A Dagster code server spawns a new Python per run (multiprocessing "spawn"), which re-imports
dagster, pyiceberg, pyarrow, pandas and pyspark: ~10 s on a small machine before the run does
anything. The host pays that once; a forked child starts with everything imported and only
loads the code location (fresh, so tables created since the host started are there) and runs.
The host is single-threaded (fork is safe) and answers one request per connection:
  {"op": "launch", "run_id", "origin", "instance_ref"} -> {"pid"}   (serialized by dagster's serdes)
  {"op": "status", "pid"} -> {"running": bool, "exitcode": int | None}
  {"op": "terminate", "pid"} -> {"sent": bool}                        (SIGINT: Dagster's interrupt)
  {"op": "ping"} -> {"pid": host pid}
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import sys
from pathlib import Path

from compaction_assets.dagster_host.protocol import read_request, reply
from compaction_assets.defs.naming import TABLES_ENV, run_tables

# What a run imports before it compacts; the code location module itself is loaded per run.
PRELOAD = (
    "dagster",
    "compaction_assets.dagster_host.dagster_internals",
    "compaction_assets.defs.build",
    "compaction_assets.engine",
    "pyspark.sql.connect.session",
)


class _Stop(BaseException):  # noqa: N818 - a signal, not an error
    pass


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


def serve(path: Path, preload: tuple[str, ...] = PRELOAD) -> None:
    """Listen on `path` until SIGTERM or SIGINT; the socket file is removed on the way out."""
    for name in preload:
        importlib.import_module(name)
    _warm_instance()
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    listener.settimeout(0.5)
    children: dict[int, int | None] = {}  # pid -> exit code once reaped
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    print(f"run host (pid {os.getpid()}) listening on {path}", flush=True)
    try:
        while True:
            _reap(children)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                try:
                    message = read_request(conn)
                    answer = _handle(message, children, listener)
                except Exception as exc:  # noqa: BLE001 - the launcher gets the error, the host lives on
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                reply(conn, answer)
    except _Stop:
        pass
    finally:
        listener.close()
        path.unlink(missing_ok=True)
        for sig, old in previous.items():
            signal.signal(sig, old)


def _warm_instance() -> None:
    """Open (and close) the instance once: its storage modules are ~4 s of imports on a small
    machine. Nothing of it stays open, so no connection is shared with a forked run."""
    if os.environ.get("DAGSTER_HOME"):
        from dagster import DagsterInstance

        with DagsterInstance.get() as instance:
            instance.get_runs(limit=1)


def _reap(children: dict[int, int | None]) -> None:
    for pid, code in list(children.items()):
        if code is None:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children[pid] = os.waitstatus_to_exitcode(status)
                # a run killed outright (kill -9, OOM) could not take its group along itself
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGTERM)


def _handle(message: dict, children: dict[int, int | None], listener: socket.socket) -> dict:
    op = message.get("op")
    if op == "ping":
        return {"pid": os.getpid()}
    if op == "launch":
        pid = os.fork()
        if pid == 0:
            listener.close()
            _child(message)  # never returns
        children[pid] = None
        return {"pid": pid}
    pid = int(message.get("pid", -1))
    if pid not in children:
        return {"error": f"process {pid} is not a run of this host"}
    _reap(children)
    if op == "status":
        return {"running": children[pid] is None, "exitcode": children[pid]}
    if op == "terminate":
        if children[pid] is None:
            os.kill(pid, signal.SIGINT)
        return {"sent": children[pid] is None}
    return {"error": f"unknown op {op!r}"}


def _child(message: dict) -> None:
    """Execute the run as the code server's run process does (dagster_internals.core_execute_run), then exit."""
    code = 1
    try:
        os.setpgid(0, 0)  # a group of its own (in the host's session): what it starts goes with it
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        code = _execute_run(message)
    except BaseException:  # noqa: BLE001 - the child must never return into the host's loop
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # A local-mode JVM whose driver was interrupted before it connected outlives it (py4j's
        # non-daemon accept thread), so the run's group is told to go before the run exits.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(0, signal.SIGTERM)
        os._exit(code)


def _execute_run(message: dict) -> int:
    # dagster has no public API to run a launched run in the current process; these are what the
    # code server's run process (dagster._grpc.impl._run_in_subprocess, dagster 1.x) calls (dagster_internals).
    from dagster import DagsterInstance, deserialize_value

    from compaction_assets.dagster_host.dagster_internals import (
        EngineEventData,
        InstanceRef,
        JobPythonOrigin,
        capture_interrupts,
        core_execute_run,
        recon_job_from_origin,
    )

    origin = deserialize_value(message["origin"], JobPythonOrigin)
    with (
        capture_interrupts(),
        DagsterInstance.from_ref(deserialize_value(message["instance_ref"], InstanceRef)) as inst,
    ):
        run = inst.get_run_by_id(message["run_id"])
        if run is None:
            print(f"run host: run {message['run_id']} not found in the instance", file=sys.stderr)
            return 1
        if (tables := run_tables(run.asset_selection)) is not None:  # define only what the run needs
            os.environ[TABLES_ENV] = json.dumps(tables)
        inst.report_engine_event(
            f"Started process for run (pid: {os.getpid()}), forked from the warm run host (pid {os.getppid()}).",
            run,
            EngineEventData.in_process(os.getpid()),
        )
        try:
            for _ in core_execute_run(recon_job_from_origin(origin), run, inst, inject_env_vars=True):
                pass
        except BaseException:  # noqa: BLE001 - core_execute_run has logged it and failed the run
            return 1
        finally:
            inst.report_engine_event(f"Process for run exited (pid: {os.getpid()}).", run)
    return 0


def main() -> None:
    """`python -m compaction_assets.dagster_host [SOCKET]` (default $DAGSTER_HOME/run-host.sock)."""
    from compaction_assets.dagster_host.protocol import default_socket

    serve(Path(sys.argv[1]) if len(sys.argv) > 1 else default_socket())
