"""Partition keys are injective and Dagster takes every one of them; partition values survive the
ledger's JSON exactly. Pure functions over real pyiceberg specs, and a real Dagster instance."""

import datetime as dt
import json
import math
import uuid
from decimal import Decimal
from urllib.parse import unquote_plus

from dagster import AssetExecutionContext, DagsterInstance, DynamicPartitionsDefinition, asset, materialize
from dagster._core.definitions.partitions.utils.base import INVALID_PARTITION_SUBSTRINGS
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DateType, DoubleType, LongType, NestedField, StringType, TimestampType

from compaction_assets.lake.datafile_codec import decode_partition, encode_partition
from compaction_assets.lake.partition_key import NULL_TOKEN, partition_id, render_partition

SCHEMA = Schema(
    NestedField(1, "region", StringType(), required=False),
    NestedField(2, "n", LongType(), required=False),
    NestedField(3, "x", DoubleType(), required=False),
    NestedField(4, "ts", TimestampType(), required=False),
    NestedField(5, "d", DateType(), required=False),
)
REGION, N, X = (
    PartitionField(i, 999 + i, IdentityTransform(), name) for i, name in ((1, "region"), (2, "n"), (3, "x"))
)
# Two specs whose tuples render alike (same field names); spec 1 is the table's current one.
SPECS = {0: PartitionSpec(REGION, N, X, spec_id=0), 1: PartitionSpec(REGION, N, X, spec_id=1)}
CURRENT = 1

TRICKY = ["null", "", NULL_TOKEN, "%5F_HIVE_DEFAULT_PARTITION__", "...", "a...b", "%2E%2E%2E", "nan", "a/b=c"]
TRICKY += ["50%", "%25", "+", " ", "a b", "é", "日本", "x\x00y", "\n", "spec-0:region=eu", "region=eu"]
strings = st.one_of(st.none(), st.sampled_from(TRICKY), st.text(max_size=8))
longs = st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1))
doubles = st.one_of(st.none(), st.sampled_from([0.0, -0.0, math.nan, -math.nan, math.inf]), st.floats())
partitions = st.tuples(st.sampled_from([0, 1]), strings, longs, doubles)


def key(spec_id: int, *values) -> str:
    return render_partition(SPECS[spec_id], SCHEMA, Record(*values), CURRENT)


@settings(max_examples=300, deadline=None)
@given(st.lists(partitions, min_size=2, max_size=40))
def test_distinct_typed_partitions_get_distinct_keys(tuples):
    """Injective: as many keys as partition ids (-0.0 and 0.0 are two, every NaN is one)."""
    keys: dict = {}
    for spec_id, *values in tuples:
        keys.setdefault(partition_id(spec_id, Record(*values)), set()).add(key(spec_id, *values))
    assert all(len(k) == 1 for k in keys.values())  # a function of the partition
    assert len({k for ks in keys.values() for k in ks}) == len(keys)  # one-to-one


@settings(max_examples=300, deadline=None)
@given(partitions)
def test_keys_decode_to_the_human_strings_and_dagster_takes_them(partition):
    spec_id, region, n, x = partition
    rendered = key(spec_id, region, n, x)
    assert not [s for s in INVALID_PARTITION_SUBSTRINGS if s in rendered]
    path = rendered.removeprefix("spec-0:")
    assert (path != rendered) == (spec_id != CURRENT)
    parts = dict(unquote_plus(p).split("=", 1) for p in path.split("/"))
    assert parts["region"] == (NULL_TOKEN if region is None else region)
    assert parts["n"] == (NULL_TOKEN if n is None else str(n))
    assert parts["x"] == (NULL_TOKEN if x is None else str(x))


def test_keys_of_ordinary_values_stay_pyiceberg_partition_paths():
    spec = PartitionSpec(PartitionField(4, 1000, DayTransform(), "ts_day"), REGION, spec_id=0)
    for values in ((19723, "eu"), (0, "us-east 1/a"), (19723, "a.b")):
        assert render_partition(spec, SCHEMA, Record(*values), 0) == spec.partition_to_path(Record(*values), SCHEMA)
    assert render_partition(spec, SCHEMA, Record(19723, "eu"), 0) == "ts_day=2024-01-01/region=eu"
    assert key(CURRENT, "null", 1, 0.5) == "region=null/n=1/x=0.5"
    assert key(CURRENT, None, None, None) == f"region={NULL_TOKEN}/n={NULL_TOKEN}/x={NULL_TOKEN}"
    assert key(CURRENT, "", -1, -0.0) == "region=/n=-1/x=-0.0"
    assert render_partition(PartitionSpec(spec_id=0), SCHEMA, Record(), 0) == ""


def test_dagster_accepts_every_key_as_a_dynamic_partition_and_runs_it():
    rows = [(s, None, None) for s in [None, *TRICKY]] + [("eu", 7, x) for x in (math.nan, -0.0, 0.0, math.inf)]
    keys = [key(spec_id, *values) for values in rows for spec_id in (0, 1)]
    keys.append(render_partition(PartitionSpec(spec_id=0), SCHEMA, Record(), CURRENT))  # an old unpartitioned spec
    assert len(set(keys)) == len(keys)
    partitions = DynamicPartitionsDefinition(name="lake__ns__t")
    seen = []

    @asset(partitions_def=partitions)
    def t(context: AssetExecutionContext) -> None:
        seen.append(context.partition_key)

    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("lake__ns__t", keys)
    assert sorted(instance.get_dynamic_partitions("lake__ns__t")) == sorted(keys)
    for k in keys:
        assert materialize([t], partition_key=k, instance=instance).success
    assert seen == keys


def test_partition_values_round_trip_the_ledger_json_exactly():
    values = [None, "null", "", NULL_TOKEN, math.nan, -0.0, 0.0, math.inf, -math.inf, 1.5, True, 0, 2**62]
    values += [Decimal("1.10"), Decimal("-0.00"), b"\x00\xff", b"", uuid.UUID(int=7), dt.date(2024, 1, 1)]
    values += [dt.datetime(2024, 1, 1, 12, 0, 0, 1), dt.time(23, 59, 59, 999999)]
    record = Record(*values)

    raw = json.dumps(encode_partition(record), allow_nan=False)  # strict JSON: PostgreSQL's json takes it
    back = decode_partition(json.loads(raw))

    assert partition_id(0, back) == partition_id(0, record)
    for before, after in zip(values, (back[i] for i in range(len(back))), strict=True):
        assert type(after) is type(before)
        assert repr(after) == repr(before)  # "null" vs None, -0.0 vs 0.0, Decimal scale
