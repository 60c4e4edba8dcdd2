"""How well a partition's data files are clustered, from their manifest bounds alone (no data read).

`bounds_overlap(files, clustering)` is the average number of *other* files whose bounds box on the
clustering columns meets a file's box: each file's box is its [lower, upper] bound on every
clustering column (manifest stats, decoded with pyiceberg's conversions), and two boxes meet when
their intervals intersect on every column. 0: perfectly clustered (a lookup of one value reads one
file); n - 1 for n files: every file spans everything (a lookup reads all of them). A file without
a bound on a column (no stats, or only nulls there) spans the whole column. Values compare by the
order-preserving keys of lake/ordinal.py, so strings compare by their leading 8 bytes: strings that
share those may count as overlapping. Above MAX_QUERY_FILES files, that many files (evenly picked
by path) are compared against all of them: an estimate.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.types import PrimitiveType

from compaction_assets.lake import ordinal
from compaction_assets.lake.clustering import Clustering

MAX_QUERY_FILES = 2000
_CHUNK = 256  # query files compared at once
_TOP = np.iinfo(np.uint64).max


def bounds_overlap(files: Sequence[DataFile], clustering: Clustering) -> float:
    """See the module doc; 0.0 for fewer than two files."""
    n = len(files)
    if n < 2:
        return 0.0
    ordered = sorted(files, key=lambda f: f.file_path)
    lows = np.empty((n, len(clustering.field_ids)), dtype=np.uint64)
    highs = np.empty_like(lows)
    for c, (field_id, field_type) in enumerate(zip(clustering.field_ids, clustering.types, strict=True)):
        lows[:, c] = _bound_keys([f.lower_bounds for f in ordered], field_id, field_type, 0)
        highs[:, c] = _bound_keys([f.upper_bounds for f in ordered], field_id, field_type, _TOP)
    queries = np.arange(n) if n <= MAX_QUERY_FILES else np.linspace(0, n - 1, MAX_QUERY_FILES).round().astype(int)
    met = 0
    for start in range(0, len(queries), _CHUNK):
        q = queries[start : start + _CHUNK]
        meets = (lows[q][:, None, :] <= highs[None, :, :]) & (lows[None, :, :] <= highs[q][:, None, :])
        met += int(meets.all(axis=2).sum()) - len(q)  # a file meets itself
    return met / len(queries)


def _bound_keys(bounds: list[dict[int, bytes] | None], field_id: int, field_type: PrimitiveType, missing) -> np.ndarray:
    """The ordinal key of each file's bound on `field_id` (`missing` where it has none)."""
    raw = [b.get(field_id) if b else None for b in bounds]
    present = {i: v for i, v in enumerate(raw) if v is not None}
    keys = np.full(len(raw), missing, dtype=np.uint64)
    if present:
        values = [_comparable(from_bytes(field_type, v)) for v in present.values()]
        keys[list(present)], _ = ordinal.ordinals(pa.array(values))
    return keys


def _comparable(value: object) -> object:
    """A decoded bound as a value pyarrow infers an ordered type for (UUIDs as their bytes)."""
    return value.bytes if isinstance(value, uuid.UUID) else value
