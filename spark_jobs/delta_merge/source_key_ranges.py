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
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ByteType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)
from sqlglot import exp

from spark_jobs.delta_merge.column_mapping import physical_name
from spark_jobs.delta_merge.copy_by_position import size_conf
from spark_jobs.delta_merge.expressions import column_refs, parse_expression, split_conjuncts
from spark_jobs.delta_merge.files import LiveFile
from spark_jobs.delta_merge.merge_plan import MergePlan
from spark_jobs.delta_merge.snapshot import TargetSnapshot

__all__ = ["KEY_RANGES_CONF", "join_keys", "joinable_files"]

# Candidates holding fewer bytes are all joined: the source's key range costs a Spark job (seconds in a
# cold JVM), more than reading a few small files.
KEY_RANGES_CONF = "spark.delta_merge.sourceKeyRanges.minFileBytes"
_DEFAULT_MIN_FILE_BYTES = 8 << 20

# Key types whose statistics compare with the source's min and max exactly, as Python values.
_RANGE_TYPES = (ByteType, ShortType, IntegerType, LongType, DateType, StringType)


def joinable_files(
    spark: SparkSession, source: DataFrame, *, snapshot: TargetSnapshot, plan: MergePlan,
    files: Sequence[LiveFile],
) -> list[LiveFile]:
    """The ``files`` whose statistics allow a row with keys in the source's key ranges (when they hold at
    least :data:`KEY_RANGES_CONF` bytes, default 8 MiB): one Spark job for
    the ranges (none where no file has statistics on a key), the files compared on the driver. All of
    them when the statement has NOT MATCHED BY SOURCE clauses (which act on unmatched rows) or no
    equi-join key of a type ranges are taken on."""
    if not files or plan.clauses_of("not_matched_by_source"):
        return list(files)
    minimum = size_conf(spark, KEY_RANGES_CONF, _DEFAULT_MIN_FILE_BYTES, never="never prune by key range")
    if minimum < 0 or sum(f.size for f in files) < minimum:
        return list(files)
    equalities = join_keys(
        plan.parsed.condition, target_alias=plan.target_alias, source_alias=plan.source_alias,
        target_schema=plan.target_schema, source_schema=source.schema,
    )  # fmt: skip
    partition_columns = {c.lower() for c in snapshot.partition_columns}
    keys = [
        (physical_name(field, snapshot.column_mapping_mode), field.dataType, source_column)
        for target, source_column in equalities
        if (field := _field(plan.target_schema, target)).name.lower() not in partition_columns
        and isinstance(field.dataType, _RANGE_TYPES)
        and any(_bound(f, "min_values", physical_name(field, snapshot.column_mapping_mode)) is not None
                for f in files)
    ]  # fmt: skip
    if not keys:
        return list(files)
    bounds = source.agg(*[
        aggregate(F.col(_quoted(column))).alias(f"{name}{i}")
        for i, (_, _, column) in enumerate(keys) for name, aggregate in (("low", F.min), ("high", F.max))
    ]).collect()[0]  # fmt: skip
    ranges = []
    for i, (name, data_type, _) in enumerate(keys):
        low, high = bounds[f"low{i}"], bounds[f"high{i}"]
        if low is None:
            return []  # no source row has this key: nothing matches
        ranges.append((name, data_type, low, high))
    return [f for f in files if all(_may_hold(f, *key_range) for key_range in ranges)]


def _may_hold(live: LiveFile, name: str, data_type: DataType, low: Any, high: Any) -> bool:
    """Whether ``live``'s statistics allow a value of ``name`` in [``low``, ``high``]: a missing or
    unreadable bound allows anything. Truncated string bounds still bound (a prefix is below every value it
    starts, and Delta's truncated maximum is above), and Python orders strings by code point, as UTF-8
    bytes order."""
    file_low = _typed(_bound(live, "min_values", name), data_type)
    file_high = _typed(_bound(live, "max_values", name), data_type)
    if file_low is not None and file_low > high:
        return False
    return not (file_high is not None and file_high < low)


def _bound(live: LiveFile, which: str, name: str) -> Any:
    if live.stats is None:
        return None
    value = getattr(live.stats, which).get(name)
    return None if isinstance(value, (dict, list)) else value


def _typed(value: Any, data_type: DataType) -> Any:
    """A statistic as the source's min and max come (int, date or str), or None if it is not one."""
    try:
        if isinstance(data_type, StringType):
            return value if isinstance(value, str) else None
        if isinstance(data_type, DateType):
            return dt.date.fromisoformat(value) if isinstance(value, str) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    except ValueError:
        return None


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
        if _field(target_schema, target).dataType == _field(source_schema, source).dataType:
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


def _field(schema: StructType, name: str) -> StructField:
    return next(f for f in schema.fields if f.name == name)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
