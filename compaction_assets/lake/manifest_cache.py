"""A process-wide cache of manifest entries.

Iceberg manifests are immutable (every write makes a new file with a unique name), so their
entries can be cached by path. Planning, commit checks and recovery all read the current
snapshot's manifests; under a streaming writer that is hundreds of files per read, most of them
already read by the previous one. Entries are shared, read-only objects: callers must not mutate.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestEntry, ManifestFile

MAX_CACHED_ENTRIES = 200_000  # about 1 KiB each: bounded at a few hundred MB for huge tables

_lock = threading.Lock()
_cache: OrderedDict[str, tuple[ManifestEntry, ...]] = OrderedDict()
_size = 0


def live_entries(manifest: ManifestFile, io: FileIO) -> tuple[ManifestEntry, ...]:
    """The manifest's entries that are not DELETED, read once per process."""
    global _size
    key = manifest.manifest_path
    with _lock:
        cached = _cache.get(key)
        if cached is not None:
            _cache.move_to_end(key)
            return cached
    entries = tuple(manifest.fetch_manifest_entry(io, discard_deleted=True))
    with _lock:
        if key not in _cache:
            _cache[key] = entries
            _size += len(entries)
            while _size > MAX_CACHED_ENTRIES and len(_cache) > 1:
                _, evicted = _cache.popitem(last=False)
                _size -= len(evicted)
    return entries
