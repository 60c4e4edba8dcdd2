"""The delete-file tiers as Spark tasks: each job of a TierRun is one task, run in a Python worker
(execution/delete_tiers.py does the work), its outcome a result row, its files made durable before
the driver sees them; a failure comes back as data, the job's files already deleted.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyiceberg.io import load_file_io
from pyiceberg.table.metadata import TableMetadataUtil

from compaction_assets.errors import worker_error
from compaction_assets.execution import durable
from compaction_assets.execution.dispatch import collect_rows
from compaction_assets.execution.worker import _reset_peak_rss, peak_rss
from compaction_assets.lake.datafile_codec import (
    datafile_from_json,
    datafile_to_json,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

from compaction_assets.execution.delete_tiers import (
    Tier,
    TierOutcome,
    TierRun,
    convert_equality_deletes,
    rewrite_position_deletes,
)

_TIERS = {
    Tier.CONVERT_EQUALITY_DELETES: convert_equality_deletes,
    Tier.REWRITE_POSITION_DELETES: rewrite_position_deletes,
}


def run_tier_job(run: TierRun, index: int) -> TierOutcome:
    """Run job `index` of `run`; any failure is reported as data (its files already deleted)."""
    job = run.jobs[index]
    _reset_peak_rss()
    try:
        metadata = TableMetadataUtil.parse_raw(run.metadata_json)
        io = load_file_io(run.io_properties, metadata.location)
        outcome = _TIERS[Tier(job.tier)](metadata, io, job, run.target_file_size_bytes, index)
    except Exception as exc:  # reported to the driver, which fails the attempt with this message
        error = worker_error(exc)
        return TierOutcome(index, job.tier, [], [], 0, 0, error=error, peak_rss=peak_rss())
    outcome.peak_rss = peak_rss()
    return outcome


TIER_RESULT_ARROW_SCHEMA = pa.schema(
    [
        ("job", pa.int32()),
        ("tier", pa.string()),
        ("delete_files", pa.string()),
        ("covered_data_files", pa.string()),
        ("rows_read", pa.int64()),
        ("rows_written", pa.int64()),
        ("rows_dropped", pa.int64()),
        ("bytes_read", pa.int64()),
        ("peak_rss", pa.int64()),
        ("error", pa.string()),
    ]
)


def run_tier_rows(run_json: str, indices: Iterable[int]) -> Iterator[dict]:
    """The Spark task function (execution/dispatch): one result row (TIER_RESULT_ARROW_SCHEMA) per job index."""
    run = TierRun.from_json(run_json)
    with durable.TaskOutputs(run.io_properties) as outputs:  # the driver commits only once they are on disk
        for index in indices:
            outcome = run_tier_job(run, index)
            outputs.add([f.file_path for f in outcome.delete_files])
            yield {
                **vars(outcome),
                "tier": str(outcome.tier),
                "delete_files": json.dumps([datafile_to_json(f) for f in outcome.delete_files]),
                "covered_data_files": json.dumps(outcome.covered_data_files),
            }


def outcome_from_row(row: dict) -> TierOutcome:
    return TierOutcome(
        **{
            **row,
            "delete_files": [datafile_from_json(d) for d in json.loads(row["delete_files"])],
            "covered_data_files": json.loads(row["covered_data_files"]),
        }
    )


def run_tiers(spark: SparkSession, run: TierRun) -> list[TierOutcome]:
    """Run every job of `run` on Spark, one task each; outcomes come back in job order."""
    if not run.jobs:
        return []
    rows = collect_rows(spark, len(run.jobs), functools.partial(run_tier_rows, run.to_json()), TIER_RESULT_ARROW_SCHEMA)
    return sorted((outcome_from_row(r) for r in rows), key=lambda o: o.job)
