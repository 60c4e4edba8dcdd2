"""`compaction-assets soak`: writers, compactions, GC and injected kills together, then the
invariants. Every decision (which partition, which fault, when to kill) comes from the seed, so a
failing schedule can be replayed; the timing of the machine still varies.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import yaml
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from compaction_assets.config import load_config
from compaction_assets.engine.facade import Engine
from compaction_assets.faults import CRASH_ENV
from compaction_assets.lake.catalog import load_table, open_catalog
from compaction_assets.lake.digest import row_hashes
from compaction_tools.reliability import InvariantReport, check_invariants

TABLE = "soak.events"
REGIONS = ("eu", "us", "apac", "latam")
COMPACTION_FAULTS = ("kill -9 mid-run", "after_plan", "after_rewrite", "after_prepare", "after_iceberg_commit", "none")
FAULT_WEIGHTS = (5, 1, 2, 2, 2, 1)


@dataclass
class SoakFigures:
    seed: int
    minutes: float
    processes: int = 0
    commits: int = 0
    appends: int = 0
    kills: int = 0
    faults: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    max_recovery_s: float = 0.0
    invariants: InvariantReport | None = None

    def report(self) -> InvariantReport:
        """The invariants' report, which run_soak sets once the soak is over."""
        if self.invariants is None:
            raise RuntimeError("soak: no invariant report yet (the invariants are checked when the soak ends)")
        return self.invariants

    def lines(self) -> list[str]:
        inv = self.report()
        return [
            f"seed {self.seed}, {self.minutes:g} min: {self.processes} compaction/GC processes, {self.kills} kills "
            f"survived, {self.commits} commits, {self.appends} acknowledged appends",
            f"rows verified {inv.rows_verified}, rows lost {inv.rows_lost}, rows duplicated {inv.rows_duplicated}, "
            f"orphan files after GC {len(inv.orphan_files)}, open attempts {inv.open_attempts}, "
            f"consistency problems {len(inv.consistency_problems)}, max recovery time {self.max_recovery_s:.1f}s",
        ]


def run_soak(minutes: float, seed: int, workdir: Path | None = None, log=print, slots: int = 4) -> SoakFigures:  # noqa: ANN001
    """`slots` fault loops run side by side, each with its own schedule drawn from the seed."""
    root = Path(workdir or tempfile.mkdtemp(prefix="compaction-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    config_path = _write_config(root)
    engine = Engine(load_config(config_path))
    _create_table(engine)
    figures = SoakFigures(seed, minutes)
    oracle: Counter[bytes] = Counter()
    stop = threading.Event()
    writer = threading.Thread(target=_write, args=(config_path, seed, oracle, figures, stop), daemon=True)
    writer.start()
    deadline = time.monotonic() + minutes * 60
    lock = threading.Lock()
    log(f"soak: seed {seed}, {minutes:g} min, {slots} slot(s), lake in {root}")
    loops = [
        threading.Thread(target=_fault_loop, args=(config_path, seed * 1000 + slot, deadline, figures, lock, log))
        for slot in range(slots)
    ]
    for loop in loops:
        loop.start()
    for loop in loops:
        loop.join()
    stop.set()
    writer.join()
    engine.recover()
    figures.commits = engine.ledger.counts().get("COMMITTED", 0)
    figures.invariants = check_invariants(engine, TABLE, oracle)
    for line in figures.lines():
        log(line)
    return figures


def _fault_loop(config_path: Path, seed: int, deadline: float, figures: SoakFigures, lock, log) -> None:  # noqa: ANN001
    rng = random.Random(seed)
    engine = Engine(load_config(config_path))  # its own catalog and ledger connections
    while time.monotonic() < deadline:
        if rng.random() < 0.2:  # GC often enough to keep the snapshot history short
            fault = rng.choice(("gc_after_expire", "none"))
            args = ["gc", TABLE]
        else:
            fault = rng.choices(COMPACTION_FAULTS, FAULT_WEIGHTS)[0]
            partition = rng.choice((*REGIONS, None))
            args = ["compact", TABLE, *(["--partition", f"region={partition}"] if partition else [])]
        killed_at = _run_process(config_path, args, fault, rng.uniform(0.5, 12.0))
        report = engine.recover()  # what the recovery sensor's run does; live processes are left alone
        outcome = "clean" if killed_at is None else _outcome(report)
        recovered_in = None if killed_at is None else time.monotonic() - killed_at
        with lock:
            figures.processes += 1
            if recovered_in is not None:
                figures.kills += 1
                figures.max_recovery_s = max(figures.max_recovery_s, recovered_in)
            figures.faults[fault][outcome] += 1
        took = "" if recovered_in is None else f" (recovered {recovered_in:.1f}s after the kill)"
        log(f"  {args[0]} {' '.join(args[2:]) or 'all'}: fault {fault}: {outcome}{took}")


def _outcome(report) -> str:  # noqa: ANN001 - RecoveryReport
    parts = [
        f"{name} {len(ids)}"
        for name, ids in (
            ("confirmed", report.confirmed),
            ("recommitted", report.recommitted),
            ("rolled back", report.rolled_back),
            ("abandoned", report.abandoned),
        )
        if ids
    ]
    return ", ".join(parts) or "nothing to recover"


def _run_process(config_path: Path, args: list[str], fault: str, delay: float) -> float | None:
    """Run one CLI process with the fault; returns when it was killed, or None if it ran clean."""
    env = {**os.environ, "COMPACTION_CONFIG": str(config_path)}
    env.pop(CRASH_ENV, None)
    if fault not in ("none", "kill -9 mid-run"):
        env[CRASH_ENV] = fault
    command = [str(Path(sys.executable).parent / "compaction-assets"), *args]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        returncode = process.wait(timeout=delay if fault == "kill -9 mid-run" else 300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the process and its JVM, as a lost machine would
        process.wait()
        return time.monotonic()
    _reap(process.pid)
    return time.monotonic() if returncode == 137 else None


def _reap(pgid: int) -> None:
    """A process that died at a crash point leaves its JVM child behind; kill the group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _write(config_path: Path, seed: int, oracle: Counter, figures: SoakFigures, stop: threading.Event) -> None:
    """A streaming writer: small appends; a row enters the oracle only once its append committed."""
    rng = random.Random(seed + 1)
    table = load_table(open_catalog(load_config(config_path).catalog), TABLE)
    next_id = 0
    while not stop.wait(1.0):  # one commit a second: a busy streaming sink
        region = rng.choice(REGIONS)
        rows = [{"id": next_id + i, "region": region, "payload": f"{seed}-{next_id + i}"} for i in range(20)]
        next_id += 20
        try:
            table.append(pa.Table.from_pylist(rows, schema=_ARROW))
        except Exception:  # not acknowledged, so not in the oracle
            table.refresh()
            continue
        oracle.update(row_hashes(rows))
        figures.appends += 1


_ARROW = pa.schema([("id", pa.int64()), ("region", pa.string()), ("payload", pa.string())])


def _create_table(engine: Engine) -> None:
    engine.catalog.create_namespace_if_not_exists("soak")
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "region", StringType(), required=False),
        NestedField(3, "payload", StringType(), required=False),
    )
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"))
    engine.catalog.create_table(TABLE, schema=schema, partition_spec=spec)


def _write_config(root: Path) -> Path:
    doc = {
        "catalog": {
            "name": "soak",
            "properties": {"type": "sql", "uri": "sqlite:///catalog.db", "warehouse": "file://warehouse"},
        },
        "state": {"uri": "sqlite:///state.db"},
        "spark": {"mode": "local", "master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        "tables": [{"match": "*", "policy": {"target_file_size_bytes": 256 * 1024, "min_input_files": 3}}],
        # The writer keeps committing: orphans younger than a minute may be its next commit.
        "gc": {"max_snapshot_age_hours": 0, "min_snapshots_to_keep": 1, "orphan_grace_hours": 1 / 60},
    }
    path = root / "compaction.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def readme_section(figures: SoakFigures, command: str) -> str:
    rows = [
        f"| {fault} | {sum(outcomes.values())} | {'; '.join(f'{k}: {v}' for k, v in sorted(outcomes.items()))} |"
        for fault, outcomes in sorted(figures.faults.items())
    ]
    return "\n".join(
        [
            f"Generated by `{command}`:",
            "",
            "| injected fault | times | recovery outcome (attempts) |",
            "|---|---|---|",
            *rows,
            "",
            *(f"- {line}" for line in figures.lines()),
        ]
    )
