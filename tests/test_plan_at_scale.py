"""The planning-scale bench's table (bench/plan_at_scale.py), built small: a real Iceberg table
whose hard-linked files hold their partition's rows, planned like any other."""

import pyarrow.compute as pc

from compaction_assets.config import load_config
from compaction_assets.engine import Engine
from compaction_tools.bench import plan_at_scale


def test_the_generated_table_is_real_and_plans_every_partition(tmp_path):
    built = plan_at_scale.ensure_table(tmp_path, files=400, partitions=10, manifests=40, commits=10, log=lambda _: None)
    engine = Engine(load_config(tmp_path / "compaction.yaml"))
    table = engine.catalog.load_table(plan_at_scale.TABLE)

    assert built["generation_s"] > 0 and len(table.current_snapshot().manifests(table.io)) == 40
    rows = table.scan(row_filter="region == 'region-03'").to_arrow()
    assert rows.num_rows == 40 * plan_at_scale.ROWS_PER_FILE  # 40 links of its one file
    assert set(pc.unique(rows["region"]).to_pylist()) == {"region-03"}
    assert table.scan().to_arrow().num_rows == 400 * plan_at_scale.ROWS_PER_FILE
    plan = engine.plan(plan_at_scale.TABLE)
    assert len(plan.to_compact) == 10
    assert {p.partition_key for p in plan.partitions} == {f"ts_day=2024-01-01/region=region-{r:02d}" for r in range(10)}
    assert all(p.input_files == 40 and len(p.groups) == 1 for p in plan.to_compact)
