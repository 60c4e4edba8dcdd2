"""Outside attack on the worker's output sync (execution/durable), kept as regression cases:
outputs in folders several levels deep that the write itself made, a data path outside the table
with spaces and percent signs, and a folder above it that the worker may not list."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import BucketTransform, IdentityTransform

from compaction_assets.lake.delete_files import commit_delete_files, equality_delete_file, position_delete_file
from compaction_tools.demo import append_fragments
from tests.conftest import SCHEMA, Lake, batch, create_fragmented
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.files import data_of, rows
from tests.lakekit.spec_reader import spec_rows

TWO_FIELDS = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"),
    PartitionField(source_id=1, field_id=1001, transform=BucketTransform(3), name="id_b"),
)


def _rows_kept(lake: Lake, name: str, expected) -> None:  # noqa: ANN001 - a Counter
    table = lake.table(name)
    assert rows(spec_rows, table) == expected
    assert rows(duckdb_rows, table) == expected


def test_a_two_field_spec_written_outside_the_table_under_a_folder_it_may_not_list(lake: Lake, tmp_path: Path):
    locked = tmp_path / "locked dir"
    data = locked / "in side" / "da ta%20x%2Fq"
    data.mkdir(parents=True)
    table = lake.catalog.create_table(
        "ns.two", schema=SCHEMA, partition_spec=TWO_FIELDS, properties={"write.data.path": f"file://{data}"}
    )
    regions = ["e u%", "u+s", "a/b", "x#y?z"]
    append_fragments(table, [batch(i * 20, 20, regions[i % 4]) for i in range(24)])
    expected = rows(spec_rows, lake.table("ns.two"))
    assert sum(expected.values()) == 480
    os.chmod(locked, stat.S_IWUSR | stat.S_IXUSR)  # -wx: the sync cannot open it, and must not fail for it
    try:
        outcomes = lake.engine.compact("ns.two")
    finally:
        os.chmod(locked, 0o755)
    assert outcomes and all(o.ok for o in outcomes), [(o.partition_key, o.reason) for o in outcomes]
    _rows_kept(lake, "ns.two", expected)


def test_an_old_spec_rewrite_into_new_two_level_folders_keeps_its_deletes(lake: Lake):
    table = create_fragmented(lake, "ns.t", {"eu": 8, "us": 6})
    eu = data_of(table, "eu")
    commit_delete_files(table, [position_delete_file(table, eu[1], [0, 3, 49])])
    table = lake.table("ns.t")
    ids = [{"id": i} for i in (1, 2, 130)]
    commit_delete_files(table, [equality_delete_file(table, 0, eu[0].partition, ["id"], ids)])
    table = lake.table("ns.t")
    with table.update_spec() as update:
        update.add_field("id", BucketTransform(4), "id_b")
    append_fragments(lake.table("ns.t"), [batch(10_000 + i * 30, 30, "eu") for i in range(4)])
    table = lake.table("ns.t")
    expected = rows(spec_rows, table)
    assert sum(expected.values()) == 14 * 50 + 4 * 30 - 6
    assert rows(duckdb_rows, table) == expected
    for _ in range(2):  # the second pass meets the first one's outputs in their new folders
        outcomes = lake.engine.compact("ns.t")
        assert all(o.ok for o in outcomes), [(o.partition_key, o.reason) for o in outcomes]
        _rows_kept(lake, "ns.t", expected)
