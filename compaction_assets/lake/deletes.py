"""Which delete files can apply to which data files: one rule for the planner and the commit.

Two indexes. `ApplyingDeletes` is the spec's exact rule with sequence numbers, for deciding
which deletes a rewrite must apply to a data file (and which deletes dangle once files are
replaced). `DeleteIndex` is the widened, sequence-number-free rule for conflict checks (below).

The Iceberg spec ("Scan Planning") applies a delete file to a data file of the same partition
(spec id and partition tuple), or to every data file when the delete file's spec is unpartitioned
(a global delete); a position delete file that references one data file applies to that file
only. `DeleteIndex` leaves sequence numbers to its caller (the commit looks only at deletes
added after its base snapshot).

Its partition match is widened on purpose: a partition-scoped delete counts for every data file
with an equal partition tuple, whatever the spec ids. That is a superset of the spec's rule, so it
can only make more commits back off, never let a delete that applies go unseen.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.transforms import VoidTransform
from pyiceberg.typedef import Record

from compaction_assets.lake.partition_key import PartitionId, partition_id
from compaction_assets.lake.v3_fields import CONTENT_OFFSET, REFERENCED_DATA_FILE, v3_field

FILE_PATH_FIELD_ID = 2147483546  # the file_path column of a position delete file (Iceberg spec reserved id)
_NAN = object()  # NaN partition values are one partition (NaN != NaN would make each its own)


def referenced_data_file(delete_file: DataFile) -> str | None:
    """The one data file a position delete file references: its manifest entry's
    `referenced_data_file` (format version 3; every deletion vector has one), else the file_path
    column's lower and upper bounds when equal (as Java's ContentFileUtil.referencedDataFile).
    Entries read by pyiceberg 0.12 itself (v2 entry schema) lack the field; a delete file that only
    says so there counts as partition-scoped: a superset, so still safe."""
    if delete_file.content != DataFileContent.POSITION_DELETES:
        return None
    if (referenced := v3_field(delete_file, REFERENCED_DATA_FILE)) is not None:
        return referenced
    lower = (delete_file.lower_bounds or {}).get(FILE_PATH_FIELD_ID)
    upper = (delete_file.upper_bounds or {}).get(FILE_PATH_FIELD_ID)
    if lower is None or lower != upper:
        return None
    try:
        return lower.decode("utf-8")
    except UnicodeDecodeError:
        return None


def is_deletion_vector(delete_file: DataFile) -> bool:
    """A deletion vector (format version 3): a Puffin blob of deleted positions of one data file.
    Many share one Puffin file, each its own manifest entry (see file_key)."""
    return delete_file.content == DataFileContent.POSITION_DELETES and delete_file.file_format == FileFormat.PUFFIN


def file_key(data_file: DataFile) -> str:
    """What tells a live file from the others: its path, but for a deletion vector the Puffin file's
    path and the blob's offset in it (`<path>#<offset>`), since Java writes the DVs of many data files
    (of several partitions) into one Puffin file."""
    if is_deletion_vector(data_file):
        return f"{data_file.file_path}#{v3_field(data_file, CONTENT_OFFSET)}"
    return data_file.file_path


def path_in_bounds(delete_file: DataFile, data_path: str) -> bool:
    """Whether a position delete file's file_path column bounds admit `data_path` (Java's
    ContentFileUtil / DeleteFileIndex.canContainPosDeletesForFile); True when bounds are missing."""
    lower = (delete_file.lower_bounds or {}).get(FILE_PATH_FIELD_ID)
    upper = (delete_file.upper_bounds or {}).get(FILE_PATH_FIELD_ID)
    path = data_path.encode("utf-8")
    return (lower is None or lower <= path) and (upper is None or path <= upper)


def global_spec_ids(specs: Iterable[PartitionSpec]) -> frozenset[int]:
    """The ids of the specs whose delete files are global: no field, or void fields only (Java's
    PartitionSpec.isUnpartitioned; a v1 table's dropped partition field stays as a void one)."""
    return frozenset(s.spec_id for s in specs if all(isinstance(f.transform, VoidTransform) for f in s.fields))


def _tuple(partition: Record) -> tuple[Any, ...]:
    return tuple(
        _NAN if isinstance(v, float) and math.isnan(v) else v for v in (partition[i] for i in range(len(partition)))
    )


class DeleteIndex:
    """Delete files indexed for "which of them can apply to this data file" (see the module doc)."""

    def __init__(self, delete_files: Iterable[DataFile], global_specs: frozenset[int] = frozenset()) -> None:
        self._by_path: dict[str, list[DataFile]] = {}
        self._by_partition: dict[tuple[Any, ...], list[DataFile]] = {}
        self._global: list[DataFile] = []
        for delete_file in delete_files:
            if delete_file.content == DataFileContent.DATA:
                raise ValueError(f"not a delete file: {delete_file.file_path}")
            if (path := referenced_data_file(delete_file)) is not None:
                self._by_path.setdefault(path, []).append(delete_file)
            elif len(delete_file.partition) == 0 or delete_file.spec_id in global_specs:  # unpartitioned spec
                self._global.append(delete_file)
            else:
                self._by_partition.setdefault(_tuple(delete_file.partition), []).append(delete_file)

    def __bool__(self) -> bool:
        return bool(self._by_path or self._by_partition or self._global)

    def for_data_file(self, data_file: DataFile) -> list[DataFile]:
        """The delete files that can apply to `data_file`, whatever the sequence numbers."""
        if not self:
            return []
        return [
            *self._by_path.get(data_file.file_path, ()),
            *self._by_partition.get(_tuple(data_file.partition), ()),
            *self._global,
        ]


class SequencedFile(Protocol):
    """A live file with its data sequence number (lake.files.LiveFile has these)."""

    @property
    def data_file(self) -> DataFile: ...
    @property
    def data_sequence_number(self) -> int: ...


D = TypeVar("D", bound=SequencedFile)  # the caller's delete-file type: the index hands its own objects back


def _scope(data_file: DataFile) -> PartitionId:
    """Spec id and partition values as the planner groups files (floats by their bits: -0.0 is not
    0.0, as Java's Double.compare has it; every NaN one)."""
    return partition_id(data_file.spec_id, data_file.partition)


class ApplyingDeletes(Generic[D]):
    """The Iceberg spec's rule ("Scan Planning"), exactly: which live delete files apply to a data file.

    - a position delete applies when it is of the data file's spec and partition, or of an
      unpartitioned spec; the data file's data sequence number is <= the delete's; and its
      file_path bounds admit the data file's path (its rows then name the positions);
    - an equality delete applies when it is of the data file's spec and partition, or of an
      unpartitioned spec, and the data file's data sequence number is < the delete's.
    A spec is unpartitioned when it has no field or, with `global_specs` (global_spec_ids), only void ones.
    A position delete listed here may hold no row for the file: the rewrite reads it to find out.
    """

    def __init__(self, deletes: Iterable[D], global_specs: frozenset[int] = frozenset()) -> None:
        self._scoped: dict[PartitionId, _Scope[D]] = {}
        self._global: _Scope[D] = _Scope()
        for delete in deletes:
            content = delete.data_file.content
            if content == DataFileContent.DATA:
                raise ValueError(f"not a delete file: {delete.data_file.file_path}")
            if len(delete.data_file.partition) == 0 or delete.data_file.spec_id in global_specs:
                self._global.add(delete)
            else:
                self._scoped.setdefault(_scope(delete.data_file), _Scope()).add(delete)
        for scope in [*self._scoped.values(), self._global]:
            scope.seal()

    def __bool__(self) -> bool:
        return bool(self._scoped or self._global)

    def for_data_file(self, data: SequencedFile) -> list[D]:
        """The live delete files that apply to `data`, by the spec's rule (see the class doc), in a
        stable order: position deletes, then equality deletes by descending sequence number."""
        if not self:
            return []
        scoped = self._scoped.get(_scope(data.data_file))
        found = scoped.applying(data) if scoped is not None else []
        return found + self._global.applying(data) if self._global else found


class _Scope(Generic[D]):
    """The delete files of one scope (a partition, or the global deletes), indexed: position
    deletes that name one file by that path, the rest by their bounds; equality deletes sorted by
    sequence number, so the ones newer than a data file are a prefix found by bisection."""

    def __init__(self) -> None:
        self._by_path: dict[str, list[D]] = {}
        self._positional: list[D] = []
        self._equality: list[D] = []
        self._negated_seqs: list[int] = []

    def __bool__(self) -> bool:
        return bool(self._by_path or self._positional or self._equality)

    def add(self, delete: D) -> None:
        if delete.data_file.content == DataFileContent.EQUALITY_DELETES:
            self._equality.append(delete)
        elif (path := referenced_data_file(delete.data_file)) is not None:
            self._by_path.setdefault(path, []).append(delete)
        else:
            self._positional.append(delete)

    def seal(self) -> None:
        self._equality.sort(key=lambda d: (-d.data_sequence_number, d.data_file.file_path))
        self._negated_seqs = [-d.data_sequence_number for d in self._equality]

    def applying(self, data: SequencedFile) -> list[D]:
        seq, path = data.data_sequence_number, data.data_file.file_path
        found = [d for d in self._by_path.get(path, ()) if seq <= d.data_sequence_number]
        found += [d for d in self._positional if applies(d, data)]
        # equality deletes with a sequence number > seq: -number < -seq, a prefix of the sorted list
        return found + self._equality[: bisect.bisect_left(self._negated_seqs, -seq)]


def applies(delete: SequencedFile, data: SequencedFile) -> bool:
    """Whether `delete` applies to `data` by sequence numbers and path bounds (scope is the caller's)."""
    if delete.data_file.content == DataFileContent.POSITION_DELETES:
        return data.data_sequence_number <= delete.data_sequence_number and path_in_bounds(
            delete.data_file, data.data_file.file_path
        )
    return data.data_sequence_number < delete.data_sequence_number
