"""`Engine`: compaction for the tables of one compaction.yaml, the one entry point of the CLI and
the Dagster assets. Each verb is thin: planning is engine/table_plan.py, a compaction run
engine/run.py (its attempts begun in engine/begin.py, its Spark job built in execution/job.py),
the rest the commit and maintenance packages'."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from compaction_assets.commit.ledger import OPEN, Attempt, Ledger
from compaction_assets.commit.manifest_rewrite import ManifestRewriteReport, rewrite_manifests
from compaction_assets.commit.recovery import RecoveryReport, describe_holder, recover
from compaction_assets.config import CompactionConfig
from compaction_assets.engine import run
from compaction_assets.engine.outcomes import PartitionOutcome, skipped
from compaction_assets.engine.table_plan import TablePlan, plan_loaded_table
from compaction_assets.errors import CompactionError
from compaction_assets.execution.spark import spark_session
from compaction_assets.gc_pause import gc_paused
from compaction_assets.lake.catalog import load_table, open_catalog
from compaction_assets.lake.files import LiveFile
from compaction_assets.maintenance.gc import GcPolicy, GcReport, collect_garbage
from compaction_assets.planning.model import Kind
from compaction_assets.planning.policy import ENABLED_PROPERTY, Policy, resolve_policy

log = logging.getLogger("compaction_assets")


class Engine:
    """Compaction for the tables of one compaction.yaml."""

    def __init__(
        self,
        config: CompactionConfig,
        catalog: Catalog | None = None,
        ledger: Ledger | None = None,
        spark: Callable[[], SparkSession] | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        """`clock`: now, in epoch milliseconds, for data expiration's cutoff (default: the system's)."""
        self.config = config
        self.catalog = catalog or open_catalog(config.catalog)
        self.ledger = ledger or Ledger(config.state_uri)
        self._spark_factory = spark or (lambda: spark_session(config.spark))
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)

    def spark_session(self) -> SparkSession:
        """The Spark session compactions run on."""
        return self._spark_factory()

    def policy(self, table: Table, table_name: str) -> Policy:
        rule = self.config.rule_for(table_name)
        if rule is None:
            raise CompactionError(f"table '{table_name}' matches no `tables:` rule in {self.config.source}")
        return resolve_policy(table_name, rule.policy, table.properties)

    def plan(self, table_name: str, partition: str | None = None) -> TablePlan:
        return self._plan(load_table(self.catalog, table_name), table_name, partition)[0]

    def plan_for(self, table: Table, table_name: str) -> TablePlan:
        """Plan an already loaded table (the sensor loads it to read its snapshot id)."""
        return self._plan(table, table_name, None)[0]

    @gc_paused()
    def compact(
        self,
        table_name: str,
        partition: str | None = None,
        task_id: str | None = None,
        partitions: Collection[str] | None = None,
        kinds: Collection[Kind] | None = None,
    ) -> list[PartitionOutcome]:
        """Compact every partition worth it (or only `partition`, which must exist, or only those
        of `partitions` the table has; only plans of `kinds`, if given); one task attempt per
        partition, all in one Spark job and one commit (data expirations: one commit of their own).
        With a `task_id`, a partition's attempts are that task's if it is the only one
        compacted and `partitions` names at most one, else task `<task_id>:<partition key>`.

        The driver's work allocates an object or more per source file (entries, plans, specs,
        results): Python's cyclic collector is paused meanwhile (see gc_pause), else its sweeps of
        a long-lived process's heap cost a 5,000-file compaction 0.2-0.3 s each, at random.

        Open attempts of the table (of its compacted partitions) whose process is gone are recovered
        first (commit/recovery.py). A partition another open attempt holds is skipped with the
        holder and what to run: each partition's attempt is claimed in the ledger (Ledger.begin),
        so a second `compact` of the table, started at the same moment, takes the partitions the
        first has not claimed."""
        started = time.monotonic()
        self._recover_orphans(table_name, partition, partitions)
        table = load_table(self.catalog, table_name)
        tplan, files = self._plan(table, table_name, partition, partitions)
        plan_done = time.monotonic()
        todo = [p for p in tplan.to_compact if kinds is None or p.kind in kinds]
        chosen = {id(p) for p in todo}
        outcomes = [
            skipped(table_name, p, "" if not p.worth_compacting else f"planned {p.kind}, not run: {p.reason}")
            for p in tplan.partitions
            if id(p) not in chosen
        ]
        self._say_who_holds(table_name, outcomes)
        if not todo:
            return outcomes
        log.info(
            "%s: compacting %d partition(s): %s",
            table_name,
            len(todo),
            ", ".join(f"{p.partition_key or '-'} ({p.kind})" for p in todo),
        )
        runs = len(todo) if partitions is None else max(len(todo), len(partitions))
        outcomes += run.run_compaction(
            self.ledger,
            self.config,
            self._spark_factory,
            table,
            tplan,
            files,
            todo,
            (task_id, runs),
            (started, plan_done),
        )
        return outcomes

    def expire(
        self, table_name: str, partition: str | None = None, task_id: str | None = None
    ) -> list[PartitionOutcome]:
        """Run only the data expirations of TABLE's plan (or of `partition`); the rest is skipped."""
        return self.compact(table_name, partition=partition, task_id=task_id, kinds={Kind.EXPIRE})

    def recover(self) -> RecoveryReport:
        return recover(self.catalog, self.ledger, self.config.state.executing_timeout_seconds)

    def _recover_orphans(self, table_name: str, partition: str | None, partitions: Collection[str] | None) -> None:
        """Recover the open attempts of the table (of `partition` / `partitions`, if given) whose
        process is gone, before planning, so a crashed run does not hold them until `recover` runs.
        What cannot be recovered stays open: the partition is then skipped naming it (_say_who_holds)."""
        scope = {partition} if partition is not None else set(partitions) if partitions is not None else None
        report = recover(self.catalog, self.ledger, self.config.state.executing_timeout_seconds, table_name, scope)
        if report.handled:
            log.info(
                "%s: recovered %d attempt(s) of processes that are gone: %d confirmed committed, %d recommitted, "
                "%d rolled back, %d abandoned, %d parked",
                table_name,
                report.handled,
                len(report.confirmed),
                len(report.recommitted),
                len(report.rolled_back),
                len(report.abandoned),
                len(report.parked),
            )
        for error in report.errors:
            log.warning("%s: could not recover %s; run `compaction-assets recover` once it is fixed", table_name, error)

    def _say_who_holds(self, table_name: str, skipped: list[PartitionOutcome]) -> None:
        """Add to each skipped partition's reason the open attempts holding its files, and what to run."""
        holders: dict[str, list[Attempt]] = {}
        for attempt in self.ledger.attempts(statuses=OPEN, table_name=table_name) if skipped else ():
            holders.setdefault(attempt.partition_key, []).append(attempt)
        timeout = self.config.state.executing_timeout_seconds
        for outcome in skipped:
            for attempt in holders.get(outcome.partition_key, ()):
                outcome.reason += f"; {len(attempt.source_files)} file(s) held by {describe_holder(attempt, timeout)}"

    def gc(self, table_name: str, dry_run: bool = False) -> GcReport:
        table = load_table(self.catalog, table_name)
        policy = GcPolicy.resolve(table_name, self.config.gc, table.properties)
        return collect_garbage(table, self.ledger, policy, dry_run=dry_run)

    def rewrite_manifests(
        self, table_name: str, task_id: str | None = None, dry_run: bool = False
    ) -> ManifestRewriteReport:
        """Rewrite the table's small manifests if due (commit/manifest_rewrite.py); metadata only, no Spark."""
        table = load_table(self.catalog, table_name)
        policy = self.policy(table, table_name)
        return rewrite_manifests(
            table, table_name, self.ledger, policy, task_id, dry_run, self.config.state.heartbeat_seconds
        )

    def set_enabled(self, table_name: str, enabled: bool) -> None:
        """Pause or resume compaction and GC of a table, persisted as its compaction.enabled property."""
        table = load_table(self.catalog, table_name)
        with table.transaction() as txn:
            txn.set_properties({ENABLED_PROPERTY: str(enabled).lower()})

    @gc_paused()  # a LiveFile per file and the planner's working set (the sensor plans here too)
    def _plan(
        self, table: Table, table_name: str, partition: str | None, only: Collection[str] | None = None
    ) -> tuple[TablePlan, dict[str, LiveFile]]:
        policy = self.policy(table, table_name)
        return plan_loaded_table(table, table_name, policy, self.ledger, self._clock, partition, only)
