"""A table's effective compaction policy: defaults < compaction.yaml entry < Iceberg table properties."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

from compaction_assets.config import PolicyConfig
from compaction_assets.errors import ConfigError
from compaction_assets.lake.properties import ENABLED_PROPERTY as ENABLED_PROPERTY  # engine and GC import it here
from compaction_assets.lake.properties import ICEBERG_TARGET_SIZE_PROPERTY, TABLE_PROPERTIES

T = TypeVar("T")

MiB = 1024 * 1024
DEFAULT_TARGET_FILE_SIZE = 128 * MiB
DEFAULT_MANIFEST_TARGET_SIZE = 8 * MiB  # Iceberg's default for ICEBERG_MANIFEST_TARGET_PROPERTY
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
            # the field is named at run time: its parser gives its type, _validate checks the values
            change: dict[str, Any] = {field_name: _parse(table_name, prop, table_properties[prop], parse)}
            policy = replace(policy, **change)
    _validate(table_name, policy)
    return policy


def _parse(table_name: str, prop: str, raw: str, parse: Callable[[str], T]) -> T:
    try:
        return parse(raw)
    except ValueError as exc:
        raise ConfigError(f"table '{table_name}': property {prop}={raw!r} is invalid: {exc}") from None


# What a valid policy satisfies besides positive int fields, each with what it says when not.
_RULES: tuple[tuple[Callable[[Policy], bool], str], ...] = (
    (lambda p: 0 < p.min_target_size_ratio <= 1, "min_target_size_ratio must be in (0, 1]"),
    (lambda p: p.cluster_min_overlap > 0, "cluster_min_overlap must be positive"),
    (lambda p: 0 < p.delete_ratio_threshold <= 1, "delete_ratio_threshold must be in (0, 1]"),
    (lambda p: p.position_delete_file_threshold >= 2, "position_delete_file_threshold must be at least 2"),
    (lambda p: p.rewrite_manifests_min_count >= 2, "rewrite_manifests_min_count must be at least 2"),
    (lambda p: p.min_input_files >= 2, "min_input_files must be at least 2"),
    (
        lambda p: p.max_group_bytes >= p.target_file_size_bytes,
        "max_group_bytes must be at least target_file_size_bytes",
    ),
    (
        lambda p: p.full_trigger_interval_ms is None or p.full_trigger_interval_ms > 0,
        "full_trigger_interval_ms must be positive",
    ),
    (lambda p: p.expire_retention_ms is None or p.expire_retention_ms > 0, "expire_retention_ms must be positive"),
    (
        lambda p: p.max_file_size_bytes is None or p.max_file_size_bytes > p.target_file_size_bytes,
        "max_file_size_bytes must be larger than target_file_size_bytes",
    ),
    (
        lambda p: (p.expire_field is None) == (p.expire_retention_ms is None),
        "expire_field and expire_retention_ms go together (data expiration needs both)",
    ),
)


def _validate(table_name: str, policy: Policy) -> None:
    problems = [
        f"{f.name} must be positive" for f in fields(policy) if f.type == "int" and getattr(policy, f.name) <= 0
    ]
    problems += [message for holds, message in _RULES if not holds(policy)]
    if problems:
        raise ConfigError(f"table '{table_name}': invalid compaction policy {policy}: {'; '.join(problems)}")
