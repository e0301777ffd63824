"""MERGE INTO text, or the structural form's parts, to a ParsedMerge; and Delta's rules on the result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import TokenType, exp
from sqlglot.errors import SqlglotError

from spark_jobs.delta_merge.errors import MergeSpecError
from spark_jobs.delta_merge.expression_guard import (
    ClauseAction,
    check_expression,
    normalize_expression,
    render_expression,
    syntax_error,
    tokenize_checked,
)
from spark_jobs.delta_merge.spec import (
    ActionKind,
    Assignment,
    ClauseKind,
    MergeClause,
    ParsedMerge,
    format_column_path,
)

__all__ = [
    "check_parsed_merge",
    "parse_merge_sql",
    "parse_structural",
    "strip_target_alias",
]

_ALLOWED_ACTIONS: dict[ClauseKind, tuple[ActionKind, ...]] = {
    "matched": ("update", "update_all", "delete"),
    "not_matched": ("insert", "insert_all"),
    # Delta's grammar has no UPDATE SET * here: there is no source row to take values from.
    "not_matched_by_source": ("update", "delete"),
}
_KIND_SQL: dict[ClauseKind, str] = {
    "matched": "MATCHED",
    "not_matched": "NOT MATCHED [BY TARGET]",
    "not_matched_by_source": "NOT MATCHED BY SOURCE",
}
_ACTION_SQL: dict[ActionKind, tuple[str, ClauseAction]] = {
    "update": ("UPDATE SET ...", "UPDATE"),
    "update_all": ("UPDATE SET *", "UPDATE"),
    "delete": ("DELETE", "DELETE"),
    "insert": ("INSERT (...) VALUES (...)", "INSERT"),
    "insert_all": ("INSERT *", "INSERT"),
}


def strip_target_alias(column: Sequence[str], target_alias: str) -> tuple[str, ...]:
    """Drop a leading target alias (``t.addr.city`` -> ``addr.city``), as Spark resolves SET columns."""
    if len(column) > 1 and column[0].lower() == target_alias.lower():
        return tuple(column[1:])
    return tuple(column)


@dataclass(frozen=True)
class _Fields:
    """How errors name a part of the merge: by SQL position, or by the structural form's keys."""

    sql: bool

    def on(self) -> str:
        return "merge_sql ON condition" if self.sql else "condition"

    def clause(self, index: int) -> str:
        return f"merge_sql WHEN clause {index + 1}" if self.sql else f"clauses[{index}]"

    def condition(self, index: int) -> str:
        return f"{self.clause(index)} condition" if self.sql else f"clauses[{index}].condition"

    def value(self, index: int, action: ActionKind, column: Sequence[str]) -> str:
        path = format_column_path(column)
        if self.sql:
            return f"{self.clause(index)} {'SET' if action == 'update' else 'INSERT'} {path}"
        return f"clauses[{index}].{'set' if action == 'update' else 'values'}.{path}"


def parse_merge_sql(merge_sql: str, *, field: str = "merge_sql") -> ParsedMerge:
    """Parse one ``MERGE INTO target [AS] t USING source [AS] s ON ... WHEN ...`` statement.

    The names after MERGE INTO and USING stand for the spec's target and source; their aliases (or, without
    an alias, the names themselves) are what the expressions refer to.
    """
    if not isinstance(merge_sql, str) or not merge_sql.strip():
        raise MergeSpecError(f"{field}: expected a MERGE INTO statement, found {merge_sql!r}")
    tokens = tokenize_checked(merge_sql, field=field, allow_trailing_semicolon=True)
    if tokens[0].token_type == TokenType.MERGE and all(t.token_type != TokenType.WHEN for t in tokens):
        raise MergeSpecError(f"{field}: There must be at least one WHEN clause in a MERGE statement")
    try:
        statements = [s for s in sqlglot.parse(merge_sql, dialect="spark") if s is not None]
    except SqlglotError as error:
        raise syntax_error(field, error, expected="a Spark SQL MERGE INTO statement") from error
    merge = statements[0] if len(statements) == 1 else None
    if not isinstance(merge, exp.Merge):
        found = merge.key.upper() if merge is not None else f"{len(statements)} statements"
        raise MergeSpecError(f"{field}: expected a MERGE INTO statement, found {found}")
    target_alias = _alias(merge.this, field=f"{field} MERGE INTO", role="target")
    source_alias = _alias(merge.args.get("using"), field=f"{field} USING", role="source")
    on = merge.args.get("on")
    if not isinstance(on, exp.Expr):
        raise MergeSpecError(f"{field}: expected an ON condition, found none")
    fields = _Fields(sql=True)
    whens = merge.args.get("whens")
    clauses = tuple(
        _sql_clause(when, index, target_alias=target_alias, fields=fields)
        for index, when in enumerate(whens.expressions if whens is not None else [])
    )
    return ParsedMerge(
        target_alias=target_alias,
        source_alias=source_alias,
        condition=_normalize_node(on, field=fields.on()),
        clauses=clauses,
    )


def parse_structural(
    *, target_alias: str, source_alias: str, condition: str, clauses: Sequence[MergeClause]
) -> ParsedMerge:
    """The structural form (clauses as data, expressions as text), normalized as merge_sql is."""
    fields = _Fields(sql=False)
    parsed = []
    for index, clause in enumerate(clauses):
        assignments = tuple(
            Assignment(
                column=strip_target_alias(a.column, target_alias),
                value=normalize_expression(a.value, field=fields.value(index, clause.action, a.column)),
            )
            for a in clause.assignments
        )
        clause_condition = clause.condition
        if clause_condition is not None:
            clause_condition = normalize_expression(clause_condition, field=fields.condition(index))
        parsed.append(MergeClause(clause.when, clause.action, clause_condition, assignments))
    return ParsedMerge(
        target_alias=target_alias,
        source_alias=source_alias,
        condition=normalize_expression(condition, field=fields.on()),
        clauses=tuple(parsed),
    )


def check_parsed_merge(parsed: ParsedMerge, *, sql_form: bool) -> None:
    """Delta's rules for a MERGE statement, then the expression guard on every expression.

    :param sql_form: whether the merge came from ``merge_sql`` (errors then name SQL positions).
    :raises MergeSpecError: with Delta's wording where Delta has one.
    """
    fields = _Fields(sql=sql_form)
    field = "merge_sql" if sql_form else "clauses"
    if parsed.target_alias.lower() == parsed.source_alias.lower():
        raise MergeSpecError(
            f"{'merge_sql' if sql_form else 'target_alias'}: expected different aliases for the target and "
            f"the source, found {parsed.target_alias!r} for both"
        )
    if not parsed.clauses:
        raise MergeSpecError(f"{field}: There must be at least one WHEN clause in a MERGE statement")
    for index, clause in enumerate(parsed.clauses):
        allowed = _ALLOWED_ACTIONS[clause.when]
        if clause.action not in allowed:
            raise MergeSpecError(
                f"{fields.clause(index)}: expected one of {', '.join(allowed)} in a WHEN "
                f"{_KIND_SQL[clause.when]} clause, found {clause.action} ({_ACTION_SQL[clause.action][0]})"
            )
    _check_clause_order(parsed, field=field)
    for index, clause in enumerate(parsed.clauses):
        _check_assignments(clause, field=fields.clause(index))
    check_expression(parsed.condition, field=fields.on(), context="search condition")
    for index, clause in enumerate(parsed.clauses):
        if clause.condition is not None:
            check_expression(
                clause.condition,
                field=fields.condition(index),
                context="clause condition",
                action=_ACTION_SQL[clause.action][1],
            )
        for a in clause.assignments:
            where = fields.value(index, clause.action, a.column)
            check_expression(a.value, field=where, context="assignment")


def _check_clause_order(parsed: ParsedMerge, *, field: str) -> None:
    for kind, name in _KIND_SQL.items():
        of_kind = parsed.clauses_of(kind)
        unconditional = [i for i, c in enumerate(of_kind[:-1]) if c.condition is None]
        if unconditional:
            raise MergeSpecError(
                f"{field}: When there are more than one {name} clauses in a MERGE statement, only the last "
                f"{name} clause can omit the condition. Found an unconditional {name} clause at position "
                f"{unconditional[0] + 1} of {len(of_kind)}."
            )


def _check_assignments(clause: MergeClause, *, field: str) -> None:
    needs = clause.action in ("update", "insert")
    if needs and not clause.assignments:
        raise MergeSpecError(f"{field}: expected at least one assignment for {clause.action}, found none")
    if not needs and clause.assignments:
        raise MergeSpecError(
            f"{field}: expected no assignments for action {clause.action}, found {len(clause.assignments)}"
        )
    columns = [tuple(part.lower() for part in a.column) for a in clause.assignments]
    shown = [f"`{'.'.join(a.column)}`" for a in clause.assignments]
    if clause.action == "update":
        # Spark's case-insensitive resolution: `a` and `A` are one column; `a` and `a.b` overlap.
        conflicts = [
            shown[i]
            for i, column in enumerate(columns)
            if any(j != i and _overlaps(column, other) for j, other in enumerate(columns))
        ]
        if conflicts:
            listed = ", ".join(conflicts)
            raise MergeSpecError(f"{field}: There is a conflict from these SET columns: [{listed}].")
    elif clause.action == "insert":
        for a in clause.assignments:
            if len(a.column) > 1:
                nested = ".".join(f"`{part}`" for part in a.column)
                raise MergeSpecError(
                    f"{field}: Nested field is not supported in the INSERT clause of MERGE operation "
                    f"(field = {nested})."
                )
        duplicated = sorted({shown[i] for i, column in enumerate(columns) if columns.count(column) > 1})
        if duplicated:
            raise MergeSpecError(
                f"{field}: Duplicate column names in INSERT clause: found {', '.join(duplicated)} repeated"
            )


def _overlaps(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]


def _alias(node: object, *, field: str, role: str) -> str:
    if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
        found = render_expression(node, field=field) if isinstance(node, exp.Expr) else "nothing"
        hint = "; put a source query in source.query" if role == "source" else ""
        raise MergeSpecError(f"{field}: expected a table name standing for the {role}, found {found}{hint}")
    return str(node.alias or node.name)


def _normalize_node(node: exp.Expr, *, field: str) -> str:
    # Rendered, then parsed again as one expression, so both spec forms meet in exactly one normal form.
    return normalize_expression(render_expression(node, field=field), field=field)


def _sql_column(node: exp.Expr, *, field: str) -> tuple[str, ...]:
    if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
        return tuple(str(part.name) for part in node.parts)
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Identifier):
        return (*_sql_column(node.this, field=field), str(node.expression.name))
    raise MergeSpecError(f"{field}: expected a column name, found {render_expression(node, field=field)!r}")


def _sql_clause(when: exp.When, index: int, *, target_alias: str, fields: _Fields) -> MergeClause:
    kind: ClauseKind = "matched" if when.args.get("matched") else "not_matched"
    if kind == "not_matched" and when.args.get("source"):
        kind = "not_matched_by_source"
    condition = when.args.get("condition")
    text = _normalize_node(condition, field=fields.condition(index)) if condition is not None else None
    then = when.args.get("then")
    field = fields.clause(index)
    if isinstance(then, exp.Var) and then.name.upper() == "DELETE":
        return MergeClause(kind, "delete", text)
    if isinstance(then, exp.Update):
        if len(then.expressions) == 1 and isinstance(then.expressions[0], exp.Star):
            return MergeClause(kind, "update_all", text)
        pairs = []
        for eq in then.expressions:
            if not isinstance(eq, exp.EQ):
                raise MergeSpecError(f"{field}: expected SET column = value, found {render_expression(eq)!r}")
            pairs.append((_sql_column(eq.this, field=field), eq.expression))
        return MergeClause(kind, "update", text, _assignments(pairs, index, "update", target_alias, fields))
    if isinstance(then, exp.Insert):
        if isinstance(then.this, exp.Star):
            return MergeClause(kind, "insert_all", text)
        if not isinstance(then.this, exp.Tuple) or not isinstance(then.expression, exp.Tuple):
            raise MergeSpecError(
                f"{field}: expected INSERT (columns) VALUES (values) or INSERT *, found no column list"
            )
        columns = [_sql_column(c, field=field) for c in then.this.expressions]
        values = then.expression.expressions
        if len(columns) != len(values):
            raise MergeSpecError(
                f"{field}: expected as many INSERT values as columns, found {len(columns)} columns and "
                f"{len(values)} values"
            )
        pairs = list(zip(columns, values, strict=True))
        return MergeClause(kind, "insert", text, _assignments(pairs, index, "insert", target_alias, fields))
    found = render_expression(then, field=field) if isinstance(then, exp.Expr) else "nothing"
    raise MergeSpecError(f"{field}: expected UPDATE, DELETE or INSERT after THEN, found {found!r}")


def _assignments(
    pairs: Sequence[tuple[tuple[str, ...], exp.Expr]],
    index: int,
    action: ActionKind,
    target_alias: str,
    fields: _Fields,
) -> tuple[Assignment, ...]:
    return tuple(
        Assignment(
            column=strip_target_alias(column, target_alias),
            value=_normalize_node(value, field=fields.value(index, action, column)),
        )
        for column, value in pairs
    )
