"""The compaction engine: plan a table, rewrite its fragmented partitions on Spark, commit in two
phases. The CLI and the Dagster assets both call `Engine.compact`; nothing here imports Dagster.

Data expiration is a plan kind like the others (planning/expiration.py): its dropped files are
removed by the commit without being read, its other files are rewritten by the same Spark job with
a row filter, and rows are accounted for: rows written = rows read - rows deleted - rows expired.

The modules, in the order a compaction runs through them:
- facade.py: `Engine`, the verbs (plan, compact, expire, recover, gc, rewrite_manifests, set_enabled);
- table_plan.py: `TablePlan`, a table planned on its live files and the ledger;
- begin.py: a claimed attempt per planned partition, its share of the Spark work (execution/job.py);
- run.py: the Spark job, the precommit of each partition, the two-phase commit, the report;
- outcomes.py: `PartitionOutcome`, the reasons it gives, `describe_phases`.
"""

from compaction_assets.engine.facade import Engine
from compaction_assets.engine.outcomes import PartitionOutcome, describe_phases
from compaction_assets.engine.table_plan import TablePlan
from compaction_assets.execution.job import SORTED_KINDS

__all__ = ["SORTED_KINDS", "Engine", "PartitionOutcome", "TablePlan", "describe_phases"]
