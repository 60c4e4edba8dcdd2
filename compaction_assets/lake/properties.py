"""The Iceberg table properties compaction reads, and how each parses: other engines' users tune a
table with these. planning/policy.py layers them over compaction.yaml; lake/table_details.py keeps
only these of a table's properties."""

from __future__ import annotations

from collections.abc import Callable

from pyiceberg.utils.properties import property_as_int

ICEBERG_TARGET_SIZE_PROPERTY = "write.target-file-size-bytes"
# Iceberg's manifest size target (its writers roll and merge manifests at it), default 8 MiB
ICEBERG_MANIFEST_TARGET_PROPERTY = "commit.manifest.target-size-bytes"
ENABLED_PROPERTY = "compaction.enabled"


def int_property(properties: dict[str, str], name: str, default: int) -> int:
    """pyiceberg's property_as_int with a default (then never None, which its type does not say)."""
    value = property_as_int(properties, name, default)
    return default if value is None else value


def _parse_columns(value: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in value.split(",") if c.strip())


def _parse_bool(value: str) -> bool:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError("expected true or false")


# Iceberg table property -> (Policy field, parser).
TABLE_PROPERTIES: dict[str, tuple[str, Callable[[str], object]]] = {
    "compaction.target-file-size-bytes": ("target_file_size_bytes", int),
    "compaction.fragment-ratio": ("fragment_ratio", int),
    "compaction.min-target-size-ratio": ("min_target_size_ratio", float),
    "compaction.min-input-files": ("min_input_files", int),
    "compaction.max-group-bytes": ("max_group_bytes", int),
    ENABLED_PROPERTY: ("enabled", _parse_bool),
    "compaction.delete-file-threshold": ("delete_file_threshold", int),
    "compaction.delete-ratio-threshold": ("delete_ratio_threshold", float),
    "compaction.equality-delete-file-threshold": ("equality_delete_file_threshold", int),
    "compaction.position-delete-file-threshold": ("position_delete_file_threshold", int),
    "compaction.full.trigger-interval-ms": ("full_trigger_interval_ms", int),
    "compaction.max-file-size-bytes": ("max_file_size_bytes", int),
    "compaction.zorder-columns": ("zorder_columns", _parse_columns),
    "compaction.cluster.min-overlap": ("cluster_min_overlap", float),
    "compaction.sort.memory-bytes": ("sort_memory_bytes", int),
    "compaction.expire.field": ("expire_field", str),
    "compaction.expire.retention-ms": ("expire_retention_ms", int),
    "compaction.rewrite-manifests.min-count": ("rewrite_manifests_min_count", int),
    ICEBERG_MANIFEST_TARGET_PROPERTY: ("manifest_target_size_bytes", int),
    "compaction.rewrite-old-specs": ("rewrite_old_specs", _parse_bool),
}
# Every property a table's policy reads.
POLICY_PROPERTIES = frozenset({ICEBERG_TARGET_SIZE_PROPERTY, *TABLE_PROPERTIES})
