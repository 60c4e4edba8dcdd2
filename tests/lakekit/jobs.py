"""The rewrite job the engine would send to Spark, built without running it."""

from __future__ import annotations

from compaction_assets.engine import Engine, begin
from compaction_assets.execution.worker import RewriteJob
from compaction_assets.lake.catalog import load_table


def rewrite_job(engine: Engine, table_name: str) -> RewriteJob:
    """The rewrite job the engine would send to Spark for `table_name` (attempts begun in the ledger)."""
    table = load_table(engine.catalog, table_name)
    tplan, files = engine._plan(table, table_name, None)
    _, job, _, _, _ = begin.begin(
        engine.ledger, engine.config, table, table_name, tplan, files, tplan.to_compact, (None, len(tplan.to_compact))
    )
    return RewriteJob.from_json(job.to_json())
