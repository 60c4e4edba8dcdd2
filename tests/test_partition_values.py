"""Every partition value stays exactly itself through compaction (review finding r3): NULL and the
string 'null', '', special characters and floats each keep their own partition, their own key and
their own rows; real tables, real Spark, partition tuples read back from the manifests."""

import math
import struct

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.expressions import EqualTo, IsNull
from pyiceberg.typedef import Record

from compaction_assets.iceberg_compat.arrow import dataframe_to_data_files
from compaction_assets.lake.files import live_files
from compaction_assets.lake.partition_key import NULL_TOKEN
from compaction_tools.demo import append_fragments
from tests.conftest import BY_REGION, SCHEMA, batch

REGIONS = [None, "null", "", NULL_TOKEN, "a/b=c", "50% + x", "é日本", "...", "nan"]
FILES = 6  # per partition, above min_input_files


def _region_batch(start: int, region: str | None) -> pa.Table:
    return batch(start, 20, region).cast(batch(0, 1, "x").schema)  # an all-NULL column stays a string column


def _file_partitions(table) -> list[tuple]:
    """(partition tuple from the manifest, the distinct values its Parquet file holds) per live data file."""
    out = []
    for f in live_files(table):
        with table.io.new_input(f.path).open() as stream:
            values = set(pq.read_table(stream, columns=["region"]).column("region").to_pylist())
        out.append((f.data_file.partition[0], values))
    return out


def test_null_null_string_and_special_values_keep_their_own_partition(lake):
    table = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    append_fragments(table, [_region_batch(1000 * r + 20 * i, v) for r, v in enumerate(REGIONS) for i in range(FILES)])
    table = lake.table("ns.t")
    before = sorted((r["id"], r["region"]) for r in table.scan().to_arrow().to_pylist())

    plans = {p.partition_key: p for p in lake.engine.plan("ns.t").partitions}
    assert len(plans) == len(REGIONS) and all(p.input_files == FILES for p in plans.values())
    null_key = f"region={NULL_TOKEN}"
    assert {"region=null", null_key, "region=", "region=%5F_HIVE_DEFAULT_PARTITION__"} <= plans.keys()

    # one partition by its key (as `compact --partition` and the Dagster asset do): only that one
    [only] = lake.engine.compact("ns.t", partition=null_key)
    assert only.status == "committed" and only.partition_key == null_key
    by_value = {}
    for value, held in _file_partitions(lake.table("ns.t")):
        by_value.setdefault(value, []).append(held)
    assert len(by_value[None]) == 1 and len(by_value["null"]) == FILES

    outcomes = lake.engine.compact("ns.t")
    assert sorted(o.partition_key for o in outcomes if o.status == "committed") == sorted(plans.keys() - {null_key})

    table = lake.table("ns.t")
    assert sorted((r["id"], r["region"]) for r in table.scan().to_arrow().to_pylist()) == before
    files = _file_partitions(table)
    assert sorted(files, key=repr) == sorted(((v, {v}) for v in REGIONS), key=repr)  # one file each, exact
    manifests = table.inspect.files().column("partition").to_pylist()  # pyiceberg's own manifest reader
    assert sorted(manifests, key=repr) == sorted(({"region": v} for v in REGIONS), key=repr)
    assert len(table.scan(row_filter=IsNull("region")).to_arrow()) == 20 * FILES
    for value in REGIONS[1:]:
        assert len(table.scan(row_filter=EqualTo("region", value)).to_arrow()) == 20 * FILES, value


def _append_float_partitions(table, batches: list[tuple[float, pa.Table]]) -> None:
    """Commit each batch as one file whose partition is its amount, as Spark or Flink would write it.
    pyiceberg's own writer cannot: it selects a partition's rows with `== value`, none for NaN. The
    files are written through the table's first spec (unpartitioned), then given spec 1 and their value."""
    unpartitioned = table.metadata.model_copy(update={"default_spec_id": 0})
    with table.transaction() as txn, txn.update_snapshot().fast_append() as append:
        for amount, rows in batches:
            for data_file in dataframe_to_data_files(unpartitioned, rows, table.io):
                data_file[3] = Record(amount)  # DataFile field 3: the partition tuple
                data_file.spec_id = 1
                append.append_data_file(data_file)


def _float_partitioned(lake, name: str, amounts: list[float]):
    table = lake.catalog.create_table(name, schema=SCHEMA)
    with table.update_spec() as update:
        update.add_identity("amount")
    batches = []
    for a, amount in enumerate(amounts):
        for i in range(FILES):
            rows = batch(1000 * a + 20 * i, 20, "eu")
            batches.append((amount, rows.set_column(3, "amount", pa.array([amount] * 20, pa.float64()))))
    _append_float_partitions(lake.table(name), batches)
    return lake.table(name)


def _bits(value: float) -> str:
    return struct.pack(">d", value).hex()


def _compacts_each_float_partition_exactly(lake, name: str, amounts: list[float], keys: list[str]) -> None:
    assert sorted(p.partition_key for p in lake.engine.plan(name).partitions) == keys

    outcomes = lake.engine.compact(name)

    assert sorted(o.partition_key for o in outcomes if o.status == "committed") == keys, outcomes
    table = lake.table(name)
    assert sorted(_bits(f.data_file.partition[0]) for f in live_files(table)) == sorted(map(_bits, amounts))
    by_id = {r["id"]: r["amount"] for r in table.scan().to_arrow().to_pylist()}
    assert len(by_id) == len(amounts) * FILES * 20
    for a, amount in enumerate(amounts):
        assert {_bits(by_id[1000 * a + i]) for i in range(20 * FILES)} == {_bits(amount)}


def test_signed_zero_float_partitions_stay_apart(lake):
    """-0.0 == 0.0 in Python, yet they are two Iceberg partitions (Java's PartitionData uses Double.equals)."""
    amounts = [-0.0, 0.0, 1.5]
    _float_partitioned(lake, "ns.f", amounts)
    _compacts_each_float_partition_exactly(lake, "ns.f", amounts, ["amount=-0.0", "amount=0.0", "amount=1.5"])


def test_nan_float_partition_compacts(lake):
    amounts = [math.nan, 1.5]
    _float_partitioned(lake, "ns.f", amounts)
    _compacts_each_float_partition_exactly(lake, "ns.f", amounts, ["amount=1.5", "amount=nan"])


def test_nan_files_plan_as_one_partition(lake):
    """NaN != NaN in Python, yet every NaN file is in one partition (as Java's PartitionData)."""
    _float_partitioned(lake, "ns.f", [math.nan, 1.5])
    plans = lake.engine.plan("ns.f").partitions
    assert sorted((p.partition_key, p.input_files) for p in plans) == [("amount=1.5", FILES), ("amount=nan", FILES)]
