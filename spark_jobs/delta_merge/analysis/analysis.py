"""Resolve a parsed merge against the target and source schemas, as Delta's PreprocessTableMerge does.

The result says, for every clause, which value each column of the final table schema takes. It is built
from empty DataFrames only: analysis runs no Spark job and reads no data.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, NullType, StructField, StructType

from spark_jobs.delta_merge.analysis.column_defaults import (
    column_defaults,
    default_placement_error,
    default_value,
    is_default_keyword,
    mentions_default,
    no_default_error,
)
from spark_jobs.delta_merge.analysis.constraints import generated_columns
from spark_jobs.delta_merge.analysis.evolution import evolve_schema
from spark_jobs.delta_merge.analysis.merge_plan import MergePlan, ResolvedClause
from spark_jobs.delta_merge.analysis.store_assignment import find_field, store_assign
from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.protocol.identity_columns import (
    IdentityColumn,
    check_identity_assignments,
    generated_identity_value,
    identity_columns,
    inserts_generating,
)
from spark_jobs.delta_merge.protocol.type_widening import WideningRule
from spark_jobs.delta_merge.spec import MergeClause, MergeOptions, ParsedMerge
from spark_jobs.delta_merge.sql_names import quoted_path
from spark_jobs.delta_merge.statement.expressions import column_refs, qualify_to_side, split_conjuncts

__all__ = ["resolve_merge"]


_CLAUSE_NAMES = {
    ("matched", "update"): "UPDATE",
    ("matched", "update_all"): "UPDATE",
    ("matched", "delete"): "DELETE",
    ("not_matched", "insert"): "INSERT",
    ("not_matched", "insert_all"): "INSERT",
    ("not_matched_by_source", "update"): "UPDATE",
    ("not_matched_by_source", "delete"): "DELETE",
}
_UNRESOLVED = re.compile(r"name (`[^ ]+`) cannot be resolved")
_UNRESOLVED_CLASS = "DELTA_MERGE_UNRESOLVED_EXPRESSION"


def _quote(parts: Sequence[str]) -> str:
    return quoted_path(parts)


def _as_condition(sql: str, sql_type: DataType) -> str:
    # `ON NULL` (or `AND NULL`) is VOID-typed, which Spark's joins and CASE WHEN refuse; as a BOOLEAN
    # NULL it holds for no row, so every row is unmatched, as in Delta.
    return f"CAST(({sql}) AS BOOLEAN)" if isinstance(sql_type, NullType) else sql


# In an assignment tree, a struct node that SET * unfolded from one source struct names that struct here.
_WHOLE_SOURCE_STRUCT = "\x00source struct"


class _Resolver:
    def __init__(
        self, spark: SparkSession, parsed: ParsedMerge, target_schema: StructType,
        source_schema: StructType, options: MergeOptions, widen_types: WideningRule | None = None,
    ) -> None:
        self.spark = spark
        self.parsed = parsed
        self.t = parsed.target_alias
        self.s = parsed.source_alias
        self.target_schema = target_schema
        self.source_schema = source_schema
        self.options = options
        self.target_df = spark.createDataFrame([], target_schema).alias(self.t)
        self.source_df = spark.createDataFrame([], source_schema).alias(self.s)
        self.joined_df = self.source_df.crossJoin(self.target_df)
        self.final_schema = evolve_schema(
            parsed, target_schema, source_schema, enabled=options.schema_evolution, widen_types=widen_types
        )
        self.generated = set(generated_columns(target_schema))
        self.identity = identity_columns(target_schema)
        self.defaults = column_defaults(target_schema)

    # -- resolution helpers -------------------------------------------------------------------------
    def _columns_of(self, df: DataFrame) -> str:
        names: list[str] = []
        if df is not self.target_df:
            names += [f"{self.s}.{f.name}" for f in self.source_schema.fields]
        if df is not self.source_df:
            names += [f"{self.t}.{f.name}" for f in self.target_schema.fields]
        return ", ".join(names)

    def expr_type(self, sql: str, df: DataFrame, where: str) -> DataType:
        try:
            return df.select(F.expr(sql)).schema.fields[0].dataType
        except AnalysisException as exc:
            message = str(exc)
            match = _UNRESOLVED.search(message)
            if match:
                raise MergeAnalysisError(
                    f"cannot resolve {match.group(1)} in {where} given columns {self._columns_of(df)}. "
                    "Check the column name and the alias it is qualified with.",
                    error_class=_UNRESOLVED_CLASS,
                ) from exc
            raise MergeAnalysisError(
                f"Invalid expression in {where}: {sql}: {message.splitlines()[0]}"
            ) from exc

    def side_sql(self, sql: str, clause: MergeClause, where: str) -> tuple[str, DataFrame]:
        """The expression qualified for the rows the clause sees, and the DataFrame to resolve it on."""
        if clause.when == "matched":
            return sql, self.joined_df
        if clause.when == "not_matched":
            alias, other, other_cols, df = self.s, self.t, self.target_schema.fieldNames(), self.source_df
        else:
            alias, other, other_cols, df = self.t, self.s, self.source_schema.fieldNames(), self.target_df
        del other_cols
        qualified, foreign = qualify_to_side(sql, alias=alias, other_alias=other, other_columns=[])
        if foreign:
            raise MergeAnalysisError(
                f"cannot resolve {foreign[0]} in {where} given columns {self._columns_of(df)}. "
                f"A {'NOT MATCHED' if clause.when == 'not_matched' else 'NOT MATCHED BY SOURCE'} clause "
                "sees only the "
                f"{'source' if clause.when == 'not_matched' else 'target'} row.",
                error_class=_UNRESOLVED_CLASS,
            )
        return qualified, df

    # -- clauses ------------------------------------------------------------------------------------
    def resolve(self) -> MergePlan:
        condition_type = self.expr_type(self.parsed.condition, self.joined_df, "search condition")
        clauses = tuple(self._clause(c) for c in self.parsed.clauses)
        # After resolution, as Delta's PreprocessTableMerge checks resolved clauses.
        check_identity_assignments(self.identity, self.parsed, source_schema=self.source_schema)
        return MergePlan(
            target_alias=self.t,
            source_alias=self.s,
            condition=_as_condition(self.parsed.condition, condition_type),
            clauses=clauses,
            target_schema=self.target_schema,
            final_schema=self.final_schema,
            source_columns=self._referenced_source_columns(),
            target_only_predicates=self._target_only_predicates(),
            parsed=self.parsed,
            copy_values=tuple(self._target_value(f) for f in self.final_schema.fields),
            tracked_identity=tuple(
                column.name for column in self.identity
                if any(inserts_generating(column, c, self.source_schema) for c in self.parsed.clauses)
            ),
        )

    def _clause(self, clause: MergeClause) -> ResolvedClause:
        name = _CLAUSE_NAMES[(clause.when, clause.action)]
        condition = None
        if clause.condition is not None:
            condition, df = self.side_sql(clause.condition, clause, f"{name} condition")
            condition = _as_condition(condition, self.expr_type(condition, df, f"{name} condition"))
        outputs: tuple[Column, ...] | None = None
        generated: set[str] = set()
        if clause.action == "update_all":
            outputs = self._star(clause, update=True, generated=generated)
        elif clause.action == "insert_all":
            outputs = self._star(clause, update=False, generated=generated)
        elif clause.action in ("update", "insert"):
            outputs = self._explicit(
                clause, update=clause.action == "update", where=f"{name} clause", generated=generated
            )
        drawing = [c for c in self.identity if inserts_generating(c, clause, self.source_schema)]
        if drawing and outputs is not None:
            outputs = self._with_identity_values(outputs, drawing)
        return ResolvedClause(
            clause.when, clause.action, condition, outputs, frozenset(generated), draws_identity=bool(drawing)
        )

    def _with_identity_values(
        self, outputs: tuple[Column, ...], drawing: Sequence[IdentityColumn]
    ) -> tuple[Column, ...]:
        by_name = {c.name.lower(): c for c in drawing}
        return tuple(
            generated_identity_value(by_name[f.name.lower()], f).alias(f.name)
            if f.name.lower() in by_name else value
            for f, value in zip(self.final_schema.fields, outputs, strict=True)
        )

    def _target_value(self, field: StructField) -> Column:
        """The current target value widened to the final type (NULL for a column the merge adds)."""
        existing = find_field(self.target_schema, field.name)
        if existing is None:
            return F.lit(None).cast(field.dataType)
        return self._assign(
            F.col(_quote((self.t, existing.name))), existing.dataType, field.dataType, field.name,
            allow_missing=True,
        )

    def _assign(
        self, value: Column, src: DataType, dst: DataType, column: str, *, allow_missing: bool
    ) -> Column:
        return store_assign(
            value, src, dst, policy=self.options.store_assignment_policy,
            by_name=self.options.resolve_structs_by_name, column=column,
            allow_missing_fields=allow_missing or self.options.schema_evolution,
        )

    def _star(self, clause: MergeClause, *, update: bool, generated: set[str]) -> tuple[Column, ...]:
        """``SET *`` / ``INSERT *``; a generated column the source lacks is added to ``generated``.

        With schema evolution Delta unfolds ``UPDATE SET *`` into one assignment per leaf field of the
        source, so a target struct field the source struct lacks keeps its value; ``INSERT *`` and
        ``SET *`` without evolution assign each whole column by name.
        """
        df = self.joined_df if update else self.source_df
        where = "UPDATE clause" if update else "INSERT clause"
        if update and self.options.schema_evolution:
            tree = self._source_leaves(self.source_schema, self.final_schema, ())
            return self._tree_outputs(tree, clause, update=True, where=where, generated=generated)
        outputs: list[Column] = []
        for field in self.final_schema.fields:
            source_field = find_field(self.source_schema, field.name)
            if source_field is None:
                if field.name.lower() in self.generated:
                    generated.add(field.name)
                if (self.options.schema_evolution or find_field(self.target_schema, field.name) is None
                        or field.name.lower() in self.generated
                        or any(c.name.lower() == field.name.lower() for c in self.identity)):
                    value = self._target_value(field) if update else F.lit(None).cast(field.dataType)
                    outputs.append(value.alias(field.name))
                    continue
                raise MergeAnalysisError(
                    f"cannot resolve {self.s}.{field.name} in {where} given columns {self._columns_of(df)}. "
                    f"`{'UPDATE SET *' if update else 'INSERT *'}` needs a source column for every target "
                    "column; enable options.schema_evolution or list the columns explicitly.",
                    error_class=_UNRESOLVED_CLASS,
                )
            value = F.col(_quote((self.s, source_field.name)))
            outputs.append(
                self._assign(value, source_field.dataType, field.dataType, field.name, allow_missing=False)
                .alias(field.name)
            )
        return tuple(outputs)

    def _source_leaves(self, source: StructType, final: StructType, path: tuple[str, ...]) -> dict[str, Any]:
        """An assignment tree (as ``_explicit`` builds) assigning every leaf of the source by its name."""
        tree: dict[str, Any] = {}
        for field in source.fields:
            final_field = find_field(final, field.name)
            if final_field is None:
                continue
            if isinstance(field.dataType, StructType) and isinstance(final_field.dataType, StructType):
                tree[field.name.lower()] = {
                    **self._source_leaves(field.dataType, final_field.dataType, (*path, field.name)),
                    _WHOLE_SOURCE_STRUCT: _quote((self.s, *path, field.name)),
                }
            else:
                tree[field.name.lower()] = {"": _quote((self.s, *path, field.name))}
        return tree

    def _explicit(
        self, clause: MergeClause, *, update: bool, where: str, generated: set[str]
    ) -> tuple[Column, ...]:
        """Explicit assignments; an unassigned generated column is added to ``generated``.

        NOT MATCHED BY SOURCE clauses assign only the target's own columns: schema evolution adds
        columns only for the other clauses (Delta resolves their columns against the target alone).
        """
        # A tree of assignments: {column: {"": value} | {field: ...}} keyed by lower-cased name.
        tree: dict[str, Any] = {}
        schema = self.target_schema if clause.when == "not_matched_by_source" else self.final_schema
        for assignment in clause.assignments:
            path = self._resolve_path(assignment.column, where, schema=schema)
            node = tree
            for part in path[:-1]:
                node = node.setdefault(part.lower(), {})
            node[path[-1].lower()] = {"": assignment.value}
        return self._tree_outputs(tree, clause, update=update, where=where, generated=generated)

    def _tree_outputs(
        self, tree: dict[str, Any], clause: MergeClause, *, update: bool, where: str, generated: set[str]
    ) -> tuple[Column, ...]:
        outputs: list[Column] = []
        for field in self.final_schema.fields:
            assigned = tree.get(field.name.lower())
            has_default = field.name.lower() in self.defaults
            if assigned is None and field.name.lower() in self.generated and not has_default:
                generated.add(field.name)
            if assigned is None and update:
                value = self._target_value(field)
            elif assigned is None:
                # An INSERT column list leaving a column out gives it its DEFAULT (Spark fills it in).
                value = self._default_value(field) if has_default else F.lit(None).cast(field.dataType)
            else:
                value = self._node_value(assigned, field, clause, where, (field.name,), update=update)
            outputs.append(value.alias(field.name))
        return tuple(outputs)

    def _node_value(
        self, node: dict[str, Any], field: StructField, clause: MergeClause, where: str,
        path: tuple[str, ...], *, update: bool,
    ) -> Column:
        if "" in node:
            text = node[""]
            if len(path) == 1 and is_default_keyword(text) and not self._side_has_column(clause, "default"):
                return self._explicit_default(field, where)
            try:
                sql, df = self.side_sql(text, clause, where)
                src_type = self.expr_type(sql, df, where)
            except MergeAnalysisError as exc:
                if exc.error_class == _UNRESOLVED_CLASS and not is_default_keyword(text) and mentions_default(
                    text
                ):
                    raise default_placement_error(where, text) from exc
                raise
            return self._assign(F.expr(sql), src_type, field.dataType, ".".join(path), allow_missing=False)
        struct = field.dataType
        assert isinstance(struct, StructType)
        target_struct = self._target_type(path)
        base = F.col(_quote((self.t, *path)))
        children: list[Column] = []
        for child in struct.fields:
            child_node = node.get(child.name.lower())
            child_path = (*path, child.name)
            if child_node is not None:
                value = self._node_value(child_node, child, clause, where, child_path, update=update)
            elif isinstance(target_struct, StructType) and find_field(target_struct, child.name) is not None:
                existing = find_field(target_struct, child.name)
                assert existing is not None
                value = self._assign(
                    base.getField(existing.name), existing.dataType, child.dataType, ".".join(child_path),
                    allow_missing=True,
                )
            else:
                value = F.lit(None).cast(child.dataType)
            children.append(value.alias(child.name))
        if _WHOLE_SOURCE_STRUCT in node:
            # A struct SET * unfolded leaf by leaf stays NULL where the source's struct is NULL, as in Delta.
            source_struct = F.col(node[_WHOLE_SOURCE_STRUCT])
            return F.when(source_struct.isNull(), F.lit(None).cast(struct)).otherwise(F.struct(*children))
        return F.struct(*children)

    def _side_has_column(self, clause: MergeClause, name: str) -> bool:
        """A column of the rows the clause sees is called ``name`` (names resolve before the keyword)."""
        schemas = {
            "matched": (self.source_schema, self.target_schema),
            "not_matched": (self.source_schema,),
            "not_matched_by_source": (self.target_schema,),
        }[clause.when]
        return any(find_field(schema, name) is not None for schema in schemas)

    def _explicit_default(self, field: StructField, where: str) -> Column:
        """``column = DEFAULT``: the column's default, or NULL for a nullable column without one."""
        lowered = field.name.lower()
        if lowered in self.generated or any(c.name.lower() == lowered for c in self.identity):
            kind = "a generated" if lowered in self.generated else "an identity"
            raise MergeAnalysisError(
                f"DEFAULT cannot be assigned to `{field.name}` in {where}: it is {kind} column, whose value "
                "Delta computes. Leave the column out of the INSERT column list (or the UPDATE SET list) "
                "instead."
            )
        if lowered in self.defaults:
            return self._default_value(field)
        if not field.nullable:
            raise no_default_error(field)
        return F.lit(None).cast(field.dataType)

    def _default_value(self, field: StructField) -> Column:
        """The column's DEFAULT expression, guarded and stored as the column's type."""
        return default_value(
            self.spark, field, self.defaults[field.name.lower()],
            assign=lambda value, src: self._assign(
                value, src, field.dataType, field.name, allow_missing=False
            ),
        )

    def _target_type(self, path: Sequence[str]) -> DataType | None:
        current: DataType = self.target_schema
        for part in path:
            if not isinstance(current, StructType):
                return None
            found = find_field(current, part)
            if found is None:
                return None
            current = found.dataType
        return current

    def _resolve_path(self, column: Sequence[str], where: str, *, schema: StructType) -> tuple[str, ...]:
        current: DataType = schema
        resolved: list[str] = []
        for index, part in enumerate(column):
            found = find_field(current, part) if isinstance(current, StructType) else None
            if found is None:
                given = ", ".join(f"{self.t}.{f.name}" for f in self.target_schema.fields)
                if index > 0 and not isinstance(current, StructType):
                    raise MergeAnalysisError(
                        f"Cannot update {_quote(column)} in {where}: `{'.'.join(resolved)}` is not a struct."
                    )
                raise MergeAnalysisError(
                    f"cannot resolve {'.'.join(column)} in {where} given columns {given}. "
                    "The assigned column must exist in the target table (or, with schema evolution, in "
                    "the source under the same name).",
                    error_class=_UNRESOLVED_CLASS,
                )
            resolved.append(found.name)
            current = found.dataType
        return tuple(resolved)

    # -- what later stages need ---------------------------------------------------------------------
    def _referenced_source_columns(self) -> tuple[str, ...]:
        if any(c.action in ("update_all", "insert_all") for c in self.parsed.clauses):
            return tuple(self.source_schema.fieldNames())
        texts = [self.parsed.condition]
        for clause in self.parsed.clauses:
            texts += [clause.condition] if clause.condition else []
            texts += [a.value for a in clause.assignments]
        names: set[str] = set()
        for text in texts:
            for ref in column_refs(text):
                names.update(p.lower() for p in ref.parts[:2])
        return tuple(f.name for f in self.source_schema.fields if f.name.lower() in names)

    def _is_target_only(self, sql: str) -> bool:
        target_names = {n.lower() for n in self.target_schema.fieldNames()}
        source_names = {n.lower() for n in self.source_schema.fieldNames()}
        for ref in column_refs(sql):
            first = ref.parts[0].lower()
            if len(ref.parts) > 1 and first == self.t.lower():
                continue
            if len(ref.parts) > 1 and first == self.s.lower():
                return False
            if first not in target_names or first in source_names:
                return False
        return True

    def _target_only_predicates(self) -> tuple[str, ...]:
        if self.parsed.clauses_of("not_matched_by_source"):
            # A target row failing a target-only part of ON is "not matched by source", so NOT MATCHED BY
            # SOURCE clauses may act on it: no file can be skipped (Delta skips none either).
            return ()
        predicates = [p for p in split_conjuncts(self.parsed.condition) if self._is_target_only(p)]
        matched = self.parsed.clauses_of("matched")
        if self.parsed.is_matched_only and all(c.condition for c in matched):
            combined = " OR ".join(f"({c.condition})" for c in matched)
            predicates += [p for p in split_conjuncts(combined) if self._is_target_only(p)]
        return tuple(predicates)


def resolve_merge(
    spark: SparkSession, parsed: ParsedMerge, *, target_schema: StructType, source_schema: StructType,
    options: MergeOptions, widen_types: WideningRule | None = None,
) -> MergePlan:
    """Resolve every expression of the merge; raise :class:`MergeAnalysisError` on what Delta rejects.

    :param widen_types: how the table widens types in schema evolution (``delta.enableTypeWidening``), or
        None.
    """
    return _Resolver(spark, parsed, target_schema, source_schema, options, widen_types).resolve()
