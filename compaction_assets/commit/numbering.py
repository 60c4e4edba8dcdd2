"""The numbering a snapshot was made from, required unchanged at commit.

A producer numbers its snapshot from the metadata of its try: the sequence number, and in format
version 3 the first row id. `numbered` turns the producer's assert-ref-snapshot-id into one that
also requires that numbering (_AssertNumbering), so a table another engine upgraded or numbered on
(a commit to another branch) since is a retry, not a snapshot pyiceberg refuses with an unknown
outcome. Used by both producers (rewrite_producer, manifest_rewrite).
"""

from __future__ import annotations

from pydantic import PrivateAttr
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    TableRequirement,
    UpdatesAndRequirements,
)


class _AssertNumbering(AssertRefSnapshotId):
    """assert-ref-snapshot-id that also requires the format version, last-sequence-number and
    next-row-id the snapshot was numbered from (`numbered`), where pyiceberg checks requirements
    itself (SQL and other metastore catalogs). pyiceberg 0.12 checks a snapshot's sequence number
    only on format version 2 and a stale first-row-id, or a v3 upgrade, only as it applies the
    update, by ValueError (to the caller: outcome unknown); nor does asserting main's head help,
    since a commit to another branch moves the table's numbering without moving main. Failing here
    is a CommitFailedException, so pyiceberg's retry numbers the snapshot again from the refreshed
    table. A REST catalog receives a plain assert-ref-snapshot-id (private attributes are not
    serialised); its server checks the numbering itself (Java's TableMetadata.Builder)."""

    _expected: tuple[int, int, int | None] = PrivateAttr(default=(0, 0, None))

    # pyiceberg's requirement hook (its signature); it shadows pydantic's deprecated BaseModel.validate
    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
        super().validate(base_metadata)
        assert base_metadata is not None  # super() raised otherwise
        found = _numbering(base_metadata)
        if found != self._expected:
            raise CommitFailedException(
                "Requirement failed: table numbering changed (format version, last-sequence-number, "
                f"next-row-id): expected {self._expected}, found {found}"
            )


def _numbering(metadata: TableMetadata) -> tuple[int, int, int | None]:
    """Format version, last-sequence-number (none before v2) and next-row-id (none before v3)."""
    return metadata.format_version, getattr(metadata, "last_sequence_number", 0), getattr(metadata, "next_row_id", None)


def numbered(commit: UpdatesAndRequirements, metadata: TableMetadata) -> UpdatesAndRequirements:
    """A producer's `snapshot_updates` result with its assert-ref-snapshot-id requiring, besides the branch
    head, the numbering `metadata` gave the snapshot (_AssertNumbering)."""
    updates, requirements = commit

    def checked(requirement: TableRequirement) -> TableRequirement:
        if not isinstance(requirement, AssertRefSnapshotId):
            return requirement
        strict = _AssertNumbering(ref=requirement.ref, snapshot_id=requirement.snapshot_id)
        strict._expected = _numbering(metadata)
        return strict

    return updates, tuple(checked(r) for r in requirements)
