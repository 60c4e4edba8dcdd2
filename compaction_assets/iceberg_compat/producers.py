"""pyiceberg 0.12's snapshot producers, with their private hooks under public names.

pyiceberg builds a snapshot in `_SnapshotProducer` and its private subclasses (`_OverwriteFiles`,
`_FastAppendFiles`): the snapshot id, the manifest list, the commit and its retries (on each retry
it calls `_commit` again, which calls `_manifests` and `_summary` on the refreshed head). There is
no public producer to extend (pyiceberg 0.12 offers `fast_append`, `merge_append`, `overwrite`
and `delete` only, none with RewriteFiles semantics), so ours subclass these bases:
`rewrite_producer.RewriteFiles` (OverwriteProducer), `manifest_rewrite._RewriteManifests`
(SnapshotProducer), `delete_files._AddDeleteFiles` and the bench's `_ManifestPerBatch`
(AppendProducer).

`ProducerHooks` stands between them: each private hook pyiceberg calls (left column of HOOKS) calls
a public method (right column), which by default is pyiceberg's own; our producers override the
public names only, and read the producer's private state through the properties below. So no
module outside this package names a pyiceberg private, and tests/test_compat_contract.py checks
every entry of HOOKS and STATE against the installed pyiceberg.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import DataFile, ManifestEntry, ManifestFile
from pyiceberg.table import Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update import UpdatesAndRequirements
from pyiceberg.table.update.snapshot import (
    _FastAppendFiles,
    _ManifestMergeManager,
    _new_manifest_list_file_name,
    _OverwriteFiles,
    _SnapshotProducer,
)
from pyiceberg.typedef import EMPTY_DICT

# pyiceberg's private hook -> the public method ProducerHooks routes it to
HOOKS = {
    "_manifests": "manifests",
    "_existing_manifests": "existing_manifests",
    "_deleted_entries": "deleted_entries",
    "_process_manifests": "process_manifests",
    "_summary": "snapshot_summary",
    "_commit": "snapshot_updates",
    "_validate_concurrency": "validate_concurrency",
    "_build_manifest_evaluator": "manifest_evaluator",
    "_build_delete_files_partition_predicate": "build_partition_filters",
}
# pyiceberg's private attribute -> the property that reads it
STATE = {
    "_transaction": "transaction",
    "_io": "file_io",
    "_operation": "operation",
    "_parent_snapshot_id": "parent_snapshot_id",
    "_added_data_files": "added_files",
    "_deleted_data_files": "deleted_files",
    "_compression": "compression",
    "_case_sensitive": "case_sensitive",
    "_target_branch": "target_branch",
    "_written_manifest_lists": "written_manifest_lists",
}


class ProducerHooks:
    """Placed before a pyiceberg producer class in a subclass's bases (see the module docstring)."""

    # the hooks pyiceberg calls, routed to the public names
    def _manifests(self) -> list[ManifestFile]:
        return self.manifests()

    def _existing_manifests(self) -> list[ManifestFile]:
        return self.existing_manifests()

    def _deleted_entries(self) -> list[ManifestEntry]:
        return self.deleted_entries()

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        return self.process_manifests(manifests)

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        return self.snapshot_summary(snapshot_properties)

    def _commit(self) -> UpdatesAndRequirements:
        return self.snapshot_updates()

    def _validate_concurrency(self) -> None:
        self.validate_concurrency()

    def _build_manifest_evaluator(self, spec_id: int) -> Callable[[ManifestFile], bool]:
        return self.manifest_evaluator(spec_id)

    def _build_delete_files_partition_predicate(self) -> None:
        self.build_partition_filters()

    # the public names: pyiceberg's own behaviour unless a producer overrides them
    def manifests(self) -> list[ManifestFile]:
        """The new snapshot's manifests (written on each commit try)."""
        return super()._manifests()  # type: ignore[misc]

    def existing_manifests(self) -> list[ManifestFile]:
        """The parent's manifests the new snapshot keeps (or writes again without removed files)."""
        return super()._existing_manifests()  # type: ignore[misc]

    def deleted_entries(self) -> list[ManifestEntry]:
        return super()._deleted_entries()  # type: ignore[misc]

    def process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        """Post-processing of the manifests (pyiceberg's merge-append merges them here)."""
        return super()._process_manifests(manifests)  # type: ignore[misc]

    def snapshot_summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        return super()._summary(snapshot_properties)  # type: ignore[misc]

    def snapshot_updates(self) -> UpdatesAndRequirements:
        """The snapshot's updates and requirements (pyiceberg's `_commit`: manifests, manifest list, snapshot)."""
        return super()._commit()  # type: ignore[misc]

    def validate_concurrency(self) -> None:
        super()._validate_concurrency()  # type: ignore[misc]

    def manifest_evaluator(self, spec_id: int) -> Callable[[ManifestFile], bool]:
        """Whether a manifest of the spec may hold a file `partition_filters` selects."""
        return super()._build_manifest_evaluator(spec_id)  # type: ignore[misc]

    def build_partition_filters(self) -> None:
        """Fill `partition_filters` from the files this producer deletes."""
        super()._build_delete_files_partition_predicate()  # type: ignore[misc]

    # pyiceberg's private state, read-only
    @property
    def transaction(self) -> Transaction:
        return self._transaction  # type: ignore[attr-defined]

    @property
    def table_metadata(self) -> TableMetadata:
        """The transaction's metadata: rebuilt on every read (read it once per step)."""
        return self._transaction.table_metadata  # type: ignore[attr-defined]

    @property
    def file_io(self) -> FileIO:
        return self._io  # type: ignore[attr-defined]

    @property
    def operation(self) -> Operation:
        return self._operation  # type: ignore[attr-defined]

    @property
    def parent_snapshot_id(self) -> int | None:
        """The head this try commits on (pyiceberg refreshes it on each retry)."""
        return self._parent_snapshot_id  # type: ignore[attr-defined]

    @property
    def added_files(self) -> list[DataFile]:
        return self._added_data_files  # type: ignore[attr-defined]

    @property
    def deleted_files(self) -> set[DataFile]:
        return self._deleted_data_files  # type: ignore[attr-defined]

    @property
    def compression(self) -> Any:
        """The table's Avro codec for manifests (write.avro.compression-codec)."""
        return self._compression  # type: ignore[attr-defined]

    @property
    def case_sensitive(self) -> bool:
        return self._case_sensitive  # type: ignore[attr-defined]

    @property
    def target_branch(self) -> str | None:
        return self._target_branch  # type: ignore[attr-defined]

    @property
    def written_manifest_lists(self) -> list[str]:
        return self._written_manifest_lists  # type: ignore[attr-defined]

    def new_manifest_list_output(self) -> tuple[str, OutputFile]:
        """Where this try's manifest list goes (pyiceberg's name and location), recorded so that
        pyiceberg deletes it if the try fails."""
        commit_uuid: uuid.UUID = self.commit_uuid  # type: ignore[attr-defined]
        name = _new_manifest_list_file_name(snapshot_id=self.snapshot_id, attempt=0, commit_uuid=commit_uuid)  # type: ignore[attr-defined]
        location = self._transaction._table.location_provider().new_metadata_location(name)  # type: ignore[attr-defined]
        self._written_manifest_lists.append(location)  # type: ignore[attr-defined]
        return location, self.file_io.new_output(location)

    def drop_partition_filters(self) -> None:
        """Forget the cached `partition_filters` (a functools.cached_property holding a KeyDefaultDict
        of a bound method of the producer: a reference cycle)."""
        self.__dict__.pop("partition_filters", None)

    def merge_manifests(
        self, manifests: Sequence[ManifestFile], target_size_bytes: int, min_count_to_merge: int
    ) -> list[ManifestFile]:
        """Data manifests merged as pyiceberg's merge-append does (bin-packed by size, per spec),
        written through this producer's manifest writers."""
        merger: _ManifestMergeManager[Any] = _ManifestMergeManager(
            target_size_bytes=target_size_bytes,
            min_count_to_merge=min_count_to_merge,
            merge_enabled=True,
            snapshot_producer=self,  # type: ignore[arg-type]
        )
        return merger.merge_manifests(list(manifests))


class SnapshotProducer(ProducerHooks, _SnapshotProducer["SnapshotProducer"]):
    """pyiceberg's base producer: a snapshot of whatever manifests `manifests` returns."""


class OverwriteProducer(ProducerHooks, _OverwriteFiles):
    """pyiceberg's overwrite: files added and files deleted, the rest of the parent kept."""


class AppendProducer(ProducerHooks, _FastAppendFiles):
    """pyiceberg's fast append: added files in new manifests, the parent's manifests kept."""
