"""The demo's CDC table: upserts (equality delete + new version) and merge-on-read DELETEs (position
deletes) that real readers apply as the writer meant: every live order exactly once, deleted ones gone."""

import random
from collections import Counter

from compaction_assets.config import load_config
from compaction_assets.lake.catalog import open_catalog
from compaction_assets.lake.files import live_files
from compaction_tools.demo_cdc import CDC_TABLE, CdcWriter, create_cdc_table
from tests.conftest import write_config
from tests.lakekit.duckdb_reader import duckdb_rows
from tests.lakekit.spec_reader import spec_rows


def test_cdc_rounds_leave_every_live_order_once_with_both_kinds_of_deletes(tmp_path):
    catalog = open_catalog(load_config(write_config(tmp_path)).catalog)
    catalog.create_namespace("demo")
    create_cdc_table(catalog, 2, random.Random(1))
    table = catalog.load_table(CDC_TABLE)
    writer = CdcWriter(table, random.Random(2), first_id=10**6)  # checks the ids it inserts from here
    writer.play(8)
    table.refresh()
    kinds = Counter(int(f.data_file.content) for f in live_files(table))
    assert kinds[1] >= 2 and kinds[2] >= 3 * 8, kinds  # position and equality delete files
    for reader in (spec_rows, duckdb_rows):  # ids are unique across regions, so DuckDB's scope slip is harmless
        ids = Counter(r["order_id"] for r in reader(table) if r["order_id"] >= 10**6)
        assert set(ids) == writer.live_ids and max(ids.values()) == 1, reader.__name__
