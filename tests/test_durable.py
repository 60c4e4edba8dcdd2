"""A task's local outputs are synced before it ends (execution/durable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_assets.execution import durable


def test_local_locations_are_synced_and_remote_ones_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "part=a b"
    folder.mkdir(parents=True)
    files = [folder / f"f{k}.parquet" for k in range(3)]
    for f in files:
        f.write_bytes(b"PAR1" * 1000)
    durable.forget()
    durable.submit([f"file://{files[0]}", str(files[1]), f"file:{files[2]}"])
    durable.submit(["s3://bucket/key.parquet", "gs://bucket/key.parquet"])
    assert len(durable._pending) == 3  # noqa: SLF001
    durable.wait()
    assert not durable._pending  # noqa: SLF001


def test_an_output_missing_at_its_sync_fails_the_task(tmp_path: Path) -> None:
    durable.forget()
    durable.submit([str(tmp_path / "gone.parquet")])
    with pytest.raises(FileNotFoundError):
        durable.wait()
    durable.wait()  # nothing left over for the worker's next task


def test_a_failed_tasks_leftovers_are_forgotten(tmp_path: Path) -> None:
    durable.submit([str(tmp_path / "never-written.parquet")])
    durable.forget()
    durable.wait()
