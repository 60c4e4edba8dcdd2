"""Upgrading a table to format version 3 as Java does (metadata only)."""

from __future__ import annotations

import json
import sqlite3
import uuid


def upgrade_to_v3(lake, name: str):
    """Point the catalog at a copy of the table's metadata with format-version 3 and next-row-id 0,
    as Java's upgrade leaves it: the manifests and manifest lists stay as they were (no first_row_id:
    their rows get row ids once a v3 manifest list assigns them one)."""
    table = lake.table(name)
    with open(table.metadata_location.removeprefix("file://")) as metadata:
        doc = json.load(metadata)
    doc["format-version"], doc["next-row-id"] = 3, 0
    location = table.metadata_location.rsplit("/", 1)[0] + f"/00099-{uuid.uuid4()}.metadata.json"
    with open(location.removeprefix("file://"), "w") as out:
        out.write(json.dumps(doc))
    with sqlite3.connect(lake.root / "catalog.db") as db:
        db.execute("update iceberg_tables set metadata_location=? where table_name=?", (location, name.split(".")[1]))
    table = lake.table(name)
    assert table.format_version == 3
    return table
