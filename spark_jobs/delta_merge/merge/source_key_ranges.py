"""The target files a merge's join can skip by the source's keys.

A target row matches a source row only where every conjunct ``t.a = s.b`` of the search condition holds,
so a file whose statistics put all its ``a`` values where no ``b`` of the source is holds no row the
source matches (NULL keys match nothing under ``=``). One Spark job marks which pieces of the files'
[min, max] intervals hold a source key (key_intervals); a file none of whose pieces is marked is skipped,
also when it lies between the source's keys. delta-rs prunes its scan by the source's one [min, max]
range, a coarser form of the same; Delta on Spark leaves it to dynamic file pruning. Only the join reads
fewer files: the files after skipping that the metrics count and that the commit's conflict check takes
as read stay those of the target-only predicates, as Delta's.
"""

from __future__ import annotations

import datetime as dt
import functools
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

from spark_jobs.delta_merge.analysis.merge_plan import MergePlan
from spark_jobs.delta_merge.merge.key_intervals import (
    EPOCH,
    MARKS_SCHEMA,
    intervals_marked,
    mark_pieces,
    merge_marks,
)
from spark_jobs.delta_merge.protocol.column_mapping import physical_name
from spark_jobs.delta_merge.protocol.files import LiveFile
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot
from spark_jobs.delta_merge.spark_confs import size_conf
from spark_jobs.delta_merge.sql_names import quoted_name
from spark_jobs.delta_merge.statement.expressions import column_refs, parse_expression, split_conjuncts

__all__ = ["KEY_RANGES_CONF", "join_keys", "joinable_files"]

# Candidates holding fewer bytes are all joined: marking the source's keys costs a Spark job (seconds in a
# cold JVM), more than reading a few small files.
KEY_RANGES_CONF = "spark.delta_merge.sourceKeyRanges.minFileBytes"
_DEFAULT_MIN_FILE_BYTES = 8 << 20

# Key types whose statistics compare with the source's keys exactly, as Python values.
_RANGE_TYPES = (ByteType, ShortType, IntegerType, LongType, DateType, StringType)


def joinable_files(
    spark: SparkSession, source: DataFrame, *, snapshot: TargetSnapshot, plan: MergePlan,
    files: Sequence[LiveFile],
) -> list[LiveFile]:
    """The ``files`` whose statistics allow a row with a key some source row has (when they hold at
    least :data:`KEY_RANGES_CONF` bytes, default 8 MiB): one Spark job over the source's key columns
    (none where no file has statistics on a key), the files compared on the driver. All of them when the
    statement has NOT MATCHED BY SOURCE clauses (which act on unmatched rows) or no equi-join key of a
    type whose statistics order as the keys compare (integers, dates, strings of the binary collation)."""
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
        and getattr(field.dataType, "collation", "UTF8_BINARY") == "UTF8_BINARY"
        and any(_bound(f, "min_values", physical_name(field, snapshot.column_mapping_mode)) is not None
                for f in files)
    ]  # fmt: skip
    if not keys:
        return list(files)
    intervals = [[_interval(f, name, data_type) for f in files] for name, data_type, _ in keys]
    endpoints = [sorted({v for interval in key for v in interval if v is not None}) for key in intervals]
    # Dot-free names: pyspark's mapInArrow looks its input columns up by bare name, reading `a.b` as a field.
    key_columns = source.select(*[
        F.col(quoted_name(column)).alias(f"key{index}") for index, (_, _, column) in enumerate(keys)
    ])  # fmt: skip
    rows = key_columns.mapInArrow(functools.partial(mark_pieces, endpoints), MARKS_SCHEMA).collect()
    marks = merge_marks([(row["key"], row["pieces"]) for row in rows], endpoints)
    if not all(m.any() for m in marks):
        return []  # no source row has this key: nothing matches
    held = [intervals_marked(m, e, i) for m, e, i in zip(marks, endpoints, intervals, strict=True)]
    return [f for index, f in enumerate(files) if all(per_key[index] for per_key in held)]


def _interval(live: LiveFile, name: str, data_type: DataType) -> tuple[Any, Any]:
    """``live``'s [min, max] of ``name`` as key_intervals compares them (dates as days since 1970-01-01);
    a missing or unreadable bound is None (unbounded). Truncated string bounds still bound: a prefix is
    below every value it starts, and Delta's truncated maximum is above."""
    low = _typed(_bound(live, "min_values", name), data_type)
    high = _typed(_bound(live, "max_values", name), data_type)
    if low is not None and high is not None and low > high:
        return None, None  # inconsistent statistics bound nothing
    return low, high


def _bound(live: LiveFile, which: str, name: str) -> Any:
    if live.stats is None:
        return None
    value = getattr(live.stats, which).get(name)
    return None if isinstance(value, (dict, list)) else value


def _typed(value: Any, data_type: DataType) -> Any:
    """A statistic as an int (a date as days since 1970-01-01) or str, or None if it is not one."""
    try:
        if isinstance(data_type, StringType):
            return value if isinstance(value, str) else None
        if isinstance(data_type, DateType):
            return (dt.date.fromisoformat(value) - EPOCH).days if isinstance(value, str) else None
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


