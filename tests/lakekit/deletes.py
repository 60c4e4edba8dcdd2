"""Delete files written and committed as another engine would: the product's writer (lake.delete_files),
which tests/test_lakekit.py checks against DuckDB's and the spec reader's reading of them. Plus a
test-only commit of a delete-tier result (`swap_delete_files`)."""

from collections.abc import Sequence

from pyiceberg.manifest import DataFile, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.typedef import EMPTY_DICT

from compaction_assets.lake.delete_files import (  # noqa: F401 (re-exported)
    _AddDeleteFiles,
    _DeleteManifestWriter,
    commit_delete_files,
    equality_delete_file,
    position_delete_file,
    position_delete_rows,
    read_column,
)


class _SwapDeleteFiles(_AddDeleteFiles):
    """Removes some live delete files and adds others, in one snapshot, validating nothing: the
    tests' stand-in for the product's commit of a tier (commit/), which validates against the head."""

    def __init__(self, removed: set[str], **kwargs) -> None:  # noqa: ANN003 - the producer's own arguments
        super().__init__(**kwargs)
        self._removed = removed
        self._removed_files: list[DataFile] = []

    def existing_manifests(self) -> list[ManifestFile]:
        """Manifests holding a removed delete file are rewritten with it DELETED, the rest EXISTING."""
        metadata = self.table_metadata
        kept = []
        for manifest in metadata.snapshot_by_id(self.parent_snapshot_id).manifests(self.file_io):
            entries = manifest.fetch_manifest_entry(self.file_io, discard_deleted=True)
            if not any(e.data_file.file_path in self._removed for e in entries):
                kept.append(manifest)
                continue
            writer = _DeleteManifestWriter(
                metadata.specs()[manifest.partition_spec_id],
                metadata.schema(),
                self.new_manifest_output(),
                self.snapshot_id,
                self.compression,
            )
            with writer:
                for entry in entries:
                    gone = entry.data_file.file_path in self._removed
                    if gone:
                        self._removed_files.append(entry.data_file)
                    writer.add_entry(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.DELETED if gone else ManifestEntryStatus.EXISTING,
                            snapshot_id=self.snapshot_id if gone else entry.snapshot_id,
                            sequence_number=entry.sequence_number,
                            file_sequence_number=entry.file_sequence_number,
                            data_file=entry.data_file,
                        )
                    )
            kept.append(writer.to_manifest_file())
        return kept

    def snapshot_summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        metadata = self.table_metadata
        collector = SnapshotSummaryCollector()
        for added in self.added_files:
            collector.add_file(added, metadata.schema(), metadata.specs()[added.spec_id])
        for removed in self._removed_files:
            collector.remove_file(removed, metadata.schema(), metadata.specs()[removed.spec_id])
        parent = metadata.snapshot_by_id(self.parent_snapshot_id)
        return update_snapshot_summaries(
            summary=Summary(operation=self.operation, **collector.build(), **snapshot_properties),
            previous_summary=parent.summary if parent is not None else None,
        )


def swap_delete_files(table: Table, removed: Sequence[DataFile], added: Sequence[DataFile]) -> None:
    """Commit a delete tier's result: `removed` delete files out, `added` in, one snapshot."""
    txn = table.transaction()
    producer = _SwapDeleteFiles(
        {f.file_path for f in removed}, operation=Operation.OVERWRITE, transaction=txn, io=table.io
    )
    for delete_file in added:
        producer.append_data_file(delete_file)
    with producer:
        pass
    txn.commit_transaction()
    table.refresh()
