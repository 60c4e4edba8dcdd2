"""Appending many small files in one commit, as a streaming writer leaves them."""

from __future__ import annotations

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
