"""Z-order values: the bits of several columns interleaved into one uint64 sort key (Iceberg's
`zorder(...)`, delta-rs `z_order`). Vectorised with numpy; the value is a sort key only, never written.

Each column is mapped onto an unsigned range (lake/ordinal.py: numerics and temporals by value,
strings and binary by their leading bytes), then scaled by the group's smallest and largest key
onto `bits` bits (1 .. 2^bits - 1; null -> 0, so nulls come first), and the columns' bits are
interleaved most significant first. Rows close in every column get close z-values, so files cut
from a z-sorted group have small bounding boxes on all the columns at once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from compaction_assets.lake import ordinal

MAX_BITS = 32  # per column: 2^32 steps resolve any clustering; keeps the float64 scaling exact enough


def bits_per_column(columns: int) -> int:
    return min(MAX_BITS, 64 // max(columns, 1))


@dataclass
class ZRange:
    """The smallest and largest ordinal key of each z-order column seen so far (None: all null)."""

    columns: tuple[str, ...]
    bounds: list[tuple[int, int] | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.bounds:
            self.bounds = [None] * len(self.columns)

    def observe(self, batch: pa.RecordBatch | pa.Table) -> None:
        for i, name in enumerate(self.columns):
            seen = ordinal.min_max(batch.column(name))
            if seen is None:
                continue
            known = self.bounds[i]
            self.bounds[i] = seen if known is None else (min(known[0], seen[0]), max(known[1], seen[1]))

    def z_values(self, batch: pa.RecordBatch | pa.Table) -> np.ndarray:
        """The z-value (uint64) of every row of `batch` (which holds the z-order columns)."""
        bits = bits_per_column(len(self.columns))
        top = np.uint64((1 << bits) - 1)
        scaled = []
        for i, name in enumerate(self.columns):
            keys, valid = ordinal.ordinals(batch.column(name))
            lo, hi = self.bounds[i] or (0, 0)
            if hi > lo:
                above = np.where(keys > np.uint64(lo), keys - np.uint64(lo), np.uint64(0))
                share = above.astype(np.float64) / float(hi - lo)
                steps = np.clip(share, 0.0, 1.0) * float(int(top) - 1)
                column = np.uint64(1) + steps.astype(np.uint64)
            else:
                column = np.ones(len(keys), dtype=np.uint64)
            column[~valid] = 0  # nulls first
            scaled.append(np.minimum(column, top))
        return interleave(scaled, bits)


def interleave(columns: list[np.ndarray], bits: int) -> np.ndarray:
    """The bits of `columns` (uint64, each below 2^bits) interleaved, most significant first: bit b
    of column c lands at b * k + (k - 1 - c) for k columns. A byte at a time through a table that
    spreads a byte's bits k apart (8 lookups a column of 32 bits, not 32 shifts and masks)."""
    k = len(columns)
    z = np.zeros(len(columns[0]) if columns else 0, dtype=np.uint64)
    spread = _spread_table(k)
    for c, column in enumerate(columns):
        for byte in range(-(-bits // 8)):
            part = spread[(column >> np.uint64(8 * byte)) & np.uint64(0xFF)]
            z |= part << np.uint64(8 * byte * k + k - 1 - c)
    return z


@functools.cache
def _spread_table(k: int) -> np.ndarray:
    """For every byte value, its bit i moved to bit i * k (bits past 64 dropped: they are never set)."""
    mask = (1 << 64) - 1
    return np.array([sum(((v >> i) & 1) << (i * k) for i in range(8)) & mask for v in range(256)], dtype=np.uint64)
