"""A table's effective compaction policy: defaults < compaction.yaml entry < Iceberg table properties."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from compaction_assets.config import PolicyConfig
from compaction_assets.errors import ConfigError

MiB = 1024 * 1024
DEFAULT_TARGET_FILE_SIZE = 128 * MiB
ICEBERG_TARGET_SIZE_PROPERTY = "write.target-file-size-bytes"
# Iceberg's manifest size target (its writers roll and merge manifests at it), default 8 MiB
ICEBERG_MANIFEST_TARGET_PROPERTY = "commit.manifest.target-size-bytes"
DEFAULT_MANIFEST_TARGET_SIZE = 8 * MiB
ENABLED_PROPERTY = "compaction.enabled"
SPLIT_DEFAULT_RATIO = 1.8  # Iceberg's max-file-size-bytes default: 1.8 x the target
# execution/external_sort.py: Arrow bytes a sorted group holds in memory (about twice that at peak)
DEFAULT_SORT_MEMORY = 48 * MiB


@dataclass(frozen=True)
class Policy:
    target_file_size_bytes: int = DEFAULT_TARGET_FILE_SIZE
    fragment_ratio: int = 8
    min_target_size_ratio: float = 0.75
    min_input_files: int = 5
    max_group_bytes: int = 10 * 1024 * MiB
    enabled: bool = True
    # merge-on-read (planning/planner.py): a data file with at least this many delete files
    # applying is rewritten (Iceberg's rewrite_data_files delete-file-threshold)
    delete_file_threshold: int = 5
    # a partition whose deleted-row ratio reaches this has its files with deletes rewritten
    delete_ratio_threshold: float = 0.2
    # cheaper tiers: this many partition-scoped equality-delete files make a conversion to
    # position deletes worth it; this many small position-delete files, combining them
    equality_delete_file_threshold: int = 3
    position_delete_file_threshold: int = 5
    # maintenance tiers (issue 20); None / empty: the tier is off (or, for max_file_size_bytes,
    # its default of SPLIT_DEFAULT_RATIO x target)
    full_trigger_interval_ms: int | None = None  # full optimizing: a partition rewritten whole this often
    max_file_size_bytes: int | None = None  # a data file larger than this is split into target-size files
    zorder_columns: tuple[str, ...] = ()  # clustering: z-order over these columns (else the table's sort order)
    # clustering (kind cluster): a healthy partition whose files' bounds boxes overlap this much
    # (planning/overlap.py: other files each file's box meets, on average) is rewritten clustered
    cluster_min_overlap: float = 4.0
    sort_memory_bytes: int = DEFAULT_SORT_MEMORY  # a sorted rewrite spills to local disk beyond this
    expire_field: str | None = None  # data expiration: rows whose value of this column is older than
    expire_retention_ms: int | None = None  # now - retention are dropped
    # manifest rewrite (planning/manifests.py): due when at least this many data and delete
    # manifests are smaller than manifest_target_size_bytes (Iceberg's commit.manifest.target-size-bytes)
    rewrite_manifests_min_count: int = 100
    manifest_target_size_bytes: int = DEFAULT_MANIFEST_TARGET_SIZE
    rewrite_old_specs: bool = True  # files of an earlier partition spec are rewritten into the current one

    @property
    def split_above_bytes(self) -> int:
        """A data file larger than this is oversized (compaction.max-file-size-bytes)."""
        return self.max_file_size_bytes or int(self.target_file_size_bytes * SPLIT_DEFAULT_RATIO)

    @property
    def fragment_max_bytes(self) -> int:
        """A file of at most this size is a fragment."""
        return self.target_file_size_bytes // self.fragment_ratio

    @property
    def undersized_below_bytes(self) -> int:
        """A file smaller than this is undersized."""
        return int(self.target_file_size_bytes * self.min_target_size_ratio)


def _parse_columns(value: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in value.split(",") if c.strip())


def _parse_bool(value: str) -> bool:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError("expected true or false")


# Iceberg table property -> (Policy field, parser). Other engines' users tune a table with these.
TABLE_PROPERTIES = {
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


def resolve_policy(table_name: str, configured: PolicyConfig, table_properties: Mapping[str, str]) -> Policy:
    """Merge the layers; invalid table properties raise a ConfigError naming table and property."""
    policy = Policy()
    if target := table_properties.get(ICEBERG_TARGET_SIZE_PROPERTY):
        policy = replace(policy, target_file_size_bytes=_parse(table_name, ICEBERG_TARGET_SIZE_PROPERTY, target, int))
    configured_values = {k: v for k, v in configured.model_dump().items() if v is not None}
    if "zorder_columns" in configured_values:
        configured_values["zorder_columns"] = tuple(configured_values["zorder_columns"])
    policy = replace(policy, **configured_values)
    for prop, (field_name, parse) in TABLE_PROPERTIES.items():
        if prop in table_properties:
            policy = replace(policy, **{field_name: _parse(table_name, prop, table_properties[prop], parse)})
    _validate(table_name, policy)
    return policy


def _parse(table_name: str, prop: str, raw: str, parse) -> object:
    try:
        return parse(raw)
    except ValueError as exc:
        raise ConfigError(f"table '{table_name}': property {prop}={raw!r} is invalid: {exc}") from None


def _validate(table_name: str, policy: Policy) -> None:
    problems = [
        f"{f.name} must be positive" for f in fields(policy) if f.type == "int" and getattr(policy, f.name) <= 0
    ]
    if not 0 < policy.min_target_size_ratio <= 1:
        problems.append("min_target_size_ratio must be in (0, 1]")
    if not policy.cluster_min_overlap > 0:
        problems.append("cluster_min_overlap must be positive")
    if not 0 < policy.delete_ratio_threshold <= 1:
        problems.append("delete_ratio_threshold must be in (0, 1]")
    if policy.position_delete_file_threshold < 2:
        problems.append("position_delete_file_threshold must be at least 2")
    if policy.rewrite_manifests_min_count < 2:
        problems.append("rewrite_manifests_min_count must be at least 2")
    if policy.min_input_files < 2:
        problems.append("min_input_files must be at least 2")
    if policy.max_group_bytes < policy.target_file_size_bytes:
        problems.append("max_group_bytes must be at least target_file_size_bytes")
    for name in ("full_trigger_interval_ms", "expire_retention_ms"):
        if (value := getattr(policy, name)) is not None and value <= 0:
            problems.append(f"{name} must be positive")
    if policy.max_file_size_bytes is not None and policy.max_file_size_bytes <= policy.target_file_size_bytes:
        problems.append("max_file_size_bytes must be larger than target_file_size_bytes")
    if (policy.expire_field is None) != (policy.expire_retention_ms is None):
        problems.append("expire_field and expire_retention_ms go together (data expiration needs both)")
    if problems:
        raise ConfigError(f"table '{table_name}': invalid compaction policy {policy}: {'; '.join(problems)}")
