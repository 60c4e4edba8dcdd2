"""Recovery acts only on attempts that are its to act on: the attempt's own table (not another one
created under its name after a rename) and an owner that is really gone (not a live one in
another PID namespace under the same host name). Both found by the outside attack on issue 35,
once `compact` began recovering a table's dead attempts before planning."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from compaction_assets.commit.ledger import OPEN, Status
from compaction_assets.commit.process_identity import judged_gone, process_identity
from compaction_assets.lake.digest import row_hashes
from compaction_tools.demo import append_fragments
from tests.conftest import BY_REGION, CLI, SCHEMA, batch, create_fragmented, data_files
from tests.lakekit.waiting import wait_until


@pytest.mark.parametrize("command", [["recover"], ["compact", "ns.t"]], ids=["recover", "compact"])
def test_an_attempt_on_a_table_renamed_and_replaced_is_parked_not_swept(lake, command):
    """A run dies after its Iceberg commit (attempts PREPARED); the table is renamed and a new one
    created under the old name, at the same location. Recovery of the old name parks the attempts
    (other table uuid) and deletes nothing: the renamed table still reads every row. Before, the
    attempts rolled back against the new table and swept the renamed table's live files."""
    table = create_fragmented(lake, "ns.t", {"eu": 12, "us": 12})
    oracle = row_hashes(table.scan().to_arrow().to_pylist())
    assert lake.cli("compact", "ns.t", crash_at="after_iceberg_commit").returncode == 137
    assert len(lake.engine.ledger.attempts(statuses=[Status.PREPARED])) == 2
    lake.catalog.rename_table("ns.t", "ns.t_old")
    new = lake.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    append_fragments(new, [batch(10_000 + 50 * i, 50, "eu") for i in range(3)])

    run = lake.cli(*command)

    assert run.returncode == 0, run.stderr
    renamed = lake.table("ns.t_old")
    missing = [f["file_path"] for f in data_files(renamed) if not Path(f["file_path"].removeprefix("file://")).exists()]
    assert not missing
    assert row_hashes(renamed.scan().to_arrow().to_pylist()) == oracle
    attempts = lake.engine.ledger.attempts(table_name="ns.t")
    parked = [a for a in attempts if a.status == Status.FAILED and "is not the table this attempt ran on" in a.reason]
    assert len(parked) == 2, [(a.status, a.reason) for a in attempts]
    assert not lake.engine.ledger.attempts(statuses=OPEN)


def test_a_live_owner_in_another_pid_namespace_is_not_taken_for_dead(lake):
    """A `compact` holds its partitions PREPARED (paused before its commit, heartbeat fresh); a
    `recover` under the same host name in another PID namespace (a container on the host's
    network) cannot see its pid: it leaves the attempts to the owner, which commits them."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a PID namespace here (unshare: {probe.stderr.decode().strip()})")
    create_fragmented(lake, "ns.t", {"eu": 12, "us": 12})
    env = {**os.environ, "COMPACTION_CONFIG": str(lake.config_path)}
    owner = subprocess.Popen(
        [*CLI, "compact", "ns.t"],
        env={**env, "COMPACTION_PAUSE_AT": "before_commit:20"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with contextlib.suppress(AssertionError):  # the assertion below says what was missing
        wait_until(lambda: len(lake.engine.ledger.attempts(statuses=[Status.PREPARED])) >= 2, 120, interval=0.3)
    assert len(lake.engine.ledger.attempts(statuses=[Status.PREPARED])) == 2 and owner.poll() is None

    other = subprocess.run(["unshare", "--pid", "--fork", *CLI, "recover"], env=env, capture_output=True, text=True)

    assert other.returncode == 0, other.stderr
    assert owner.poll() is None, "the owner ended before the other namespace's recover did"
    assert not lake.engine.ledger.attempts(statuses=[Status.COMMITTED, Status.ROLLED_BACK, Status.FAILED])
    out, err = owner.communicate(timeout=300)
    assert owner.returncode == 0, err
    assert {a.status for a in lake.engine.ledger.attempts()} == {Status.COMMITTED}


def test_a_reused_pid_is_a_gone_owner():
    """The recorded start time tells a reused pid from the process that recorded it."""
    me = process_identity()
    assert me is not None and judged_gone(me, os.getpid()) is False
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert judged_gone(me, child.pid) is True  # a live pid, but not the process recorded
    finally:
        child.kill()
        child.wait()
    assert judged_gone(me, child.pid) is True  # the pid is free
    assert judged_gone(None, os.getpid()) is None
