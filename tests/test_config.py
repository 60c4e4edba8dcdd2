"""compaction.yaml validation and per-table policy resolution."""

from pathlib import Path

import pytest
import yaml

from compaction_assets.config import PolicyConfig, load_config
from compaction_assets.errors import ConfigError
from compaction_assets.planning.policy import DEFAULT_TARGET_FILE_SIZE, resolve_policy

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "compaction.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_repo_default_config_loads_and_resolves_paths():
    cfg = load_config(REPO / "compaction.yaml")
    assert cfg.catalog.properties["uri"] == f"sqlite:///{REPO / '.lake' / 'catalog.db'}"
    assert cfg.catalog.properties["warehouse"] == f"file://{REPO / '.lake' / 'warehouse'}"
    assert cfg.state_uri == f"sqlite:///{REPO / '.lake' / 'compaction_state.db'}"
    assert cfg.rule_for("sales.orders").queue == "high"
    assert cfg.rule_for("demo.events").queue == "default"


def test_config_path_comes_from_environment(tmp_path, monkeypatch):
    path = write(tmp_path, {"queues": [{"name": "q1"}], "tables": [{"match": "a.*", "queue": "q1"}]})
    monkeypatch.setenv("COMPACTION_CONFIG", str(path))
    cfg = load_config()
    assert cfg.source == str(path)
    assert cfg.rule_for("a.b").queue == "q1"
    assert cfg.rule_for("other.b") is None


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        ({"catalogue": {}}, ["catalogue", "unknown key"]),
        ({"tables": [{"match": "*", "polcy": {}}]}, ["tables.0.polcy", "unknown key"]),
        ({"tables": [{"match": "*", "policy": {"target_file_size_bytes": -5}}]}, ["target_file_size_bytes"]),
        ({"tables": [{"match": "*", "priority": "high"}]}, ["tables.0.priority"]),
        ({"spark": {"mode": "cluster"}}, ["spark.mode"]),
        ({"tables": [{"match": "*", "queue": "nope"}]}, ["tables.0.queue", "'nope' is not declared"]),
        ({"queues": [{"name": "a", "capacity": 0}]}, ["queues.0.capacity"]),
    ],
)
def test_invalid_config_names_the_key_and_the_file(tmp_path, doc, names):
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message
    for name in names:
        assert name in message


def test_missing_file_and_bad_yaml_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tables: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_policy_layers_defaults_file_then_table_properties():
    assert resolve_policy("t", PolicyConfig(), {}).target_file_size_bytes == DEFAULT_TARGET_FILE_SIZE
    from_iceberg = resolve_policy("t", PolicyConfig(), {"write.target-file-size-bytes": "1000"})
    assert from_iceberg.target_file_size_bytes == 1000
    from_file = resolve_policy("t", PolicyConfig(target_file_size_bytes=2000, min_input_files=7), {})
    assert (from_file.target_file_size_bytes, from_file.min_input_files) == (2000, 7)
    props = {"compaction.target-file-size-bytes": "3000", "compaction.enabled": "false"}
    from_props = resolve_policy("t", PolicyConfig(target_file_size_bytes=2000), props)
    assert from_props.target_file_size_bytes == 3000
    assert from_props.enabled is False
    assert from_props.fragment_max_bytes == 375


@pytest.mark.parametrize(
    "props",
    [
        {"compaction.min-input-files": "many"},
        {"compaction.enabled": "perhaps"},
        {"compaction.min-input-files": "1"},
        {"compaction.target-file-size-bytes": "0"},
    ],
)
def test_invalid_table_property_names_table_and_property(props):
    with pytest.raises(ConfigError) as err:
        resolve_policy("ns.tbl", PolicyConfig(), props)
    assert "ns.tbl" in str(err.value)


def test_environment_variables_expand_and_unset_ones_are_named(tmp_path, monkeypatch):
    uri = "postgresql+psycopg://${PGUSER}:${PGPASSWORD}@${PGHOST}/lake"
    path = write(
        tmp_path, {"catalog": {"name": "lake", "properties": {"type": "sql", "uri": uri}}, "state": {"uri": uri}}
    )
    monkeypatch.setenv("PGUSER", "svc")
    monkeypatch.setenv("PGPASSWORD", "s3cret")
    monkeypatch.setenv("PGHOST", "db.internal")
    cfg = load_config(path)
    assert cfg.catalog.properties["uri"] == "postgresql+psycopg://svc:s3cret@db.internal/lake"
    assert cfg.state_uri == cfg.catalog.properties["uri"]
    monkeypatch.delenv("PGPASSWORD")
    with pytest.raises(ConfigError, match="catalog.properties.uri: environment variable PGPASSWORD is not set"):
        load_config(path)
