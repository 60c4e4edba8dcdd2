"""What the code location needs to know of each managed table, without loading every table.

A table's details (partitioned?, location, the properties its policy reads) are a function of
its metadata file, and a metadata file never changes once written: they are cached by metadata
location in the state database, so a code location load costs one catalog query for names and
metadata locations (SQL catalogs) and one cache query, and reads only the metadata files it has
not seen (new tables, or tables changed since: a table that became partitioned has a new file).
Catalogs with no such listing (REST, Glue, Hive) load every table, several at a time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from pyiceberg.catalog import Catalog
from pyiceberg.io import load_file_io
from pyiceberg.serializers import Compressor
from pyiceberg.table import Table
from sqlalchemy import String, Text, create_engine, event, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from compaction_assets.errors import CatalogError
from compaction_assets.lake.catalog import load_table, refuse_relative
from compaction_assets.lake.properties import POLICY_PROPERTIES

READERS = 8  # metadata files (or tables) read at once: object stores and REST answer in parallel


@dataclass(frozen=True)
class TableDetails:
    partitioned: bool  # the default spec has fields: the asset's partitions are the table's
    location: str
    properties: dict[str, str] = field(default_factory=dict)  # only those a policy reads


class _Base(DeclarativeBase):
    pass


class _DetailsRow(_Base):
    __tablename__ = "compaction_table_details"

    location_hash: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the metadata location
    details: Mapped[str] = mapped_column(Text)


class DetailsCache:
    """Details by metadata location, in the state database (any SQLAlchemy URI)."""

    def __init__(self, uri: str) -> None:
        is_sqlite = uri.startswith("sqlite")
        self._engine = create_engine(uri, connect_args={"timeout": 30} if is_sqlite else {})
        if is_sqlite:
            event.listen(self._engine, "connect", lambda conn, _: conn.execute("PRAGMA journal_mode=WAL"))
        _Base.metadata.create_all(self._engine)

    def get(self, locations: Iterable[str]) -> dict[str, TableDetails]:
        by_hash = {_hash(loc): loc for loc in locations}
        found: dict[str, TableDetails] = {}
        keys = list(by_hash)
        with Session(self._engine) as session:
            for start in range(0, len(keys), 500):  # bound the IN list
                query = select(_DetailsRow).where(_DetailsRow.location_hash.in_(keys[start : start + 500]))
                for row in session.scalars(query):
                    found[by_hash[row.location_hash]] = TableDetails(**json.loads(row.details))
        return found

    def put(self, details: dict[str, TableDetails]) -> None:
        rows = [_DetailsRow(location_hash=_hash(loc), details=json.dumps(asdict(d))) for loc, d in details.items()]
        try:
            with Session(self._engine) as session, session.begin():
                session.add_all(rows)
        except IntegrityError:  # another process cached some of them meanwhile: same content
            for row in rows:
                try:
                    with Session(self._engine) as session, session.begin():
                        session.merge(row)
                except IntegrityError:
                    continue

    def dispose(self) -> None:
        self._engine.dispose()


def _hash(location: str) -> str:
    return hashlib.sha256(location.encode()).hexdigest()


def details_from_metadata(doc: dict) -> TableDetails:
    """From a table metadata file's JSON (format v1-v3): v1 files may carry only `partition-spec`."""
    if "partition-specs" in doc:
        default = doc.get("default-spec-id", 0)
        spec: dict = next((s for s in doc["partition-specs"] if s.get("spec-id") == default), {"fields": []})
        fields = spec.get("fields", [])
    else:
        fields = doc.get("partition-spec", [])
    properties = {k: v for k, v in doc.get("properties", {}).items() if k in POLICY_PROPERTIES}
    return TableDetails(partitioned=bool(fields), location=doc["location"], properties=properties)


def details_from_table(table: Table) -> TableDetails:
    properties = {k: v for k, v in table.properties.items() if k in POLICY_PROPERTIES}
    return TableDetails(not table.spec().is_unpartitioned(), table.location(), properties)


def read_metadata(catalog: Catalog, metadata_location: str) -> TableDetails:
    """Read one metadata file through the catalog's FileIO (gzip-compressed ones too)."""
    io = load_file_io(catalog.properties, metadata_location)
    with io.new_input(metadata_location).open() as stream:
        raw = Compressor.get_compressor(metadata_location).stream_decompressor(stream).read()
    return details_from_metadata(json.loads(raw))


def managed_details(
    catalog: Catalog,
    versions: dict[str, str | None],
    cache: DetailsCache,
    warn: Callable[[str], None],
) -> dict[str, TableDetails]:
    """Details of the tables in `versions` (name -> metadata location, None where the catalog did
    not list it). A table that cannot be read is left out and `warn`ed about, so one unusable
    table does not take the code location down."""
    known = cache.get(loc for loc in versions.values() if loc)
    details = {name: known[loc] for name, loc in versions.items() if loc in known}
    missing = [name for name in versions if name not in details]

    def read(name: str) -> tuple[str, str | None, TableDetails]:
        location = versions[name]
        if location:
            return name, location, read_metadata(catalog, location)
        table = load_table(catalog, name)
        return name, table.metadata_location, details_from_table(table)

    fresh: dict[str, TableDetails] = {}
    with ThreadPoolExecutor(READERS) as pool:
        for name, future in [(n, pool.submit(read, n)) for n in missing]:
            try:
                _, location, found = future.result()
                refuse_relative(name, found.location)
            except Exception as exc:  # noqa: BLE001 - named and reported; the table is left out
                warn(f"{name}: left out: {exc if isinstance(exc, CatalogError) else f'cannot read it: {exc}'}")
                continue
            details[name] = found
            if location:
                fresh[location] = found
    if fresh:
        cache.put(fresh)
    return dict(sorted(details.items()))
