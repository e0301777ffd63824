"""Column DEFAULT values (Delta's allowColumnDefaults): what an INSERT leaves out or assigns ``DEFAULT`` gets.

PROTOCOL.md "Default Columns": a column's default is the Spark SQL expression in its field metadata key
``CURRENT_DEFAULT``. Spark's analyzer (ResolveDefaultColumns) fills the columns an INSERT column list
leaves out with their defaults, and resolves an assignment whose whole value is the bare name ``DEFAULT``
(any case, possibly back-quoted) to the assigned column's default, or to NULL when the column has none and
is nullable; only when that name resolves to no column, since names are resolved first. ``DEFAULT`` inside
a larger expression is refused (DEFAULT_PLACEMENT_INVALID).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pyspark.errors import AnalysisException
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, DataType, MapType, StructField, StructType

from spark_jobs.delta_merge.analysis.store_assignment import can_store
from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.statement.expression_guard import check_expression
from spark_jobs.delta_merge.statement.expressions import column_refs

__all__ = [
    "CURRENT_DEFAULT",
    "column_defaults",
    "default_placement_error",
    "default_value",
    "is_default_keyword",
    "mentions_default",
    "no_default_error",
]

CURRENT_DEFAULT = "CURRENT_DEFAULT"
# Parentheses around it leave the same UnresolvedAttribute in Spark's parse.
_KEYWORD = re.compile(r"[\s(]*(?:default|`default`)[\s)]*", re.IGNORECASE)


def column_defaults(schema: StructType) -> dict[str, str]:
    """The DEFAULT expression text of every top-level column that has one, by lower-cased name.

    Spark allows defaults on top-level columns only, so nested fields are not looked at.
    """
    fields = [f for f in schema.fields if CURRENT_DEFAULT in f.metadata]
    return {f.name.lower(): str(f.metadata[CURRENT_DEFAULT]) for f in fields}


def is_default_keyword(sql: str) -> bool:
    """The whole value is the name ``DEFAULT`` (which means the keyword unless a column has that name)."""
    return _KEYWORD.fullmatch(sql) is not None and sql.count("(") == sql.count(")")


def mentions_default(sql: str) -> bool:
    """The expression refers to the unqualified name ``DEFAULT`` somewhere."""
    try:
        refs = column_refs(sql)
    except ValueError:
        return False
    return any(len(ref.parts) == 1 and ref.parts[0].lower() == "default" for ref in refs)


def default_value(
    spark: SparkSession, field: StructField, sql: str, *, assign: Callable[[Column, DataType], Column]
) -> Column:
    """The default ``sql`` of ``field`` as a value of the column's type, checked as Spark checks defaults.

    The expression passes the guard every merge expression passes, must resolve without any column and be
    constant. Its type must up-cast to the column's (then ``assign``, the merge's store assignment, casts
    it), or, as Spark's coerceDefaultValue allows for a value known at planning time, that value must
    survive a TRY cast to a narrower atomic type (``DEFAULT 0`` on a SMALLINT column). Checking that
    evaluates the default once on the driver.

    :param assign: stores a value of the given type as the column's type (the merge's store assignment).
    :raises MergeSpecError: the guard refuses the expression.
    :raises MergeAnalysisError: Spark's INVALID_DEFAULT_VALUE cases, before anything is written.
    """
    check_expression(sql, field=f"DEFAULT value of column {field.name}", context="assignment")
    value = F.expr(sql)
    try:
        resolved = spark.createDataFrame([], StructType([])).select(value)
        src_type = resolved.schema.fields[0].dataType
    except AnalysisException as exc:
        raise _invalid_default(
            field, sql, "which fails to resolve as a valid expression",
            error_class="INVALID_DEFAULT_VALUE.UNRESOLVED_EXPRESSION", cause=str(exc).splitlines()[0],
        ) from exc
    # Spark's analyzer takes only defaults it can fold to one value (current_date() folds; rand() does not).
    if not _is_constant(spark, value):
        raise _invalid_default(
            field, sql, "which is not a constant expression whose equivalent value is known at query "
            "planning time", error_class="INVALID_DEFAULT_VALUE.NOT_CONSTANT",
        )
    dst_type = field.dataType
    if not can_store(src_type, dst_type, policy="STRICT") and not _fits_when_narrowed(
        spark, value, src_type, dst_type
    ):
        raise _invalid_default(
            field, sql, f"which requires {dst_type.simpleString()} type, but the statement provided a "
            f"value of incompatible {src_type.simpleString()} type",
            error_class="INVALID_DEFAULT_VALUE.DATA_TYPE",
        )
    return assign(value, src_type)


def _is_constant(spark: SparkSession, value: Column) -> bool:
    """Whether ``value`` (which references no column) is a constant: deterministic, and no aggregate,
    window or generator. Spark's analyzer admits only such an expression in a join condition, which is
    how it is asked here: the expression's foldability is not visible through Spark Connect."""
    one = spark.range(1)
    try:
        one.alias("l").join(one.alias("r"), F.lit(True) | value.isNull()).schema  # noqa: B018
    except AnalysisException:
        return False
    return True


def _fits_when_narrowed(spark: SparkSession, value: Column, src: DataType, dst: DataType) -> bool:
    excluded = (BooleanType, ArrayType, StructType, MapType)
    if isinstance(src, excluded) or isinstance(dst, excluded):
        return False
    row = spark.range(1).select(value.isNull(), value.try_cast(dst)).first()
    assert row is not None
    return bool(row[0]) or row[1] is not None


def _invalid_default(
    field: StructField, sql: str, reason: str, *, error_class: str, cause: str = ""
) -> MergeAnalysisError:
    return MergeAnalysisError(
        f"Failed to execute MERGE command because the destination column or variable `{field.name}` has a "
        f"DEFAULT value {sql}, {reason}.{f' {cause}' if cause else ''} Fix the column's default (its "
        f"{CURRENT_DEFAULT} field metadata); nothing was written.",
        error_class=error_class,
    )


def no_default_error(field: StructField) -> MergeAnalysisError:
    return MergeAnalysisError(
        f"Can't determine the default value for `{field.name}` since it is not nullable and it has no "
        "default value. Assign it a value instead of DEFAULT.",
        error_class="NO_DEFAULT_COLUMN_VALUE_AVAILABLE",
    )


def default_placement_error(where: str, sql: str) -> MergeAnalysisError:
    return MergeAnalysisError(
        "A DEFAULT keyword in a MERGE command could not be directly assigned to a target column because it "
        "was part of an expression. For example: `UPDATE SET c1 = DEFAULT` is allowed, but `UPDATE T SET "
        f"c1 = DEFAULT + 1` is not allowed. Found in the {where}: {sql}.",
        error_class="DEFAULT_PLACEMENT_INVALID",
    )
