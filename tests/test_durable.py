"""A task's local outputs are synced before it ends (execution/durable)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compaction_assets.execution.durable import TaskOutputs, folder_chain


def test_local_locations_are_synced_and_remote_ones_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "part=a b"
    folder.mkdir(parents=True)
    files = [folder / f"f{k}.parquet" for k in range(3)]
    for f in files:
        f.write_bytes(b"PAR1" * 1000)
    with TaskOutputs({}) as outputs:
        outputs.add([f"file://{files[0]}", str(files[1]), f"file:{files[2]}"])
        outputs.add(["s3://bucket/key.parquet", "gs://bucket/key.parquet"])
        assert len(outputs._pending) == 3  # noqa: SLF001
    assert not outputs._pending  # noqa: SLF001


def test_an_output_missing_at_its_sync_fails_the_task(tmp_path: Path) -> None:
    outputs = TaskOutputs({})
    outputs.add([str(tmp_path / "gone.parquet")])
    with pytest.raises(FileNotFoundError):
        outputs.wait()
    outputs.wait()  # nothing left over


def test_a_failed_task_does_not_wait_for_its_files(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), TaskOutputs({}) as outputs:
        outputs.add([str(tmp_path / "never-written.parquet")])
        raise RuntimeError("the group failed")


def test_every_folder_a_write_may_have_made_is_synced(tmp_path: Path) -> None:
    deep = tmp_path / "data" / "a=1" / "b=2"  # a new partition of a two-field spec: three new folders
    chain = folder_chain(str(deep))
    assert chain[:4] == [str(deep), str(deep.parent), str(tmp_path / "data"), str(tmp_path)]
    assert os.path.ismount(chain[-1])
    deep.mkdir(parents=True)
    (deep / "f.parquet").write_bytes(b"PAR1")
    with TaskOutputs({}) as outputs:
        outputs.add([str(deep / "f.parquet")])


def test_bare_paths_another_file_io_resolves_are_not_taken_for_local_files(tmp_path: Path) -> None:
    outputs = TaskOutputs({"DEFAULT_SCHEME": "hdfs", "DEFAULT_NETLOC": "namenode:8020"})
    outputs.add([str(tmp_path / "on-hdfs.parquet"), "hdfs://namenode:8020/w/t/data/x.parquet"])
    assert not outputs._pending  # noqa: SLF001 - neither is a local file: nothing to sync here
    outputs.wait()
