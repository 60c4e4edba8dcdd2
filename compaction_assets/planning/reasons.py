"""Reason text: how a partition's plan says why. The chosen strategy's reason comes first; the
strategies before it that did not fire add why not (`Notes`); the delete load closes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from compaction_assets.planning.model import PartitionPlan, PartitionStats


class NoteSlot(Enum):
    """Where a strategy's why-not goes in the reason of the plan chosen after it."""

    LEAD = "lead"  # first (the size triggers' why-not; an old-spec partition's replaces it: it says more)
    NEXT = "next"  # after the lead, in strategy order
    LOAD = "load"  # just before the delete load, kept even by a delete-file tier's reason


@dataclass
class Notes:
    """The why-nots gathered while strategies are tried in order, and the partition's delete load."""

    load: str
    lead: str = ""
    rest: list[str] = field(default_factory=list)

    def add(self, slot: NoteSlot, why: str) -> None:
        """Record a strategy's why-not ("": nothing to say)."""
        if not why:
            return
        if slot is NoteSlot.LEAD:
            self.lead = why
        elif slot is NoteSlot.LOAD:
            self.load = f"{why}; {self.load}"
        else:
            self.rest.append(why)

    def reason_of(self, plan: PartitionPlan) -> str:
        """The chosen plan's full reason. A delete-file tier's says why only with the delete load:
        its data files are not rewritten, so why no data rewrite ran is beside the point."""
        if plan.is_tier:
            return f"{plan.reason}; {self.load}"
        return "; ".join([plan.reason, *self._notes(), self.load])

    def nothing(self) -> str:
        """The reason of a partition no strategy plans."""
        return "; ".join([*self._notes(), self.load])

    def _notes(self) -> list[str]:
        return [self.lead, *self.rest] if self.lead else self.rest


def load_text(stats: PartitionStats) -> str:
    """The partition's delete load, as every plan's reason ends."""
    if not stats.applying_delete_files:
        return "deletes: none apply"
    dvs = f" ({stats.deletion_vectors} of them deletion vectors)" if stats.deletion_vectors else ""
    return (
        f"deletes: {stats.position_delete_files} position-delete{dvs} and {stats.equality_delete_files} "
        f"equality-delete file(s) apply to {stats.data_files_with_deletes} of {stats.data_files} data file(s), "
        f"~{stats.deleted_rows} row(s) deleted (estimated from their record counts), deleted-row ratio "
        f"{stats.delete_ratio:.2f}, read amplification {stats.read_amplification:.2f}"
    )
