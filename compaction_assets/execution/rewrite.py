"""Driver side of the rewrite: all groups of a run in one Spark job, one task per entry of
`job.tasks` (execution/packing decides which groups share a task).

Uses only DataFrame APIs (`range` + `mapInArrow`), so it runs unchanged on a local session and
on Spark Connect.
"""

from __future__ import annotations

import functools

from pyspark.sql import SparkSession

from compaction_assets.execution.worker import (
    RESULT_SCHEMA,
    GroupOutcome,
    RewriteJob,
    outcome_from_row,
    rewrite_partition_batches,
)


def run_rewrite(spark: SparkSession, job: RewriteJob) -> list[GroupOutcome]:
    """Rewrite every group of `job` in parallel; outcomes come back in group order."""
    if not job.groups:
        return []
    count = len(job.tasks)
    worker = functools.partial(rewrite_partition_batches, job.to_json())
    rows = spark.range(0, count, 1, count).mapInArrow(worker, RESULT_SCHEMA).collect()
    return sorted((outcome_from_row(r.asDict()) for r in rows), key=lambda o: o.group)
