"""Table constraints on the merge's output rows: generated values filled in, violations described per row.

Delta checks every row a write produces (DeltaInvariantCheckerExec) and fails the write on the first
violation. Here the check is one string column of the output: NULL for a row that satisfies every
constraint, else Delta's message for the first violated one with the values of that row. The writer
fails its task on the first non-NULL value, so a violation fails the merge before anything is
committed; a dry run collects one instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark_jobs.delta_merge.analysis.store_assignment import find_field
from spark_jobs.delta_merge.errors import MergeAnalysisError, MergeSpecError
from spark_jobs.delta_merge.protocol.table_features import TableConstraints
from spark_jobs.delta_merge.sql_names import quoted_path
from spark_jobs.delta_merge.statement.expression_guard import check_expression
from spark_jobs.delta_merge.statement.expressions import column_refs

__all__ = ["VIOLATION_COLUMN", "apply_constraints", "generated_columns"]

# Each violation message starts with Delta's error class: "[DELTA_...] CHECK constraint ...".
VIOLATION_COLUMN = "__merge_violation"
_CHECK_VIOLATED = "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES"
_NOT_NULL_VIOLATED = "DELTA_NOT_NULL_CONSTRAINT_VIOLATED"
_INVARIANT_PREFIX = "invariant:"
_GENERATION_KEY = "delta.generationExpression"


@dataclass(frozen=True)
class _Rule:
    """One constraint as a row predicate: ``violated`` holds on a row that breaks it."""

    violated: Column
    message: Column


def generated_columns(schema: StructType) -> dict[str, str]:
    """Generation expressions of the top-level columns of ``schema``, by lower-cased column name.

    Delta allows generated columns only at the top level.
    """
    return {f.name.lower(): str(f.metadata[_GENERATION_KEY]) for f in schema.fields
            if _GENERATION_KEY in f.metadata}


def apply_constraints(
    df: DataFrame, *, constraints: TableConstraints, schema: StructType, generate: Mapping[str, Column],
    written: Column,
) -> DataFrame:
    """``df`` with generated columns computed where ``generate`` says so and :data:`VIOLATION_COLUMN` added
    (NULL, or ``[DELTA_ERROR_CLASS] message`` for the first constraint a row violates).

    :param df: the output rows: the columns of ``schema`` by name, plus any bookkeeping columns
        (kept as they are; ``generate`` and ``written`` may refer to them).
    :param constraints: the table's constraints.
    :param schema: the table schema the rows are written with (after schema evolution).
    :param generate: per generated column (name as in ``schema``), a condition that holds on the rows
        whose value the merge did not assign: those get the generation expression's value. On the
        other written rows an assigned value must equal it (null-safe), as Delta checks.
    :param written: holds on the rows that are written (deleted and dropped rows are not checked).
    :raises MergeAnalysisError: a constraint is not a safe expression or does not resolve on ``schema``.
    """
    for name, text in constraints.checks.items():
        _guard(name, text)
    for name, text in constraints.generated.items():
        _guard(f"Generated Column {name}", text)
    columns: list[Column] = []
    for field in schema.fields:
        column = F.col(quoted_path((field.name,)))
        expression = _generation(constraints, field.name)
        condition = generate.get(field.name)
        if expression is not None and condition is not None:
            column = F.when(condition, F.expr(expression).cast(field.dataType)).otherwise(column)
        columns.append(column.alias(field.name))
    extra = [F.col(quoted_path((c,))) for c in df.columns if find_field(schema, c) is None]
    filled = _resolve(df, [*columns, *extra], constraints)
    chain: Column | None = None
    for rule in _rules(constraints, schema, generate):
        if chain is None:
            chain = F.when(rule.violated, rule.message)
        else:
            chain = chain.when(rule.violated, rule.message)
    violation = F.lit(None).cast("string") if chain is None else F.when(written, chain)
    kept = [F.col(quoted_path((c,))) for c in filled.columns]
    return _resolve(filled, [*kept, violation.alias(VIOLATION_COLUMN)], constraints)


def _rules(
    constraints: TableConstraints, schema: StructType, generate: Mapping[str, Column]
) -> Iterator[_Rule]:
    """In Delta's order (TransactionalWrite): CHECK constraints, NOT NULL, invariants, generated columns."""
    invariants = {k: v for k, v in constraints.checks.items() if k.startswith(_INVARIANT_PREFIX)}
    checks = {k: v for k, v in constraints.checks.items() if k not in invariants}
    for name, text in checks.items():
        yield _check_rule(name, text)
    for path in constraints.not_null:
        if _present(schema, path):
            yield _not_null_rule(path)
    for text in invariants.values():
        yield _check_rule(f"EXPRESSION({text})", text)
    for field in schema.fields:
        expression = _generation(constraints, field.name)
        if expression is None:
            continue
        column = F.col(quoted_path((field.name,)))
        equal = F.expr(f"{quoted_path((field.name,))} <=> ({expression})")
        assigned = ~generate[field.name] if field.name in generate else F.lit(True)
        yield _Rule(
            violated=assigned & ~equal,
            message=_message(f"CHECK constraint Generated Column ({field.name} <=> {expression})",
                             [((field.name,), column), *_referenced(expression, exclude=field.name)]),
        )


def _check_rule(name: str, expression: str) -> _Rule:
    # Delta fails a row whose CHECK is false or NULL (CheckDeltaInvariant), unlike SQL's CHECK.
    holds = F.coalesce(F.expr(expression).cast("boolean"), F.lit(False))
    message = _message(f"CHECK constraint {name} {expression}", _referenced(expression))
    return _Rule(violated=~holds, message=message)


def _not_null_rule(path: tuple[str, ...]) -> _Rule:
    # A NOT NULL field inside a NULL struct is fine: only rows whose parents are all present are checked.
    violated = F.col(quoted_path(path)).isNull()
    for depth in range(1, len(path)):
        violated = F.col(quoted_path(path[:depth])).isNotNull() & violated
    message = F.lit(f"[{_NOT_NULL_VIOLATED}] NOT NULL constraint violated for column: {'.'.join(path)}.")
    return _Rule(violated=violated, message=message)


def _message(head: str, values: list[tuple[tuple[str, ...], Column]]) -> Column:
    parts: list[Column] = [F.lit(f"[{_CHECK_VIOLATED}] {head} violated by row with values:")]
    for path, column in values:
        parts += [F.lit(f"\n - {'.'.join(path)} : "), F.coalesce(column.cast("string"), F.lit("null"))]
    return F.concat(*parts)


def _referenced(expression: str, *, exclude: str | None = None) -> list[tuple[tuple[str, ...], Column]]:
    seen: dict[tuple[str, ...], Column] = {}
    for ref in column_refs(expression):
        if ref.parts not in seen and (exclude is None or ref.parts != (exclude,)):
            seen[ref.parts] = F.col(quoted_path(ref.parts))
    return list(seen.items())


def _generation(constraints: TableConstraints, name: str) -> str | None:
    lowered = name.lower()
    return next((e for n, e in constraints.generated.items() if n.lower() == lowered), None)


def _present(schema: StructType, path: tuple[str, ...]) -> bool:
    current: StructType | None = schema
    for part in path:
        found = find_field(current, part) if current is not None else None
        if found is None:
            return False
        current = found.dataType if isinstance(found.dataType, StructType) else None
    return True


def _guard(name: str, expression: str) -> None:
    # Constraints come from the table's metadata, not the spec; they still run inside this job, so they
    # get the checks merge expressions get (no UDFs, no reflection, deterministic).
    try:
        check_expression(expression, field=f"constraint {name}", context="clause condition")
    except MergeSpecError as exc:
        raise MergeAnalysisError(
            f"Table constraint {name} ({expression}) cannot be enforced by this job: {exc}"
        ) from exc


def _resolve(df: DataFrame, columns: list[Column], constraints: TableConstraints) -> DataFrame:
    try:
        return df.select(*columns)
    except AnalysisException as exc:
        cause = exc
    # Name the constraint that does not resolve (Spark's message names only the column).
    for name, expression in {**constraints.checks, **constraints.generated}.items():
        try:
            df.select(F.expr(expression))
        except AnalysisException as exc:
            raise MergeAnalysisError(
                f"Table constraint {name} ({expression}) does not resolve on the merge's output columns "
                f"({', '.join(df.columns)}): {str(exc).splitlines()[0]}"
            ) from exc
    raise MergeAnalysisError(
        f"The target's constraints do not resolve on the merge's output: {str(cause).splitlines()[0]}"
    ) from cause


