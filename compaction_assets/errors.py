"""Errors the engine raises on purpose; each message names the thing that is wrong."""


class CompactionError(Exception):
    """Base class: an expected failure with a message meant for a person."""


class ConfigError(CompactionError):
    """compaction.yaml or a table's `compaction.*` properties are invalid."""


class CatalogError(CompactionError):
    """The catalog cannot be reached, or a table cannot be found in it."""


class InputFileError(CompactionError):
    """A source data file is missing, truncated or not valid Parquet."""


class BackOff(CompactionError):
    """The commit gave way: its sources changed since planning. Nothing of the attempt remains."""
