"""A small reader that follows the Iceberg spec's read rules literally, for tables no other reader here
reads right: pyiceberg 0.12 refuses equality deletes, and DuckDB 1.4.4 loses rows on some tables
with several equality-delete files (tests/test_lakekit.py pins what it does get right).

It decodes manifests with pyiceberg (plain Avro records), but plans and applies on its own:
- a position delete applies to the data file it names if its data sequence number is >= the file's;
- an equality delete applies if its data sequence number is > the file's, and it is global (an
  unpartitioned spec) or of the same spec and partition; NULL equals NULL;
- columns are matched by field id (files without ids through the table's name mapping); a field a
  file lacks reads NULL; int -> long widening is a no-op in Python.
Slow and simple on purpose: test tables have tens of small files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table

FIELD_ID = b"PARQUET:field_id"


@dataclass(frozen=True)
class _Live:
    file: DataFile
    sequence_number: int


def spec_rows(table: Table) -> list[dict[str, Any]]:
    """Every row of the table's current snapshot, as the spec says a reader must see it."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    data, positions, equalities = [], [], []
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            live = _Live(entry.data_file, entry.sequence_number)
            {
                DataFileContent.DATA: data,
                DataFileContent.POSITION_DELETES: positions,
                DataFileContent.EQUALITY_DELETES: equalities,
            }[entry.data_file.content].append(live)
    deleted_positions: dict[str, list[tuple[int, int]]] = {}
    for delete in positions:
        columns = _columns(table, delete.file)
        for path, pos in zip(columns[2147483546], columns[2147483545], strict=True):
            deleted_positions.setdefault(path, []).append((pos, delete.sequence_number))
    equality_sets = [(delete, _equality_keys(table, delete.file)) for delete in equalities]
    specs = table.specs()
    schema = table.schema()
    rows = []
    for live in data:
        f = live.file
        columns = _columns(table, f)
        count = f.record_count
        gone = {pos for pos, seq in deleted_positions.get(f.file_path, []) if seq >= live.sequence_number}
        applicable = [
            (delete.file.equality_ids, keys)
            for delete, keys in equality_sets
            if delete.sequence_number > live.sequence_number
            and (
                specs[delete.file.spec_id].is_unpartitioned()
                or (delete.file.spec_id == f.spec_id and tuple(delete.file.partition) == tuple(f.partition))
            )
        ]
        for pos in range(count):
            if pos in gone:
                continue
            by_id = {field_id: values[pos] for field_id, values in columns.items()}
            if any(tuple(by_id.get(i) for i in ids) in keys for ids, keys in applicable):
                continue
            rows.append({field.name: by_id.get(field.field_id) for field in schema.fields})
    return rows


def _equality_keys(table: Table, delete: DataFile) -> set[tuple]:
    columns = _columns(table, delete)
    ids = delete.equality_ids or []
    return set(zip(*(columns.get(i, [None] * delete.record_count) for i in ids), strict=True))


def _columns(table: Table, data_file: DataFile) -> dict[int, list[Any]]:
    """The file's top-level columns by Iceberg field id."""
    with table.io.new_input(data_file.file_path).open() as stream:
        parquet = pq.read_table(stream)
    by_name = _name_mapping(table)
    columns = {}
    for index, field in enumerate(parquet.schema):
        if field.metadata and FIELD_ID in field.metadata:
            field_id = int(field.metadata[FIELD_ID])
        elif field.name in by_name:
            field_id = by_name[field.name]
        else:
            continue
        columns[field_id] = parquet.column(index).to_pylist()
    return columns


def _name_mapping(table: Table) -> dict[str, int]:
    mapping = table.metadata.name_mapping()
    return {} if mapping is None else {name: f.field_id for f in mapping if f.field_id is not None for name in f.names}
