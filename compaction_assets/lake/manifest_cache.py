"""A process-wide cache of manifest entries.

Iceberg manifests are immutable (every write makes a new file with a unique name), so their
entries can be cached by path. Planning, commit checks and recovery all read the current
snapshot's manifests; under a streaming writer that is hundreds of files per read, most of them
already read by the previous one. Entries are shared, read-only objects: callers must not mutate.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestEntry, ManifestFile

from compaction_assets.gc_pause import gc_paused
from compaction_assets.lake.manifest_io import ManifestContents, read_manifest

MAX_CACHED_ENTRIES = 200_000  # about 1.3 KiB each with their bytes: a few hundred MB at most

_lock = threading.Lock()
_cache: OrderedDict[str, ManifestContents] = OrderedDict()
_size = 0


def live_entries(manifest: ManifestFile, io: FileIO) -> tuple[ManifestEntry, ...]:
    """The manifest's entries that are not DELETED, read once per process."""
    return manifest_contents(manifest, io).entries


def manifest_contents(manifest: ManifestFile, io: FileIO) -> ManifestContents:
    """The manifest's live entries with what restating them needs, read once per process."""
    global _size
    key = manifest.manifest_path
    with _lock:
        cached = _cache.get(key)
        if cached is not None:
            _cache.move_to_end(key)
            return cached
    with gc_paused():
        contents = read_manifest(manifest, io)
    with _lock:
        if key not in _cache:
            _cache[key] = contents
            _size += len(contents.entries)
            while _size > MAX_CACHED_ENTRIES and len(_cache) > 1:
                _, evicted = _cache.popitem(last=False)
                _size -= len(evicted.entries)
    return contents


def forget(paths: Iterable[str]) -> None:
    """Drop the cached entries of manifests at `paths` (a commit took them out of the current
    snapshot: planning and commit checks no longer read them)."""
    global _size
    with _lock:
        for path in paths:
            if (evicted := _cache.pop(path, None)) is not None:
                _size -= len(evicted.entries)
