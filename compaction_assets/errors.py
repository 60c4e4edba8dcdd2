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
    """The commit gave way: its sources changed since planning. Nothing of the attempt remains.
    The message names the table and partition; `reason` is only why (for lines that name them)."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


def worker_error(exc: BaseException, limit: int = 300) -> str:
    """What a Spark worker reports for a failed group: an InputFileError's message (it names the
    file), else the exception's type and the first line of its message, cut at `limit` characters.
    Never the whole message: Arrow's errors go on to print the batch, i.e. table rows."""
    if isinstance(exc, InputFileError):
        return str(exc)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
