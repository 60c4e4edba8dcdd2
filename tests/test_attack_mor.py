"""Outside review of merge-on-read compaction: regressions for the problems it found."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFileContent
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField

from compaction_assets.execution.deletes import GroupDeletes


def test_an_equality_delete_on_zero_keeps_negative_zero_and_nan_payloads_all_match(tmp_path: Path):
    """Java (Double.compare, as the convert tier) does not match -0.0 with 0.0; every NaN is one key."""
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "x", DoubleType(), required=False))
    path = str(tmp_path / "eq.parquet")
    x = pa.field("x", pa.float64(), metadata={b"PARQUET:field_id": b"2"})
    pq.write_table(pa.table([pa.array([0.0, float("nan")])], schema=pa.schema([x])), path)
    source = SimpleNamespace(path=str(tmp_path / "data.parquet"), deletes=[0])
    delete = SimpleNamespace(path=path, content=DataFileContent.EQUALITY_DELETES, equality_ids=[2])
    deletes = GroupDeletes(PyArrowFileIO(), schema, None, [source], [delete])
    odd_nan = np.array([0x7FF8000000000001], dtype=np.uint64).view(np.float64)[0]
    batch = pa.record_batch([pa.array([1, 2, 3, 4, 5]), pa.array([0.0, -0.0, 1.0, odd_nan, None])], names=["id", "x"])

    kept = deletes.apply(source, 0, batch)

    assert kept.column("id").to_pylist() == [2, 3, 5]
