"""Load and validate compaction.yaml.

The file says which catalog to manage, where the task ledger lives, how to reach Spark, which
queues exist and which tables map to them with which policy. Every mistake (unknown key, wrong
type, negative size, undeclared queue) is reported with the key's path and the file's name.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from compaction_assets import redact
from compaction_assets.errors import ConfigError

CONFIG_ENV = "COMPACTION_CONFIG"
# Overrides spark.remote (`serve --spark-port` sets it for the processes it starts)
SPARK_REMOTE_ENV = "COMPACTION_SPARK_REMOTE"
DEFAULT_CONFIG_NAME = "compaction.yaml"

PositiveInt = Annotated[int, Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PolicyConfig(_Strict):
    """Per-table thresholds (Amoro-style, Iceberg names). Unset fields fall back to defaults."""

    target_file_size_bytes: PositiveInt | None = None
    fragment_ratio: PositiveInt | None = None
    min_target_size_ratio: Annotated[float, Field(gt=0, le=1)] | None = None
    min_input_files: Annotated[int, Field(ge=2)] | None = None
    max_group_bytes: PositiveInt | None = None
    # merge-on-read triggers (planning/planner.py); table properties compaction.<dashed-name> win
    delete_file_threshold: PositiveInt | None = None
    delete_ratio_threshold: Annotated[float, Field(gt=0, le=1)] | None = None
    equality_delete_file_threshold: PositiveInt | None = None
    position_delete_file_threshold: Annotated[int, Field(ge=2)] | None = None
    # maintenance tiers (planning/policy.py); table properties compaction.<name> win
    full_trigger_interval_ms: PositiveInt | None = None
    max_file_size_bytes: PositiveInt | None = None
    zorder_columns: list[str] | None = None
    cluster_min_overlap: Annotated[float, Field(gt=0)] | None = None
    sort_memory_bytes: PositiveInt | None = None
    expire_field: str | None = None
    expire_retention_ms: PositiveInt | None = None
    rewrite_manifests_min_count: Annotated[int, Field(ge=2)] | None = None
    rewrite_old_specs: bool | None = None


class CatalogConfig(_Strict):
    name: str = "lake"
    properties: dict[str, str] = Field(default_factory=dict)


class StateConfig(_Strict):
    uri: str | None = None
    # An open attempt whose heartbeat is older than this is dead (its process or host is gone).
    executing_timeout_seconds: PositiveInt = 60
    heartbeat_seconds: Annotated[float, Field(gt=0)] = 10


class SparkConfig(_Strict):
    mode: Literal["local", "connect"] = "local"
    master: str = "local[*]"
    remote: str = "sc://localhost:15002"
    conf: dict[str, str] = Field(default_factory=dict)
    server_dir: str = ".spark-connect"  # pid and log files of `compaction-assets spark-server`
    # groups Polars rewrites (small files; it uses all of a worker's cores) share Spark tasks of
    # up to this many input bytes, run one after the other; see execution/packing
    task_bytes: PositiveInt = 1024**3


class SchedulingConfig(_Strict):
    sensor_interval_seconds: PositiveInt = 30
    recovery_interval_seconds: PositiveInt = 60
    ageing_points_per_minute: Annotated[float, Field(ge=0)] = 1.0
    # a run compacts a range of up to this many of a table's partitions, in one Spark job and
    # one commit, each still its own materialisation and check result (1: a run per partition)
    max_partitions_per_run: PositiveInt = 500


class GcConfig(_Strict):
    """Defaults; a table's Iceberg properties history.expire.* and compaction.gc.* win."""

    max_snapshot_age_hours: Annotated[float, Field(ge=0)] = 120  # Iceberg's default: 5 days
    min_snapshots_to_keep: PositiveInt = 1
    orphan_grace_hours: Annotated[float, Field(ge=0)] = 72


class QueueConfig(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]
    max_concurrent_runs: PositiveInt = 1
    capacity: PositiveInt = 100


class TableRule(_Strict):
    match: str
    queue: str = "default"
    priority: int = 0
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    upstream: list[str] = Field(default_factory=list)


class CompactionConfig(_Strict):
    catalog: CatalogConfig = Field(default_factory=CatalogConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    gc: GcConfig = Field(default_factory=GcConfig)
    queues: list[QueueConfig] = Field(default_factory=lambda: [QueueConfig(name="default")])
    tables: list[TableRule] = Field(default_factory=lambda: [TableRule(match="*")])
    source: str = Field(default="<defaults>", exclude=True)

    @model_validator(mode="after")
    def _across_sections(self) -> CompactionConfig:
        if problems := cross_section_problems(self.model_dump()):
            raise ValueError("\n  ".join(problems))
        return self

    def rule_for(self, table_name: str) -> TableRule | None:
        """The first `tables:` rule whose pattern matches "namespace.table", or None (unmanaged)."""
        return next((r for r in self.tables if fnmatch.fnmatchcase(table_name, r.match)), None)

    def managed_rule(self, table_name: str) -> TableRule:
        """The rule of a table listed as managed (one a rule matches); ConfigError if none does."""
        if (rule := self.rule_for(table_name)) is None:
            raise ConfigError(f"{self.source}: {table_name}: no `tables:` rule matches it")
        return rule

    def queue(self, name: str) -> QueueConfig:
        return next(q for q in self.queues if q.name == name)

    @property
    def state_uri(self) -> str:
        """The ledger's SQLAlchemy URI; by default a SQLite file beside a SQLite catalog."""
        if self.state.uri:
            return self.state.uri
        catalog_uri = self.catalog.properties.get("uri", "")
        if catalog_uri.startswith("sqlite:///"):
            folder = Path(catalog_uri.removeprefix("sqlite:///")).parent
            return f"sqlite:///{folder / 'compaction_state.db'}"
        raise ConfigError(f"{self.source}: state.uri is required when the catalog is not a SQLite SQL catalog")


def config_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The config file to use: an explicit path, else $COMPACTION_CONFIG, else ./compaction.yaml."""
    return Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_NAME).resolve()


def load_config(path: str | os.PathLike[str] | None = None) -> CompactionConfig:
    """Read, resolve relative paths in, and validate a compaction.yaml."""
    file = config_path(path)
    try:
        raw = yaml.safe_load(file.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{file}: config file not found (set {CONFIG_ENV} or pass --config)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: the top level must be a mapping, got {type(raw).__name__}")
    config = parse_config(raw, base_dir=file.parent, source=str(file))
    if remote := os.environ.get(SPARK_REMOTE_ENV):
        config = config.model_copy(update={"spark": config.spark.model_copy(update={"remote": remote})})
    return config


def parse_config(raw: dict[str, Any], base_dir: Path, source: str = "<inline>") -> CompactionConfig:
    """Validate a config mapping; `${VAR}` expands from the environment; relative paths resolve
    against `base_dir`."""
    expanded: set[tuple] = set()
    raw = _expand_env(raw, source, (), expanded)
    try:
        cfg = CompactionConfig.model_validate({**raw, "source": source})
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source, expanded, cross_section_problems(raw))) from None
    for key, value in [*cfg.catalog.properties.items(), ("uri", cfg.state.uri), *cfg.spark.conf.items()]:
        redact.register(key, value)
    catalog_props = {k: _resolve_path_value(k, v, base_dir) for k, v in cfg.catalog.properties.items()}
    state_uri = _resolve_path_value("uri", cfg.state.uri, base_dir) if cfg.state.uri else None
    server_dir = str((base_dir / cfg.spark.server_dir).resolve())
    return cfg.model_copy(
        update={
            "catalog": cfg.catalog.model_copy(update={"properties": catalog_props}),
            "state": cfg.state.model_copy(update={"uri": state_uri}),
            "spark": cfg.spark.model_copy(update={"server_dir": server_dir}),
        }
    )


def cross_section_problems(raw: dict[str, Any]) -> list[str]:
    """Mistakes across sections (an undeclared or duplicate queue, a heartbeat too slow for its
    timeout), read from the raw mapping: reported with the field errors, not in a second pass."""
    problems = []
    raw_state = raw.get("state")
    state: dict[str, Any] = raw_state if isinstance(raw_state, dict) else {}
    fields = StateConfig.model_fields
    beat = state.get("heartbeat_seconds", fields["heartbeat_seconds"].default)
    timeout = state.get("executing_timeout_seconds", fields["executing_timeout_seconds"].default)
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in (beat, timeout)) and beat * 3 > timeout:
        problems.append("state.heartbeat_seconds: must be at most a third of state.executing_timeout_seconds")
    queues = raw.get("queues", [{"name": "default"}])
    if not isinstance(queues, list):
        return problems
    names = [q["name"] for q in queues if isinstance(q, dict) and isinstance(q.get("name"), str)]
    if len(set(names)) != len(names):
        problems.append(f"queues: duplicate queue names in {names}")
    tables = raw.get("tables", [{"match": "*"}])
    for i, rule in enumerate(tables if isinstance(tables, list) else []):
        queue = rule.get("queue", "default") if isinstance(rule, dict) else None
        if isinstance(queue, str) and queue not in names:
            problems.append(f"tables.{i}.queue: queue '{queue}' is not declared under queues ({names})")
    return problems


def _format_validation_error(exc: ValidationError, source: str, expanded: set[tuple], also: list[str]) -> str:
    """One line per mistake naming its key (and the mistakes `also` found across sections); the
    offending value only when it cannot be a secret."""
    lines = [f"{source}: invalid compaction config"]
    for err in exc.errors():
        loc = tuple(err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if not loc:  # a whole-config check: its message names the keys
            lines.append(f"  {msg}")
        elif err["type"] == "extra_forbidden":
            lines.append(f"  {'.'.join(map(str, loc))}: unknown key")
        else:
            lines.append(f"  {'.'.join(map(str, loc))}: {msg}{_shown_input(loc, err.get('input'), expanded)}")
    lines += [f"  {p}" for p in also if f"  {p}" not in "\n".join(lines).split("\n")]
    return "\n".join(lines)


def _shown_input(loc: tuple, value: Any, expanded: set[tuple]) -> str:
    """' (got VALUE)' for a plain scalar typed in the file; nothing for credentials, `${VAR}`
    values and whole sections (which may hold either)."""
    from_env = any(loc[: len(p)] == p for p in expanded)
    secret = any(redact.is_secret_key(str(part)) for part in loc)
    if from_env or secret or isinstance(value, dict | list):
        return ""
    return f" (got {value!r})"


_ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand_env(value: Any, source: str, path: tuple, expanded: set[tuple]) -> Any:
    """Replace ${NAME} in strings with the environment's value; an unset variable is an error.
    Adds the path of every string that had a variable to `expanded`."""
    if isinstance(value, dict):
        return {k: _expand_env(v, source, (*path, k), expanded) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, source, (*path, i), expanded) for i, v in enumerate(value)]
    if not isinstance(value, str) or not _ENV_VAR.search(value):
        return value
    expanded.add(path)

    def lookup(match: re.Match) -> str:
        name = match.group(1)
        if name not in os.environ:
            key = ".".join(str(p) for p in path)
            raise ConfigError(f"{source}: {key}: environment variable {name} is not set")
        if redact.is_secret_variable(name):
            redact.register_value(os.environ[name])
        return os.environ[name]

    return _ENV_VAR.sub(lookup, value)


_SQLITE = re.compile(r"^(sqlite(?:\+\w+)?:///)(?!/)(.+)$")


def _resolve_path_value(key: str, value: str, base_dir: Path) -> str:
    """Make relative sqlite URIs and local warehouse paths absolute against the config's folder."""
    if m := _SQLITE.match(value):
        return f"{m.group(1)}{(base_dir / m.group(2)).resolve()}"
    if key == "warehouse":
        if value.startswith("file://") and not value.startswith("file:///"):
            return f"file://{(base_dir / value.removeprefix('file://')).resolve()}"
        if value.startswith("file:") and not value.startswith("file:/"):
            return f"file://{(base_dir / value.removeprefix('file:')).resolve()}"
        if "://" not in value:
            return f"file://{(base_dir / value).resolve()}"
    return value
