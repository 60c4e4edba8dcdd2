"""Which groups share a Spark task: Polars groups of local files packed by bytes (LPT), every other
group alone (Polars groups on object storage or with delete files too); and a compaction whose groups share one task
keeps every partition's rows."""

from compaction_assets.engine import Engine, describe_phases
from compaction_assets.execution.packing import pack_tasks
from compaction_assets.lake.delete_files import commit_delete_files, position_delete_file
from compaction_assets.lake.digest import rows_digest
from tests.conftest import create_fragmented
from tests.lakekit.jobs import rewrite_job


def test_packable_groups_share_tasks_of_at_most_task_bytes_largest_first():
    sizes = [100, 100, 100, 50]
    assert pack_tasks(sizes, [True] * 4, 1_000) == [[0, 1, 2, 3]]
    # 350 bytes in tasks of 200: two tasks, LPT-balanced (200 + 150, not 300 + 50)
    tasks = pack_tasks(sizes, [True] * 4, 200)
    assert sorted(sum(sizes[i] for i in t) for t in tasks) == [150, 200]
    assert sorted(i for t in tasks for i in t) == [0, 1, 2, 3]
    # never more tasks than groups, whatever the bytes
    assert pack_tasks(sizes, [True] * 4, 1) == [[0], [1], [2], [3]]
    assert pack_tasks([0, 0], [True, True], 10) == [[0, 1]]


def test_other_groups_keep_a_task_each_and_the_biggest_task_comes_first():
    sizes = [10, 500, 20, 40]
    assert pack_tasks(sizes, [True, False, True, False], 1_000) == [[1], [3], [0, 2]]
    assert pack_tasks(sizes, [False] * 4, 1_000) == [[1], [3], [2], [0]]
    assert pack_tasks([], [], 1_000) == []


def test_the_engine_packs_the_polars_groups_of_a_run(lake):
    create_fragmented(lake, "ns.layout", {"eu": 10, "us": 10, "asia": 10})
    assert rewrite_job(lake.engine, "ns.layout").tasks == [[0, 1, 2]]

    create_fragmented(lake, "ns.layout_apart", {"eu": 10, "us": 10})
    config = lake.engine.config
    apart = Engine(
        config.model_copy(update={"spark": config.spark.model_copy(update={"task_bytes": 1})}),
        catalog=lake.catalog,
        ledger=lake.engine.ledger,
    )
    assert sorted(rewrite_job(apart, "ns.layout_apart").tasks) == [[0], [1]]


def test_groups_sharing_a_task_each_commit_their_own_partition(lake):
    table = create_fragmented(lake, "ns.packed", {"eu": 40, "us": 30, "asia": 20})
    before = rows_digest(table)

    outcomes = lake.engine.compact("ns.packed")

    assert sorted((o.partition_key, o.status, o.engine) for o in outcomes) == [
        ("region=asia", "committed", "polars"),
        ("region=eu", "committed", "polars"),
        ("region=us", "committed", "polars"),
    ]
    table = lake.table("ns.packed")
    assert rows_digest(table) == before
    # one run, one breakdown: its busiest task's group rewrites fit inside the Spark job
    phases = outcomes[0].phases
    assert all(o.phases is phases for o in outcomes)
    assert set(phases) == {"plan", "begin", "rewrite", "tasks", "workers", "workers_total", "commit"}
    assert phases["tasks"] == 1 and 0 < phases["workers"] == phases["workers_total"] <= phases["rewrite"]
    assert phases["plan"] > 0 and phases["commit"] > 0
    assert "spark" in describe_phases(phases)
    assert sorted(f["partition"]["region"] for f in table.inspect.files().to_pylist()) == ["asia", "eu", "us"]


def test_polars_groups_on_object_storage_keep_a_task_each(s3_lake):
    create_fragmented(s3_lake, "ns.remote", {"eu": 10, "us": 10})

    job = rewrite_job(s3_lake.engine, "ns.remote")

    assert [g.polars for g in job.groups] == [True, True]
    assert sorted(job.tasks) == [[0], [1]]


def test_polars_groups_with_delete_files_keep_a_task_each(lake):
    table = create_fragmented(lake, "ns.mor", {"eu": 10, "us": 10, "asia": 10})
    eu = [t.file for t in table.scan().plan_files() if t.file.partition[0] == "eu"]
    commit_delete_files(table, [position_delete_file(table, eu[0], [0, 1])])

    job = rewrite_job(lake.engine, "ns.mor")

    with_deletes = [i for i, g in enumerate(job.groups) if g.deletes]
    assert all(g.polars for g in job.groups) and len(with_deletes) == 1
    assert with_deletes in job.tasks and sorted(i for t in job.tasks for i in t) == [0, 1, 2]
    assert len(job.tasks) == 2  # the two without deletes still share one
