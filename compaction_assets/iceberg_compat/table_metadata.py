"""pyiceberg 0.12 cannot serialise format-version-3 table metadata: patched here.

`TableMetadataV3.model_dump_json` raises NotImplementedError in pyiceberg 0.12 for every v3 table
(iceberg-python #1551), so no commit could land on one: not a compaction, nor setting a property
(pause, resume), nor expiring snapshots (gc). The project writes what a v3 snapshot needs itself
(lake/format_v3.py, commit/rewrite_producer.py); this gives the metadata its serialisation back.
Applied when this module is imported (lake/format_v3.py imports it); tests/test_compat_contract.py
checks that pyiceberg's own still refuses (drop this once it does not).
"""

from __future__ import annotations

from typing import Any

from pyiceberg.table.metadata import TableMetadataV3
from pyiceberg.typedef import IcebergBaseModel


def dump_v3_metadata_json(
    self: TableMetadataV3,
    exclude_none: bool = True,
    exclude: Any | None = None,
    by_alias: bool = True,
    **kwargs: Any,
) -> str:
    """TableMetadataV3 as JSON (IcebergBaseModel's serialisation, which round-trips what Java 1.10
    writes); refuses metadata that lost its next-row-id (a snapshot committed without added-rows)."""
    if self.next_row_id is None:
        raise ValueError("format-version 3 table metadata without next-row-id: refusing to write it")
    return IcebergBaseModel.model_dump_json(
        self, exclude_none=exclude_none, exclude=exclude, by_alias=by_alias, **kwargs
    )


PYICEBERG_DUMP_V3 = TableMetadataV3.model_dump_json  # pyiceberg's own: raises NotImplementedError
TableMetadataV3.model_dump_json = dump_v3_metadata_json  # type: ignore[method-assign]
