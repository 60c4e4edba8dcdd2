"""What the CLI prints: a table's plan (`plan`, text and JSON) and compaction outcomes."""

from __future__ import annotations

from dataclasses import asdict

import click

from compaction_assets.engine.outcomes import PartitionOutcome
from compaction_assets.engine.table_plan import TablePlan
from compaction_assets.planning.manifests import ManifestPlan
from compaction_assets.planning.planner import Kind, PartitionPlan


def plan_doc(table: str, tplan: TablePlan, in_flight: list[str]) -> dict:
    """`plan --json`: the table's plan as a document."""
    return {
        "table": table,
        "snapshot_id": tplan.snapshot_id,
        "policy": asdict(tplan.policy),
        "refused": tplan.refused,
        "partitions": [
            {
                "partition": p.partition_key,
                "kind": p.kind,
                "reason": p.reason,
                "benefit": round(p.benefit, 4),
                "stats": asdict(p.stats),
                "groups": [{"files": len(g.paths), "bytes": g.bytes} for g in p.groups],
                "delete_paths": list(p.delete_paths),
                "covered_data_paths": list(p.covered_data_paths),
                "drop_paths": list(p.drop_paths),
                "expired_rows_estimate": p.expired_rows,
            }
            for p in tplan.partitions
        ],
        "manifests": _manifests_doc(tplan.manifests),
        "in_flight": in_flight,
    }


def plan_lines(table: str, tplan: TablePlan, in_flight: list[str]) -> list[str]:
    """`plan`: the policy, then a line per partition and what is in flight."""
    lines = [_policy_line(table, tplan)]
    lines += _table_notes(tplan)
    lines.append(
        f"{'partition':32} {'files':>6} {'bytes':>12} {'frag':>5} {'under':>5} {'posdel':>6} {'eqdel':>5} "
        f"{'deleted':>9} {'ratio':>5} {'amp':>6}  plan"
    )
    for p in tplan.partitions:
        s = p.stats
        lines.append(
            f"{p.partition_key or '(unpartitioned)':32} {s.data_files:>6} {s.data_bytes:>12} "
            f"{s.fragments:>5} {s.undersized:>5} {s.position_delete_files:>6} {s.equality_delete_files:>5} "
            f"{s.deleted_rows:>9} {s.delete_ratio:>5.2f} {s.read_amplification:>6.2f}  {_partition_plan(p)}"
        )
    lines.append(f"{len(tplan.to_compact)} of {len(tplan.partitions)} partition(s) to compact")
    for line in in_flight:
        lines.append(f"in flight: {line}")
    if (m := tplan.manifests) is not None:
        lines.append(_manifests_line(m, bool(tplan.to_compact)))
    return lines


def _policy_line(table: str, tplan: TablePlan) -> str:
    """`plan`'s first line: the table's snapshot and compaction policy."""
    policy = tplan.policy
    return (
        f"{table} @ snapshot {tplan.snapshot_id}: target {policy.target_file_size_bytes} B, "
        f"fragment <= {policy.fragment_max_bytes} B, undersized < {policy.undersized_below_bytes} B, "
        f"min_input_files {policy.min_input_files}; delete triggers: >= {policy.delete_file_threshold} delete "
        f"files on a file, deleted-row ratio >= {policy.delete_ratio_threshold}; tiers: >= "
        f"{policy.equality_delete_file_threshold} equality-delete files, >= "
        f"{policy.position_delete_file_threshold} small position-delete files; split > {policy.split_above_bytes} B; "
        + (
            f"full every {policy.full_trigger_interval_ms} ms"
            if policy.full_trigger_interval_ms is not None
            else "full optimizing off"
        )
    )


def _table_notes(tplan: TablePlan) -> list[str]:
    """`plan`'s table-wide notes: clustering, why it is not compacted, data expiration."""
    lines = []
    policy = tplan.policy
    if tplan.clustering:
        lines.append(
            f"clustering: {tplan.clustering.describe()}; cluster when bounds overlap >= "
            f"{policy.cluster_min_overlap:g}; sorted rewrites spill beyond {policy.sort_memory_bytes} B"
        )
    if tplan.refused:
        lines.append(f"not compacted: {tplan.refused}")
    if tplan.expire is not None:
        expiry = tplan.expire if isinstance(tplan.expire, str) else f"expires rows where {tplan.expire.describe()}"
        lines.append(f"data expiration: {expiry}")
    return lines


def _partition_plan(p: PartitionPlan) -> str:
    """Decides a partition's plan column: nothing, expiry, a delete tier or a rewrite."""
    if not p.worth_compacting:
        return f"nothing: {p.reason}"
    if p.drop_paths or p.kind == Kind.EXPIRE:
        return f"{expire_summary(p)}, benefit {p.benefit:.2f}; {p.reason}"
    if p.is_tier:
        return (
            f"{len(p.delete_paths)} delete files over {len(p.covered_data_paths)} data files, "
            f"benefit {p.benefit:.2f}; {p.reason}"
        )
    return f"{p.input_files} files in {len(p.groups)} group(s), benefit {p.benefit:.2f}; {p.reason}"


def _manifests_line(m: ManifestPlan, compacting: bool) -> str:
    """Decides the table's manifest line: nothing due, after the compactions, or on its own."""
    if not m.due:
        return f"table: nothing: {m.reason}"
    if compacting:
        return f"table: {m.kind} after the compactions (they merge manifests too): {m.reason}"
    return f"table: {m.kind}, benefit {m.benefit:.2f}; {m.reason}"


def _manifests_doc(m: ManifestPlan | None) -> dict | None:
    if m is None:
        return None
    return {
        "kind": m.kind if m.due else None,
        "due": m.due,
        "reason": m.reason,
        "benefit": round(m.benefit, 4),
        "manifests": m.manifests,
        "small": m.small,
        "entries": m.entries,
        "avg_entries": round(m.avg_entries, 2),
        "expected_outputs": m.expected_outputs,
    }


def expire_summary(p: PartitionPlan) -> str:
    """What a data expiration of one partition would remove: files dropped unread, files rewritten."""
    dropped = len(p.drop_paths)
    return (
        f"expire ~{p.expired_rows} row(s): {dropped} file(s) dropped unread, {p.input_files} file(s) "
        f"rewritten in {len(p.groups)} group(s)"
    )


def _overlap_text(overlap: dict) -> str:
    columns = ", ".join(overlap["columns"])
    return f", bounds overlap {overlap['before']:g} -> {overlap['after']:g} on {overlap['order']}({columns})"


def print_outcomes(outcomes: list[PartitionOutcome]) -> None:
    for o in outcomes:
        where = f"{o.table_name} [{o.partition_key or 'unpartitioned'}]"
        if o.status == "committed":
            click.echo(
                f"{where}: committed {o.kind}: {o.files_before} -> {o.files_after} files, "
                f"{o.bytes_before} -> {o.bytes_after} bytes, {o.rows} rows, {o.groups} group(s), "
                f"{o.seconds:.1f}s, snapshot {o.snapshot_id}"
                + (f", rewrite path {o.engine}" if o.engine else "")
                + (f"; {o.reason}" if o.kind in (Kind.EXPIRE, Kind.OLD_SPEC) else "")  # what went, where
                + (_overlap_text(o.bounds_overlap) if o.bounds_overlap else "")
            )
        else:
            click.echo(f"{where}: {o.status}: {o.reason}", err=o.status == "failed")
