"""Data expiration (`compaction.expire.field`, `compaction.expire.retention-ms`): which rows are past
retention, and what that means for each data file, decided from its manifest statistics alone.

cutoff = now - retention. A row expires when its value of the field is < cutoff; a NULL never
expires. Accepted field types (top-level columns), each compared in its own unit:
- timestamp, timestamptz: microseconds since the epoch (timestamp without zone read as UTC);
- date: days since the epoch, against the cutoff's day (a day expires once it has wholly passed);
- long, int: epoch milliseconds.
Any other type is a ConfigError naming table and column. The column is named in the current
schema and followed by field id, so files written before a rename are judged by their own bounds.

Per data file (its lower/upper bounds and null count of the field, decoded with pyiceberg's
conversions): upper < cutoff and no NULLs: every row expires, the file is dropped by metadata;
lower >= cutoff, or only NULLs: nothing expires, the file is kept; otherwise (or statistics
missing) the file is rewritten without its expired rows.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.types import DateType, IntegerType, LongType, PrimitiveType, TimestampType, TimestamptzType

from compaction_assets.errors import ConfigError
from compaction_assets.planning.policy import Policy

DAY_MS = 86_400_000
_UNITS = {  # accepted type -> its name in messages
    TimestampType: "timestamp",
    TimestamptzType: "timestamptz",
    DateType: "date",
    LongType: "long (epoch millis)",
    IntegerType: "int (epoch millis)",
}


class Verdict(StrEnum):
    DROP = "drop"  # every row expires: removed by metadata, never read
    KEEP = "keep"  # no row expires
    REWRITE = "rewrite"  # some rows may expire: rewritten without them


@dataclass(frozen=True)
class ExpireRule:
    """The expiration in force for one plan: the field (by id) and the cutoff in its own unit."""

    field_id: int
    column: str  # its name in the current schema
    field_type: PrimitiveType
    cutoff: int  # micros (timestamps), days (date) or millis (long, int)
    cutoff_ms: int
    retention_ms: int

    def describe(self) -> str:
        try:
            at = dt.datetime.fromtimestamp(self.cutoff_ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
        except (ValueError, OverflowError, OSError):  # before year 1 (a retention of millennia)
            at = f"{self.cutoff_ms} ms after the epoch"
        return f"{self.column} < {at} (now - retention {self.retention_ms} ms)"

    def verdict(self, data_file: DataFile) -> Verdict:
        """What expiration does to this file, from its manifest statistics (see the module doc)."""
        records = data_file.record_count
        nulls = (data_file.null_value_counts or {}).get(self.field_id)
        if nulls is not None and nulls >= records:
            return Verdict.KEEP
        lower = self._bound(data_file.lower_bounds)
        if lower is not None and lower >= self.cutoff:
            return Verdict.KEEP
        upper = self._bound(data_file.upper_bounds)
        if upper is not None and upper < self.cutoff and nulls == 0:
            return Verdict.DROP
        return Verdict.REWRITE

    def estimated_rows(self, data_file: DataFile) -> int:
        """Rows of a file to rewrite that expire, estimated as if its non-NULL values spread evenly
        between its bounds (0 when a bound is missing)."""
        lower, upper = self._bound(data_file.lower_bounds), self._bound(data_file.upper_bounds)
        if lower is None or upper is None:
            return 0
        nulls = (data_file.null_value_counts or {}).get(self.field_id) or 0
        share = min(1.0, max(0.0, (self.cutoff - lower) / (upper - lower + 1)))
        return round((data_file.record_count - nulls) * share)

    def _bound(self, bounds: dict[int, bytes] | None) -> int | None:
        raw = (bounds or {}).get(self.field_id)
        if raw is None:
            return None
        # a long column promoted from int keeps 4-byte bounds in files written before the promotion
        kind = IntegerType() if isinstance(self.field_type, LongType) and len(raw) == 4 else self.field_type
        try:
            return int(from_bytes(kind, raw))
        except (ValueError, TypeError, OverflowError):
            return None


def expire_rule(table_name: str, schema: Schema, policy: Policy, now_ms: int) -> ExpireRule | str | None:
    """The table's expiration rule at `now_ms`: None when it is off (both properties are needed),
    a reason when the tier cannot run (its column is not in the current schema).

    Raises:
        ConfigError: the column is nested or of a type expiration cannot compare.
    """
    if policy.expire_field is None or policy.expire_retention_ms is None:
        return None
    name = policy.expire_field
    try:
        field = schema.find_field(name)
    except ValueError:
        return (
            f"expiration stopped: column {name!r} (compaction.expire.field) is not in the current schema "
            "(renamed or dropped? name it as the schema does now)"
        )
    field_type = field.field_type
    top_level = field.field_id in {f.field_id for f in schema.fields}
    # every type in _UNITS is primitive: the isinstance only tells the type checker so
    if not top_level or not isinstance(field_type, PrimitiveType) or type(field_type) not in _UNITS:
        raise ConfigError(
            f"table '{table_name}': compaction.expire.field={name!r} names a {field_type} column; "
            f"expiration needs a top-level column of type {', '.join(_UNITS.values())}"
        )
    cutoff_ms = now_ms - policy.expire_retention_ms
    if isinstance(field_type, TimestampType | TimestamptzType):
        cutoff = cutoff_ms * 1000
    elif isinstance(field_type, DateType):
        cutoff = cutoff_ms // DAY_MS
    else:
        cutoff = cutoff_ms
    return ExpireRule(field.field_id, name, field_type, cutoff, cutoff_ms, policy.expire_retention_ms)
