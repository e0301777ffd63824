"""The merge benchmark's cases: Delta's ``MergeTestCases`` (clauses, names, fractions) and the targets.

The cases and their names follow ``MergeTestCases`` of Delta's own merge benchmark (delta-io/delta,
``benchmarks/src/main/scala/benchmark/MergeTestCases.scala``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CASES",
    "CATALOG",
    "DEFAULT_CASES",
    "DELETE_ONLY",
    "DV_CASES",
    "DV_TARGETS",
    "INSERT_ONLY",
    "TARGETS",
    "UPSERT_5",
    "UPSERT_50",
    "UPSERT_100",
    "Clause",
    "MergeCase",
    "Target",
]


@dataclass(frozen=True)
class Clause:
    """One WHEN clause; the actions are Delta's benchmark ones: UPDATE SET *, DELETE, INSERT *."""

    when: Literal["matched", "not_matched"]
    action: Literal["update_all", "delete", "insert_all"]
    condition: str | None = None


@dataclass(frozen=True)
class MergeCase:
    """A case of Delta's MergeTestCases: which files and rows of the target the source hits."""

    kind: Literal["single_insert_only", "multiple_insert_only", "delete_only", "upsert"]
    file_matched_fraction: float
    row_matched_fraction: float
    row_not_matched_fraction: float

    @property
    def name(self) -> str:
        """Delta's name for the case (Scala prints these doubles as Python does)."""
        parts = [self.kind, f"fileMatchedFraction_{self.file_matched_fraction}"]
        if self.kind != "single_insert_only" and self.kind != "multiple_insert_only":
            parts.append(f"rowMatchedFraction_{self.row_matched_fraction}")
        if self.kind != "delete_only":
            parts.append(f"rowNotMatchedFraction_{self.row_not_matched_fraction}")
        return "_".join(parts)

    @property
    def clauses(self) -> tuple[Clause, ...]:
        """The WHEN clauses of Delta's SQL for this case (aliases ``t`` and ``s``)."""
        if self.kind == "single_insert_only":
            return (Clause("not_matched", "insert_all"),)
        if self.kind == "multiple_insert_only":
            return (
                Clause("not_matched", "insert_all", "s.int_a % 2 = 0"),
                Clause("not_matched", "insert_all"),
            )
        if self.kind == "delete_only":
            return (Clause("matched", "delete"),)
        return (Clause("matched", "update_all"), Clause("not_matched", "insert_all"))


def _insert(kind: Literal["single_insert_only", "multiple_insert_only"], not_matched: float) -> MergeCase:
    return MergeCase(kind, 0.05, 0.0, not_matched)


# All of MergeTestCases.testCases, in Delta's order.
CATALOG: tuple[MergeCase, ...] = (
    *(_insert("single_insert_only", f) for f in (0.05, 0.5, 1.0)),
    *(_insert("multiple_insert_only", f) for f in (0.05, 0.5, 1.0)),
    MergeCase("delete_only", 0.05, 0.05, 0.0),
    MergeCase("upsert", 0.05, 0.1, 0.01),
    MergeCase("upsert", 0.05, 0.0, 0.1),
    MergeCase("upsert", 0.05, 0.01, 0.1),
    MergeCase("upsert", 0.05, 0.1, 0.0),
    MergeCase("upsert", 0.5, 0.01, 0.001),
    MergeCase("upsert", 1.0, 0.01, 0.001),
    MergeCase("upsert", 0.05, 0.5, 0.001),
    MergeCase("upsert", 0.05, 0.99, 0.001),
    MergeCase("upsert", 0.05, 1.0, 0.001),
)
CASES = {case.name: case for case in CATALOG}
INSERT_ONLY = "single_insert_only_fileMatchedFraction_0.05_rowNotMatchedFraction_0.05"
DELETE_ONLY = "delete_only_fileMatchedFraction_0.05_rowMatchedFraction_0.05"
UPSERT_5 = "upsert_fileMatchedFraction_0.05_rowMatchedFraction_0.1_rowNotMatchedFraction_0.01"
UPSERT_50 = "upsert_fileMatchedFraction_0.5_rowMatchedFraction_0.01_rowNotMatchedFraction_0.001"
UPSERT_100 = "upsert_fileMatchedFraction_1.0_rowMatchedFraction_0.01_rowNotMatchedFraction_0.001"
DEFAULT_CASES = (INSERT_ONLY, DELETE_ONLY, UPSERT_5, UPSERT_50, UPSERT_100)
DV_CASES = (UPSERT_5, UPSERT_50, UPSERT_100)


@dataclass(frozen=True)
class Target:
    """A performance goal: the job's median at most ``max_ratio`` times the ``base`` engine's."""

    label: str
    case: str
    max_ratio: float
    no_file_removed: bool = False
    base: str = "naive"
    merge_on_read: bool = False  # the job's runs must have written deletion vectors


# Against Delta's own MERGE INTO in the same session: at most as slow in every case, at most half as slow
# where the job's file pruning applies (the keys in 5% of the files; inserts, which touch no file).
DELTA_TARGETS = (
    Target("insert-only <= 0.5x delta", INSERT_ONLY, 0.5, base="delta"),
    Target("delete-only (5% of files) <= 0.5x delta", DELETE_ONLY, 0.5, base="delta"),
    Target("5%-of-files upsert <= 0.5x delta", UPSERT_5, 0.5, base="delta"),
    Target("50%-of-files upsert <= 1.0x delta", UPSERT_50, 1.0, base="delta"),
    Target("100%-of-files upsert <= 1.0x delta", UPSERT_100, 1.0, base="delta"),
)
TARGETS = (
    Target("5%-of-files upsert <= 0.15x naive", UPSERT_5, 0.15),
    Target("insert-only <= 0.08x naive, no file removed", INSERT_ONLY, 0.08, no_file_removed=True),
    Target("100%-of-files upsert <= 1.0x naive", UPSERT_100, 1.0),
    *DELTA_TARGETS,
)
# --deletion-vectors: merge-on-read against the job's copy-on-write and delta-rs, on the same table.
DV_TARGETS = (
    Target("100%-of-files upsert <= 0.5x delta-rs", UPSERT_100, 0.5, base="delta-rs", merge_on_read=True),
    Target("100%-of-files upsert <= 0.3x job-cow", UPSERT_100, 0.3, base="job-cow", merge_on_read=True),
    Target("5%-of-files upsert <= 1.0x job-cow", UPSERT_5, 1.0, base="job-cow", merge_on_read=True),
    *(goal for goal in DELTA_TARGETS if goal.case in DV_CASES),
)
