"""Listing and deleting files under a table's location, and nowhere else."""

from __future__ import annotations

from collections.abc import Iterable

from pyarrow import fs as pafs
from pyiceberg.io import FileIO

from compaction_assets.errors import CompactionError


class OutsideTableLocation(CompactionError):
    """Refused: a path to delete is not inside the table's own location."""


def files_with_prefix(directory: str, prefix: str) -> list[str]:
    """URIs of the files directly in `directory` whose names start with `prefix`."""
    filesystem, root = pafs.FileSystem.from_uri(directory)
    scheme = directory.split("://", 1)[0] if "://" in directory else "file"
    infos = filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    return sorted(
        f"{scheme}://{info.path}"
        for info in infos
        if info.type == pafs.FileType.File and info.base_name.startswith(prefix)
    )


def table_files(location: str, suffixes: tuple[str, ...]) -> dict[str, int | None]:
    """URI -> modification time (ms) of every file under `location` whose name ends in `suffixes`."""
    filesystem, root = pafs.FileSystem.from_uri(location)
    scheme = location.split("://", 1)[0] if "://" in location else "file"
    infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return {
        f"{scheme}://{i.path}": (i.mtime_ns // 1_000_000 if i.mtime_ns is not None else None)
        for i in infos
        if i.type == pafs.FileType.File and i.base_name.endswith(suffixes)
    }


def is_inside(path: str, location: str) -> bool:
    return path.startswith(location.rstrip("/") + "/")


def delete_files(io: FileIO, table_location: str, paths: Iterable[str]) -> int:
    """Delete files of this table; refuses (before deleting any) a path outside its location."""
    paths = list(paths)
    outside = [p for p in paths if not is_inside(p, table_location)]
    if outside:
        raise OutsideTableLocation(f"refusing to delete {outside[0]}: outside table location {table_location}")
    deleted = 0
    for path in paths:
        try:
            io.delete(path)
            deleted += 1
        except FileNotFoundError:
            pass
    return deleted
