"""Delta's rules on a parsed MERGE statement, and the structural form reduced to the same ParsedMerge."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spark_jobs.delta_merge.errors import MergeSpecError
from spark_jobs.delta_merge.statement.expression_guard import ClauseAction, check_expression, parse_expression
from spark_jobs.delta_merge.statement.parsed_merge import (
    ActionKind,
    Assignment,
    ClauseKind,
    MergeClause,
    ParsedMerge,
    format_column_path,
)

__all__ = [
    "ErrorFields",
    "check_parsed_merge",
    "expression_text",
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
# Spark's parser raises these for MERGE text (Delta runs SQL through it); Delta's merge builder raises its
# own for clauses given as data, with the kind named without "[BY TARGET]".
_SQL_OMIT_CONDITION: dict[ClauseKind, tuple[str, str]] = {
    "matched": ("NON_LAST_MATCHED_CLAUSE_OMIT_CONDITION", "MATCHED"),
    "not_matched": ("NON_LAST_NOT_MATCHED_BY_TARGET_CLAUSE_OMIT_CONDITION", "NOT MATCHED [BY TARGET]"),
    "not_matched_by_source": (
        "NON_LAST_NOT_MATCHED_BY_SOURCE_CLAUSE_OMIT_CONDITION",
        "NOT MATCHED BY SOURCE",
    ),
}
_STRUCTURAL_OMIT_CONDITION: dict[ClauseKind, tuple[str, str]] = {
    "matched": ("DELTA_NON_LAST_MATCHED_CLAUSE_OMIT_CONDITION", "MATCHED"),
    "not_matched": ("DELTA_NON_LAST_NOT_MATCHED_CLAUSE_OMIT_CONDITION", "NOT MATCHED"),
    "not_matched_by_source": (
        "DELTA_NON_LAST_NOT_MATCHED_BY_SOURCE_CLAUSE_OMIT_CONDITION",
        "NOT MATCHED BY SOURCE",
    ),
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
class ErrorFields:
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


def expression_text(sql_text: str, *, field: str) -> str:
    """``sql_text`` once it parses as exactly one Spark SQL expression, kept as written.

    The text is kept, not re-rendered: Spark runs exactly what the user wrote, and the job checks that
    Spark's own parser reads it as the same expression (``spark_statement``).
    """
    parse_expression(sql_text, field=field)
    return sql_text.strip()


def parse_structural(
    *, target_alias: str, source_alias: str, condition: str, clauses: Sequence[MergeClause]
) -> ParsedMerge:
    """The structural form (clauses as data, expressions as text), normalized as merge_sql is."""
    fields = ErrorFields(sql=False)
    parsed = []
    for index, clause in enumerate(clauses):
        assignments = tuple(
            Assignment(
                column=strip_target_alias(a.column, target_alias),
                value=expression_text(a.value, field=fields.value(index, clause.action, a.column)),
            )
            for a in clause.assignments
        )
        clause_condition = clause.condition
        if clause_condition is not None:
            clause_condition = expression_text(clause_condition, field=fields.condition(index))
        parsed.append(MergeClause(clause.when, clause.action, clause_condition, assignments))
    return ParsedMerge(
        target_alias=target_alias,
        source_alias=source_alias,
        condition=expression_text(condition, field=fields.on()),
        clauses=tuple(parsed),
    )


def check_parsed_merge(parsed: ParsedMerge, *, sql_form: bool) -> None:
    """Delta's rules for a MERGE statement, then the expression guard on every expression.

    :param sql_form: whether the merge came from ``merge_sql`` (errors then name SQL positions).
    :raises MergeSpecError: with Delta's wording where Delta has one.
    """
    fields = ErrorFields(sql=sql_form)
    field = "merge_sql" if sql_form else "clauses"
    if parsed.target_alias.lower() == parsed.source_alias.lower():
        raise MergeSpecError(
            f"{'merge_sql' if sql_form else 'target_alias'}: expected different aliases for the target and "
            f"the source, found {parsed.target_alias!r} for both"
        )
    if not parsed.clauses:
        raise MergeSpecError(
            f"{field}: There must be at least one WHEN clause in a MERGE statement.",
            error_class="DELTA_MERGE_MISSING_WHEN",
        )
    for index, clause in enumerate(parsed.clauses):
        allowed = _ALLOWED_ACTIONS[clause.when]
        if clause.action not in allowed:
            raise MergeSpecError(
                f"{fields.clause(index)}: expected one of {', '.join(allowed)} in a WHEN "
                f"{_KIND_SQL[clause.when]} clause, found {clause.action} ({_ACTION_SQL[clause.action][0]})"
            )
    _check_clause_order(parsed, field=field, sql_form=sql_form)
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


def _check_clause_order(parsed: ParsedMerge, *, field: str, sql_form: bool) -> None:
    for kind, (error_class, name) in (
        _SQL_OMIT_CONDITION if sql_form else _STRUCTURAL_OMIT_CONDITION
    ).items():
        of_kind = parsed.clauses_of(kind)
        unconditional = [i for i, c in enumerate(of_kind[:-1]) if c.condition is None]
        if unconditional:
            raise MergeSpecError(
                f"{field}: When there are more than one {name} clauses in a MERGE statement, only the last "
                f"{name} clause can omit the condition. Found an unconditional {name} clause at position "
                f"{unconditional[0] + 1} of {len(of_kind)}.",
                error_class=error_class,
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
    shown = [f"`{'.'.join(a.column)}`" for a in clause.assignments]  # Delta's rendering of the names
    if clause.action == "update":
        # Spark's case-insensitive resolution: `a` and `A` are one column; `a` and `a.b` overlap.
        conflicts = [
            shown[i]
            for i, column in enumerate(columns)
            if any(j != i and _overlaps(column, other) for j, other in enumerate(columns))
        ]
        if conflicts:
            listed = ", ".join(conflicts)
            raise MergeSpecError(
                f"{field}: There is a conflict from these SET columns: [{listed}].",
                error_class="DELTA_CONFLICT_SET_COLUMN",
            )
    elif clause.action == "insert":
        for a in clause.assignments:
            if len(a.column) > 1:
                nested = ".".join(f"`{part}`" for part in a.column)
                raise MergeSpecError(
                    f"{field}: Nested field is not supported in the INSERT clause of MERGE operation "
                    f"(field = {nested}).",
                    error_class="DELTA_UNSUPPORTED_NESTED_FIELD_IN_OPERATION",
                )
        duplicated = sorted({shown[i] for i, column in enumerate(columns) if columns.count(column) > 1})
        if duplicated:
            raise MergeSpecError(
                f"{field}: Duplicate column names in INSERT clause: found {', '.join(duplicated)} repeated",
                error_class="DELTA_DUPLICATE_COLUMNS_ON_INSERT",
            )


def _overlaps(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]
