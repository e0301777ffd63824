"""Prune target files with target-only predicates: exactly on partition values, safely on statistics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession
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
    TimestampNTZType,
    TimestampType,
)
from sqlglot import exp

from spark_jobs.delta_merge.protocol.column_mapping import partition_keys, physical_name
from spark_jobs.delta_merge.protocol.files import LiveFile
from spark_jobs.delta_merge.protocol.partition_values import parse_partition_value
from spark_jobs.delta_merge.protocol.type_widening import type_changed_columns
from spark_jobs.delta_merge.statement.expressions import parse_expression, render

if TYPE_CHECKING:
    from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot

__all__ = ["partition_count", "prune_files"]

# Types whose JSON bounds convert to Spark values exactly (decimals and floats do not round-trip safely).
_STATS_TYPES = (
    ByteType, ShortType, IntegerType, LongType, StringType, DateType, TimestampType, TimestampNTZType
)
_STRING_PREFIX = 32  # Delta's dataSkippingStringPrefixLength: longer max bounds may be truncated.
_FLIP = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ,
         exp.NullSafeEQ: exp.NullSafeEQ}


class _Rewriter:
    """Rewrites a row predicate into a file predicate that is true whenever the file may hold a match."""

    def __init__(self, snapshot: TargetSnapshot, target_alias: str) -> None:
        self.alias = target_alias.lower()
        self.schema: StructType = snapshot.schema
        self.partition = {c.lower(): c for c in snapshot.partition_columns}
        self.stats: dict[str, tuple[int, StructField]] = {}
        # A widened column's older files carry statistics of the narrower type: not used.
        widened = type_changed_columns(self.schema)
        for field in self.schema.fields:
            if (field.name.lower() not in self.partition and isinstance(field.dataType, _STATS_TYPES)
                    and field.name not in widened):
                self.stats[field.name.lower()] = (len(self.stats), field)

    def _target_column(self, node: exp.Expr) -> str | None:
        if not isinstance(node, exp.Column) or isinstance(node.parent, exp.Dot):
            return None
        parts = [p.name for p in node.parts]
        if len(parts) == 2 and parts[0].lower() == self.alias:
            parts = parts[1:]
        return parts[0].lower() if len(parts) == 1 else None

    def _only_partition_columns(self, node: exp.Expr) -> bool:
        columns = list(node.find_all(exp.Column))
        return all(self._target_column(c) in self.partition for c in columns)

    def rewrite(self, node: exp.Expr) -> exp.Expr | None:
        while isinstance(node, exp.Paren):
            node = node.this
        if not list(node.find_all(exp.Column)):
            # A constant (ON false, ON NULL): kept as a file filter. A VOID-typed NULL is no filter Spark
            # accepts, so it is cast; as a BOOLEAN NULL it keeps no file, since no row can match.
            return exp.Cast(this=node.copy(), to=exp.DataType.build("boolean"))
        if self._only_partition_columns(node):
            out = node.copy()
            for col in list(out.find_all(exp.Column)):
                name = self._target_column(col)
                assert name is not None
                col.replace(exp.column(self.partition[name], quoted=True))
            return out
        if isinstance(node, exp.And):
            left, right = self.rewrite(node.this), self.rewrite(node.expression)
            if left is None or right is None:
                return left or right
            return exp.and_(left, right)
        if isinstance(node, exp.Or):
            left, right = self.rewrite(node.this), self.rewrite(node.expression)
            return exp.or_(left, right) if left is not None and right is not None else None
        if isinstance(node, exp.In) and not node.args.get("query"):
            options = [exp.EQ(this=node.this, expression=v) for v in node.expressions]
            rewritten = [self.rewrite(o) for o in options]
            return exp.or_(*rewritten) if rewritten and all(r is not None for r in rewritten) else None
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            stat = self._stat(node.this)
            return None if stat is None else exp.condition(f"coalesce(__nulls_{stat[0]} > 0, true)")
        negated = node.this if isinstance(node, exp.Not) else None
        if isinstance(negated, exp.Is) and isinstance(negated.expression, exp.Null):
            stat = self._stat(negated.this)
            if stat is None:
                return None
            return exp.condition(f"coalesce(__nulls_{stat[0]} < __num_records, true)")
        if type(node) in _FLIP:
            return self._comparison(node)
        return None

    def _stat(self, node: exp.Expr) -> tuple[int, StructField] | None:
        name = self._target_column(node)
        return self.stats.get(name) if name is not None else None

    def _comparison(self, node: exp.Expr) -> exp.Expr | None:
        kind: Any = type(node)
        left, right = node.this, node.expression
        if self._stat(left) is None:
            left, right, kind = right, left, _FLIP[kind]
        stat = self._stat(left)
        if stat is None or list(right.find_all(exp.Column)):
            return None
        index, field = stat
        value = render(right)
        if kind is exp.NullSafeEQ and isinstance(right, exp.Null):
            return exp.condition(f"coalesce(__nulls_{index} > 0, true)")
        low, high = f"__min_{index}", f"__max_{index}"
        if isinstance(field.dataType, (TimestampType, TimestampNTZType)):
            # Writers truncate timestamp bounds to milliseconds; widen the max like Delta's reader does.
            high = f"({high} + INTERVAL 1 MILLISECOND)"
        is_string = isinstance(field.dataType, StringType)
        max_ok = f"length(__max_{index}) >= {_STRING_PREFIX} OR " if is_string else ""
        if kind in (exp.EQ, exp.NullSafeEQ):
            text = f"{low} <= {value} AND ({max_ok}{high} >= {value})"
        elif kind is exp.LT:
            text = f"{low} < {value}"
        elif kind is exp.LTE:
            text = f"{low} <= {value}"
        elif kind is exp.GT:
            text = f"{max_ok}{high} > {value}"
        else:
            text = f"{max_ok}{high} >= {value}"
        return exp.condition(f"coalesce({text}, true)")


def _stat_value(stats: Any, name: str) -> str | None:
    if stats is None:
        return None
    value = stats.get(name)
    return None if value is None or isinstance(value, (dict, list)) else str(value)


def prune_files(
    spark: SparkSession,
    snapshot: TargetSnapshot,
    files: Sequence[LiveFile],
    *,
    predicates: Sequence[str],
    target_alias: str,
) -> list[LiveFile]:
    """The files that may hold rows satisfying all ``predicates`` (each referencing only the target)."""
    rewriter = _Rewriter(snapshot, target_alias)
    conditions = [r for p in predicates if (r := rewriter.rewrite(parse_expression(p))) is not None]
    if not conditions or not files:
        return list(files)
    schema = snapshot.schema
    part_names = list(snapshot.partition_columns)
    fields = [StructField("__index", LongType()), StructField("__num_records", LongType())]
    fields += [StructField(c, schema[c].dataType) for c in part_names]
    for index, _field in rewriter.stats.values():
        fields += [StructField(f"__min_{index}", StringType()), StructField(f"__max_{index}", StringType()),
                   StructField(f"__nulls_{index}", LongType())]
    # Partition values and stats are keyed as in the log: by physical name in column-mapped tables.
    mode = snapshot.column_mapping_mode
    keys = partition_keys(schema, part_names, mode)
    rows = []
    for position, live in enumerate(files):
        stats = live.stats
        row: list[Any] = [position, stats.num_records if stats else None]
        row += [parse_partition_value(live.partition_values.get(keys[c]), schema[c].dataType)
                for c in part_names]
        for _index, field in rewriter.stats.values():
            name = physical_name(field, mode)
            nulls = _stat_value(stats.null_count if stats else None, name)
            row += [_stat_value(stats.min_values if stats else None, name),
                    _stat_value(stats.max_values if stats else None, name),
                    int(nulls) if nulls is not None else None]
        rows.append(tuple(row))
    df = spark.createDataFrame(rows, StructType(fields))
    for index, field in rewriter.stats.values():
        typed: DataType = field.dataType
        df = df.withColumn(f"__min_{index}", F.col(f"__min_{index}").try_cast(typed))
        if not isinstance(typed, StringType):
            df = df.withColumn(f"__max_{index}", F.col(f"__max_{index}").try_cast(typed))
    keep = " AND ".join(f"({render(c)})" for c in conditions)
    kept = {row[0] for row in df.filter(F.expr(keep)).select("__index").collect()}
    return [live for position, live in enumerate(files) if position in kept]


def partition_count(files: Sequence[LiveFile], partition_columns: Sequence[str]) -> int:
    """Distinct partitions among ``files`` (0 for an unpartitioned table, as Delta reports)."""
    if not partition_columns:
        return 0
    # By the files' own keys: they are physical names in column-mapped tables.
    return len({tuple(sorted(f.partition_values.items())) for f in files})

