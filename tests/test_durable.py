"""A task's local outputs are synced before it ends (execution/durable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_assets.execution.durable import TaskOutputs


def test_local_locations_are_synced_and_remote_ones_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "part=a b"
    folder.mkdir(parents=True)
    files = [folder / f"f{k}.parquet" for k in range(3)]
    for f in files:
        f.write_bytes(b"PAR1" * 1000)
    with TaskOutputs() as outputs:
        outputs.add([f"file://{files[0]}", str(files[1]), f"file:{files[2]}"])
        outputs.add(["s3://bucket/key.parquet", "gs://bucket/key.parquet"])
        assert len(outputs._pending) == 3  # noqa: SLF001
    assert not outputs._pending  # noqa: SLF001


def test_an_output_missing_at_its_sync_fails_the_task(tmp_path: Path) -> None:
    outputs = TaskOutputs()
    outputs.add([str(tmp_path / "gone.parquet")])
    with pytest.raises(FileNotFoundError):
        outputs.wait()
    outputs.wait()  # nothing left over


def test_a_failed_task_does_not_wait_for_its_files(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), TaskOutputs() as outputs:
        outputs.add([str(tmp_path / "never-written.parquet")])
        raise RuntimeError("the group failed")
