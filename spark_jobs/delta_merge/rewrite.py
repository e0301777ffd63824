"""The merge's output rows: per joined row, the first clause of its kind whose condition holds acts.

Every output row carries an action code; the writer counts rows by code in the pass that writes them
and drops the deleted ones, so no stage scans the data a second time to count. Every row also carries
the table constraints' verdict (:data:`VIOLATION_COLUMN`), which the writer enforces.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.delta_merge.analysis import MergePlan, ResolvedClause
from spark_jobs.delta_merge.constraints import VIOLATION_COLUMN, apply_constraints
from spark_jobs.delta_merge.table_features import TableConstraints

__all__ = [
    "ACTION_COLUMN",
    "DROPPED_ACTIONS",
    "VIOLATION_COLUMN",
    "Action",
    "classic_output",
    "insert_only_output",
]

ACTION_COLUMN = "__merge_action"
_CLAUSE_COLUMN = "__merge_clause"
_SOURCE_PRESENT = "__merge_source_present"
_TARGET_PRESENT = "__merge_target_present"
_COPY = -1
_DROP = -2


class Action(IntEnum):
    """What happened to an output row; the writer counts rows per code."""

    COPY = 0
    INSERT = 1
    UPDATE_MATCHED = 2
    DELETE_MATCHED = 3
    UPDATE_NOT_MATCHED_BY_SOURCE = 4
    DELETE_NOT_MATCHED_BY_SOURCE = 5
    SOURCE_UNMATCHED = 6


# Rows with these codes are counted but not written.
DROPPED_ACTIONS = frozenset(
    {Action.DELETE_MATCHED, Action.DELETE_NOT_MATCHED_BY_SOURCE, Action.SOURCE_UNMATCHED}
)


def _code(clause: ResolvedClause) -> Action:
    if clause.when == "not_matched":
        return Action.INSERT
    if clause.when == "matched":
        return Action.DELETE_MATCHED if clause.action == "delete" else Action.UPDATE_MATCHED
    if clause.action == "delete":
        return Action.DELETE_NOT_MATCHED_BY_SOURCE
    return Action.UPDATE_NOT_MATCHED_BY_SOURCE


def _first_clause(clauses: Sequence[tuple[int, ResolvedClause]], default: int) -> Column:
    """Index of the first clause whose condition holds (a NULL condition does not hold)."""
    chain: Column | None = None
    for index, clause in clauses:
        condition = F.expr(clause.condition) if clause.condition is not None else F.lit(True)
        chain = F.when(condition, F.lit(index)) if chain is None else chain.when(condition, F.lit(index))
    return F.lit(default) if chain is None else chain.otherwise(F.lit(default))


def _outputs(
    df: DataFrame, plan: MergePlan, copy_values: Sequence[Column], constraints: TableConstraints
) -> DataFrame:
    """The final columns, the action code and the constraint verdict, from a frame with the clause index."""
    clause_col = F.col(_CLAUSE_COLUMN)
    columns: list[Column] = []
    for position, field in enumerate(plan.final_schema.fields):
        value: Column | None = None
        for index, clause in enumerate(plan.clauses):
            if clause.outputs is None:
                continue
            branch = clause.outputs[position]
            if value is None:
                value = F.when(clause_col == index, branch)
            else:
                value = value.when(clause_col == index, branch)
        columns.append((copy_values[position] if value is None else value.otherwise(copy_values[position]))
                       .alias(field.name))
    action: Column = F.when(clause_col == _COPY, F.lit(int(Action.COPY)))
    for index, clause in enumerate(plan.clauses):
        action = action.when(clause_col == index, F.lit(int(_code(clause))))
    columns.append(action.otherwise(F.lit(int(Action.SOURCE_UNMATCHED))).cast("tinyint").alias(ACTION_COLUMN))
    selected = df.select(*columns, clause_col)
    generate = {}
    for field in plan.final_schema.fields:
        computing = [index for index, clause in enumerate(plan.clauses) if field.name in clause.generated]
        if computing:
            generate[field.name] = F.col(_CLAUSE_COLUMN).isin(computing)
    written = ~F.col(ACTION_COLUMN).isin([int(a) for a in DROPPED_ACTIONS])
    checked = apply_constraints(
        selected, constraints=constraints, schema=plan.final_schema, generate=generate, written=written
    )
    return checked.drop(_CLAUSE_COLUMN)


def classic_output(
    source: DataFrame, target: DataFrame, *, plan: MergePlan, copy_values: Sequence[Column],
    constraints: TableConstraints,
) -> DataFrame:
    """Join the source with the rows of the touched files and apply the clauses (ClassicMergeExecutor).

    A full outer join when there are NOT MATCHED clauses (source-only rows may be inserted), otherwise
    a right outer join: matched-only merges never need source rows that match nothing.
    """
    indexed = list(enumerate(plan.clauses))
    how = "full_outer" if plan.clauses_of("not_matched") else "right_outer"
    joined = source.withColumn(_SOURCE_PRESENT, F.lit(True)).alias(plan.source_alias).join(
        target.withColumn(_TARGET_PRESENT, F.lit(True)).alias(plan.target_alias),
        on=F.expr(plan.condition),
        how=how,
    )
    clause_index = (
        F.when(F.col(_SOURCE_PRESENT).isNull(),
               _first_clause([(i, c) for i, c in indexed if c.when == "not_matched_by_source"], _COPY))
        .when(F.col(_TARGET_PRESENT).isNull(),
              _first_clause([(i, c) for i, c in indexed if c.when == "not_matched"], _DROP))
        .otherwise(_first_clause([(i, c) for i, c in indexed if c.when == "matched"], _COPY))
    )
    return _outputs(joined.withColumn(_CLAUSE_COLUMN, clause_index), plan, copy_values, constraints)


def insert_only_output(
    source: DataFrame, candidates: DataFrame | None, *, plan: MergePlan, constraints: TableConstraints
) -> DataFrame:
    """Source rows that match no candidate target row, through the first insert clause that holds."""
    rows = source.alias(plan.source_alias)
    if candidates is not None:
        rows = rows.join(candidates.alias(plan.target_alias), on=F.expr(plan.condition), how="left_anti")
        rows = rows.alias(plan.source_alias)
    indexed = list(enumerate(plan.clauses))
    with_clause = rows.withColumn(_CLAUSE_COLUMN, _first_clause(indexed, _DROP))
    nulls = [F.lit(None).cast(f.dataType) for f in plan.final_schema.fields]
    return _outputs(with_clause, plan, nulls, constraints)
