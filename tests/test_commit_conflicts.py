"""The commit's conflict rules (commit/conflicts.py), table by table: pure functions of metadata
and files, checked here without a catalog; tests/test_rewrite_commit.py and
tests/test_commit_deletes.py check the same rules through real commits."""

from __future__ import annotations

import pytest
from pyiceberg.exceptions import ValidationException
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from compaction_assets.commit.conflicts import (
    Sequenced,
    base_history,
    dangling,
    delete_conflict,
    format_conflict,
    uncovered,
)
from compaction_assets.lake.v3_fields import LAST_UPDATED_FIELD_ID, ROW_ID_FIELD_ID

DATA, POSITION, EQUALITY = DataFileContent.DATA, DataFileContent.POSITION_DELETES, DataFileContent.EQUALITY_DELETES
PARTITIONED, UNPARTITIONED = 0, 1  # spec ids
GLOBAL = frozenset({UNPARTITIONED})


def file(name: str, content: DataFileContent = DATA, region: str | None = "eu", lineage: bool = False) -> DataFile:
    """A file of spec PARTITIONED in partition `region` (region None: of the unpartitioned spec)."""
    sizes = {1: 10, ROW_ID_FIELD_ID: 8, LAST_UPDATED_FIELD_ID: 8} if lineage else {1: 10}
    data_file = DataFile.from_args(
        content=content,
        file_path=f"s3://lake/{name}.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record() if region is None else Record(region),
        record_count=1,
        file_size_in_bytes=100,
        column_sizes=sizes,
        equality_ids=[1] if content == EQUALITY else None,
    )
    data_file.spec_id = UNPARTITIONED if region is None else PARTITIONED
    return data_file


def seq(data_file: DataFile, number: int) -> Sequenced:
    return Sequenced(data_file, number)


# --- base_history: the head must descend from the attempt's base -------------------------------

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False), NestedField(2, "region", StringType(), required=False)
)
SPEC = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))


def metadata(*snapshots: tuple[int, int | None]):  # noqa: ANN201 - a TableMetadataV2
    """Table metadata holding snapshots (id, parent id), sequence numbers in order."""
    base = new_table_metadata(SCHEMA, SPEC, UNSORTED_SORT_ORDER, "s3://lake/t", {})
    made = [
        Snapshot(
            snapshot_id=sid,
            parent_snapshot_id=parent,
            sequence_number=k + 1,
            timestamp_ms=1_700_000_000_000 + k,
            manifest_list=f"s3://lake/t/metadata/snap-{sid}.avro",
            summary=Summary(Operation.APPEND),
            schema_id=0,
        )
        for k, (sid, parent) in enumerate(snapshots)
    ]
    return base.model_copy(update={"snapshots": made})


LINE = [(1, None), (2, 1), (3, 2)]


@pytest.mark.parametrize(
    ("snapshots", "base", "head", "expected"),
    [
        (LINE, 1, 3, [3, 2]),  # what came after the base, newest first
        (LINE, 3, 3, []),  # nothing committed since
        ([(2, 1), (3, 2)], 1, 3, [3, 2]),  # the base expired, its child still names it
        ([*LINE, (4, 1)], 2, 4, "no ancestor"),  # main set to another line since the plan
        ([(1, None), (3, 2)], 1, 3, "is missing"),  # a snapshot between them expired
        (LINE, None, 3, "no base snapshot"),
    ],
    ids=["after-base", "base-is-head", "base-expired", "other-line", "gap", "no-base"],
)
def test_base_history(snapshots: list, base: int | None, head: int, expected: list | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(ValidationException, match=expected):
            base_history(metadata(*snapshots), base, head)
    else:
        assert [s.snapshot_id for s in base_history(metadata(*snapshots), base, head)] == expected


# --- format_conflict: results a table of this format version takes -----------------------------


@pytest.mark.parametrize(
    ("results", "version", "expected"),
    [
        ([file("r")], 2, None),
        ([file("r", POSITION)], 2, None),
        ([file("r", lineage=True)], 3, None),
        ([file("r")], 3, "holds no row lineage"),  # upgraded to v3 after the plan
        ([file("r", lineage=True), file("d", POSITION)], 3, "takes no position-delete file"),
    ],
    ids=["v2-data", "v2-position-delete", "v3-lineage", "v3-no-lineage", "v3-position-delete"],
)
def test_format_conflict(results: list, version: int, expected: str | None) -> None:
    reason = format_conflict(results, version)
    assert reason is None if expected is None else expected in reason


# --- delete_conflict: a delete added since the base -------------------------------------------


@pytest.mark.parametrize(
    ("added", "results", "expected"),
    [
        ([], [file("r")], None),
        ([file("pd", POSITION)], [file("r")], "position delete file"),  # its positions would move
        ([file("pd", POSITION, region="us")], [file("r")], None),  # another partition
        ([file("pd", POSITION, region=None)], [file("r")], "position delete file"),  # global: applies anywhere
        ([file("ed", EQUALITY)], [file("r")], None),  # results keep the base's sequence number
        ([file("ed", EQUALITY)], [file("r", region="us")], "moves rows between partitions"),
        ([file("ed", EQUALITY, region="us")], [file("r", region="us")], "moves rows between partitions"),
        ([file("ed", EQUALITY, region=None)], [file("r", region="us")], None),  # global: alike on both sides
    ],
    ids=[
        "nothing-added",
        "position-same-partition",
        "position-other-partition",
        "position-global",
        "equality-same-partition",
        "equality-moved-from",
        "equality-moved-to",
        "equality-global-moved",
    ],
)
def test_delete_conflict(added: list, results: list, expected: str | None) -> None:
    reason = delete_conflict([file("a"), file("b")], added, GLOBAL, results)
    assert reason is None if expected is None else expected in reason


# --- uncovered: a replaced equality delete must not apply to a data file the attempt left out ---


@pytest.mark.parametrize(
    ("replaced", "live", "covered", "expected"),
    [
        ([seq(file("pd", POSITION), 5)], [seq(file("x"), 3)], [], None),  # no equality delete replaced
        ([seq(file("ed", EQUALITY), 5)], [seq(file("x"), 3)], [], "still applies to live data file"),
        ([seq(file("ed", EQUALITY), 5)], [seq(file("x"), 3)], ["s3://lake/x.parquet"], None),
        ([seq(file("ed", EQUALITY), 5)], [seq(file("x"), 5)], [], None),  # not older than the delete
        ([seq(file("ed", EQUALITY), 5)], [seq(file("x", region="us"), 3)], [], None),
        ([seq(file("ed", EQUALITY, region=None), 5)], [seq(file("x", region="us"), 3)], [], "still applies"),
    ],
    ids=["position-only", "uncovered", "covered", "same-sequence", "other-partition", "global-uncovered"],
)
def test_uncovered(replaced: list, live: list, covered: list, expected: str | None) -> None:
    reason = uncovered(replaced, live, covered, GLOBAL)
    assert reason is None if expected is None else expected in reason


# --- dangling: deletes the swap leaves applying to nothing -------------------------------------


@pytest.mark.parametrize(
    ("candidate", "remaining", "results", "dangles"),
    [
        (seq(file("pd", POSITION), 5), [seq(file("x"), 3)], [], False),  # still applies to a kept file
        (seq(file("pd", POSITION), 5), [], [seq(file("r"), 3)], True),  # results have new paths
        (seq(file("pd", POSITION), 5), [seq(file("x", region="us"), 3)], [], True),
        (seq(file("ed", EQUALITY), 5), [], [seq(file("r"), 3)], False),  # applies to the rewritten rows
        (seq(file("ed", EQUALITY), 5), [], [seq(file("r"), 5)], True),  # results as new as the delete
        (seq(file("ed", EQUALITY, region=None), 5), [seq(file("x", region="us"), 3)], [], False),
    ],
    ids=["position-kept", "position-results", "position-other", "equality-results", "equality-newer", "global"],
)
def test_dangling(candidate: Sequenced, remaining: list, results: list, dangles: bool) -> None:
    assert dangling([candidate], remaining, results, GLOBAL) == ([candidate] if dangles else [])
