"""Rewriting a table's small manifests (Iceberg's `rewrite_manifests`, Java's BaseRewriteManifests):
metadata only, through the two-phase protocol.

What readers see does not change: every live entry of the replaced manifests is written again,
EXISTING, with its own snapshot id, data and file sequence numbers and its data_file record byte
for byte (lake.manifest_io.write_restated), so the same data and delete files, with the same
sequence numbers and statistics, are live after as before, and deletes apply exactly as before.
Only the manifests holding them change: entries are clustered (sorted by partition values, then
path) per content and partition spec, and cut into manifests of about
`commit.manifest.target-size-bytes`, at partition boundaries where a partition fits in one.

Protocol: an EXECUTING ledger attempt (kind rewrite-manifests, partition "", sources: the
manifests replaced) writes the new manifests into the metadata folder named after the attempt
(so GC's orphan cleanup leaves them alone while it is open), then PREPARED (results: the new
manifests), then one `replace` snapshot tagged with the task and attempt ids, then COMMITTED.
The snapshot is made only if the head it lands on descends from the snapshot the rewrite was
planned on (conflicts.base_history: main rolled back since makes it back off, as every attempt
does) and every replaced manifest is still in that head; manifests a concurrent commit added are
kept as they are (pyiceberg's retries rebuild the manifest list on each new head). A concurrent
commit that replaced one of them (a compaction, a delete), or a rollback, makes the attempt roll
back (its manifests deleted: its commit did not land) and the rewrite is planned again on the new
head. Recovery never recommits a manifest rewrite: committed if a snapshot
carries it or references one of its manifests, else rolled back, its manifests left in place (the
next plan redoes it). A process recovery took for dead may still commit them; it checks the
attempt is still PREPARED right before its commit, but recovery can step in after that check, so
what keeps every snapshot's manifests in place is that recovery deletes none: GC's orphan cleanup
removes them after its grace period, and only while no snapshot references them.

Manifests are merged per content and partition spec, as planning counts them: those whose entries
share one Avro layout are restated byte for byte (the table schema their headers record may
differ, the newest is written); any other group (format-version-1 manifests of an upgraded table)
is encoded again by pyiceberg's v2 writer, its entries' sequence numbers as inherited (0 for v1).
A run that would not leave fewer manifests commits nothing.

pyiceberg 0.12 has no RewriteManifests producer: `_RewriteManifests` below is built on its
snapshot producer (the snapshot, manifest list, commit and retry machinery), reached through
iceberg_compat.producers.SnapshotProducer.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from pyiceberg.avro.codecs import AvroCompressionCodec
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile, ManifestWriterV2
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import UpdatesAndRequirements
from pyiceberg.typedef import EMPTY_DICT
from pyiceberg.utils.concurrent import ExecutorFactory

from compaction_assets.commit.conflicts import base_history
from compaction_assets.commit.heartbeat import Heartbeat
from compaction_assets.commit.ledger import Attempt, Ledger, StaleAttempt, Status
from compaction_assets.commit.numbering import numbered
from compaction_assets.commit.two_phase import (
    ATTEMPT_ID_PROPERTY,
    TASK_ID_PROPERTY,
    abandon,
    commit_snapshot,
    confirm_committed,
    roll_back,
)
from compaction_assets.errors import CompactionError
from compaction_assets.faults import crash_point
from compaction_assets.gc_pause import gc_paused
from compaction_assets.iceberg_compat.producers import SnapshotProducer
from compaction_assets.lake.delete_files import _DeleteManifestWriter
from compaction_assets.lake.features import manifest_refusal, manifest_version_refusal
from compaction_assets.lake.manifest_cache import manifest_contents
from compaction_assets.lake.manifest_io import (
    ManifestContents,
    layout_key,
    newest_header,
    partition_schema,
    write_restated,
)
from compaction_assets.planning.manifests import ManifestPlan, plan_manifests
from compaction_assets.planning.planner import Kind
from compaction_assets.planning.policy import Policy

log = logging.getLogger("compaction_assets")
KIND = str(Kind.REWRITE_MANIFESTS)
HEADER_OVERHEAD = 32  # an Avro header's bytes beside its metadata's keys and values (magic, lengths, sync)
MAX_PLANS = 4  # plans of one run: a concurrent commit that replaced a manifest makes it plan again
# Java's RewriteManifests summary properties
MANIFESTS_CREATED, MANIFESTS_KEPT, MANIFESTS_REPLACED, ENTRIES_PROCESSED = (
    "manifests-created",
    "manifests-kept",
    "manifests-replaced",
    "entries-processed",
)


@dataclass
class ManifestRewriteReport:
    """What a manifest rewrite did (or, for a dry run, would do); what the CLI prints and Dagster records."""

    table_name: str
    status: str  # committed | skipped | dry_run | backed_off
    reason: str
    manifests_before: int = 0
    manifests_after: int = 0
    manifests_replaced: int = 0
    manifests_written: int = 0
    entries: int = 0
    bytes_replaced: int = 0
    bytes_written: int = 0
    snapshot_id: int | None = None
    task_id: str = ""
    attempt_id: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status != "backed_off"


@gc_paused()  # an entry object per file of the rewritten manifests
def rewrite_manifests(
    table: Table,
    table_name: str,
    ledger: Ledger,
    policy: Policy,
    task_id: str | None = None,
    dry_run: bool = False,
    heartbeat_seconds: float = 10.0,
) -> ManifestRewriteReport:
    """Rewrite the table's small manifests if planning says they are due (planning/manifests.py).

    A dry run plans and reports what would be replaced and written, and changes nothing. A rerun
    plans again from the table's current manifests: once rewritten, they are not due."""
    started = time.monotonic()
    task_id = task_id or f"manifests-{uuid.uuid4().hex[:12]}"
    reasons: list[str] = []
    for _ in range(MAX_PLANS):
        table.refresh()
        snapshot = table.current_snapshot()
        manifests = snapshot.manifests(table.io) if snapshot is not None else []
        plan = plan_manifests(manifests, policy, manifest_refusal(table))
        report = ManifestRewriteReport(
            table_name, "skipped", plan.reason, len(manifests), len(manifests), task_id=task_id
        )
        if plan.due and dry_run:
            report.status = "dry_run"
            report.manifests_replaced, report.manifests_written = plan.small, plan.expected_outputs
            report.manifests_after = len(manifests) - plan.small + plan.expected_outputs
            report.entries, report.bytes_replaced = plan.entries, plan.small_bytes
        elif plan.due and snapshot is not None:
            _run(table, table_name, ledger, policy, snapshot, manifests, plan, heartbeat_seconds, report)
            if report.status == "backed_off":
                reasons.append(report.reason)
                continue
        report.seconds = time.monotonic() - started
        return report
    report.reason = f"gave way {MAX_PLANS} times to concurrent commits; last: {reasons[-1]}"
    report.seconds = time.monotonic() - started
    return report


def _run(
    table: Table,
    table_name: str,
    ledger: Ledger,
    policy: Policy,
    snapshot: Snapshot,
    manifests: list[ManifestFile],
    plan: ManifestPlan,
    heartbeat_seconds: float,
    report: ManifestRewriteReport,
) -> None:
    """One attempt: write, prepare, commit; fills `report` (status backed_off: plan again)."""
    chosen = set(plan.paths)
    replaced = [m for m in manifests if m.manifest_path in chosen]
    read = ExecutorFactory.get_or_create().map(lambda m: manifest_contents(m, table.io), replaced)  # one request each
    contents = {m.manifest_path: found for m, found in zip(replaced, read, strict=True)}
    outputs = cluster(replaced, contents, policy.manifest_target_size_bytes)
    if len(outputs) >= len(replaced):
        report.reason = (
            f"merging would leave {len(outputs)} manifest(s) for {len(replaced)}: not rewritten; {plan.reason}"
        )
        return
    entries = sum(len(contents[m.manifest_path].entries) for m in replaced)
    metadata_dir = table.location_provider().new_metadata_location("x").rsplit("/", 1)[0]
    attempt = ledger.begin(
        task_id=report.task_id,
        table_name=table_name,
        partition_key="",
        kind=KIND,
        base_snapshot_id=snapshot.snapshot_id,
        source_files=[m.manifest_path for m in replaced],
        output_dirs=[metadata_dir],
        rows_in=entries,
        bytes_in=sum(m.manifest_length for m in replaced),
        table_uuid=str(table.metadata.table_uuid),
    )
    report.attempt_id = attempt.attempt_id
    with Heartbeat(ledger, heartbeat_seconds) as heartbeat:
        heartbeat.track(attempt.attempt_id)
        try:
            txn, producer, written = _write_and_prepare(table, ledger, attempt, snapshot, replaced, outputs, entries)
        except Exception as exc:
            abandon(table, ledger, attempt, f"could not write the manifests: {exc}")
            raise
        crash_point("after_prepare")
        _still_prepared(ledger, attempt)
        try:
            with producer:
                pass
            txn.commit_transaction()
        except (CommitFailedException, ValidationException) as exc:  # guaranteed not to have landed
            report.status, report.reason = "backed_off", roll_back(table, ledger, attempt, str(exc)).reason
            return
        except Exception as exc:
            raise CompactionError(
                f"{table_name}: manifest rewrite commit outcome unknown ({type(exc).__name__}: {exc}); attempt "
                f"{attempt.attempt_id} stays PREPARED and recovery finishes it"
            ) from exc
        crash_point("after_iceberg_commit")
        committed = confirm_committed(table, ledger, attempt)
    table.refresh()
    report.status = "committed"
    report.snapshot_id = committed.committed_snapshot_id
    report.manifests_replaced, report.manifests_written = len(replaced), len(written)
    report.manifests_after = len(table.current_snapshot().manifests(table.io))  # type: ignore[union-attr]
    report.entries = entries
    report.bytes_replaced = attempt.bytes_in
    report.bytes_written = sum(m.manifest_length for m in written)
    report.reason = (
        f"{len(replaced)} manifest(s) ({entries} entries, {report.bytes_replaced} B) -> {len(written)} "
        f"clustered by partition ({report.bytes_written} B)"
    )
    log.info("%s: rewrote manifests in snapshot %s: %s", table_name, report.snapshot_id, report.reason)


def _write_and_prepare(
    table: Table,
    ledger: Ledger,
    attempt: Attempt,
    snapshot: Snapshot,
    replaced: list[ManifestFile],
    outputs: list[_Output],
    entries: int,
) -> tuple[Transaction, _RewriteManifests, list[ManifestFile]]:
    """What the attempt commits: its manifests written, staged in a producer, and the attempt PREPARED."""
    txn = table.transaction()
    properties = {TASK_ID_PROPERTY: attempt.task_id, ATTEMPT_ID_PROPERTY: attempt.attempt_id}
    producer = _RewriteManifests(txn, table.io, properties, snapshot.snapshot_id)
    written = write_outputs(table, outputs, producer.snapshot_id, attempt.attempt_id)
    producer.replace(replaced, written, entries)
    ledger.prepare(
        attempt.attempt_id,
        [{"file_path": m.manifest_path, "content": "manifest"} for m in written],
        rows_out=sum((m.existing_files_count or 0) for m in written),
        bytes_out=sum(m.manifest_length for m in written),
    )
    return txn, producer, written


def _still_prepared(ledger: Ledger, attempt: Attempt) -> None:
    """Raise StaleAttempt unless the attempt is still PREPARED: recovery may have taken a stalled
    process for dead and rolled it back. This narrows the window, it cannot close it (recovery may
    step in between this check and the commit): recovery never deletes a manifest rewrite's
    manifests, so a commit that lands after all lists files that exist (GC's orphan cleanup
    removes them only once no snapshot references them)."""
    current = ledger.get(attempt.attempt_id)
    if current is None or current.status != Status.PREPARED:
        actual = current.status if current is not None else None
        raise StaleAttempt(attempt.attempt_id, [Status.PREPARED], actual, ": not committed")


@dataclass
class _Output:
    """One manifest to write: entries (a source's contents and a position in it) of one content and
    spec, and the header to restate them under (None: encoded again by pyiceberg's writer)."""

    members: list[tuple[ManifestContents, int]]
    content: ManifestContent
    spec_id: int
    header: dict[str, str] | None


def cluster(
    manifests: Sequence[ManifestFile], contents: dict[str, ManifestContents], target_bytes: int
) -> list[_Output]:
    """The live entries of `manifests` as the manifests to write: per content and spec (as
    planning/manifests.py counts), sorted by partition values then path, cut at about
    `target_bytes` (estimated from the sources' bytes per entry and the header's size), at a
    partition boundary where the partition fits in one. A group whose sources all have one entry
    layout (manifest_io.layout_key: the table schema a header records may differ) is restated
    byte for byte under the newest header; any other (a format-version-1 manifest of an upgraded
    table, manifests of engines writing other entry schemas) is encoded again in the v2 layout."""
    groups: dict[tuple[ManifestContent, int], list[ManifestFile]] = {}
    for manifest in manifests:
        groups.setdefault((manifest.content, manifest.partition_spec_id), []).append(manifest)
    outputs: list[_Output] = []
    for (content, spec_id), sources in groups.items():
        found = [contents[m.manifest_path] for m in sources]
        header = _uniform_header(found)
        overhead = _header_overhead(header)
        size = sum(max(m.manifest_length - overhead, 1) for m in sources)  # bytes of the entries
        members = [(c, i) for c in found for i in range(len(c.entries))]
        if not members:
            continue
        capacity = max(1, int(max(target_bytes - overhead, 1) * len(members) / size))
        members.sort(key=lambda m: _cluster_key(m[0].entries[m[1]]))
        outputs.extend(_Output(chunk, content, spec_id, header) for chunk in _chunks(members, capacity))
    return outputs


def _uniform_header(found: Sequence[ManifestContents]) -> dict[str, str] | None:
    """Which header a group is restated under: the newest, when all its sources share one entry layout; else None."""
    headers = [c.header for c in found if c.header is not None]
    uniform = len(headers) == len(found) and len({layout_key(h) for h in headers}) == 1
    return newest_header(headers) if uniform else None


def _header_overhead(header: dict[str, str] | None) -> int:
    """How many bytes of a manifest are not entries: the file overhead and the header's keys and values."""
    return HEADER_OVERHEAD + sum(len(k.encode()) + len(v.encode()) for k, v in (header or {}).items())


def write_outputs(table: Table, outputs: Sequence[_Output], snapshot_id: int, prefix: str) -> list[ManifestFile]:
    """Write each output, EXISTING, as `<prefix>-m<n>.avro` in the metadata folder."""
    metadata = table.metadata
    provider = table.location_provider()
    # a codec name, as pyiceberg's own producers read it (its Avro writer refuses an unknown one)
    compression = cast(
        AvroCompressionCodec,
        metadata.properties.get(TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT),
    )
    written: list[ManifestFile] = []
    for n, out in enumerate(outputs):
        spec, schema = metadata.specs()[out.spec_id], partition_schema(metadata, out.spec_id)
        output = table.io.new_output(provider.new_metadata_location(f"{prefix}-m{n}.avro"))
        if out.header is not None:
            parts = [(c, [i for _, i in run]) for c, run in itertools.groupby(out.members, key=lambda m: m[0])]
            written.append(write_restated(output, parts, ManifestEntryStatus.EXISTING, snapshot_id, spec, schema))
            continue
        writer_type = ManifestWriterV2 if out.content == ManifestContent.DATA else _DeleteManifestWriter
        with writer_type(spec, schema, output, snapshot_id, compression) as writer:
            for c, i in out.members:
                writer.existing(c.entries[i])  # v1 entries' sequence numbers: inherited (0), written out
        written.append(writer.to_manifest_file())
    return written


def _partition(entry: ManifestEntry) -> tuple:
    partition = entry.data_file.partition
    return tuple((value is not None, value) for value in (partition[i] for i in range(len(partition))))


def _cluster_key(entry: ManifestEntry) -> tuple:
    return _partition(entry), entry.data_file.file_path


def _chunks(members: list[tuple[ManifestContents, int]], capacity: int) -> list[list[tuple[ManifestContents, int]]]:
    """Consecutive runs of at most `capacity` entries; a partition that fits in one starts a new
    chunk rather than straddling two."""
    chunks: list[list[tuple[ManifestContents, int]]] = [[]]
    for _, run in itertools.groupby(members, key=lambda m: _partition(m[0].entries[m[1]])):
        run_list = list(run)
        if chunks[-1] and len(chunks[-1]) + len(run_list) > capacity >= len(run_list):
            chunks.append([])
        for member in run_list:
            if len(chunks[-1]) >= capacity:
                chunks.append([])
            chunks[-1].append(member)
    return chunks


def committed_by_manifests(table: Table, attempt: Attempt) -> int | None:
    """The id of the oldest snapshot the table has that carries the attempt or lists one of its
    manifests (the one that committed it may have been expired since), else None."""
    if (snapshot := commit_snapshot(table, attempt)) is not None:
        return snapshot.snapshot_id
    results = {d["file_path"] for d in attempt.result_files}
    for snapshot in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0):
        if any(m.manifest_path in results for m in snapshot.manifests(table.io)):
            return snapshot.snapshot_id
    return None


class _RewriteManifests(SnapshotProducer):
    """A `replace` snapshot whose manifest list is the head's with the replaced manifests swapped
    for the written ones (Java's BaseRewriteManifests); made again on each of pyiceberg's commit
    retries with the new head as parent. Raises ValidationException if that head does not descend
    from the snapshot the rewrite was planned on (conflicts.base_history: main rolled back since),
    or a replaced manifest is not in it (a concurrent commit replaced it)."""

    def __init__(
        self, transaction: Transaction, io: FileIO, snapshot_properties: dict[str, str], base_snapshot_id: int
    ) -> None:
        super().__init__(
            operation=Operation.REPLACE, transaction=transaction, io=io, snapshot_properties=snapshot_properties
        )
        self._base_snapshot_id = base_snapshot_id
        self._replaced: frozenset[str] = frozenset()
        self._written: list[ManifestFile] = []
        self._entries = 0
        self._kept = 0

    def replace(self, replaced: Sequence[ManifestFile], written: list[ManifestFile], entries: int) -> None:
        self._replaced = frozenset(m.manifest_path for m in replaced)
        self._written = written
        self._entries = entries

    def deleted_entries(self) -> list[ManifestEntry]:
        return []

    def existing_manifests(self) -> list[ManifestFile]:
        return []

    def validate_concurrency(self) -> None:
        """Nothing here: `manifests` checks the replaced manifests against each try's head."""

    def snapshot_updates(self) -> UpdatesAndRequirements:
        """pyiceberg's, with the table's numbering required unchanged (numbering.numbered): a table
        upgraded to format version 3, or numbered on by a commit to another branch, since this
        try's metadata is a retry, not a snapshot pyiceberg refuses with an unknown outcome."""
        return numbered(super().snapshot_updates(), self.table_metadata)

    def manifests(self) -> list[ManifestFile]:
        metadata, parent_id = self.table_metadata, self.parent_snapshot_id
        if reason := manifest_version_refusal(metadata.format_version):
            raise ValidationException(reason)
        base_history(metadata, self._base_snapshot_id, parent_id)
        parent = metadata.snapshot_by_id(parent_id) if parent_id is not None else None
        current = parent.manifests(self.file_io) if parent is not None else []
        if missing := self._replaced - {m.manifest_path for m in current}:
            raise ValidationException(
                f"{len(missing)} manifest(s) to replace are no longer in the table's current snapshot "
                f"(e.g. {sorted(missing)[0]}): a concurrent commit rewrote them"
            )
        kept = [m for m in current if m.manifest_path not in self._replaced]
        self._kept = len(kept)
        return [*self._written, *kept]

    def snapshot_summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        """No file added or removed: the parent's totals, and Java's manifest counts."""
        metadata, parent_id = self.table_metadata, self.parent_snapshot_id
        parent = metadata.snapshot_by_id(parent_id) if parent_id is not None else None
        previous = parent.summary.additional_properties if parent is not None and parent.summary is not None else {}
        totals = {k: v for k, v in previous.items() if k.startswith("total-")}
        counts = {
            MANIFESTS_CREATED: str(len(self._written)),
            MANIFESTS_KEPT: str(self._kept),
            MANIFESTS_REPLACED: str(len(self._replaced)),
            ENTRIES_PROCESSED: str(self._entries),
        }
        return Summary(operation=self.operation, **totals, **counts, **snapshot_properties)
