"""The merge contract shared by the Airflow operator and the Spark job (stdlib + sqlglot only)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "ActionKind",
    "Assignment",
    "ClauseKind",
    "MergeClause",
    "MergeOptions",
    "MergeSpec",
    "ParsedMerge",
    "RunSpec",
    "SourceSpec",
    "TargetSpec",
]

ClauseKind = Literal["matched", "not_matched", "not_matched_by_source"]
ActionKind = Literal["update", "update_all", "delete", "insert", "insert_all"]


@dataclass(frozen=True)
class Assignment:
    """One ``SET col = expr`` or one ``INSERT (col) VALUES (expr)`` pair.

    :param column: the target column path without the target alias, e.g. ``("addr", "city")``.
    :param value: the value as Spark SQL text, normalized by the SQL parser.
    """

    column: tuple[str, ...]
    value: str


@dataclass(frozen=True)
class MergeClause:
    """One WHEN clause, in the order written.

    :param when: ``matched``, ``not_matched`` (BY TARGET) or ``not_matched_by_source``.
    :param action: ``update``, ``update_all`` (SET *), ``delete``, ``insert`` or ``insert_all`` (INSERT *).
    :param condition: the clause's ``AND`` condition as Spark SQL text, or None.
    :param assignments: SET pairs for ``update``, column/value pairs for ``insert``; empty otherwise.
    """

    when: ClauseKind
    action: ActionKind
    condition: str | None = None
    assignments: tuple[Assignment, ...] = ()


@dataclass(frozen=True)
class ParsedMerge:
    """A merge reduced to what the job executes, whichever form it was given in.

    Expressions keep the aliases as written; the job resolves them against the target (``target_alias``)
    and the source (``source_alias``).
    """

    target_alias: str
    source_alias: str
    condition: str
    clauses: tuple[MergeClause, ...]

    def clauses_of(self, when: ClauseKind) -> tuple[MergeClause, ...]:
        """The clauses of one kind, in the order written."""
        return tuple(c for c in self.clauses if c.when == when)

    @property
    def is_insert_only(self) -> bool:
        """Only WHEN NOT MATCHED clauses: target files are never rewritten."""
        return all(c.when == "not_matched" for c in self.clauses) and bool(self.clauses)

    @property
    def is_matched_only(self) -> bool:
        """Only WHEN MATCHED clauses: source rows that match nothing are not needed."""
        return all(c.when == "matched" for c in self.clauses) and bool(self.clauses)

    @property
    def is_only_one_unconditional_delete(self) -> bool:
        """The only MATCHED clause is an unconditional DELETE: multiple matches are then allowed."""
        matched = self.clauses_of("matched")
        return len(matched) == 1 and matched[0].action == "delete" and matched[0].condition is None


@dataclass(frozen=True)
class TargetSpec:
    """The target Delta table."""

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceSpec:
    """The source: a path or URI with a format and reader options, or a Spark SQL query.

    :param version: for ``format="delta"``, the table version to read (None: the latest).
    """

    uri: str | None = None
    format: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    query: str | None = None
    version: int | None = None


@dataclass(frozen=True)
class MergeOptions:
    """Execution options.

    :param materialize_source: ``auto``, ``all`` or ``none`` (Delta's ``merge.materializeSource``).
    :param materialize_storage_level: Spark storage level of the materialized source.
    :param schema_evolution: Delta's ``spark.databricks.delta.schema.autoMerge.enabled``.
    :param target_file_size: bytes per written file (default: the table's ``delta.targetFileSize``).
    :param store_assignment_policy: ``ANSI`` (default), ``LEGACY`` or ``STRICT``, as Spark's
        ``spark.sql.storeAssignmentPolicy``.
    :param resolve_structs_by_name: Delta's ``resolveMergeUpdateStructsByName.enabled``.
    :param shuffle_partitions: ``spark.sql.shuffle.partitions`` during the merge (None: chosen by size).
    :param dry_run: compute the metrics without writing or committing anything.
    """

    materialize_source: Literal["auto", "all", "none"] = "auto"
    materialize_storage_level: str = "MEMORY_AND_DISK"
    schema_evolution: bool = False
    target_file_size: int | None = None
    store_assignment_policy: Literal["ANSI", "LEGACY", "STRICT"] = "ANSI"
    resolve_structs_by_name: bool = True
    shuffle_partitions: int | None = None
    dry_run: bool = False


@dataclass(frozen=True)
class RunSpec:
    """Identity of one application of the merge (the idempotency key) and what to record with it."""

    app_id: str | None = None
    app_version: int | None = None
    commit_metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MergeSpec:
    """One merge: target, source, the statement (SQL or structural) and options.

    Give either ``merge_sql`` or the structural form (``condition`` and ``clauses``, with optional
    ``target_alias`` / ``source_alias``). ``parsed()`` turns both into the same :class:`ParsedMerge`.
    """

    target: TargetSpec
    source: SourceSpec
    merge_sql: str | None = None
    target_alias: str | None = None
    source_alias: str | None = None
    condition: str | None = None
    clauses: tuple[MergeClause, ...] = ()
    options: MergeOptions = field(default_factory=MergeOptions)
    run: RunSpec = field(default_factory=RunSpec)
    expected_metrics: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
