"""The target files a merge's join can skip by the range of the source's keys.

A target row matches a source row only where every conjunct ``t.a = s.b`` of the search condition holds,
so a file whose statistics put all its ``a`` values outside the source's [min(b), max(b)] holds no row
the source matches (NULL keys match nothing under ``=``). delta-rs prunes its scan by the source's key
range the same way; Delta on Spark leaves it to dynamic file pruning. Only the join reads fewer files:
the files after skipping that the metrics count and that the commit's conflict check takes as read stay
those of the target-only predicates, as Delta's.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ByteType, DateType, IntegerType, LongType, ShortType, StringType, StructType
from sqlglot import exp

from spark_jobs.delta_merge.data_skipping import prune_files
from spark_jobs.delta_merge.expressions import column_refs, parse_expression, split_conjuncts
from spark_jobs.delta_merge.files import LiveFile
from spark_jobs.delta_merge.merge_plan import MergePlan
from spark_jobs.delta_merge.snapshot import TargetSnapshot

__all__ = ["join_keys", "joinable_files"]

# Key types whose min and max render exactly as SQL literals the statistics compare with.
_RANGE_TYPES = (ByteType, ShortType, IntegerType, LongType, DateType, StringType)


def joinable_files(
    spark: SparkSession, source: DataFrame, *, snapshot: TargetSnapshot, plan: MergePlan,
    files: Sequence[LiveFile],
) -> list[LiveFile]:
    """The ``files`` whose statistics allow a row with keys in the source's key ranges (one Spark job for
    the ranges, one for the statistics); all of them when the statement has NOT MATCHED BY SOURCE
    clauses (which act on unmatched rows) or no equi-join key of a type ranges are taken on."""
    if not files or plan.clauses_of("not_matched_by_source"):
        return list(files)
    equalities = join_keys(
        plan.parsed.condition, target_alias=plan.target_alias, source_alias=plan.source_alias,
        target_schema=plan.target_schema, source_schema=source.schema,
    )  # fmt: skip
    keys = [(t, s) for t, s in equalities if isinstance(_field_type(plan.target_schema, t), _RANGE_TYPES)]
    if not keys:
        return list(files)
    bounds = source.agg(*[
        aggregate(F.col(_quoted(column))).alias(f"{name}{i}")
        for i, (_, column) in enumerate(keys) for name, aggregate in (("low", F.min), ("high", F.max))
    ]).collect()[0]  # fmt: skip
    predicates = []
    for i, (target, _) in enumerate(keys):
        low, high = bounds[f"low{i}"], bounds[f"high{i}"]
        if low is None:
            return []  # no source row has this key: nothing matches
        literals = _literal(low), _literal(high)
        if None not in literals:
            column = f"{_quoted(plan.target_alias)}.{_quoted(target)}"
            predicates += [f"{column} >= {literals[0]}", f"{column} <= {literals[1]}"]
    if not predicates:
        return list(files)
    return prune_files(spark, snapshot, files, predicates=predicates, target_alias=plan.target_alias)


def join_keys(
    condition: str, *, target_alias: str, source_alias: str, target_schema: StructType,
    source_schema: StructType,
) -> list[tuple[str, str]]:
    """(target column, source column) of each conjunct ``t.a = s.b`` (or ``s.b = t.a``) of ``condition``
    between top-level columns of the same type."""
    keys = []
    for conjunct in split_conjuncts(condition):
        node = parse_expression(conjunct)
        while isinstance(node, exp.Paren):
            node = node.this
        if not isinstance(node, exp.EQ):
            continue
        sides = dict(
            side for operand in (node.this, node.expression)
            if (side := _side(operand, target_alias, source_alias, target_schema, source_schema)) is not None
        )  # fmt: skip
        if set(sides) != {"target", "source"}:
            continue
        target, source = sides["target"], sides["source"]
        if _field_type(target_schema, target) == _field_type(source_schema, source):
            keys.append((target, source))
    return keys


def _side(
    operand: exp.Expr, target_alias: str, source_alias: str, target_schema: StructType,
    source_schema: StructType,
) -> tuple[str, str] | None:
    """("target" or "source", the column's name) when ``operand`` is a bare top-level column of one side."""
    while isinstance(operand, exp.Paren):
        operand = operand.this
    if not isinstance(operand, exp.Column):
        return None
    refs = column_refs(operand.sql(dialect="spark"))
    if len(refs) != 1:
        return None
    parts = [p.lower() for p in refs[0].parts]
    target_names = {f.name.lower(): f.name for f in target_schema.fields}
    source_names = {f.name.lower(): f.name for f in source_schema.fields}
    if len(parts) == 2 and parts[0] == target_alias.lower() and parts[1] in target_names:
        return "target", target_names[parts[1]]
    if len(parts) == 2 and parts[0] == source_alias.lower() and parts[1] in source_names:
        return "source", source_names[parts[1]]
    if len(parts) == 1 and (parts[0] in target_names) != (parts[0] in source_names):
        if parts[0] in target_names:
            return "target", target_names[parts[0]]
        return "source", source_names[parts[0]]
    return None


def _field_type(schema: StructType, name: str) -> object:
    return next(f.dataType for f in schema.fields if f.name == name)


def _literal(value: object) -> str | None:
    """``value`` as a Spark SQL literal, or None where a literal could differ from the value."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, str) and "'" not in value and "\\" not in value:
        return f"'{value}'"
    return None


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
