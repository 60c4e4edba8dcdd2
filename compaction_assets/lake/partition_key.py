"""Partition identity (typed, for grouping) and partition keys (injective strings, for people).

A file's partition is its spec id and its typed partition tuple; files are grouped by that, never
by a rendered path. Its key (the Dagster partition key, the ledger's, `compact --partition`'s) is
the Iceberg partition path pyiceberg's `PartitionSpec.partition_to_path` renders (URL-encoded
`name=value` parts, so `region=eu` or `ts_day=2024-01-01/region=eu`), made injective:

- NULL renders as Hive's `__HIVE_DEFAULT_PARTITION__`, not as `null` (the string 'null' keeps
  `null`); a value that would render as that token has its first character percent-encoded;
- a part that would contain `...` (Dagster refuses it in a partition key) has its dots encoded;
- files of a spec other than the table's current one get the prefix `spec-<id>:` (`:` never
  occurs in a rendered path), so two specs whose tuples render alike never share a key.

Every rendered part URL-decodes (`unquote_plus`) to the human string of its value, which is
injective per type (NaN payloads aside: one NaN partition, as in Java's PartitionData).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Hashable
from typing import Any
from urllib.parse import quote_plus

from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record

NULL_TOKEN = "__HIVE_DEFAULT_PARTITION__"
_NAN_BITS = struct.pack(">d", math.nan)

PartitionId = tuple[int, tuple[Hashable, ...]]
"""(spec id, partition values) with floats compared by bits: -0.0 != 0.0, NaN == NaN."""


def partition_id(spec_id: int, partition: Record) -> PartitionId:
    """The typed identity files are grouped by."""
    return spec_id, tuple(_canonical(partition[i]) for i in range(len(partition)))


def render_partition(spec: PartitionSpec, schema: Schema, partition: Record, current_spec_id: int) -> str:
    """The partition key of `partition` under `spec` ("" for an unpartitioned current spec)."""
    field_types = spec.partition_type(schema).fields
    parts = []
    for pos, partition_field in enumerate(spec.fields):
        value = partition[pos]
        if value is None:
            rendered = NULL_TOKEN
        else:
            rendered = _escape(partition_field.transform.to_human_string(field_types[pos].field_type, value))
            if rendered == NULL_TOKEN:
                rendered = f"%{ord(rendered[0]):02X}{rendered[1:]}"
        parts.append(f"{_escape(partition_field.name)}={rendered}")
    path = "/".join(parts)
    return path if spec.spec_id == current_spec_id else f"spec-{spec.spec_id}:{path}"


def _escape(text: str) -> str:
    """pyiceberg's quote_plus(text, safe=""), with the dots encoded where Dagster would see `...`."""
    quoted = quote_plus(text, safe="")
    return quoted.replace(".", "%2E") if "..." in quoted else quoted


def _canonical(value: Any) -> Hashable:
    if isinstance(value, float):
        return ("float", _NAN_BITS if math.isnan(value) else struct.pack(">d", value))
    return value
