"""A table's clustering: its z-order columns (compaction.zorder-columns), which win, else its sort
order. What the planner measures bounds_overlap on and what sorted rewrites order by."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema, sanitize_column_names
from pyiceberg.table import Table
from pyiceberg.table.sorting import SortDirection
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform, MonthTransform, YearTransform
from pyiceberg.types import NestedField, PrimitiveType

from compaction_assets.errors import CompactionError, ConfigError
from compaction_assets.lake import ordinal

_MONOTONIC = (IdentityTransform, YearTransform, MonthTransform, DayTransform, HourTransform)


@dataclass(frozen=True)
class Clustering:
    """The columns a table is clustered on: z-order columns (compaction.zorder-columns), else the
    sort order's leading columns."""

    columns: tuple[str, ...]  # table column names
    field_ids: tuple[int, ...]
    types: tuple[PrimitiveType, ...]
    zorder: bool

    def describe(self) -> str:
        return f"{'zorder' if self.zorder else 'sort'}({', '.join(self.columns)})"


class ZorderSetting(Protocol):
    """What clustering_of reads of a table's policy (planning.policy.Policy has it)."""

    @property
    def zorder_columns(self) -> Sequence[str]: ...


def clustering_of(table: Table, table_name: str, policy: ZorderSetting) -> Clustering | None:
    """The z-order columns if set (each a top-level column of a primitive type), else the sort
    order's leading fields (up to the first non-monotonic transform); None: neither.

    Raises:
        ConfigError: a z-order column the table does not have, or one that is not a top-level
            primitive column (naming the table and the column).
    """
    schema = table.schema()
    if policy.zorder_columns:
        fields = [_zorder_field(schema, table_name, name) for name in policy.zorder_columns]
        return Clustering(
            tuple(f.name for f in fields), tuple(f.field_id for f in fields), _primitive_types(table_name, fields), True
        )
    fields = [schema.find_field(field_id) for field_id, _ in _sort_fields(table)]
    if not fields:
        return None
    return Clustering(
        tuple(f.name for f in fields), tuple(f.field_id for f in fields), _primitive_types(table_name, fields), False
    )


def _primitive_types(table_name: str, fields: Sequence[NestedField]) -> tuple[PrimitiveType, ...]:
    """The fields' types: primitive for z-order columns (_zorder_field checks) and for sort-order
    sources (the Iceberg spec; pyiceberg's SortOrder.check_compatible): anything else is refused."""
    types: list[PrimitiveType] = []
    for f in fields:
        if not isinstance(f.field_type, PrimitiveType):
            raise CompactionError(f"table '{table_name}': cannot cluster on the non-primitive column '{f.name}'")
        types.append(f.field_type)
    return tuple(types)


def sort_keys(table: Table) -> list[tuple[str, str]]:
    """The table's sort order as pyarrow sort keys on the written files' column names."""
    names = sanitize_column_names(table.schema())
    return [(_column_name(names, field_id), direction) for field_id, direction in _sort_fields(table)]


def file_column_names(table: Table, clustering: Clustering) -> list[str]:
    """The clustering columns' names in the written files (pyiceberg sanitises some names)."""
    names = sanitize_column_names(table.schema())
    return [_column_name(names, field_id) for field_id in clustering.field_ids]


def _column_name(schema: Schema, field_id: int) -> str:
    """The name of top-level field `field_id` in `schema`; ValueError if it has no such field."""
    if (name := schema.find_column_name(field_id)) is None:
        raise ValueError(f"no column with field id {field_id} in the table's current schema")
    return name


def _sort_fields(table: Table) -> list[tuple[int, str]]:
    """(field id, ascending|descending) of the sort order's leading top-level fields with a
    monotonic transform (sorting by the column itself then sorts by the transform too)."""
    top_level = {f.field_id for f in table.schema().fields}
    keys: list[tuple[int, str]] = []
    for sort_field in table.sort_order().fields:
        if not isinstance(sort_field.transform, _MONOTONIC) or sort_field.source_id not in top_level:
            break
        keys.append((sort_field.source_id, "ascending" if sort_field.direction == SortDirection.ASC else "descending"))
    return keys


def _zorder_field(schema: Schema, table_name: str, name: str) -> NestedField:
    top_level = {f.name: f for f in schema.fields}
    found = top_level.get(name)
    if found is None:
        raise ConfigError(
            f"table '{table_name}': compaction.zorder-columns names '{name}', which is no top-level column of "
            f"the table (columns: {', '.join(top_level)})"
        )
    if not isinstance(found.field_type, PrimitiveType) or not ordinal.orderable(schema_to_pyarrow(found.field_type)):
        raise ConfigError(
            f"table '{table_name}': compaction.zorder-columns names '{name}' of type {found.field_type}; "
            "z-order needs primitive columns"
        )
    return found
