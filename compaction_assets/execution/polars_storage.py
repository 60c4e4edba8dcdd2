"""Where Polars reads and writes a group's files: local paths, or S3 through object_store.

Polars reaches S3 itself (object_store, several GETs in flight), configured by `storage_options`
translated from the table FileIO's pyiceberg properties. Keys it cannot honour (a role to
assume, a remote signer, server-side encryption, a proxy, ...) make a group not qualify, so it
takes the pyarrow path through the FileIO as before. Without keys, object_store uses its own
chain (environment, web identity, instance metadata), as pyiceberg does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

from compaction_assets import redact

S3_SCHEMES = ("s3://", "s3a://", "s3n://")
# pyiceberg property -> object_store option; the client.* names apply to every store
_S3_OPTIONS = {
    "s3.endpoint": "aws_endpoint_url",
    "s3.access-key-id": "aws_access_key_id",
    "client.access-key-id": "aws_access_key_id",
    "s3.secret-access-key": "aws_secret_access_key",
    "client.secret-access-key": "aws_secret_access_key",
    "s3.session-token": "aws_session_token",
    "client.session-token": "aws_session_token",
    "s3.region": "aws_region",
    "client.region": "aws_region",
    "s3.force-virtual-addressing": "aws_virtual_hosted_style_request",
    "s3.anonymous": "aws_skip_signature",
}
_FLAGS = ("aws_virtual_hosted_style_request", "aws_skip_signature")
_CREDENTIALS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
# tuning only (object_store's defaults do); a region pyiceberg would resolve, object_store takes from its chain
_HARMLESS = ("s3.connect-timeout", "s3.request-timeout", "s3.resolve-region")
# Polars' speculative read of an object's tail (footer and length; local files are not read so),
# 256 KiB by default: 28% more bytes than a 0.9 MB source object holds. Read at every scan.
FOOTER_READ_VARIABLE = "POLARS_CLOUD_FOOTER_READ_SIZE"
MIN_FOOTER_READ = 64 * 1024  # pyarrow's own speculative footer read
# A group whose sources are all at most this size has them read whole by the tail read: a compaction
# reads every column anyway, and Polars decodes from the bytes it already holds, so the sink makes
# one GET per source instead of two (the footer, then the column chunks). On the bench's "s3"
# dataset (moto, 0.9 MB objects) that took 1,128 requests to 632 for 500 objects. Small objects
# only: on 7.8 MB objects an outside test measured whole reads slower (8.3 s against 5.9 s) and
# peak RSS 41-54% higher (Polars holds whole objects in flight rather than the chunks it decodes).
# One larger source keeps footer-sized tails for all: a tail that does not cover an object is wasted.
WHOLE_OBJECT_READ = 2 * 1024 * 1024


@dataclass(frozen=True)
class PolarsStorage:
    """How Polars names a group's files and what it needs to reach them."""

    local: bool
    options: dict[str, str] | None = field(default=None, repr=False)  # object_store's; None for local files
    io: FileIO | None = field(default=None, repr=False)

    def path(self, location: str) -> str:
        """`location` as Polars opens it (s3:// for s3a:// and s3n://, which it lacks; keys taken literally)."""
        if self.local:
            if (path := local_path(self.io.properties if self.io is not None else {}, location)) is None:
                raise ValueError(f"not a local file, for Polars' local storage: {location}")
            return path
        return "s3://" + location.split("://", 1)[1]

    def register_secrets(self) -> None:
        """Have `redact` mask the credentials Polars was given (a Spark worker loaded no config)."""
        for key in _CREDENTIALS:
            if self.options and self.options.get(key):
                redact.register_value(self.options[key])


# How many source files Polars' multi-scan opens and decodes at once (POLARS_MAX_CONCURRENT_SCANS,
# and as many readers initialised ahead, POLARS_NUM_READERS_PRE_INIT). Polars' default follows its
# thread count (2 and 5 on 2 cores): on thousands of tiny local files the scan then waits on one
# file after another. Sinking the bench's "tiny" 5,000 x 11 KB files into one took 0.40 s at the
# default and 0.31 s at 64 (median of 7, same process); "small" 500 x 0.9 MB into 4 files 0.87 s
# and 0.82 s (peak RSS 124 -> 247 MiB). A file in flight is held decoded: 6 MiB sources at 5 in
# flight raised the bench's 2 GB group from 381-455 to 542 MiB peak, as fast, and 39 KiB files
# of long runs that decode to 6 MiB each, at 64 in flight, took a worker to 756 MiB (an outside
# attack). So: as many as SCAN_BYTES_IN_FLIGHT allows of the largest source's bytes in memory
# (the caller's estimate of its decoded size), at most MAX_CONCURRENT_SCANS; Polars' default
# where that is no more than its threads.
SCAN_VARIABLES = ("POLARS_MAX_CONCURRENT_SCANS", "POLARS_NUM_READERS_PRE_INIT")
SCAN_BYTES_IN_FLIGHT = 8 * 1024 * 1024
MAX_CONCURRENT_SCANS = 64


def concurrent_scans(held_bytes: Sequence[int]) -> int:
    """Sources to have in flight for sources that hold these bytes in memory: SCAN_BYTES_IN_FLIGHT of the largest."""
    largest = max(held_bytes, default=SCAN_BYTES_IN_FLIGHT)
    return max(1, min(MAX_CONCURRENT_SCANS, SCAN_BYTES_IN_FLIGHT // max(largest, 1)))


@contextmanager
def polars_variables(values: dict[str, str]) -> Iterator[None]:
    """Set Polars' environment variables (read at every query) for the `with` block; any the
    environment already sets are left as they are."""
    ours = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(ours)
    try:
        yield
    finally:
        for key in ours:
            os.environ.pop(key, None)


def footer_reads(footer_bytes: int, object_sizes: Sequence[int] = ()) -> AbstractContextManager[None]:
    """Polars' tail read of each object sized for footers of about `footer_bytes` (a source's),
    with room for larger ones (a footer past it costs a second GET); or, if every object in
    `object_sizes` is at most WHOLE_OBJECT_READ, for the whole of the largest."""
    largest = max(object_sizes, default=0)
    whole = largest if largest <= WHOLE_OBJECT_READ else 0
    return polars_variables({FOOTER_READ_VARIABLE: str(max(MIN_FOOTER_READ, 2 * (footer_bytes + 8), whole))})


def scan_concurrency(held_bytes: Sequence[int]) -> AbstractContextManager[None]:
    """Polars' multi-scan concurrency for sources that hold these bytes decoded: concurrent_scans,
    if that is more than Polars' threads (its default)."""
    import polars as pl

    scans = concurrent_scans(held_bytes)
    return polars_variables(dict.fromkeys(SCAN_VARIABLES, str(scans)) if scans > pl.thread_pool_size() else {})


def storage_for(io: FileIO, locations: list[str]) -> PolarsStorage | None:
    """How Polars reaches all of `locations` (local files, or S3 objects), or None if it cannot."""
    if not locations or any("?" in loc or "#" in loc for loc in locations):
        return None
    if all(loc.startswith(S3_SCHEMES) for loc in locations):
        options = s3_storage_options(io.properties)
        return None if options is None else PolarsStorage(local=False, options=options, io=io)
    if isinstance(io, PyArrowFileIO) and all(local_path(io.properties, loc) is not None for loc in locations):
        return PolarsStorage(local=True, io=io)
    return None


def s3_storage_options(properties: dict[str, str]) -> dict[str, str] | None:
    """object_store's S3 options from pyiceberg's FileIO properties; None if one cannot be honoured."""
    options: dict[str, str] = {}
    # s3.* before client.* whatever the order they come in, as pyiceberg's get_first_property_value
    # takes them: the client.* keys can be another client's (the catalog's), not the store's
    for key, value in sorted(properties.items(), key=lambda item: item[0].startswith("s3.")):
        if key in _S3_OPTIONS:
            name = _S3_OPTIONS[key]
            options[name] = str(value).lower() if name in _FLAGS else str(value)
        elif key.startswith(("s3.", "client.")) and key not in _HARMLESS:
            return None
    if options.get("aws_endpoint_url", "").startswith("http://"):
        options["aws_allow_http"] = "true"
    return options


def local_path(properties: dict[str, str], location: str) -> str | None:
    """The filesystem path of a local file's `location` as pyiceberg's PyArrowFileIO resolves it
    with the FileIO `properties` (its DEFAULT_SCHEME may send bare paths elsewhere); None if it is not local.

    A plain `file:///` URI is sliced: it is what pyiceberg's parse_location returns for it, and
    urlparse on every path of a 5,000-file group cost 0.06 s in the driver and again in the worker."""
    if location.startswith("file:///") and "?" not in location and "#" not in location:
        return location[len("file://") :]
    scheme, _, path = PyArrowFileIO.parse_location(location, properties)
    return path if scheme == "file" else None
