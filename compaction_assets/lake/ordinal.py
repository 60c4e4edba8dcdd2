"""Order-preserving unsigned 64-bit keys of Arrow values, vectorised (numpy / pyarrow, no per-row Python).

`ordinals(values)` maps a column onto uint64 so that a <= b implies key(a) <= key(b) (a
non-decreasing map: distinct values may share a key). Z-order interleaves these keys
(execution/zorder.py) and bounds_overlap compares them (planning/overlap.py):
- signed integers, dates, times, timestamps, durations: their integer, sign bit flipped;
- unsigned integers and booleans: as they are;
- floats and decimals: the IEEE-754 bits of the float64, flipped so negatives order below positives
  (NaN above +inf, -0.0 as 0.0);
- strings, binary, fixed-size binary (UUIDs, also as extension<arrow.uuid>): their leading 8 bytes,
  big-endian, zero-padded.
Nulls get key 0 and valid=False; callers decide where nulls go.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PREFIX_BYTES = 8
_SIGN = np.uint64(1 << 63)
_SHIFTS = np.array([8 * (PREFIX_BYTES - 1 - i) for i in range(PREFIX_BYTES)], dtype=np.uint64)


def orderable(arrow_type: pa.DataType) -> bool:
    """Whether `ordinals` maps values of this type."""
    t = arrow_type.storage_type if isinstance(arrow_type, pa.BaseExtensionType) else arrow_type  # uuid
    return (
        pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_temporal(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
    )


def ordinals(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(keys as uint64, valid) for every value; see the module doc. Raises TypeError for other types."""
    values = _plain_array(values)
    t = values.type
    valid = ~np.asarray(values.is_null(), dtype=bool) if values.null_count else np.ones(len(values), dtype=bool)
    if pa.types.is_dictionary(t):
        return ordinals(values.dictionary_decode())
    keys = np.asarray(_keys(values, t), dtype=np.uint64)  # may be a read-only view of the Arrow buffer
    if not valid.all():
        keys = np.where(valid, keys, np.uint64(0))
    return keys, valid


def _plain_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Which array to key: one chunk (combined if need be), an extension type's storage."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if isinstance(values.type, pa.BaseExtensionType):  # a uuid (extension<arrow.uuid>): its 16 bytes
        values = values.storage
    return values


def _keys(values: pa.Array, t: pa.DataType) -> np.ndarray:
    """Which key mapping the type takes (see the module doc); raises TypeError for other types."""
    if pa.types.is_boolean(t) or pa.types.is_unsigned_integer(t):
        return np.asarray(values.cast(pa.uint64()).fill_null(0), dtype=np.uint64)
    if pa.types.is_signed_integer(t) or pa.types.is_temporal(t):
        return _signed_keys(values, t)
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return _float_keys(values)
    if pa.types.is_fixed_size_binary(t) or pa.types.is_string(t) or pa.types.is_binary(t):
        return _prefixes(values.cast(pa.large_binary()) if not pa.types.is_fixed_size_binary(t) else values)
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return _prefixes(values.cast(pa.large_binary()))
    raise TypeError(f"values of type {t} have no order-preserving key")


def _signed_keys(values: pa.Array, t: pa.DataType) -> np.ndarray:
    """Signed integers and temporal values: their integer (32-bit ones widened), sign bit flipped."""
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        values = values.cast(pa.int32())
    return np.asarray(values.cast(pa.int64()).fill_null(0), dtype=np.int64).view(np.uint64) ^ _SIGN


def _float_keys(values: pa.Array) -> np.ndarray:
    """Floats and decimals: the float64's bits, flipped so negatives order below positives, NaN above +inf."""
    floats = np.asarray(values.cast(pa.float64(), safe=False).fill_null(0.0), dtype=np.float64) + 0.0
    floats[np.isnan(floats)] = np.nan  # one NaN (positive), above +inf
    bits = floats.view(np.uint64)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def _prefixes(values: pa.Array) -> np.ndarray:
    """The leading PREFIX_BYTES bytes of each value as a big-endian uint64 (shorter ones zero-padded)."""
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    buffers = values.buffers()
    data = np.frombuffer(buffers[-1], dtype=np.uint8) if buffers[-1] is not None else np.zeros(0, np.uint8)
    if pa.types.is_fixed_size_binary(values.type):
        width = values.type.byte_width
        starts = (np.arange(n, dtype=np.int64) + values.offset) * width
        lengths = np.full(n, width, dtype=np.int64)
    else:
        offsets = np.frombuffer(buffers[1], dtype=np.int64)[values.offset : values.offset + n + 1]
        starts, lengths = offsets[:-1], np.diff(offsets)
    padded = np.concatenate([data, np.zeros(PREFIX_BYTES, dtype=np.uint8)])
    keys = np.zeros(n, dtype=np.uint64)
    for i in range(PREFIX_BYTES):  # one vectorised gather per byte position
        byte = padded[np.minimum(starts + i, len(padded) - 1)].astype(np.uint64)
        keys |= np.where(lengths > i, byte, np.uint64(0)) << _SHIFTS[i]
    return keys


def min_max(values: pa.Array | pa.ChunkedArray) -> tuple[int, int] | None:
    """The smallest and largest key of the valid values, or None when all are null."""
    keys, valid = ordinals(values)
    if not valid.any():
        return None
    present = keys[valid]
    return int(present.min()), int(present.max())


def is_nan(values: pa.Array) -> np.ndarray:
    """NaN flags (False for nulls and non-float types)."""
    if not pa.types.is_floating(values.type):
        return np.zeros(len(values), dtype=bool)
    return np.asarray(pc.is_nan(values).fill_null(False), dtype=bool)
