"""The contract of the compatibility layers with the pyiceberg and Dagster installed.

compaction_assets/iceberg_compat/ owns every pyiceberg private name the package uses, and
compaction_assets/dagster_host/dagster_internals.py every Dagster one. These tests fail, naming
the symbol, when an upgrade moves what the layers lean on: the version outside the range they were
written against, a private name gone or its signature changed, a hook the layer routes no longer
on its pyiceberg base class, private state no longer where it is read, a producer of ours
shadowing a pyiceberg name, or a private name used outside the two layers.
"""

from __future__ import annotations

import ast
import inspect
import tomllib
from pathlib import Path

import dagster
import pyarrow as pa
import pyiceberg
import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile, ManifestListWriter, ManifestWriterV2
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles, _OverwriteFiles, _SnapshotProducer
from pyiceberg.types import LongType, NestedField
from pyiceberg.utils.lazydict import LazyDict

from compaction_assets.commit.manifest_rewrite import _RewriteManifests
from compaction_assets.commit.rewrite_producer import RewriteFiles
from compaction_assets.dagster_host import dagster_internals
from compaction_assets.dagster_host.launcher import WarmRunLauncher
from compaction_assets.iceberg_compat import TESTED_PYICEBERG, manifest_writers, producers
from compaction_assets.iceberg_compat.producers import (
    AppendProducer,
    OverwriteProducer,
    ProducerHooks,
    SnapshotProducer,
)
from compaction_assets.lake.delete_files import _AddDeleteFiles, _DeleteManifestWriter
from compaction_assets.lake.format_v3 import ManifestListWriterV3, ManifestWriterV3
from compaction_tools.bench.plan_at_scale import _ManifestPerBatch

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "compaction_assets"
PYICEBERG_LAYER = PACKAGE / "iceberg_compat"
DAGSTER_LAYER = PACKAGE / "dagster_host" / "dagster_internals.py"

# (object, parameters the layer passes by name, in order where it passes them by position)
PRIVATE_SIGNATURES = [
    (
        "pyiceberg.io.pyarrow._to_requested_schema",
        [
            "requested_schema",
            "file_schema",
            "batch",
            "downcast_ns_timestamp_to_us",
            "include_field_ids",
            "projected_missing_fields",
            "allow_timestamp_tz_mismatch",
            "format_model",
        ],
    ),
    ("pyiceberg.io.pyarrow._dataframe_to_data_files", ["table_metadata", "df", "io", "write_uuid", "counter"]),
    (
        "pyiceberg.io.pyarrow.ArrowScan._record_batches_from_scan_tasks_and_deletes",
        ["self", "tasks", "deletes_per_file"],
    ),
    ("pyiceberg.manifest._inherit_from_manifest", ["entry", "manifest"]),
    ("pyiceberg.table.update.snapshot._new_manifest_list_file_name", ["snapshot_id", "attempt", "commit_uuid"]),
    (
        "pyiceberg.table.update.snapshot._ManifestMergeManager.__init__",
        ["self", "target_size_bytes", "min_count_to_merge", "merge_enabled", "snapshot_producer"],
    ),
    ("pyiceberg.table.update.snapshot._ManifestMergeManager.merge_manifests", ["self", "manifests"]),
    (
        "pyiceberg.table.update.snapshot._SnapshotProducer.__init__",
        ["self", "operation", "transaction", "io", "commit_uuid", "snapshot_properties", "branch"],
    ),
    ("pyiceberg.manifest.ManifestWriter._with_partition", ["self", "format_version"]),
]
DAGSTER_SIGNATURES = [
    (dagster_internals.core_execute_run, ["recon_job", "dagster_run", "instance", "inject_env_vars"]),
    (dagster_internals.recon_job_from_origin, ["origin"]),
    (dagster_internals.get_workspace_from_cli_opts, ["instance", "version", "workspace_opts"]),
    (dagster_internals.get_code_location_from_workspace, ["workspace", "code_location_name"]),
    (dagster_internals.get_remote_repository_from_code_location, ["code_location", "provided_repo_name"]),
    (dagster_internals.EngineEventData.in_process, ["pid"]),
]
OUR_PRODUCERS = [  # ours, its pyiceberg base, the layer's class between them
    (RewriteFiles, _OverwriteFiles, OverwriteProducer),
    (_RewriteManifests, _SnapshotProducer, SnapshotProducer),
    (_AddDeleteFiles, _FastAppendFiles, AppendProducer),
    (_ManifestPerBatch, _FastAppendFiles, AppendProducer),
]


def _resolve(dotted: str) -> object:
    module, _, rest = dotted.partition(".")
    obj = __import__(module)
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _pin(name: str) -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [spec] = [r for r in map(Requirement, project["dependencies"]) if r.name == name]
    return spec


@pytest.mark.parametrize(
    ("package", "installed", "tested"),
    [
        ("pyiceberg", pyiceberg.__version__, TESTED_PYICEBERG),
        ("dagster", dagster.__version__, dagster_internals.TESTED_DAGSTER),
    ],
)
def test_the_installed_version_is_one_the_layer_was_written_against_and_the_pin_allows_no_other(
    package: str, installed: str, tested: tuple[str, ...]
) -> None:
    assert _minor(installed) in tested, f"{package} {installed}: the compatibility layer was checked on {tested}"
    spec = _pin(package).specifier
    assert Version(installed) in spec
    newest = Version(max(tested, key=Version))
    assert Version(f"{newest.major}.{newest.minor + 1}.0") not in spec, f"{package}'s pin admits an unseen minor"


@pytest.mark.parametrize(("dotted", "parameters"), PRIVATE_SIGNATURES, ids=[d for d, _ in PRIVATE_SIGNATURES])
def test_each_pyiceberg_private_name_exists_with_the_signature_the_layer_calls(dotted: str, parameters: list) -> None:
    found = list(inspect.signature(_resolve(dotted)).parameters)
    assert found[: len(parameters)] == parameters, f"{dotted}{found}"


@pytest.mark.parametrize(("hook", "public"), sorted(producers.HOOKS.items()))
def test_each_routed_hook_is_still_a_hook_of_pyicebergs_producer(hook: str, public: str) -> None:
    base = getattr(_SnapshotProducer, hook, None)
    assert callable(base), f"_SnapshotProducer.{hook} is gone: ProducerHooks routes it to {public}"
    ours = getattr(ProducerHooks, hook)
    assert list(inspect.signature(base).parameters) == list(inspect.signature(ours).parameters), hook
    assert list(inspect.signature(getattr(ProducerHooks, public)).parameters) == list(
        inspect.signature(base).parameters
    ), public


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - a pyiceberg Table
    folder = tmp_path_factory.mktemp("compat")
    catalog = SqlCatalog("compat", uri=f"sqlite:///{folder}/catalog.db", warehouse=f"file://{folder}")
    catalog.create_namespace("ns")
    created = catalog.create_table("ns.t", Schema(NestedField(1, "id", LongType(), required=False)))
    created.append(pa.table({"id": pa.array([1, 2], pa.int64())}))
    return catalog.load_table("ns.t")


@pytest.mark.parametrize("base", [SnapshotProducer, OverwriteProducer, AppendProducer], ids=lambda b: b.__name__)
def test_the_private_state_the_layer_reads_is_set_by_pyicebergs_producer(table, base: type) -> None:  # noqa: ANN001
    producer = base(operation=Operation.APPEND, transaction=table.transaction(), io=table.io)
    for attribute, public in producers.STATE.items():
        assert hasattr(producer, attribute), f"{base.__name__}: pyiceberg no longer sets {attribute} ({public})"
        assert getattr(producer, public) is getattr(producer, attribute)
    assert producer.table_metadata.format_version == table.metadata.format_version
    assert isinstance(producer.snapshot_id, int) and producer.commit_uuid is not None
    assert "partition_filters" not in producer.__dict__
    producer.partition_filters[0]  # noqa: B018 - pyiceberg caches it in the instance: drop_partition_filters forgets it
    assert "partition_filters" in producer.__dict__
    producer.drop_partition_filters()
    assert "partition_filters" not in producer.__dict__


def test_no_public_name_of_the_layer_shadows_a_name_of_pyicebergs_producers() -> None:
    ours = {n for n, v in vars(ProducerHooks).items() if not n.startswith("_")}
    for base in (_SnapshotProducer, _OverwriteFiles, _FastAppendFiles):
        assert not ours & set(dir(base)), f"{base.__name__} now defines {sorted(ours & set(dir(base)))}"


def _self_attributes(cls: type) -> set[str]:
    """The `self._x` attributes a class's own methods assign."""
    names = set()
    for node in ast.walk(ast.parse(inspect.getsource(cls))):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
    return names


@pytest.mark.parametrize(("ours", "base", "layer"), OUR_PRODUCERS, ids=[o.__name__ for o, _, _ in OUR_PRODUCERS])
def test_our_producers_override_only_the_layers_public_hooks_and_shadow_no_pyiceberg_state(
    table,  # noqa: ANN001
    ours: type,
    base: type,
    layer: type,
) -> None:
    assert issubclass(ours, layer) and issubclass(layer, base)
    own = {n for n in vars(ours) if n.startswith("_") and not n.startswith("__") and n != "_abc_impl"}
    assert not own & set(dir(base)), f"{ours.__name__} overrides pyiceberg's {sorted(own & set(dir(base)))} directly"
    plain = layer(operation=Operation.APPEND, transaction=table.transaction(), io=table.io)
    clash = {a for a in _self_attributes(ours) if a.startswith("_")} & set(vars(plain))
    assert not clash, f"{ours.__name__} assigns pyiceberg's own attributes {sorted(clash)}"


def test_the_manifest_writers_hooks_and_state_are_where_the_layer_reads_them(tmp_path: Path, table) -> None:  # noqa: ANN001
    for hook in ("_meta", "_with_partition"):
        assert hook in vars(ManifestWriterV2) or hasattr(ManifestWriterV2, hook), hook
    assert isinstance(inspect.getattr_static(ManifestWriterV2, "_meta"), property)
    output = table.io.new_output(f"file://{tmp_path}/m.avro")
    spec, schema = table.metadata.spec(), table.metadata.schema()
    writer = ManifestWriterV3(spec, schema, output, 1, "null")
    assert writer.output_file is output and writer.file_metadata["content"] == "data"
    assert writer._meta == writer.file_metadata  # pyiceberg reads _meta: it must be the layer's
    assert writer._with_partition(3) == writer.entry_schema(3)
    delete_writer = _DeleteManifestWriter(spec, schema, output, 1, "null")
    assert delete_writer._meta["content"] == "deletes"
    for attribute in ("_writer", "_output_file", "_meta"):
        assert attribute in inspect.getsource(ManifestListWriter), f"ManifestListWriter no longer uses {attribute}"
    assert manifest_writers.MANIFEST_LIST_WRITER_STATE.keys() == {"_writer", "_output_file", "_meta"}
    listing = ManifestListWriterV3(table.io.new_output(f"file://{tmp_path}/l.avro"), 1, None, 1, 0, "null")
    with listing:
        assert listing._writer is not None  # add_manifests writes through it


def test_the_record_schema_and_lazy_dict_internals_read_by_the_metadata_layer() -> None:
    data_file = DataFile.from_args(file_path="f", record_count=1)
    assert isinstance(data_file._data, list) and data_file._data[1] == "f"
    schema = Schema(NestedField(7, "x", LongType(), required=False))
    assert set(schema._lazy_id_to_field.keys()) == {7}
    lazy = LazyDict([[1, 10, 2, 20]])
    assert lazy._contents and getattr(lazy, "_dict", None) is None
    assert dict(lazy) == {1: 10, 2: 20}
    assert inspect.signature(ArrowScan.__init__).parameters.keys() >= {"table_metadata", "io", "projected_schema"}


@pytest.mark.parametrize(("function", "parameters"), DAGSTER_SIGNATURES, ids=lambda x: getattr(x, "__qualname__", ""))
def test_each_dagster_internal_the_run_host_calls_takes_the_arguments_it_passes(function, parameters: list) -> None:  # noqa: ANN001
    found = list(inspect.signature(function).parameters)
    assert all(p in found for p in parameters), f"{function.__qualname__}{found}"


def test_the_dagster_internals_the_launcher_and_bench_lean_on() -> None:
    for name in dagster_internals.__all__:
        assert getattr(dagster_internals, name) is not None, name
    selector = inspect.signature(dagster_internals.JobSubsetSelector).parameters
    assert {"location_name", "repository_name", "job_name", "op_selection", "asset_selection"} <= set(selector)
    coordinator = __import__(dagster_internals.SYNC_RUN_COORDINATOR_MODULE, fromlist=["SyncInMemoryRunCoordinator"])
    assert coordinator.SyncInMemoryRunCoordinator
    assert isinstance(inspect.getattr_static(dagster.DefaultRunLauncher, "_instance"), property)
    assert set(vars(dagster.DefaultRunLauncher())) >= {"_run_ids"}
    overridden = {n for n in vars(WarmRunLauncher) if not n.startswith("__")} - {
        "instance",
        "socket_path",
        "_fall_back",
        "config_type",
        "from_config_value",
    }
    for name in overridden:
        assert hasattr(dagster.DefaultRunLauncher, name), f"WarmRunLauncher.{name} overrides nothing now"
    assert not hasattr(dagster.DefaultRunLauncher, "instance") and not hasattr(dagster.DefaultRunLauncher, "_fall_back")


def _private_imports(path: Path, package: str) -> list[str]:
    """`package` private names a module imports (`from package.x import _y`, `import package._x`,
    `from package._x import y`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package:
            private_module = any(part.startswith("_") for part in node.module.split("."))
            found += [
                f"{node.module}.{a.name}"
                for a in node.names
                if private_module or (a.name.startswith("_") and not a.name.startswith("__"))
            ]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == package and "._" in a.name]
    return found


def test_no_module_outside_the_layers_imports_a_private_name_of_pyiceberg_or_dagster() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if PYICEBERG_LAYER not in path.parents:
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in _private_imports(path, "pyiceberg")]
        if path != DAGSTER_LAYER:
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in _private_imports(path, "dagster")]
    assert not offenders, offenders


def test_the_v3_metadata_serialisation_is_patched_in_and_pyicebergs_own_still_refuses() -> None:
    from pyiceberg.table.metadata import TableMetadataV3

    from compaction_assets.iceberg_compat import table_metadata

    assert TableMetadataV3.model_dump_json is table_metadata.dump_v3_metadata_json
    original = table_metadata.PYICEBERG_DUMP_V3
    source = inspect.getsource(original)
    assert "NotImplementedError" in source, "pyiceberg writes v3 metadata itself now: drop the patch"
