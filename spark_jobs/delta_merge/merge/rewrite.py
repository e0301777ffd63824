"""The merge's output rows: per joined row, the first clause of its kind whose condition holds acts.

Every output row carries an action code; the writer counts rows by code in the pass that writes them
and drops the deleted ones, so no stage scans the data a second time to count. Every row also carries
the table constraints' verdict (:data:`VIOLATION_COLUMN`), which the writer enforces.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.delta_merge.analysis.constraints import VIOLATION_COLUMN, apply_constraints
from spark_jobs.delta_merge.analysis.merge_plan import MergePlan, ResolvedClause
from spark_jobs.delta_merge.protocol.identity_columns import with_identity_slots
from spark_jobs.delta_merge.protocol.row_tracking import ROW_COMMIT_VERSION_COLUMN, ROW_ID_COLUMN, RowTracking
from spark_jobs.delta_merge.protocol.table_features import TableConstraints
from spark_jobs.delta_merge.scan.table_scan import FILE_KEY_COLUMN, ROW_INDEX_COLUMN

__all__ = [
    "ACTION_COLUMN",
    "CHANGE_TYPES",
    "DROPPED_ACTIONS",
    "MARKED_ACTIONS",
    "PREIMAGE_CHANGE_TYPES",
    "PREIMAGE_PREFIX",
    "VIOLATION_COLUMN",
    "Action",
    "classic_output",
    "first_match_per_target_row",
    "insert_only_output",
    "matched_output",
    "with_materialized_columns",
]

ACTION_COLUMN = "__merge_action"
_CLAUSE_COLUMN = "__merge_clause"
_SOURCE_PRESENT = "__merge_source_present"
_TARGET_PRESENT = "__merge_target_present"
_TARGET_ROW = "__merge_target_row"
_MATCH_NUMBER = "__merge_match_number"
# With the change data feed on, the target row as it was (Delta's preimage) rides along as these columns.
PREIMAGE_PREFIX = "__merge_preimage_"
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
# Target rows with these codes leave their file: with deletion vectors, they are marked deleted there.
MARKED_ACTIONS = frozenset({
    Action.UPDATE_MATCHED, Action.UPDATE_NOT_MATCHED_BY_SOURCE,
    Action.DELETE_MATCHED, Action.DELETE_NOT_MATCHED_BY_SOURCE,
})  # fmt: skip


# Change data feed (CDCReader's _change_type values): the change row the written row is, by action code,
# and the change row the preimage columns are. Copied rows are no change.
CHANGE_TYPES = {
    Action.INSERT: "insert",
    Action.UPDATE_MATCHED: "update_postimage",
    Action.UPDATE_NOT_MATCHED_BY_SOURCE: "update_postimage",
}
PREIMAGE_CHANGE_TYPES = {
    Action.UPDATE_MATCHED: "update_preimage",
    Action.UPDATE_NOT_MATCHED_BY_SOURCE: "update_preimage",
    Action.DELETE_MATCHED: "delete",
    Action.DELETE_NOT_MATCHED_BY_SOURCE: "delete",
}


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
    df: DataFrame, plan: MergePlan, copy_values: Sequence[Column], constraints: TableConstraints,
    *, preimage: Sequence[Column] = (), carried: Sequence[str] = (),
) -> DataFrame:
    """The final columns, the action code and the constraint verdict, from a frame with the clause index
    (``copy_values`` for the rows no clause writes); the ``preimage`` values (the target row as it was)
    as :data:`PREIMAGE_PREFIX` columns; ``carried`` columns of the frame pass through unchanged."""
    clause_col = F.col(_CLAUSE_COLUMN)
    drawing = [index for index, clause in enumerate(plan.clauses) if clause.draws_identity]
    if drawing:
        partitions = int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or "200")
        df = with_identity_slots(df, clause_col.isin(drawing), partitions=partitions)
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
    columns += [value.alias(f"{PREIMAGE_PREFIX}{i}") for i, value in enumerate(preimage)]
    selected = df.select(*columns, *[F.col(c) for c in carried], clause_col)
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
    constraints: TableConstraints, change_data: bool = False, deduplicate_deletes: bool = False,
    carried: Sequence[str] = (),
) -> DataFrame:
    """Join the source with the rows of the touched files and apply the clauses (ClassicMergeExecutor).

    A full outer join when there are NOT MATCHED clauses (source-only rows may be inserted), otherwise
    a right outer join: matched-only merges never need source rows that match nothing.

    :param change_data: the table has the change data feed on: every row also carries its preimage.
    :param deduplicate_deletes: target rows matched several times (allowed for a single unconditional
        DELETE) are deleted once, so that they give one ``delete`` change row (Delta's
        deduplicateCDFDeletes); the row counts then need no compensation.
    :param carried: columns of ``target`` every output row keeps (NULL on rows without a target row).
    """
    indexed = list(enumerate(plan.clauses))
    how = "full_outer" if plan.clauses_of("not_matched") else "right_outer"
    target = target.withColumn(_TARGET_PRESENT, F.lit(True))
    if deduplicate_deletes:
        target = target.withColumn(_TARGET_ROW, F.monotonically_increasing_id())
    joined = source.withColumn(_SOURCE_PRESENT, F.lit(True)).alias(plan.source_alias).join(
        target.alias(plan.target_alias), on=F.expr(plan.condition), how=how,
    )
    if deduplicate_deletes:
        # Only one unconditional DELETE matches: every row with both sides is a delete of its target row.
        # A window, not a union: the join's qualified names (the clauses' aliases) must stay resolvable.
        both = F.col(_SOURCE_PRESENT).isNotNull() & F.col(_TARGET_PRESENT).isNotNull()
        first = F.row_number().over(Window.partitionBy(_TARGET_ROW).orderBy(_TARGET_ROW))
        joined = joined.withColumn(_MATCH_NUMBER, first).filter(~both | (F.col(_MATCH_NUMBER) == 1))
    clause_index = (
        F.when(F.col(_SOURCE_PRESENT).isNull(),
               _first_clause([(i, c) for i, c in indexed if c.when == "not_matched_by_source"], _COPY))
        .when(F.col(_TARGET_PRESENT).isNull(),
              _first_clause([(i, c) for i, c in indexed if c.when == "not_matched"], _DROP))
        .otherwise(_first_clause([(i, c) for i, c in indexed if c.when == "matched"], _COPY))
    )
    return _outputs(joined.withColumn(_CLAUSE_COLUMN, clause_index), plan, copy_values, constraints,
                    preimage=copy_values if change_data else (), carried=carried)


def matched_output(
    joined: DataFrame, *, plan: MergePlan, constraints: TableConstraints, change_data: bool = False,
    deduplicate_deletes: bool = False, carried: Sequence[str] = (),
) -> DataFrame:
    """The MATCHED clauses over the inner join of source and target rows (merge-on-read without NOT
    MATCHED BY SOURCE clauses, whose target rows stay where they are unless a clause changes them).

    Rows no clause changes are COPY rows with NULL values, for the caller to leave out: no target column
    is read for them, so Spark reads only the columns the condition and the clauses use.
    ``deduplicate_deletes`` as for :func:`classic_output`; ``joined`` carries the target rows'
    :data:`FILE_KEY_COLUMN` and :data:`ROW_INDEX_COLUMN`, which identify them.
    """
    if deduplicate_deletes:
        joined = first_match_per_target_row(joined)
    matched = [(i, c) for i, c in enumerate(plan.clauses) if c.when == "matched"]
    nulls = [F.lit(None).cast(f.dataType) for f in plan.final_schema.fields]
    with_clause = joined.withColumn(_CLAUSE_COLUMN, _first_clause(matched, _COPY))
    return _outputs(with_clause, plan, nulls, constraints, preimage=plan.copy_values if change_data else (),
                    carried=carried)


def first_match_per_target_row(rows: DataFrame) -> DataFrame:
    """One of the rows of each target row (:data:`FILE_KEY_COLUMN`, :data:`ROW_INDEX_COLUMN`): when only
    one unconditional DELETE matches, each target row is deleted once, whatever matched it."""
    target_row = [FILE_KEY_COLUMN, ROW_INDEX_COLUMN]
    first = F.row_number().over(Window.partitionBy(*target_row).orderBy(*target_row))
    return rows.withColumn(_MATCH_NUMBER, first).filter(F.col(_MATCH_NUMBER) == 1).drop(_MATCH_NUMBER)


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


def with_materialized_columns(output: DataFrame, tracking: RowTracking, *, action_column: str) -> DataFrame:
    """Replace the carried stable ids of the merge output by the materialized columns to write: the row
    id of every updated or copied row, the commit version of copied rows only (updated rows take the
    new file's default, as Delta's MERGE writes them)."""
    copied = F.col(action_column) == F.lit(int(Action.COPY))
    return (
        output.withColumn(str(tracking.row_id_column), F.col(ROW_ID_COLUMN))
        .withColumn(str(tracking.commit_version_column), F.when(copied, F.col(ROW_COMMIT_VERSION_COLUMN)))
        .drop(ROW_ID_COLUMN, ROW_COMMIT_VERSION_COLUMN)
    )

