"""execution/write_behind.py: a sorted group's batches written on a thread of their own."""

import threading

import pyarrow as pa
import pytest

from compaction_assets.execution.write_behind import WriteBehind


def _batch(i: int) -> pa.RecordBatch:
    return pa.record_batch({"i": [i]})


def test_batches_are_written_in_order_on_another_thread_and_close_waits_for_all():
    written, threads = [], set()

    def write(batch):
        threads.add(threading.get_ident())
        written.append(batch.column(0)[0].as_py())

    with WriteBehind(write) as behind:
        for i in range(50):
            behind.put(_batch(i))
        behind.close()
        assert written == list(range(50))
    assert threads and threading.get_ident() not in threads


def test_a_failed_write_is_raised_by_a_later_put_or_close_and_later_batches_are_not_written():
    written = []

    def write(batch):
        if batch.column(0)[0].as_py() == 3:
            raise OSError("disk full")
        written.append(batch.column(0)[0].as_py())

    with pytest.raises(OSError, match="disk full"), WriteBehind(write, depth=2) as behind:
        for i in range(20):
            behind.put(_batch(i))
        behind.close()
    assert written == [0, 1, 2]  # the error surfaced within `depth` puts, and nothing after it was written


def test_at_most_depth_batches_wait_for_a_slow_writer():
    release = threading.Event()
    started = []

    def write(batch):
        started.append(batch)
        release.wait(10)

    with WriteBehind(write, depth=2) as behind:
        done = threading.Event()

        def produce():
            for i in range(5):
                behind.put(_batch(i))
            done.set()

        producer = threading.Thread(target=produce)
        producer.start()
        assert not done.wait(0.5)  # blocked: one batch being written, two waiting
        assert len(started) == 1
        release.set()
        producer.join(10)
        behind.close()
    assert done.is_set() and len(started) == 5
