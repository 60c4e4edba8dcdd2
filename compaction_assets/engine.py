"""The compaction engine: plan a table, rewrite its fragmented partitions on Spark, commit in two
phases. The CLI and the Dagster assets both call `Engine.compact`; nothing here imports Dagster.

Data expiration is a plan kind like the others (planning/expiration.py): its dropped files are
removed by the commit without being read, its other files are rewritten by the same Spark job with
a row filter, and rows are accounted for: rows written = rows read - rows deleted - rows expired.
"""

from __future__ import annotations

import difflib
import json
import logging
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider
from pyspark.sql import SparkSession

from compaction_assets.commit.heartbeat import Heartbeat
from compaction_assets.commit.ledger import OPEN, Attempt, Claimed, Ledger, StaleAttempt
from compaction_assets.commit.manifest_rewrite import ManifestRewriteReport, rewrite_manifests
from compaction_assets.commit.recovery import RecoveryReport, describe_holder, recover
from compaction_assets.commit.two_phase import CommitResult, abandon, commit_together
from compaction_assets.config import CompactionConfig
from compaction_assets.errors import BackOff, CompactionError
from compaction_assets.execution import polars_rewrite
from compaction_assets.execution.delete_tiers import TierJob, TierOutcome, TierRun, run_tiers
from compaction_assets.execution.packing import pack_tasks
from compaction_assets.execution.polars_storage import S3_SCHEMES
from compaction_assets.execution.rewrite import run_rewrite
from compaction_assets.execution.spark import spark_session
from compaction_assets.execution.worker import (
    DeleteSpec,
    ExpireFilter,
    GroupOutcome,
    GroupSpec,
    RewriteJob,
    SourceFile,
)
from compaction_assets.faults import crash_point
from compaction_assets.gc_pause import gc_paused
from compaction_assets.lake.catalog import load_table, open_catalog
from compaction_assets.lake.clustering import clustering_of, file_column_names, sort_keys
from compaction_assets.lake.datafile_codec import datafile_to_json, encode_partition
from compaction_assets.lake.deletes import global_spec_ids, is_deletion_vector, referenced_data_file
from compaction_assets.lake.features import manifest_refusal, refusal, tier_refusal
from compaction_assets.lake.files import LiveFile, live_files
from compaction_assets.lake.manifest_io import CONTENT_OFFSET, CONTENT_SIZE_IN_BYTES, MIN_LINEAGE_VERSION, v3_field
from compaction_assets.maintenance.gc import GcPolicy, GcReport, collect_garbage
from compaction_assets.planning.expiration import ExpireRule, expire_rule
from compaction_assets.planning.manifests import ManifestPlan, plan_manifests
from compaction_assets.planning.overlap import Clustering, bounds_overlap
from compaction_assets.planning.planner import DeleteMap, FileGroup, FullClock, Kind, PartitionPlan, plan_table
from compaction_assets.planning.policy import ENABLED_PROPERTY, Policy, resolve_policy

log = logging.getLogger("compaction_assets")

# rewrites that write in the table's clustering order (its z-order columns, else its sort order)
SORTED_KINDS = (Kind.MAJOR, Kind.FULL, Kind.CLUSTER)


@dataclass(frozen=True)
class TablePlan:
    table_name: str
    snapshot_id: int | None
    policy: Policy
    partitions: list[PartitionPlan]
    refused: str = ""  # why the whole table is not compacted (e.g. format-version 3), or ""
    deletes: DeleteMap = field(default_factory=DeleteMap)  # which delete files apply to which data files
    manifests: ManifestPlan | None = None  # the table-level manifest rewrite (None: no snapshot yet)
    # full optimizing: when a partition fully rewritten before comes due again (epoch ms), or None;
    # the table must be planned again then even if it did not change (the sensor does)
    replan_at_ms: int | None = None
    expire: ExpireRule | str | None = None  # the expiration planned with (None: off; str: why it cannot run)
    clustering: Clustering | None = None  # z-order columns, else sort order (None: neither)
    table_uuid: str | None = None  # the planned table's (recovery refuses an attempt on another of its name)

    @property
    def to_compact(self) -> list[PartitionPlan]:
        return [p for p in self.partitions if p.worth_compacting]

    @property
    def rewrite_manifests_due(self) -> bool:
        """The manifest rewrite is due and no partition is: compactions first (they rewrite
        manifests too, and a rewrite now would be undone by theirs)."""
        return self.manifests is not None and self.manifests.due and not self.to_compact


@dataclass
class PartitionOutcome:
    """What happened to one partition; what the CLI prints and the Dagster asset reports."""

    table_name: str
    partition_key: str
    status: str  # committed | skipped | failed | backed_off (prepared only while committing)
    reason: str
    kind: str | None = None
    task_id: str | None = None
    attempt_id: str | None = None
    snapshot_id: int | None = None
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    files_rewritten: int = 0
    bytes_rewritten: int = 0
    files_written: int = 0
    rows: int = 0  # rows of the rewritten files (deleted ones included)
    deletes_applied: int = 0  # distinct delete files the rewrite applied
    rows_deleted: int = 0  # rows the applied deletes removed (rows written = rows - rows_deleted - rows_expired)
    rows_expired: int = 0  # rows a data expiration dropped on purpose (dropped files' records included)
    files_dropped: int = 0  # data files a data expiration removed by metadata, unread
    delete_files_removed: int = 0  # delete files the commit removed (none apply any more)
    groups: int = 0
    seconds: float = 0.0
    peak_worker_rss: int = 0  # bytes, the largest of its groups' Spark Python workers
    engine: str = ""  # how its groups were rewritten: polars, arrow or polars+arrow
    spill_files: int = 0  # runs its sorted groups spilled to local disk (execution/external_sort.py)
    # a sorted / z-ordered rewrite: {"before": x, "after": y, "columns": [...], "order": "sort"|"zorder"}
    # with the partition's bounds_overlap (planning/overlap.py) before and after it
    bounds_overlap: dict | None = None
    # seconds of the compaction run it was part of, per phase (see describe_phases); shared by its outcomes
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in ("committed", "skipped", "backed_off")

    @property
    def mb_per_s(self) -> float:
        """Rewrite throughput: source bytes read per second."""
        return self.bytes_rewritten / 1e6 / self.seconds if self.seconds else 0.0


@dataclass
class _Work:
    plan: PartitionPlan
    attempt: Attempt
    groups: list[int] = field(default_factory=list)
    deletes: set[str] = field(default_factory=set)  # paths of the delete files its groups apply
    written: list = field(default_factory=list)  # DataFiles its groups wrote, once prepared


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
            _skipped(table_name, p, "" if not p.worth_compacting else f"planned {p.kind}, not run: {p.reason}")
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
        crash_point("after_plan")
        with Heartbeat(self.ledger, self.config.state.heartbeat_seconds) as heartbeat:
            runs = len(todo) if partitions is None else max(len(todo), len(partitions))
            work, job, tiers, tier_run, held = self._begin(table, table_name, tplan, files, todo, (task_id, runs))
            outcomes.extend(held)
            for item in [*work, *tiers]:
                heartbeat.track(item.attempt.attempt_id)
            planned = time.monotonic()
            try:
                # a Spark session only when there is data to read (an expiration may only drop files)
                spark = self._spark_factory() if job.groups or tier_run.jobs else None
                results = run_rewrite(spark, job) if job.groups else {}
                tier_results = run_tiers(spark, tier_run) if tier_run.jobs else []
            except Exception as exc:
                message = _first_line(exc)
                for item in [*work, *tiers]:
                    self._abandon(table, item.attempt, f"rewrite job failed: {message}")
                raise CompactionError(f"{table_name}: rewrite job failed: {message}") from exc
            crash_point("after_rewrite")
            rewritten = time.monotonic()
            phases = {
                "plan": plan_done - started,
                "begin": planned - plan_done,
                "rewrite": rewritten - planned,
            }
            task_seconds = _task_seconds(job.tasks, results)
            phases.update(
                tasks=len(task_seconds), workers=max(task_seconds, default=0.0), workers_total=sum(task_seconds)
            )
            finished = [self._prepare(table, item, [results[i] for i in item.groups]) for item in work]
            finished += [self._prepare_tier(table, item, tier_results[i]) for i, item in enumerate(tiers)]
            crash_point("before_commit")
            self._commit(table, list(zip([*work, *tiers], finished, strict=True)))
            if tplan.clustering is not None:
                _report_overlap(tplan.clustering, files, list(zip(work, finished[: len(work)], strict=True)))
            seconds = time.monotonic() - started
            phases["commit"] = time.monotonic() - rewritten
            for outcome in finished:
                outcome.seconds = seconds
                outcome.phases = phases
                if outcome.status == "committed":
                    log.info(
                        "%s [%s]: committed snapshot %s: %s in %.1fs (%s)",
                        outcome.table_name,
                        outcome.partition_key or "-",
                        outcome.snapshot_id,
                        outcome.reason,
                        outcome.seconds,
                        outcome.engine,
                    )
            log.info(
                "%s: %d group(s), %d tier job(s): %s",
                table_name,
                len(job.groups),
                len(tier_run.jobs),
                describe_phases(phases),
            )
            outcomes.extend(finished)
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
        files = live_files(table)
        deletes = DeleteMap.of(files, global_spec_ids(table.metadata.specs().values()))
        in_flight = self.ledger.in_flight_sources(table_name)
        refused = refusal(table)
        clock = self._full_clock(table_name, policy)
        expire = expire_rule(table_name, table.schema(), policy, self._clock())
        clustering = clustering_of(table, table_name, policy)
        clustered = self.ledger.last_outputs(table_name, str(Kind.CLUSTER)) if clustering else set()
        plans = plan_table(
            files,
            policy,
            table.spec().spec_id,
            in_flight,
            deletes,
            refused,
            clock=clock,
            expire=expire,
            clustering=clustering,
            clustered=clustered,
            tiers_refused=tier_refusal(table),
        )
        top_level = {f.field_id for f in table.schema().fields}
        plans = [_unappliable(p, deletes, top_level) for p in plans]
        if partition is not None:
            known = sorted(p.partition_key for p in plans)
            plans = [p for p in plans if p.partition_key == partition]
            if not plans:
                known_text = _known(table_name, partition, known)
                raise CompactionError(f"table '{table_name}' has no partition '{partition}' {known_text}")
        if only is not None:
            wanted = set(only)
            plans = [p for p in plans if p.partition_key in wanted]
        snapshot = table.current_snapshot()
        manifests = plan_manifests(snapshot.manifests(table.io), policy, manifest_refusal(table)) if snapshot else None
        replan_at = None
        if policy.full_trigger_interval_ms is not None:
            replan_at = clock.next_due_ms((p.partition_key for p in plans), policy.full_trigger_interval_ms)
        tplan = TablePlan(
            table_name,
            snapshot.snapshot_id if snapshot else None,
            policy,
            plans,
            refused,
            deletes,
            manifests,
            replan_at,
            expire,
            clustering,
            str(table.metadata.table_uuid),
        )
        return tplan, {f.path: f for f in files}

    def _full_clock(self, table_name: str, policy: Policy) -> FullClock:
        """Now, and when each partition last had a full rewrite committed (read only when full optimizing is on)."""
        now_ms = self._clock()
        if policy.full_trigger_interval_ms is None:
            return FullClock(now_ms)
        committed = self.ledger.last_committed(table_name, str(Kind.FULL))
        return FullClock(now_ms, {k: int(at.timestamp() * 1000) for k, at in committed.items()})

    def _begin(
        self,
        table: Table,
        table_name: str,
        tplan: TablePlan,
        files: dict[str, LiveFile],
        todo: list[PartitionPlan],
        task: tuple[str | None, int],
    ) -> tuple[list[_Work], RewriteJob, list[_Work], TierRun, list[PartitionOutcome]]:
        """Begin one attempt per partition and build the rewrite job (data rewrites) and the tier
        run (delete-file tiers); the last item: the partitions skipped because another open attempt
        holds them (Claimed). If anything raises meanwhile, the attempts already begun are
        abandoned (FAILED, with the error) before it propagates."""
        work: list[_Work] = []
        tiers: list[_Work] = []
        held: list[PartitionOutcome] = []
        try:
            rewrites = [p for p in todo if not p.is_tier]
            job = self._build_job(table, table_name, tplan, files, rewrites, task, work, held)
            tier_plans = [p for p in todo if p.is_tier]
            tier_run = self._build_tiers(table, table_name, tplan, files, tier_plans, task, tiers, held)
            return work, job, tiers, tier_run, held
        except Exception as exc:
            for item in [*work, *tiers]:
                self._abandon(table, item.attempt, f"could not start the rewrite: {_first_line(exc)}")
            raise

    def _begin_attempt(
        self,
        table_name: str,
        tplan: TablePlan,
        plan: PartitionPlan,
        task: tuple[str | None, int],
        out_dir: str,
        source_files: list[str],
        rows_in: int,
        bytes_in: int,
    ) -> Attempt:
        """An EXECUTING ledger row for one partition's plan, on the plan's snapshot, claimed:
        raises Claimed if another open attempt holds the partition or one of the sources."""
        return self.ledger.begin(
            task_id=_task_id(*task, plan),
            table_name=table_name,
            partition_key=plan.partition_key,
            kind=str(plan.kind),
            base_snapshot_id=tplan.snapshot_id,
            source_files=source_files,
            output_dirs=[out_dir],
            rows_in=rows_in,
            bytes_in=bytes_in,
            claim=True,
            table_uuid=tplan.table_uuid,
        )

    def _skip_held(self, table_name: str, plan: PartitionPlan, claimed: Claimed, held: list[PartitionOutcome]) -> None:
        """A partition another open attempt claimed first: skipped, saying which and what to run."""
        holder = describe_holder(claimed.holder, self.config.state.executing_timeout_seconds)
        held.append(_skipped(table_name, plan, f"planned {plan.kind}, not run: the partition is held by {holder}"))

    def _build_tiers(
        self,
        table: Table,
        table_name: str,
        tplan: TablePlan,
        files: dict[str, LiveFile],
        todo: list[PartitionPlan],
        task: tuple[str | None, int],
        tiers: list[_Work],
        held: list[PartitionOutcome],
    ) -> TierRun:
        """Fill `tiers` with an attempt per delete-file tier plan, and return their Spark run.
        The attempt replaces the plan's delete files; a conversion also records (when it ends)
        the data files it covered, which the commit checks the replaced deletes against."""
        data_path = load_location_provider(table.location(), table.properties).data_path
        jobs: list[TierJob] = []
        for plan in todo:
            out_dir = f"{data_path}/{plan.partition_key}" if plan.partition_key else data_path
            deletes = [files[p] for p in plan.delete_paths]
            try:
                attempt = self._begin_attempt(
                    table_name,
                    tplan,
                    plan,
                    task,
                    out_dir,
                    list(plan.delete_paths),
                    rows_in=sum(d.record_count for d in deletes),
                    bytes_in=sum(d.size for d in deletes),
                )
            except Claimed as claimed:
                self._skip_held(table_name, plan, claimed, held)
                continue
            tiers.append(_Work(plan, attempt))
            if plan.kind == Kind.CONVERT_EQUALITY_DELETES:
                covered = [files[p] for p in plan.covered_data_paths]
                jobs.append(TierJob.convert(covered, deletes, out_dir, attempt.attempt_id))
            else:
                pid = deletes[0].partition_id
                same_partition = [f for f in files.values() if not f.is_delete and f.partition_id == pid]
                jobs.append(TierJob.rewrite(same_partition, deletes, out_dir, attempt.attempt_id))
        return TierRun(_slim_metadata_json(table), dict(table.io.properties), tplan.policy.target_file_size_bytes, jobs)

    def _prepare_tier(self, table: Table, item: _Work, result: TierOutcome) -> PartitionOutcome:
        """Precommit one tier attempt: its position-delete files are durable; PREPARED with them
        (and, for a conversion, the data files it covered)."""
        plan, attempt = item.plan, item.attempt
        outcome = _begun_outcome(
            attempt,
            plan,
            files_after=plan.stats.data_files,
            bytes_after=plan.stats.data_bytes,
            bytes_rewritten=result.bytes_read,
            rows=plan.stats.records,
            peak_worker_rss=result.peak_rss,
            engine="arrow",
        )
        if result.error:
            outcome.reason = self._abandon(table, attempt, result.error)
            return outcome
        written = result.delete_files
        covered = result.covered_data_files if plan.kind == Kind.CONVERT_EQUALITY_DELETES else None
        try:
            item.attempt = self.ledger.prepare(
                attempt.attempt_id,
                [datafile_to_json(f) for f in written],
                result.rows_written,
                sum(f.file_size_in_bytes for f in written),
                covered_files=covered,
            )
        except StaleAttempt as exc:
            outcome.reason = self._abandon(table, attempt, f"stale: {exc}")
            return outcome
        crash_point("after_prepare")
        outcome.status = "prepared"
        outcome.files_written = len(written)
        return outcome

    def _build_job(
        self,
        table: Table,
        table_name: str,
        tplan: TablePlan,
        files: dict[str, LiveFile],
        todo: list[PartitionPlan],
        task: tuple[str | None, int],
        work: list[_Work],
        held: list[PartitionOutcome],
    ) -> RewriteJob:
        """Fill `work` with an attempt per partition as each is begun (`held`: those another open
        attempt holds, skipped), and return the job."""
        data_path = load_location_provider(table.location(), table.properties).data_path
        groups: list[GroupSpec] = []
        clustering = tplan.clustering
        sorting = clustering is not None and any(p.kind in SORTED_KINDS for p in todo)
        lineage = table.metadata.format_version >= MIN_LINEAGE_VERSION  # rows keep _row_id and their sequence numbers
        for plan in todo:
            # an old-spec rewrite writes a folder per partition of the current spec below the data
            # folder, streaming (unsorted)
            repartition = plan.kind == Kind.OLD_SPEC
            sort = clustering is not None and plan.kind in SORTED_KINDS and not repartition
            out_dir = f"{data_path}/{plan.partition_key}" if plan.partition_key and not repartition else data_path
            dropped = [files[p] for p in plan.drop_paths]
            try:
                attempt = self._begin_attempt(
                    table_name,
                    tplan,
                    plan,
                    task,
                    out_dir,
                    plan.source_paths,
                    rows_in=sum(g.records for g in plan.groups) + sum(f.record_count for f in dropped),
                    bytes_in=plan.input_bytes + sum(f.size for f in dropped),
                )
            except Claimed as claimed:
                self._skip_held(table_name, plan, claimed, held)
                continue
            item = _Work(plan, attempt)
            expiry = None
            if plan.kind == Kind.EXPIRE and isinstance(tplan.expire, ExpireRule):
                expiry = ExpireFilter(tplan.expire.field_id, tplan.expire.cutoff)
            work.append(item)
            for group in plan.groups:
                first = files[group.paths[0]].data_file
                sources, delete_specs = _sources(group, files, tplan.deletes, lineage)
                item.groups.append(len(groups))
                item.deletes.update(d.path for d in delete_specs)
                groups.append(
                    GroupSpec(
                        sources=sources,
                        partition=encode_partition(first.partition),
                        spec_id=first.spec_id,
                        output_dir=out_dir,
                        file_prefix=attempt.attempt_id,
                        max_files=group.expected_outputs,
                        # the Polars path applies no expiration, writes a source file into one
                        # output, and does not split rows by partition (deletes: polars_deletes)
                        polars=not lineage
                        and expiry is None
                        and plan.kind != Kind.SPLIT
                        and not repartition
                        and polars_rewrite.qualifies(table.metadata, table.io, sources, sort),
                        deletes=delete_specs,
                        expire=expiry,
                        output_spec_id=table.spec().spec_id if repartition else None,
                        sort=sort,
                    )
                )
        sizes = [sum(s.size for s in g.sources) for g in groups]
        return RewriteJob(
            metadata_json=_slim_metadata_json(table),
            io_properties=dict(table.io.properties),
            target_file_size_bytes=tplan.policy.target_file_size_bytes,
            groups=groups,
            tasks=pack_tasks(sizes, [_packable(g) for g in groups], self.config.spark.task_bytes),
            sort_columns=sort_keys(table) if sorting and not clustering.zorder else [],
            zorder_columns=file_column_names(table, clustering) if sorting and clustering.zorder else [],
            sort_budget_bytes=tplan.policy.sort_memory_bytes,
            row_lineage=lineage,
        )

    def _prepare(self, table: Table, item: _Work, results: list[GroupOutcome]) -> PartitionOutcome:
        """Precommit one partition: its result files are durable; PREPARED with their exact list.
        Returns its outcome: "prepared", or "failed" with the reason (the attempt then cleaned up)."""
        plan, attempt = item.plan, item.attempt
        expiring = plan.kind == Kind.EXPIRE
        dropped_rows = attempt.rows_in - sum(g.records for g in plan.groups)  # an expiration's unread files
        expired_read = sum(r.rows_expired for r in results)
        outcome = _begun_outcome(
            attempt,
            plan,
            files_rewritten=plan.input_files,
            bytes_rewritten=plan.input_bytes,
            rows=attempt.rows_in,
            deletes_applied=len(item.deletes),
            rows_deleted=sum(r.rows_deleted for r in results),
            rows_expired=dropped_rows + expired_read,
            files_dropped=len(plan.drop_paths),
            groups=len(plan.groups),
            peak_worker_rss=max((r.peak_rss for r in results), default=0),
            engine="+".join(sorted({r.engine for r in results}, reverse=True)),
            spill_files=sum(r.spill_files for r in results),
        )
        written = [f for r in results for f in r.data_files]
        rows_out = sum(f.record_count for f in written)
        rows_read = sum(r.rows_read for r in results)
        if errors := [r.error for r in results if r.error]:
            outcome.reason = errors[0]
        elif rows_read != attempt.rows_in - dropped_rows:
            outcome.reason = (
                f"row count mismatch: the sources hold {attempt.rows_in - dropped_rows} rows to read, read {rows_read}"
            )
        elif expired_read and not expiring:
            outcome.reason = f"a {plan.kind} rewrite dropped {expired_read} row(s) as expired"
        elif rows_out != rows_read - outcome.rows_deleted - expired_read:
            outcome.reason = (
                f"row count mismatch: read {rows_read} rows, deletes removed {outcome.rows_deleted}, "
                f"expiration dropped {expired_read}, wrote {rows_out}"
            )
        if outcome.reason:
            outcome.reason = self._abandon(table, attempt, outcome.reason)
            return outcome
        bytes_out = sum(f.file_size_in_bytes for f in written)
        try:
            item.attempt = self.ledger.prepare(
                attempt.attempt_id,
                [datafile_to_json(f) for f in written],
                rows_out,
                bytes_out,
                rows_expired=outcome.rows_expired if expiring else None,
            )
        except StaleAttempt as exc:
            outcome.reason = self._abandon(table, attempt, f"stale: {exc}")
            return outcome
        crash_point("after_prepare")
        item.written = written
        outcome.status = "prepared"
        outcome.files_written = len(written)
        # an old-spec rewrite moves its rows out of the partition, into the current spec's partitions
        moved = plan.kind == Kind.OLD_SPEC
        outcome.files_after = plan.stats.data_files - len(plan.source_paths) + (0 if moved else len(written))
        outcome.bytes_after = plan.stats.data_bytes - attempt.bytes_in + (0 if moved else bytes_out)
        return outcome

    def _abandon(self, table: Table, attempt: Attempt, reason: str) -> str:
        """End an attempt that will not commit; returns the reason to report. An attempt another
        process already ended (recovery took it for dead) is left as that process left it."""
        try:
            abandon(table, self.ledger, attempt, reason)
        except StaleAttempt as exc:
            return f"{reason}; {exc}"
        return reason

    def _commit(self, table: Table, prepared: list[tuple[_Work, PartitionOutcome]]) -> None:
        """Commit every prepared partition of the table: the data expirations in one snapshot
        (`delete` or `overwrite`), the compactions in another (`replace`); settle each outcome."""
        prepared = [(item, outcome) for item, outcome in prepared if outcome.status == "prepared"]
        expirations = [(item, outcome) for item, outcome in prepared if item.plan.kind == Kind.EXPIRE]
        compactions = [(item, outcome) for item, outcome in prepared if item.plan.kind != Kind.EXPIRE]
        for together in (expirations, compactions):
            if together:
                self._commit_together(table, together)

    def _commit_together(self, table: Table, prepared: list[tuple[_Work, PartitionOutcome]]) -> None:
        results: dict[str, CommitResult] = {}
        unknown = None
        try:
            commit_together(table, self.ledger, [item.attempt for item, _ in prepared], results)
        except Exception as exc:  # catalog unreachable or locked, table dropped: outcome unknown
            log.warning("%s: commit failed: %s", prepared[0][1].table_name, exc)
            unknown = (
                f"commit outcome unknown ({type(exc).__name__}: {_first_line(exc)}); the attempt stays "
                "PREPARED and recovery finishes it once this process has exited"
            )
        for item, outcome in prepared:
            result = results.get(item.attempt.attempt_id)
            if result is None:
                outcome.status, outcome.reason = "failed", unknown or "commit outcome unknown"
            elif isinstance(result, BackOff):
                outcome.status, outcome.reason = "backed_off", result.reason  # the line names table and partition
            elif isinstance(result, StaleAttempt):
                outcome.status, outcome.reason = "failed", str(result)
            else:
                outcome.delete_files_removed = len(result.removed_deletes)
                outcome.status = "committed"
                if item.plan.is_tier:
                    outcome.reason = (
                        f"{len(item.plan.delete_paths)} delete file(s) -> {outcome.files_written} "
                        f"position-delete file(s) ({result.rows_out} row(s))"
                    )
                elif item.plan.kind == Kind.EXPIRE:
                    outcome.reason = (
                        f"{outcome.rows_expired} row(s) past retention expired: {outcome.files_dropped} file(s) "
                        f"dropped unread, {item.plan.input_files} file(s) -> {outcome.files_written} file(s)"
                    )
                elif item.plan.kind == Kind.OLD_SPEC:
                    written = item.attempt.result_files
                    partitions = len({json.dumps(d["partition"]) for d in written})
                    outcome.reason = (
                        f"{item.plan.input_files} file(s) of spec {', '.join(map(str, item.plan.stats.spec_ids))} -> "
                        f"{outcome.files_written} file(s) in {partitions} partition(s) of spec "
                        f"{', '.join(sorted({str(d['spec_id']) for d in written}))}"
                    )
                else:
                    outcome.reason = f"{item.plan.input_files} file(s) -> {outcome.files_written} file(s)"
                if outcome.deletes_applied:
                    outcome.reason += (
                        f", {outcome.deletes_applied} delete file(s) applied ({outcome.rows_deleted} row(s) deleted)"
                    )
                outcome.snapshot_id = result.committed_snapshot_id


def describe_phases(phases: dict[str, float]) -> str:
    """Where a compaction's seconds went: planning (table, manifests, planner), beginning the
    attempts and building the job (ledger rows, Polars checks), the Spark job, and the two-phase
    commit (precommit, validation, manifests, catalog commit, sweep). Of the Spark job: the seconds
    its tasks spent inside group rewrites, the busiest task's and all tasks' (run by as many at once
    as there are task slots); with one task, the rest of the job is Spark's share (dispatch, worker
    hand-off, results)."""
    rewrite, busiest, tasks = phases.get("rewrite", 0.0), phases.get("workers", 0.0), int(phases.get("tasks", 0))
    if tasks == 1:
        inside = f"groups {busiest:.2f}s, spark {rewrite - busiest:.2f}s"
    else:
        inside = f"{tasks} tasks, groups {busiest:.2f}s in the busiest, {phases.get('workers_total', 0.0):.2f}s in all"
    return (
        f"plan {phases.get('plan', 0.0):.2f}s, begin {phases.get('begin', 0.0):.2f}s, rewrite {rewrite:.2f}s "
        f"({inside}), commit {phases.get('commit', 0.0):.2f}s"
    )


def _task_seconds(tasks: list[list[int]], results: list[GroupOutcome]) -> list[float]:
    """Seconds each Spark task spent rewriting its groups (one after the other)."""
    seconds = {r.group: r.seconds for r in results}
    return [sum(seconds.get(g, 0.0) for g in task) for task in tasks]


def _begun_outcome(attempt: Attempt, plan: PartitionPlan, **figures: int | str) -> PartitionOutcome:
    """A begun attempt's outcome, "failed" until it is prepared, with its plan's figures."""
    return PartitionOutcome(
        table_name=attempt.table_name,
        partition_key=plan.partition_key,
        status="failed",
        reason="",
        kind=str(plan.kind),
        task_id=attempt.task_id,
        attempt_id=attempt.attempt_id,
        files_before=plan.stats.data_files,
        bytes_before=plan.stats.data_bytes,
        **figures,
    )


def _skipped(table_name: str, plan: PartitionPlan, reason: str = "") -> PartitionOutcome:
    stats = plan.stats
    return PartitionOutcome(
        table_name=table_name,
        partition_key=plan.partition_key,
        status="skipped",
        reason=reason or plan.reason,
        kind=str(plan.kind) if plan.kind else None,
        files_before=stats.data_files,
        files_after=stats.data_files,
        bytes_before=stats.data_bytes,
        bytes_after=stats.data_bytes,
        rows=stats.records,
    )


def _sources(
    group: FileGroup, files: dict[str, LiveFile], deletes: DeleteMap, lineage: bool = False
) -> tuple[list[SourceFile], list[DeleteSpec]]:
    """A group's sources and the distinct delete files applying to them (by LiveFile.path: a
    deletion vector is one of its Puffin file's blobs); each source lists the indices of the ones
    that apply to it (the spec's rule, decided here for the worker). `lineage`: sources carry what
    their rows' lineage inherits (format version 3)."""
    applying = deletes.distinct(group.paths)
    index = {d.path: i for i, d in enumerate(applying)}
    specs = [
        DeleteSpec(
            path=d.data_file.file_path,
            content=int(d.data_file.content),
            size=d.size,
            records=d.record_count,
            equality_ids=list(d.data_file.equality_ids) if d.data_file.equality_ids else None,
            **_deletion_vector(d.data_file),
        )
        for d in applying
    ]
    indices: dict[int, list[int]] = {}  # per shared delete list (DeleteMap), computed once
    sources = []
    for p in group.paths:
        applying_p = deletes.for_data(p)
        if (listed := indices.get(id(applying_p))) is None:
            listed = indices[id(applying_p)] = [index[d.path] for d in applying_p]
        f = files[p]
        if lineage:
            sources.append(SourceFile(p, f.size, f.record_count, listed, f.first_row_id, f.file_sequence_number))
        else:
            sources.append(SourceFile(p, f.size, f.record_count, listed))
    return sources, specs


def _deletion_vector(delete_file: DataFile) -> dict[str, Any]:
    """Where a deletion vector's blob is and which data file it deletes from ({} for other files)."""
    if not is_deletion_vector(delete_file):
        return {}
    return {
        "content_offset": v3_field(delete_file, CONTENT_OFFSET),
        "content_size_in_bytes": v3_field(delete_file, CONTENT_SIZE_IN_BYTES),
        "referenced_data_file": referenced_data_file(delete_file),
    }


def _task_id(task_id: str | None, partitions: int, plan: PartitionPlan) -> str:
    """The caller's task id (a Dagster run's id), made per partition when the run has several."""
    if task_id is None:
        return uuid.uuid4().hex
    return task_id if partitions == 1 else f"{task_id}:{plan.partition_key}"


def _packable(group: GroupSpec) -> bool:
    """A group that may share a Spark task (execution/packing): a local Polars group without delete files."""
    return group.polars and not group.deletes and not _remote(group)


def _remote(group: GroupSpec) -> bool:
    """A group whose files are on object storage (see execution/packing: it keeps a task of its own)."""
    return group.output_dir.startswith(S3_SCHEMES) or group.sources[0].path.startswith(S3_SCHEMES)


def _slim_metadata_json(table: Table) -> str:
    """Table metadata without snapshot history: workers need schema, specs and properties only."""
    slim = table.metadata.model_copy(
        update={
            "snapshots": [],
            "snapshot_log": [],
            "metadata_log": [],
            "refs": {},
            "current_snapshot_id": None,
            "statistics": [],
            "partition_statistics": [],
        }
    )
    return slim.model_dump_json()


def _report_overlap(
    clustering: Clustering, files: dict[str, LiveFile], done: list[tuple[_Work, PartitionOutcome]]
) -> None:
    """Each committed sorted rewrite's bounds_overlap before (its plan's) and after (the files the
    plan saw, less those it replaced, plus those it wrote) on the clustering columns."""
    done = [(i, o) for i, o in done if o.status == "committed" and i.plan.kind in SORTED_KINDS]
    wanted = {i.plan.partition_key for i, _ in done}
    by_partition: dict[str, list[LiveFile]] = {}
    for f in files.values() if done else ():
        if not f.is_delete and f.partition_key in wanted:
            by_partition.setdefault(f.partition_key, []).append(f)
    for item, outcome in done:
        replaced = set(item.plan.source_paths)
        kept = [f.data_file for f in by_partition.get(item.plan.partition_key, ()) if f.path not in replaced]
        outcome.bounds_overlap = {
            "before": round(item.plan.stats.bounds_overlap or 0.0, 3),
            "after": round(bounds_overlap([*kept, *item.written], clustering), 3),
            "columns": list(clustering.columns),
            "order": "zorder" if clustering.zorder else "sort",
        }


def _known(table_name: str, partition: str, known: list[str]) -> str:
    """The table's partitions for a message: a few (the likeliest meant first) and the count."""
    if not any(known):
        return "(it is unpartitioned: leave out --partition)"
    shown = difflib.get_close_matches(partition, known, n=3, cutoff=0.6) or known[:3]
    more = f", ... ({len(known)} in all)" if len(known) > len(shown) else ""
    return f"(it has {', '.join(shown)}{more}; `compaction-assets plan {table_name}` lists them)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]


def _unappliable(plan: PartitionPlan, deletes: DeleteMap, top_level: set[int]) -> PartitionPlan:
    """The plan, or why not, when an equality delete it must apply (or convert) is keyed on a field
    that is no top-level column of the current schema: execution refuses it, every attempt would fail."""
    if not plan.worth_compacting:
        return plan
    applying = deletes.distinct([*(p for g in plan.groups for p in g.paths), *plan.covered_data_paths])
    if plan.is_tier:
        applying = [d for d in applying if d.path in set(plan.delete_paths)]
    for d in applying:
        if missing := sorted(set(d.data_file.equality_ids or ()) - top_level):
            return PartitionPlan(
                plan.stats,
                None,
                reason=f"equality delete file {d.path} is keyed on field id(s) {missing}, no top-level column "
                "of the current schema: it cannot be applied, so the partition is not compacted",
            )
    return plan
