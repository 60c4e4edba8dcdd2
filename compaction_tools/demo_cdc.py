"""The demo's change-data-capture table: what a Flink CDC or upsert stream leaves behind.

Every round commits, per region, a micro-batch of new orders; updates of earlier orders as an
equality delete on `order_id` followed by the new versions (the upsert pattern: the delete is
committed first, so it removes only the older versions); and, every few rounds, a merge-on-read
DELETE that writes position deletes into one earlier file. Readers then pay for every delete
file on every scan: the table the merge-on-read compaction is for.
"""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestampType

from compaction_assets.lake.appends import append_fragments
from compaction_assets.lake.delete_files import (
    commit_delete_files,
    equality_delete_file,
    position_delete_file,
    read_column,
)
from compaction_assets.lake.files import live_files

CDC_TABLE = "demo.cdc_orders"
REGIONS = ("eu", "us", "apac")
INSERTS_PER_ROUND = 40  # new orders per region per round
UPDATES_PER_ROUND = 8  # orders per region updated per round (equality delete + new version)
POSITION_DELETE_EVERY = 4  # rounds between merge-on-read DELETEs (position deletes)


def create_cdc_table(catalog: Catalog, rounds: int, rng: random.Random) -> int:
    """Create demo.cdc_orders and play `rounds` rounds of CDC commits; returns data files written."""
    schema = Schema(
        NestedField(1, "order_id", LongType(), required=False),
        NestedField(2, "region", StringType(), required=False),
        NestedField(3, "status", StringType(), required=False),
        NestedField(4, "amount", DoubleType(), required=False),
        NestedField(5, "updated_at", TimestampType(), required=False),
    )
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"))
    table = catalog.create_table(
        CDC_TABLE,
        schema=schema,
        partition_spec=spec,
        properties={"format-version": "2", "write.delete.mode": "merge-on-read"},
    )
    return CdcWriter(table, rng).play(rounds)


class CdcWriter:
    """Plays CDC rounds against one table, keeping which order ids are live per region."""

    def __init__(self, table: Table, rng: random.Random, first_id: int = 1) -> None:
        self._table = table
        self._rng = rng
        self._next_id = first_id
        self._live: dict[str, list[int]] = {r: [] for r in REGIONS}
        self._clock = dt.datetime(2024, 1, 1)

    @property
    def live_ids(self) -> set[int]:
        """The order ids a reader must see, each exactly once (in its latest version)."""
        return {i for ids in self._live.values() for i in ids}

    def play(self, rounds: int) -> int:
        written = 0
        for round_no in range(rounds):
            self._clock += dt.timedelta(minutes=1)
            written += append_fragments(self._table, [self._orders(r, self._new_ids(r)) for r in REGIONS])
            updated = {r: self._rng.sample(self._live[r], min(UPDATES_PER_ROUND, len(self._live[r]))) for r in REGIONS}
            deletes = [self._equality_delete(r, ids) for r, ids in updated.items() if ids]
            if deletes:
                commit_delete_files(self._table, deletes)
                written += append_fragments(self._table, [self._orders(r, ids) for r, ids in updated.items() if ids])
            if round_no % POSITION_DELETE_EVERY == POSITION_DELETE_EVERY - 1:
                self._position_delete()
        return written

    def _new_ids(self, region: str) -> list[int]:
        ids = list(range(self._next_id, self._next_id + INSERTS_PER_ROUND))
        self._next_id += INSERTS_PER_ROUND
        self._live[region].extend(ids)
        return ids

    def _orders(self, region: str, ids: list[int]) -> pa.Table:
        return pa.table(
            {
                "order_id": pa.array(ids, pa.int64()),
                "region": [region] * len(ids),
                "status": [self._rng.choice(["new", "paid", "shipped"]) for _ in ids],
                "amount": [round(self._rng.uniform(1, 500), 2) for _ in ids],
                "updated_at": pa.array([self._clock] * len(ids), pa.timestamp("us")),
            }
        )

    def _equality_delete(self, region: str, ids: list[int]) -> DataFile:
        spec_id = self._table.spec().spec_id
        return equality_delete_file(self._table, spec_id, Record(region), ["order_id"], [{"order_id": i} for i in ids])

    def _position_delete(self) -> None:
        """A merge-on-read DELETE of a few orders of one earlier file (they are gone for good)."""
        self._table.refresh()
        data = [f.data_file for f in live_files(self._table) if not f.is_delete]
        victim = self._rng.choice(data)
        positions = sorted(self._rng.sample(range(victim.record_count), min(3, victim.record_count)))
        commit_delete_files(self._table, [position_delete_file(self._table, victim, positions)])
        ids = read_column(self._table, victim, 1, "order_id")
        region = victim.partition[0]
        gone = {ids[p] for p in positions}
        self._live[region] = [i for i in self._live[region] if i not in gone]
