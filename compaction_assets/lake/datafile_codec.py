"""DataFile <-> JSON, so the ledger can recommit result files without re-reading them.

Every field pyiceberg keeps on a DataFile is kept: paths, partition values, counts, column
sizes, value/null/NaN counts and the serialized lower/upper bounds (as base64).
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

_INT_MAPS = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")
_BYTES_MAPS = ("lower_bounds", "upper_bounds")


def datafile_to_json(data_file: DataFile) -> dict[str, Any]:
    out: dict[str, Any] = {
        "content": int(data_file.content),
        "file_path": data_file.file_path,
        "file_format": data_file.file_format.name,
        "partition": encode_partition(data_file.partition),
        "record_count": data_file.record_count,
        "file_size_in_bytes": data_file.file_size_in_bytes,
        "split_offsets": data_file.split_offsets,
        "equality_ids": data_file.equality_ids,
        "sort_order_id": data_file.sort_order_id,
        "key_metadata": _b64(data_file.key_metadata),
        "spec_id": data_file.spec_id,
    }
    for name in _INT_MAPS:
        out[name] = {str(k): v for k, v in (getattr(data_file, name) or {}).items()}
    for name in _BYTES_MAPS:
        out[name] = {str(k): _b64(v) for k, v in (getattr(data_file, name) or {}).items()}
    return out


def datafile_from_json(doc: dict[str, Any]) -> DataFile:
    # keyword arguments named at run time (from_args takes **arguments beside _table_format_version)
    int_maps: dict[str, Any] = {name: {int(k): v for k, v in doc[name].items()} for name in _INT_MAPS}
    bytes_maps: dict[str, Any] = {name: {int(k): _unb64(v) for k, v in doc[name].items()} for name in _BYTES_MAPS}
    data_file = DataFile.from_args(
        content=DataFileContent(doc["content"]),
        file_path=doc["file_path"],
        file_format=FileFormat[doc["file_format"]],
        partition=decode_partition(doc["partition"]),
        record_count=doc["record_count"],
        file_size_in_bytes=doc["file_size_in_bytes"],
        split_offsets=doc["split_offsets"],
        equality_ids=doc["equality_ids"],
        sort_order_id=doc["sort_order_id"],
        key_metadata=_unb64(doc["key_metadata"]),
        **int_maps,
        **bytes_maps,
    )
    data_file.spec_id = doc["spec_id"]
    return data_file


def encode_partition(partition: Record) -> list[Any]:
    """Partition values as JSON-safe values."""
    return [_encode_value(partition[i]) for i in range(len(partition))]


def decode_partition(values: list[Any]) -> Record:
    return Record(*[_decode_value(v) for v in values])


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode()


def _unb64(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)


def _encode_value(value: Any) -> Any:
    """Partition values: JSON natives as they are, everything else tagged. NaN and infinities are
    tagged too: they are not JSON (PostgreSQL's json type refuses them). -0.0 stays -0.0."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, bytes):
        return {"bytes": _b64(value)}
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    if isinstance(value, uuid.UUID):
        return {"uuid": str(value)}
    if isinstance(value, dt.datetime):
        return {"datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"date": value.isoformat()}
    if isinstance(value, dt.time):
        return {"time": value.isoformat()}
    raise TypeError(f"cannot encode partition value {value!r} of type {type(value).__name__}")


_DECODERS: dict[str, Callable[[str], Any]] = {
    "float": float,
    "bytes": _unb64,
    "decimal": Decimal,
    "uuid": uuid.UUID,
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
}


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        ((tag, raw),) = value.items()
        return _DECODERS[tag](raw)
    return value
