"""The invariants every fault scenario and the soak end with, checked against an oracle: the
multiset of rows every writer acknowledged."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from compaction_assets.commit.consistency import check_consistency
from compaction_assets.commit.ledger import OPEN
from compaction_assets.engine.facade import Engine
from compaction_assets.lake.catalog import load_table
from compaction_assets.lake.digest import table_row_hashes
from compaction_assets.lake.files import live_files
from compaction_assets.lake.storage import table_files
from compaction_assets.maintenance.gc import ORPHAN_SUFFIXES, GcPolicy, collect_garbage, reachable

FINAL_GC = GcPolicy(max_snapshot_age_ms=0, min_snapshots_to_keep=1, orphan_grace_ms=0)


@dataclass
class InvariantReport:
    rows_verified: int = 0
    rows_lost: int = 0
    rows_duplicated: int = 0
    open_attempts: int = 0
    orphan_files: list[str] = field(default_factory=list)
    consistency_problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.rows_lost
            or self.rows_duplicated
            or self.open_attempts
            or self.orphan_files
            or self.consistency_problems
        )


def check_invariants(engine: Engine, table_name: str, oracle: Counter[bytes]) -> InvariantReport:
    """After recovery, with no writer or compaction running: rows, ledger, GC and consistency."""
    table = load_table(engine.catalog, table_name)
    actual = table_row_hashes(table)
    report = InvariantReport(
        rows_verified=sum(actual.values()),
        rows_lost=sum((oracle - actual).values()),
        rows_duplicated=sum((actual - oracle).values()),
        open_attempts=len(engine.ledger.attempts(statuses=OPEN, table_name=table_name)),
    )
    collect_garbage(table, engine.ledger, FINAL_GC)
    table.refresh()
    report.orphan_files = unreferenced_files(table)
    timeout = engine.config.state.executing_timeout_seconds
    for key in sorted({f.partition_key for f in live_files(table)}):
        report.consistency_problems += check_consistency(table, engine.ledger, key, None, timeout).problems
    return report


def unreferenced_files(table) -> list[str]:  # noqa: ANN001 - a pyiceberg Table
    """Data and manifest files under the table location that no snapshot of it references."""
    referenced = reachable(table, table.metadata.snapshots)
    return sorted(
        uri for uri in table_files(table.location().rstrip("/"), ORPHAN_SUFFIXES, table.io) if uri not in referenced
    )
