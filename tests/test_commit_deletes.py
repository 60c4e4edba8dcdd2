"""The commit side of merge-on-read, on real tables with real delete files: a `replace` snapshot
removes the delete files its swap leaves dangling (and only those), commits delete-file rewrites
(the cheaper tiers), and validates both against concurrent changes. Attempts are made by hand
(PREPARED ledger rows whose result files the test writes with the live rows the spec's reader
computes), so no Spark is needed; rows are checked with the spec reader and, where it reads right,
DuckDB."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent
from pyiceberg.table import Table
from pyiceberg.typedef import Record

import compaction_assets.commit.rewrite_producer as rewrite_producer
import compaction_assets.commit.two_phase as two_phase
from compaction_assets.commit.consistency import check_consistency
from compaction_assets.commit.ledger import Attempt, Ledger, Status
from compaction_assets.commit.recovery import recover
from compaction_assets.commit.two_phase import CommitResult, commit_together
from compaction_assets.errors import BackOff
from compaction_assets.lake.datafile_codec import datafile_from_json, datafile_to_json
from compaction_assets.lake.delete_files import FILE_PATH_ID, POS_ID, position_delete_file
from compaction_assets.lake.files import LiveFile, live_files
from compaction_assets.lake.manifest_io import ManifestContents
from compaction_assets.lake.storage import Claims, delete_unreferenced
from tests.conftest import BY_REGION, SCHEMA, batch, postgres_schema
from tests.foreign_deletes import commit_deletes, equality_delete
from tests.lakekit.duckdb_reader import duckdb_multiset
from tests.lakekit.oracle import Row, row_key
from tests.lakekit.spec_reader import spec_rows


@dataclass
class Env:
    root: Path
    catalog: SqlCatalog
    ledger: Ledger

    def table(self) -> Table:
        return self.catalog.load_table("ns.t")


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    ledger = Ledger(f"sqlite:///{tmp_path}/state.db")
    yield Env(tmp_path, catalog, ledger)
    ledger.dispose()
    catalog.engine.dispose()


def make_table(env: Env, files: dict[str, int], rows: int = 10, global_spec: bool = False) -> Table:
    """One data file (and snapshot) per append, `files[region]` of them per region. `global_spec`:
    the table starts unpartitioned (spec 0, so deletes of spec 0 are global), then by region."""
    if global_spec:
        table = env.catalog.create_table("ns.t", schema=SCHEMA)
        with table.update_spec() as update:
            update.add_identity("region")
    else:
        env.catalog.create_table("ns.t", schema=SCHEMA, partition_spec=BY_REGION)
    start = 0
    for region, count in files.items():
        for _ in range(count):
            env.table().append(batch(start, rows, region))
            start += rows
    return env.table()


def live(table: Table) -> dict[str, LiveFile]:
    return {f.path: f for f in live_files(table)}


def data(table: Table, region: str = "eu") -> list[DataFile]:
    """The region's live data files, oldest first."""
    files = [f for f in live_files(table) if not f.is_delete and f.partition_key == f"region={region}"]
    return [f.data_file for f in sorted(files, key=lambda f: (f.data_sequence_number, f.path))]


def ids(data_file: DataFile) -> list[int]:
    return pq.read_table(data_file.file_path.removeprefix("file://"), columns=["id"])["id"].to_pylist()


def multiset(table: Table) -> Counter[Row]:
    return Counter(row_key(r) for r in spec_rows(table))


def head(table: Table) -> int:
    return table.current_snapshot().snapshot_id


def write_parquet(table: Table, arrow: pa.Table, path: str) -> tuple[int, pq.FileMetaData]:
    with table.io.new_output(path).create() as stream:
        writer = pq.ParquetWriter(stream, arrow.schema)
        writer.write_table(arrow)
        writer.close()
    return len(table.io.new_input(path)), writer.writer.metadata


def out_dir(table: Table) -> str:
    return f"{table.location()}/data/results"


def rewritten(table: Table, sources: list[DataFile], attempt_id: str, deletes: bool = True) -> list[DataFile]:
    """The live rows of `sources` (as the spec reads `table` now; every row if not `deletes`) in one
    data file of their partition named after the attempt, or no file if none is live."""
    wanted = {i for f in sources for i in ids(f)}
    if deletes:
        rows = [r for r in spec_rows(table) if r["id"] in wanted]
    else:
        rows = [r for f in sources for r in pq.read_table(local(f.file_path)).to_pylist()]
    if not rows:
        return []
    schema = table.schema()
    arrow = pa.Table.from_pylist(rows, schema=schema_to_pyarrow(schema))
    path = f"{out_dir(table)}/{attempt_id}-0.parquet"
    size, metadata = write_parquet(table, arrow, path)
    stats = data_file_statistics_from_parquet_metadata(
        metadata, compute_statistics_plan(schema, table.properties), parquet_path_to_id_mapping(schema)
    )
    result = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=sources[0].partition,
        file_size_in_bytes=size,
        **stats.to_serialized_dict(),
    )
    result.spec_id = sources[0].spec_id
    return [result]


def combined_position_delete(table: Table, rows: list[tuple[str, int]], like: DataFile, attempt_id: str) -> DataFile:
    """One position delete file holding (file_path, pos) rows of several data files, sorted as the
    spec requires, with file_path bounds as Java's writer records them."""
    rows = sorted(rows)
    arrow = pa.table(
        {"file_path": [p for p, _ in rows], "pos": [i for _, i in rows]},
        schema=pa.schema(
            [
                pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID)}),
                pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID)}),
            ]
        ),
    )
    path = f"{out_dir(table)}/{attempt_id}-pos.parquet"
    size, _ = write_parquet(table, arrow, path)
    delete = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=like.partition,
        record_count=len(rows),
        file_size_in_bytes=size,
        lower_bounds={FILE_PATH_ID: rows[0][0].encode()},
        upper_bounds={FILE_PATH_ID: rows[-1][0].encode()},
    )
    delete.spec_id = like.spec_id
    return delete


def positions(data_file: DataFile, doomed: set[int]) -> list[int]:
    return [pos for pos, i in enumerate(ids(data_file)) if i in doomed]


def prepare(
    env: Env,
    table: Table,
    sources: list[DataFile],
    results,  # Callable[[str], list[DataFile]]: writes the results, given the attempt id
    kind: str = "major",
    covered: list[DataFile] | None = None,
    base: int | None = None,
    key: str = "region=eu",
) -> Attempt:
    """A PREPARED attempt replacing `sources` by what `results` writes, planned on `base` (default: the head)."""
    attempt = env.ledger.begin(
        uuid.uuid4().hex,
        "ns.t",
        key,
        kind,
        head(table) if base is None else base,
        [f.file_path for f in sources],
        [out_dir(table)],
        sum(f.record_count for f in sources),
        sum(f.file_size_in_bytes for f in sources),
    )
    written = results(attempt.attempt_id)
    docs = [datafile_to_json(f) for f in written]
    rows, size = sum(f.record_count for f in written), sum(f.file_size_in_bytes for f in written)
    covered_files = None if covered is None else [f.file_path for f in covered]  # as a tier job reports them
    return env.ledger.prepare(attempt.attempt_id, docs, rows, size, covered_files=covered_files)


def commit(env: Env, *attempts: Attempt) -> dict[str, CommitResult]:
    results: dict[str, CommitResult] = {}
    commit_together(env.table(), env.ledger, list(attempts), results)
    return results


def committed(results: dict[str, CommitResult], attempt: Attempt) -> Attempt:
    result = results[attempt.attempt_id]
    assert isinstance(result, Attempt) and result.status == Status.COMMITTED, result
    return result


def summary(table: Table) -> dict[str, str]:
    return table.current_snapshot().summary.additional_properties


def consistent(env: Env, table: Table, attempt: Attempt) -> bool:
    report = check_consistency(table, env.ledger, attempt.partition_key, attempt.task_id, 3600)
    assert report.attempts_checked == 1 and report.passed, report.problems
    return True


def local(path: str) -> Path:
    return Path(path.removeprefix("file://"))


@pytest.mark.parametrize("restated", [True, False], ids=["bytes-restated", "entries-written"])
def test_position_deletes_of_replaced_files_are_removed_with_them(env, monkeypatch, restated):
    """Removed deletes are restated from the manifest's bytes (lake.manifest_io), or written
    entry by entry by a delete-manifest writer when a manifest cannot be restated."""
    if not restated:
        real = rewrite_producer.manifest_contents

        def unrestatable(manifest, io) -> ManifestContents:
            return ManifestContents(real(manifest, io).entries, None, ())

        monkeypatch.setattr(rewrite_producer, "manifest_contents", unrestatable)
    table = make_table(env, {"eu": 4, "us": 2})
    f0, f1, f2, f3 = data(table)
    d0 = position_delete_file(table, f0, [0, 1])
    d1 = position_delete_file(table, f1, [5])
    d3 = position_delete_file(table, f3, [2])  # on a file the rewrite keeps
    commit_deletes(table, [d0, d1, d3])
    table = env.table()
    expected = multiset(table)

    attempt = prepare(env, table, [f0, f1, f2], lambda a: rewritten(env.table(), [f0, f1, f2], a))
    result = committed(commit(env, attempt), attempt)

    table = env.table()
    assert multiset(table) == expected == duckdb_multiset(table)
    assert {d0.file_path, d1.file_path} & live(table).keys() == set()
    assert d3.file_path in live(table)
    assert sorted(result.removed_deletes) == sorted([d0.file_path, d1.file_path])
    s = summary(table)
    assert (s["removed-delete-files"], s["removed-position-deletes"], s["total-delete-files"]) == ("2", "3", "1")
    assert (s["deleted-data-files"], s["added-data-files"], s["total-position-deletes"]) == ("3", "1", "1")
    assert consistent(env, table, attempt)  # fewer rows out than in: the deletes applied
    delete_manifests = [m for m in table.current_snapshot().manifests(table.io) if m.content == ManifestContent.DELETES]
    assert {m.deleted_files_count for m in delete_manifests} == {0, 2}  # the removed ones, and d3 EXISTING


def test_a_partition_scoped_position_delete_naming_a_kept_file_stays(env):
    table = make_table(env, {"eu": 3})
    f0, f1, f2 = data(table)
    # rows for f0 and f2 in one file, bounds spanning both: it still applies to f2 after the swap
    shared = combined_position_delete(table, [(f0.file_path, 0), (f2.file_path, 1)], f0, "foreign")
    commit_deletes(table, [shared])
    table = env.table()
    expected = multiset(table)

    attempt = prepare(env, table, [f0, f1], lambda a: rewritten(env.table(), [f0, f1], a))
    result = committed(commit(env, attempt), attempt)

    table = env.table()
    assert shared.file_path in live(table)
    assert result.removed_deletes == []
    assert "removed-delete-files" not in summary(table)
    assert multiset(table) == expected == duckdb_multiset(table)


@pytest.mark.parametrize("keep_older", [False, True], ids=["older-than-every-file-left", "applies-to-a-kept-file"])
def test_an_equality_delete_is_removed_only_when_no_live_file_is_older(env, keep_older):
    table = make_table(env, {"eu": 3, "us": 1})
    f0, f1, f2 = data(table)
    eq = equality_delete(table, [ids(f0)[0], ids(f1)[3], ids(f2)[4]], spec_id=0, partition=f0.partition)
    commit_deletes(table, [eq])
    env.table().append(batch(1000, 10, "eu"))  # newer than the delete: it never applies to this file
    table = env.table()
    expected = multiset(table)
    sources = [f0, f1] if keep_older else [f0, f1, f2]

    attempt = prepare(env, table, sources, lambda a: rewritten(env.table(), sources, a))
    result = committed(commit(env, attempt), attempt)

    table = env.table()
    assert multiset(table) == expected
    if keep_older:  # f2 is older than the delete and stays: the delete still removes one of its rows
        assert eq.file_path in live(table) and result.removed_deletes == []
    else:
        assert eq.file_path not in live(table) and result.removed_deletes == [eq.file_path]
        s = summary(table)
        assert (s["removed-equality-deletes"], s["removed-delete-files"], s["total-delete-files"]) == ("3", "1", "0")
        assert duckdb_multiset(table) == expected  # no equality delete left for DuckDB to misapply


def test_a_global_equality_delete_goes_once_no_partition_needs_it(env):
    table = make_table(env, {"eu": 2, "us": 2}, global_spec=True)
    eu, us = data(table, "eu"), data(table, "us")
    glob = equality_delete(table, [ids(eu[0])[1], ids(us[1])[2]], spec_id=0, partition=Record())
    commit_deletes(table, [glob])
    table = env.table()
    expected = multiset(table)
    assert duckdb_multiset(table) == expected

    first = prepare(env, table, eu, lambda a: rewritten(env.table(), eu, a))
    committed(commit(env, first), first)
    table = env.table()
    assert glob.file_path in live(table)  # still applies to the us files
    assert multiset(table) == expected == duckdb_multiset(table)

    # two partitions in one snapshot: the delete dangles only once both are swapped
    eu, us = data(table, "eu"), data(table, "us")
    again = prepare(env, table, eu, lambda a: rewritten(env.table(), eu, a))
    other = prepare(env, table, us, lambda a: rewritten(env.table(), us, a), key="region=us")
    results = commit(env, again, other)
    table = env.table()
    assert glob.file_path not in live(table)
    removed = committed(results, again).removed_deletes + committed(results, other).removed_deletes
    assert removed == [glob.file_path]  # counted once
    assert summary(table)["removed-delete-files"] == "1"
    assert multiset(table) == expected == duckdb_multiset(table)


def test_an_equality_delete_committed_after_the_base_stays_and_applies_to_the_results(env):
    table = make_table(env, {"eu": 3})
    f0, f1, f2 = data(table)
    attempt = prepare(env, table, [f0, f1, f2], lambda a: rewritten(env.table(), [f0, f1, f2], a))
    late = equality_delete(env.table(), [ids(f1)[0], ids(f2)[9]], spec_id=0, partition=f0.partition)
    commit_deletes(env.table(), [late])
    expected = multiset(env.table())
    assert sum(expected.values()) == 28

    result = committed(commit(env, attempt), attempt)

    table = env.table()
    assert late.file_path in live(table) and result.removed_deletes == []
    assert multiset(table) == expected


def test_a_position_delete_committed_after_the_base_makes_the_commit_back_off(env):
    table = make_table(env, {"eu": 3})
    f0, f1, f2 = data(table)
    attempt = prepare(env, table, [f0, f1, f2], lambda a: rewritten(env.table(), [f0, f1, f2], a))
    [result_file] = attempt.result_files
    commit_deletes(env.table(), [position_delete_file(env.table(), f1, [4])])
    expected = multiset(env.table())

    results = commit(env, attempt)

    assert isinstance(results[attempt.attempt_id], BackOff)
    assert "added after the base snapshot" in str(results[attempt.attempt_id])
    assert env.ledger.get(attempt.attempt_id).status == Status.ROLLED_BACK
    assert not local(result_file["file_path"]).exists()  # swept: nothing references it
    table = env.table()
    assert multiset(table) == expected == duckdb_multiset(table)


def test_converting_equality_deletes_to_position_deletes(env):
    table = make_table(env, {"eu": 3, "us": 1})
    f0, f1, f2 = data(table)
    doomed = {ids(f0)[2], ids(f1)[7], ids(f1)[8]}
    eq = equality_delete(table, sorted(doomed), spec_id=0, partition=f0.partition)
    commit_deletes(table, [eq])
    table = env.table()
    expected = multiset(table)

    def convert(attempt_id: str) -> list[DataFile]:
        rows = [(f.file_path, p) for f in (f0, f1, f2) for p in positions(f, doomed)]
        return [combined_position_delete(env.table(), rows, f0, attempt_id)]

    attempt = prepare(env, table, [eq], convert, kind="convert-equality-deletes", covered=[f0, f1, f2])
    [doc] = attempt.result_files
    result = committed(commit(env, attempt), attempt)

    table = env.table()
    assert eq.file_path not in live(table)
    added = live(table)[doc["file_path"]]
    assert added.data_file.content == DataFileContent.POSITION_DELETES
    assert added.data_sequence_number == table.current_snapshot().sequence_number  # inherited
    assert result.removed_deletes == [eq.file_path]
    s = summary(table)
    assert (s["removed-equality-deletes"], s["added-position-deletes"], s["total-delete-files"]) == ("3", "3", "1")
    assert "added-data-files" not in s and s["total-data-files"] == "4"
    assert multiset(table) == expected == duckdb_multiset(table)
    assert local(doc["file_path"]).exists()  # the commit's sweep keeps its live result
    assert consistent(env, table, attempt)


def race(monkeypatch, other) -> list[bool]:
    """Run `other()` once, after commit_together's checks and before its snapshot is made: the
    first try then commits on a stale head and pyiceberg retries on the new one."""
    real, raced = two_phase._commit_once, []

    def racing(table_, attempts, live_):
        if not raced:
            raced.append(True)
            other()
        real(table_, attempts, live_)

    monkeypatch.setattr(two_phase, "_commit_once", racing)
    return raced


@pytest.mark.parametrize("when", ["before-the-commit", "inside-the-commit"])
def test_converting_equality_deletes_backs_off_when_a_file_it_did_not_cover_needs_them(env, monkeypatch, when):
    """Another engine rewrote a covered file keeping its old data sequence number (as Java's
    RewriteFiles does) after the conversion was planned: the delete applies to the new file,
    whose positions the conversion never computed, so replacing the delete would resurrect rows.
    Seen by the check before the commit, or by the commit try itself when it lands in between."""
    table = make_table(env, {"eu": 3})
    f0, f1, f2 = data(table)
    before_delete = head(table)
    doomed = {ids(f0)[1], ids(f2)[3]}
    eq = equality_delete(table, sorted(doomed), spec_id=0, partition=f0.partition)
    commit_deletes(table, [eq])
    table = env.table()

    def convert(attempt_id: str) -> list[DataFile]:
        rows = [(f.file_path, p) for f in (f0, f2) for p in positions(f, doomed)]
        return [combined_position_delete(env.table(), rows, f0, attempt_id)]

    conversion = prepare(env, table, [eq], convert, kind="convert-equality-deletes", covered=[f0, f1, f2])
    expected = multiset(table)
    # the other engine's rewrite of f0, planned before the delete (its rows all there): its result
    # keeps that data sequence number, so the delete applies to it
    other = prepare(env, table, [f0], lambda a: rewritten(env.table(), [f0], a, deletes=False), base=before_delete)
    if when == "before-the-commit":
        committed(commit(env, other), other)
    else:
        race(monkeypatch, lambda: committed(commit(env, other), other))

    results = commit(env, conversion)

    assert isinstance(results[conversion.attempt_id], BackOff)
    assert "did not cover" in str(results[conversion.attempt_id])
    table = env.table()
    assert eq.file_path in live(table) and other.source_files[0] not in live(table)
    assert multiset(table) == expected


def test_an_incomplete_covered_set_backs_off(env):
    table = make_table(env, {"eu": 3})
    f0, f1, f2 = data(table)
    eq = equality_delete(table, [ids(f2)[0]], spec_id=0, partition=f0.partition)
    commit_deletes(table, [eq])
    table = env.table()
    attempt = prepare(env, table, [eq], lambda a: [], kind="convert-equality-deletes", covered=[f0, f1])

    results = commit(env, attempt)

    assert "did not cover" in str(results[attempt.attempt_id])
    assert eq.file_path in live(env.table())


def test_combining_position_delete_files(env):
    table = make_table(env, {"eu": 3, "us": 1})
    f0, f1, f2 = data(table)
    small = [position_delete_file(table, f, [i, i + 2]) for i, f in enumerate((f0, f1, f2))]
    other = position_delete_file(table, data(table, "us")[0], [0])
    commit_deletes(table, [*small, other])
    table = env.table()
    expected = multiset(table)
    rows = [(f.file_path, p) for i, f in enumerate((f0, f1, f2)) for p in (i, i + 2)]

    attempt = prepare(
        env,
        table,
        small,
        lambda a: [combined_position_delete(env.table(), rows, f0, a)],
        kind="rewrite-position-deletes",
    )
    result = committed(commit(env, attempt), attempt)

    table = env.table()
    assert {d.file_path for d in small} & live(table).keys() == set()
    assert other.file_path in live(table)
    assert sorted(result.removed_deletes) == sorted(d.file_path for d in small)
    s = summary(table)
    assert (s["removed-delete-files"], s["added-delete-files"], s["total-delete-files"]) == ("3", "1", "2")
    assert multiset(table) == expected == duckdb_multiset(table)


def test_combining_position_deletes_backs_off_when_one_is_gone(env):
    """A compaction (ours or another engine's) removed one of the files to combine as dangling."""
    table = make_table(env, {"eu": 3})
    f0, f1, f2 = data(table)
    small = [position_delete_file(table, f, [1]) for f in (f0, f1)]
    commit_deletes(table, small)
    table = env.table()
    rows = [(f.file_path, 1) for f in (f0, f1)]
    combine = prepare(
        env,
        table,
        small,
        lambda a: [combined_position_delete(env.table(), rows, f0, a)],
        kind="rewrite-position-deletes",
    )
    [doc] = combine.result_files
    rewrite = prepare(env, table, [f0], lambda a: rewritten(env.table(), [f0], a))
    assert committed(commit(env, rewrite), rewrite).removed_deletes == [small[0].file_path]
    expected = multiset(env.table())

    results = commit(env, combine)

    assert "no longer live" in str(results[combine.attempt_id])
    assert not local(doc["file_path"]).exists()
    table = env.table()
    assert small[1].file_path in live(table)
    assert multiset(table) == expected == duckdb_multiset(table)


def test_dangling_deletes_are_decided_on_the_head_the_commit_lands_on(env, monkeypatch):
    """Another engine commits between our pre-check and our snapshot (the first try fails on the
    stale head; pyiceberg retries on the new one): its rewrite of the only other file the equality
    delete applied to makes the delete dangle there, and the retry removes it."""
    table = make_table(env, {"eu": 3})
    f0, f1, f2 = data(table)
    eq = equality_delete(table, [ids(f0)[0], ids(f2)[0]], spec_id=0, partition=f0.partition)
    commit_deletes(table, [eq])
    table = env.table()
    expected = multiset(table)
    ours = prepare(env, table, [f0, f1], lambda a: rewritten(env.table(), [f0, f1], a))
    theirs = prepare(env, table, [f2], lambda a: rewritten(env.table(), [f2], a))  # base after the delete
    raced = race(monkeypatch, lambda: committed(commit(env, theirs), theirs))

    result = committed(commit(env, ours), ours)

    table = env.table()
    assert raced and eq.file_path not in live(table)
    assert result.removed_deletes == [eq.file_path]
    assert env.ledger.get(theirs.attempt_id).removed_deletes == []
    assert multiset(table) == expected == duckdb_multiset(table)


def test_a_dangling_delete_another_commit_removed_first_is_no_conflict(env, monkeypatch):
    """An equality delete matching no row: another engine's conversion replaces it by nothing
    while our first try, on the stale head, removes it as dangling; the retry leaves it be."""
    table = make_table(env, {"eu": 2})
    f0, f1 = data(table)
    eq = equality_delete(table, [99_999], spec_id=0, partition=f0.partition)
    commit_deletes(table, [eq])
    table = env.table()
    expected = multiset(table)
    ours = prepare(env, table, [f0, f1], lambda a: rewritten(env.table(), [f0, f1], a))
    theirs = prepare(env, table, [eq], lambda a: [], kind="convert-equality-deletes", covered=[f0, f1])
    raced = race(monkeypatch, lambda: committed(commit(env, theirs), theirs))

    result = committed(commit(env, ours), ours)

    table = env.table()
    assert raced and eq.file_path not in live(table)
    assert result.removed_deletes == [] and env.ledger.get(theirs.attempt_id).removed_deletes == [eq.file_path]
    assert "removed-delete-files" not in summary(table)
    assert multiset(table) == expected == duckdb_multiset(table)


def test_a_position_delete_rewritten_after_the_base_is_a_conflict(env, monkeypatch):
    """Another engine combines the position deletes of a file we replace while we commit: the
    combined file is a position delete added after our base that can apply to it (we cannot
    tell which positions it holds without reading it), so we back off, as Java's RewriteFiles."""
    table = make_table(env, {"eu": 2})
    f0, f1 = data(table)
    d0 = position_delete_file(table, f0, [3])
    commit_deletes(table, [d0])
    table = env.table()
    expected = multiset(table)
    ours = prepare(env, table, [f0, f1], lambda a: rewritten(env.table(), [f0, f1], a))
    theirs = prepare(
        env,
        table,
        [d0],
        lambda a: [combined_position_delete(env.table(), [(f0.file_path, 3)], f0, a)],
        kind="rewrite-position-deletes",
    )
    race(monkeypatch, lambda: committed(commit(env, theirs), theirs))

    results = commit(env, ours)

    assert "added after the base snapshot" in str(results[ours.attempt_id])
    [combined] = theirs.result_files
    table = env.table()
    assert combined["file_path"] in live(table) and d0.file_path not in live(table)
    assert multiset(table) == expected == duckdb_multiset(table)


def test_recovery_of_prepared_delete_file_attempts(env):
    table = make_table(env, {"eu": 3})
    f0, f1, f2 = data(table)
    small = [position_delete_file(table, f, [2]) for f in (f0, f1, f2)]
    commit_deletes(table, small)
    table = env.table()
    expected = multiset(table)
    rows = [(f.file_path, 2) for f in (f0, f1)]
    # the first was committed by a process that died before marking it, and its snapshot expired since
    landed = prepare(
        env,
        table,
        small[:2],
        lambda a: [combined_position_delete(env.table(), rows, f0, a)],
        kind="rewrite-position-deletes",
    )
    two_phase._commit_once(env.table(), [landed], {p: f.data_file for p, f in live(env.table()).items()})
    env.table().append(batch(5000, 3, "eu"))
    expected += Counter(row_key(r) for r in batch(5000, 3, "eu").to_pylist())
    snapshot = two_phase.commit_snapshot(env.table(), landed)
    env.table().maintenance.expire_snapshots().by_id(snapshot.snapshot_id).commit()
    assert two_phase.commit_snapshot(env.table(), landed) is None
    # the second never reached the catalog
    pending = prepare(
        env,
        env.table(),
        [small[2]],
        lambda a: [combined_position_delete(env.table(), [(f2.file_path, 2)], f2, a)],
        kind="rewrite-position-deletes",
    )

    report = recover(env.catalog, env.ledger, executing_timeout_seconds=0)

    assert report.confirmed == [landed.attempt_id] and report.recommitted == [pending.attempt_id], report
    table = env.table()
    results = {d["file_path"] for a in (landed, pending) for d in a.result_files}
    assert results <= live(table).keys()
    assert not {d.file_path for d in small} & live(table).keys()
    assert all(local(p).exists() for p in results)
    assert env.ledger.get(pending.attempt_id).removed_deletes == [small[2].file_path]
    assert multiset(table) == expected == duckdb_multiset(table)
    # nothing deletes a live delete file, whoever asks
    assert delete_unreferenced(table, sorted(results), Claims()) == 0
    assert all(local(p).exists() for p in results)


def test_delete_files_round_trip_through_the_ledger_codec(env):
    table = make_table(env, {"eu": 1})
    [f0] = data(table)
    for delete in (
        position_delete_file(table, f0, [1, 4]),
        equality_delete(table, [3], spec_id=0, partition=f0.partition),
    ):
        back = datafile_from_json(datafile_to_json(delete))
        assert (back.content, back.equality_ids, back.spec_id, back.partition) == (
            delete.content,
            delete.equality_ids,
            delete.spec_id,
            delete.partition,
        )
        # the file_path bounds say which data files a position delete can apply to
        assert (back.lower_bounds, back.upper_bounds) == (delete.lower_bounds or {}, delete.upper_bounds or {})


OLD_LEDGER = """CREATE TABLE compaction_attempts (
    attempt_id VARCHAR(64) PRIMARY KEY, task_id VARCHAR(255), attempt_number INTEGER,
    table_name VARCHAR(512), partition_key TEXT, kind VARCHAR(16), status VARCHAR(16),
    base_snapshot_id BIGINT, source_files JSON, result_files JSON, output_dirs JSON,
    rows_in BIGINT, bytes_in BIGINT, rows_out BIGINT, bytes_out BIGINT, committed_snapshot_id BIGINT,
    reason TEXT, host VARCHAR(255), pid INTEGER, created_at TIMESTAMP WITH TIME ZONE,
    updated_at TIMESTAMP WITH TIME ZONE, finished_at TIMESTAMP WITH TIME ZONE)"""


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_ledger_from_before_merge_on_read_is_migrated(tmp_path, backend):
    with postgres_schema() if backend == "postgres" else nullcontext(f"sqlite:///{tmp_path}/old.db") as url:
        engine = sqlalchemy.create_engine(url)
        with engine.begin() as connection:
            connection.execute(sqlalchemy.text(OLD_LEDGER))
            connection.execute(
                sqlalchemy.text(
                    "INSERT INTO compaction_attempts VALUES ('old', 't', 1, 'ns.t', '', 'minor', 'COMMITTED', 1, "
                    "'[]', '[]', '[]', 0, 0, 0, 0, 1, NULL, 'h', 1, '2026-01-01 00:00:00+00:00', "
                    "'2026-01-01 00:00:00+00:00', NULL)"
                )
            )
        engine.dispose()
        for _ in range(2):  # opening it again finds it migrated
            ledger = Ledger(url)
            old = ledger.get("old")
            assert (old.covered_files, old.removed_deletes) == (None, [])
            new = ledger.begin(
                "t2", "ns.t", "", "convert-equality-deletes", 1, ["e"], ["/d"], 0, 0, covered_files=["a"]
            )
            ledger.prepare(new.attempt_id, [], 0, 0)
            done = ledger.mark_committed(new.attempt_id, 7, ["e"])
            assert (done.kind, done.covered_files, done.removed_deletes) == ("convert-equality-deletes", ["a"], ["e"])
            ledger.dispose()
