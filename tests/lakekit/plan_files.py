"""File statistics the pure planner takes (no table behind them): data files, position and
equality deletes, and a policy whose fragments and undersized files are easy to reason about."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from compaction_assets.planning.policy import Policy

KB = 1024


POLICY = Policy(target_file_size_bytes=800 * KB, max_group_bytes=4000 * KB)  # fragment <= 100 KB, undersized < 600 KB


POS, EQ = DataFileContent.POSITION_DELETES, DataFileContent.EQUALITY_DELETES


@dataclass(frozen=True)
class F:
    path: str
    size: int
    record_count: int = 10
    spec_id: int = 0
    content: DataFileContent = DataFileContent.DATA
    partition_key: str = "p=1"
    added_at_ms: int = 0
    data_sequence_number: int = 1
    equality_ids: tuple[int, ...] = ()
    target: str | None = None  # a position delete's file_path bounds (the one data file it names)
    column_sizes: tuple[tuple[int, int], ...] = ()

    @property
    def is_delete(self) -> bool:
        return self.content != DataFileContent.DATA

    @property
    def data_bytes(self) -> int:
        return self.size

    @property
    def partition_id(self) -> tuple:
        return self.spec_id, self.partition_key

    @cached_property
    def data_file(self) -> DataFile:
        """The manifest's view of the file, as lake.deletes reads it (a global delete: key "")."""
        bounds = {2147483546: self.target.encode()} if self.target else None
        data_file = DataFile.from_args(
            content=self.content,
            file_path=self.path,
            file_format=FileFormat.PARQUET,
            partition=Record(self.partition_key) if self.partition_key else Record(),
            record_count=self.record_count,
            file_size_in_bytes=self.size,
            lower_bounds=bounds,
            upper_bounds=bounds,
            equality_ids=list(self.equality_ids) or None,
            column_sizes=dict(self.column_sizes) or None,
        )
        data_file.spec_id = self.spec_id
        return data_file


def pos_delete(path: str, target: str | None, records: int = 1, seq: int = 2, key: str = "p=1", **kw) -> F:
    """A position delete naming `target` (None: partition-scoped, bounds absent)."""
    return F(path, 2 * KB, records, content=POS, partition_key=key, data_sequence_number=seq, target=target, **kw)


def eq_delete(path: str, records: int = 1, seq: int = 2, key: str = "p=1", **kw) -> F:
    return F(path, 2 * KB, records, content=EQ, partition_key=key, data_sequence_number=seq, equality_ids=(1,), **kw)


def fragments(n: int, size: int = 10 * KB, key: str = "p=1") -> list[F]:
    return [F(f"s3://b/t/{key}/f{i:04d}.parquet", size, partition_key=key) for i in range(n)]
