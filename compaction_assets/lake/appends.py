"""Appending many small files in one commit, as a streaming writer leaves them; and the sample
orders stream (the demo's `sales.orders` and its writer asset, defs/demo_writer.py, append it)."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pyarrow as pa
from pyiceberg.table import Table

from compaction_assets.iceberg_compat.arrow import dataframe_to_data_files


def append_fragments(table: Table, batches: Iterable[pa.Table]) -> int:
    """Write each micro-batch as its own small file(s) and commit them all in one append.

    The same files a streaming writer leaves, without paying one catalog commit per batch.
    """
    with table.transaction() as txn, txn.update_snapshot().fast_append() as append:
        added = 0
        for batch in batches:
            for data_file in dataframe_to_data_files(txn.table_metadata, batch, table.io):
                append.append_data_file(data_file)
                added += 1
    return added


def append_order_batches(table: Table, batches: int, rng: random.Random) -> int:
    """Micro-batches of 40 orders, one region each, as a streaming writer commits them."""
    regions = ["eu", "us", "apac"]
    start = rng.randrange(1 << 40)
    return append_fragments(
        table,
        (
            pa.table(
                {
                    "order_id": pa.array(range(start + i * 40, start + i * 40 + 40), pa.int64()),
                    "region": [regions[i % 3]] * 40,
                    "amount": [round(rng.uniform(1, 500), 2) for _ in range(40)],
                }
            )
            for i in range(batches)
        ),
    )
