"""pyiceberg 0.12's manifest and manifest-list writers, with their private hooks under public names.

pyiceberg writes no format-version-3 manifest or manifest list, and declares a manifest entry's
`equality_ids` as list<long> where the spec says list<int> (lake/manifest_io.py and
lake/delete_files.py say why each matters). Their writers change the Avro schema and file metadata
pyiceberg's writers use: `ManifestWriterHooks` routes ManifestWriter's private `_meta` and
`_with_partition` to `file_metadata` and `entry_schema`; `ManifestListWriterHooks` opens the Avro
file through `avro_writer`. tests/test_compat_contract.py checks the names against pyiceberg.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Self

from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.io import OutputFile
from pyiceberg.manifest import ManifestFile, ManifestListWriter, ManifestWriterV2
from pyiceberg.schema import Schema
from pyiceberg.typedef import TableVersion

# pyiceberg's private hook or attribute -> the public name here
MANIFEST_WRITER_HOOKS = {"_meta": "file_metadata", "_with_partition": "entry_schema", "_output_file": "output_file"}
MANIFEST_LIST_WRITER_STATE = {"_writer": "avro_writer", "_output_file": "output_file", "_meta": "file_metadata"}


class ManifestWriterHooks(ManifestWriterV2):
    """pyiceberg's v2 manifest writer; subclasses override `file_metadata` and `entry_schema`."""

    @property
    def _meta(self) -> dict[str, str]:
        return self.file_metadata

    def _with_partition(self, format_version: TableVersion) -> Schema:
        return self.entry_schema(format_version)

    @property
    def file_metadata(self) -> dict[str, str]:
        """The Avro file's key-value metadata (schema, partition spec, format version, content)."""
        return super()._meta

    def entry_schema(self, format_version: TableVersion) -> Schema:
        """The manifest entry schema, the data file's partition typed by the spec."""
        return super()._with_partition(format_version)

    @property
    def output_file(self) -> OutputFile:
        return self._output_file


class ManifestListWriterHooks(ManifestListWriter):
    """pyiceberg's manifest-list writer whose Avro file a subclass opens itself (`avro_writer`)."""

    def __enter__(self) -> Self:
        self._writer = self.avro_writer(self._output_file, self._meta)
        self._writer.__enter__()
        return self

    @abstractmethod
    def avro_writer(self, output_file: OutputFile, metadata: dict[str, str]) -> AvroOutputFile[ManifestFile]:
        """The Avro file the manifest list is written to (records and file schema of its format version)."""
