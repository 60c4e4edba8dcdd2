"""A table of shuffled rows for the sort and clustering tests (every file spans nearly every value)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import SortOrder
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from compaction_tools.demo import append_fragments
from tests.conftest import BY_REGION

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "a", LongType(), required=False),
    NestedField(4, "b", DoubleType(), required=False),
    NestedField(5, "s", StringType(), required=False),
)


FILES, ROWS = 8, 20_000


def shuffled(seed: int = 7) -> list[pa.Table]:
    """FILES files of ROWS random rows each: every file spans (nearly) every value of a, b and s."""
    rng = np.random.default_rng(seed)
    n = FILES * ROWS
    a = rng.integers(0, 1_000_000, n)
    table = pa.table(
        {
            "id": pa.array(np.arange(n)),
            "region": pa.array(["eu"] * n),
            "a": pa.array(np.where(rng.random(n) < 0.01, None, a).tolist(), pa.int64()),
            "b": pa.array(rng.random(n) * 1000),
            "s": pa.array(np.char.add("k", rng.integers(0, 10**6, n).astype(str))),
        }
    )
    return [table.slice(i * ROWS, ROWS) for i in range(FILES)]


def make_table(lake, chunks: list[pa.Table], properties: dict[str, str], sort_order: SortOrder | None = None):
    kwargs = {"sort_order": sort_order} if sort_order else {}
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION, **kwargs)
    append_fragments(table, chunks)
    with lake.table("ns.t").transaction() as txn:
        txn.set_properties(properties)
    return lake.table("ns.t")
