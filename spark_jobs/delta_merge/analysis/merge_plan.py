"""The resolved merge: what analysis hands to the later stages (touched files, rewrite, write, commit)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pyspark.sql import Column
from pyspark.sql.types import StructType

from spark_jobs.delta_merge.statement.parsed_merge import ParsedMerge

__all__ = ["MergePlan", "ResolvedClause"]


@dataclass(frozen=True)
class ResolvedClause:
    """A clause ready to run: its condition and, for updates and inserts, one value per output column.

    :param generated: output columns the clause does not assign that are generated columns: the
        write stage computes them from their generation expressions (Delta does, for inserts and updates).
    :param draws_identity: an INSERT clause that leaves an identity column out: each row it inserts
        draws a new identity value.
    """

    when: str
    action: str
    condition: str | None
    outputs: tuple[Column, ...] | None
    generated: frozenset[str] = frozenset()
    draws_identity: bool = False


@dataclass(frozen=True)
class MergePlan:
    """Everything the later stages need to know about the statement.

    :param tracked_identity: identity columns some INSERT clause generates values for: their
        high-water marks move with what the merge writes (Delta's trackHighWaterMarks).
    """

    target_alias: str
    source_alias: str
    condition: str
    clauses: tuple[ResolvedClause, ...]
    target_schema: StructType
    final_schema: StructType
    source_columns: tuple[str, ...]
    target_only_predicates: tuple[str, ...]
    parsed: ParsedMerge
    copy_values: tuple[Column, ...]
    tracked_identity: tuple[str, ...] = ()

    @property
    def schema_changed(self) -> bool:
        return self.final_schema != self.target_schema

    def clauses_of(self, when: str) -> tuple[ResolvedClause, ...]:
        return tuple(c for c in self.clauses if c.when == when)

    def only_inserts(self) -> MergePlan:
        """The plan restricted to its NOT MATCHED clauses (for writing only inserts)."""
        return replace(self, clauses=self.clauses_of("not_matched"))
