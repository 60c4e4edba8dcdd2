"""pyiceberg 0.12's private helpers and attributes of manifests, schemas and records, under public names.

Each is on a path that runs once per manifest entry or per file at planning time (200,000 files:
planning's own budget is a fraction of a second), where the public equivalent builds what these
read directly:
- `record_values`: a Record's list of values (`Record._data`); its `__len__` / `__getitem__` are
  Python calls (0.2 s at 200,000 files), and the list's length tells the v3 layout from the v2 one;
- `inherit_from_manifest`: what pyiceberg's manifest reader applies to every entry (snapshot id and
  sequence numbers inherited from the manifest), for our own reading of manifest bytes;
- `schema_field_ids`: a schema's field ids from its cached index (`Schema._lazy_id_to_field`);
- `lazy_dict_values`: a LazyDict's values from the flat arrays it was decoded from, without
  building the dict (which then stays with a cached entry: ~90 MB at 200,000 files); None when it
  has already built it.
"""

from __future__ import annotations

from collections.abc import KeysView
from typing import Any

from pyiceberg.manifest import ManifestEntry, ManifestFile, _inherit_from_manifest
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.utils.lazydict import LazyDict


def record_values(record: Record) -> list[Any]:
    """The values a Record holds, as the list it keeps them in."""
    return record._data


def inherit_from_manifest(entry: ManifestEntry, manifest: ManifestFile) -> ManifestEntry:
    """`entry` with what it inherits from `manifest` filled in, as pyiceberg's reader returns it."""
    return _inherit_from_manifest(entry, manifest)


def schema_field_ids(schema: Schema) -> KeysView[int]:
    """Every field id of the schema, nested ones included."""
    return schema._lazy_id_to_field.keys()


def lazy_dict_values(mapping: LazyDict) -> list[Any] | None:
    """The values of a LazyDict not yet built into a dict; None once built (read it as a dict then)."""
    if getattr(mapping, "_dict", None) is not None or not hasattr(mapping, "_contents"):
        return None
    return [v for item in mapping._contents for v in item[1::2]]
