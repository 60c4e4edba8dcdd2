"""A format-version-3 snapshot, which pyiceberg 0.12 cannot write (no v3 manifest list, and the
snapshot's `added-rows` left unset): the manifest list assigns first_row_id to the data manifests
the snapshot wrote (format_v3.ManifestListWriterV3), the snapshot's first-row-id is the table's
next-row-id and its added-rows what was assigned (the spec's row lineage; Java's V3Writer)."""

from __future__ import annotations

from pyiceberg.manifest import ManifestFile
from pyiceberg.table.metadata import TableMetadataV3
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Snapshot, Summary
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetSnapshotRefUpdate,
    UpdatesAndRequirements,
)

from compaction_assets.commit.numbering import numbered
from compaction_assets.iceberg_compat.producers import OverwriteProducer
from compaction_assets.lake.format_v3 import ManifestListWriterV3


def v3_snapshot_updates(
    producer: OverwriteProducer, metadata: TableMetadataV3, manifests: list[ManifestFile], summary: Summary
) -> UpdatesAndRequirements:
    """The producer's snapshot of `manifests` on `metadata` (its try's), with its manifest list
    written: the updates and requirements pyiceberg's commit applies."""
    assert metadata.next_row_id is not None  # the caller refuses a v3 table without one
    sequence_number = metadata.next_sequence_number()
    location, output = producer.new_manifest_list_output()
    parent_id = producer.parent_snapshot_id
    with ManifestListWriterV3(
        output,
        producer.snapshot_id,
        parent_id,
        sequence_number,
        metadata.next_row_id,
        producer.compression,
    ) as writer:
        writer.add_manifests(manifests)
    snapshot = Snapshot(
        snapshot_id=producer.snapshot_id,
        parent_snapshot_id=parent_id,
        manifest_list=location,
        sequence_number=sequence_number,
        summary=summary,
        schema_id=metadata.current_schema_id,
        first_row_id=metadata.next_row_id,
        added_rows=writer.assigned_rows,
    )
    branch = producer.target_branch
    if branch is None:
        return (AddSnapshotUpdate(snapshot=snapshot),), ()
    # by field name, as pyiceberg's producer builds it: the pydantic plugin takes the fields
    # defaulted inside Annotated[...] (max_ref_age_ms, ...) for required ones
    ref = SetSnapshotRefUpdate(  # type: ignore[call-arg]
        snapshot_id=producer.snapshot_id,
        parent_snapshot_id=parent_id,
        ref_name=branch,
        type=SnapshotRefType.BRANCH,
    )
    head = metadata.refs[branch].snapshot_id if branch in metadata.refs else None
    return numbered(
        ((AddSnapshotUpdate(snapshot=snapshot), ref), (AssertRefSnapshotId(snapshot_id=head, ref=branch),)),
        metadata,
    )
