"""The parsed merge statement: WHEN clauses, assignments and column paths, whichever form they came in."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from spark_jobs.delta_merge.field_checks import check_choice, check_str, fail, keys_of

__all__ = [
    "ActionKind",
    "Assignment",
    "ClauseKind",
    "MergeClause",
    "ParsedMerge",
    "format_column_path",
    "parse_column_path",
]

ClauseKind = Literal["matched", "not_matched", "not_matched_by_source"]
ActionKind = Literal["update", "update_all", "delete", "insert", "insert_all"]

CLAUSE_KINDS: tuple[str, ...] = get_args(ClauseKind)
ACTION_KINDS: tuple[str, ...] = get_args(ActionKind)
_PART = re.compile(r"`((?:[^`]|``)*)`|([^.`\s]+)")
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Assignment:
    """One ``SET col = expr`` or one ``INSERT (col) VALUES (expr)`` pair.

    :param column: the target column path, e.g. ``("addr", "city")``; as written in a spec's clauses,
        without the target alias in a :class:`ParsedMerge`.
    :param value: the value as Spark SQL text; normalized by the SQL parser in a :class:`ParsedMerge`.
    """

    column: tuple[str, ...]
    value: str


@dataclass(frozen=True)
class MergeClause:
    """One WHEN clause, in the order written.

    :param when: ``matched``, ``not_matched`` (BY TARGET) or ``not_matched_by_source``.
    :param action: ``update``, ``update_all`` (SET *), ``delete``, ``insert`` or ``insert_all`` (INSERT *).
    :param condition: the clause's ``AND`` condition as Spark SQL text, or None.
    :param assignments: SET pairs for ``update``, column/value pairs for ``insert``; empty otherwise.
    """

    when: ClauseKind
    action: ActionKind
    condition: str | None = None
    assignments: tuple[Assignment, ...] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, field: str = "clause") -> MergeClause:
        """``{"when", "condition"?, "action", "set" (update) | "values" (insert)}``, keyed by column path."""
        allowed = ("when", "condition", "action", "set", "values")
        keys = keys_of(data, field, allowed=allowed, required=("when", "action"))
        pairs_key = {"update": "set", "insert": "values"}.get(keys["action"])
        for key in ("set", "values"):
            if key in keys and key != pairs_key:
                raise fail(f"{field}.{key}", f"no {key!r} for action {keys['action']!r}", keys[key])
        pairs = keys.get(pairs_key, {}) if pairs_key else {}
        if not isinstance(pairs, Mapping):
            raise fail(f"{field}.{pairs_key}", "a JSON object of column: expression", pairs)
        assignments = tuple(
            Assignment(parse_column_path(column, field=f"{field}.{pairs_key}"), value)
            for column, value in pairs.items()
        )
        clause = cls(keys["when"], keys["action"], keys.get("condition"), assignments)
        clause.validate(field=field)
        return clause

    def to_dict(self) -> dict[str, Any]:
        """The structural JSON form of this clause."""
        data: dict[str, Any] = {"when": self.when, "action": self.action}
        if self.condition is not None:
            data["condition"] = self.condition
        if self.action in ("update", "insert") or self.assignments:
            pairs = {format_column_path(a.column): a.value for a in self.assignments}
            data["values" if self.action == "insert" else "set"] = pairs
        return data

    def validate(self, *, field: str = "clause") -> None:
        """Check kinds and types (Delta's rules need the whole merge: MergeSpec.validate)."""
        check_choice(self.when, f"{field}.when", CLAUSE_KINDS)
        check_choice(self.action, f"{field}.action", ACTION_KINDS)
        if self.condition is not None:
            check_str(self.condition, f"{field}.condition", "a Spark SQL condition or nothing")
        if not isinstance(self.assignments, tuple):
            raise fail(f"{field}.assignments", "a tuple of Assignment", self.assignments)
        for a in self.assignments:
            column = a.column if isinstance(a, Assignment) else None
            names_ok = isinstance(column, tuple) and all(isinstance(p, str) and p for p in column)
            if not column or not names_ok:
                raise fail(f"{field}.assignments", "Assignments with column paths of non-empty names", a)
            check_str(a.value, f"{field}.assignments {format_column_path(column)}", "a Spark SQL expression")


@dataclass(frozen=True)
class ParsedMerge:
    """A merge reduced to what the job executes, whichever form it was given in.

    Expressions keep the aliases as written; the job resolves them against the target (``target_alias``)
    and the source (``source_alias``).

    :param source_query: the Spark SQL query that is the merge's source when the statement's USING is a
        subquery or names a CTE of its WITH; in it, the name ``source`` stands for the spec's source.
        None: the spec's source itself.
    :param schema_evolution: the statement says ``MERGE WITH SCHEMA EVOLUTION``.
    """

    target_alias: str
    source_alias: str
    condition: str
    clauses: tuple[MergeClause, ...]
    source_query: str | None = None
    schema_evolution: bool = False

    def clauses_of(self, when: ClauseKind) -> tuple[MergeClause, ...]:
        """The clauses of one kind, in the order written."""
        return tuple(c for c in self.clauses if c.when == when)

    @property
    def is_insert_only(self) -> bool:
        """Only WHEN NOT MATCHED clauses: target files are never rewritten."""
        return all(c.when == "not_matched" for c in self.clauses) and bool(self.clauses)

    @property
    def is_matched_only(self) -> bool:
        """Only WHEN MATCHED clauses: source rows that match nothing are not needed."""
        return all(c.when == "matched" for c in self.clauses) and bool(self.clauses)

    @property
    def is_only_one_unconditional_delete(self) -> bool:
        """The only MATCHED clause is an unconditional DELETE: multiple matches are then allowed."""
        matched = self.clauses_of("matched")
        return len(matched) == 1 and matched[0].action == "delete" and matched[0].condition is None


def parse_column_path(text: str, *, field: str) -> tuple[str, ...]:
    """``addr.city`` -> ``("addr", "city")``; a part may be backticked (doubling a backtick inside)."""
    parts: list[str] = []
    position = 0
    while True:
        match = _PART.match(text, position) if isinstance(text, str) else None
        if match is None or not (match.group(2) or match.group(1)):
            raise fail(field, "column names: a dotted path of names, backticked where needed", text)
        quoted, plain = match.groups()
        parts.append(quoted.replace("``", "`") if quoted is not None else plain)
        position = match.end()
        if position == len(text):
            return tuple(parts)
        if text[position] != ".":
            raise fail(field, "'.' between the names of a column path", text)
        position += 1


def format_column_path(column: Sequence[str]) -> str:
    """The inverse of :func:`parse_column_path`: backticks only where a name needs them."""
    return ".".join(part if _PLAIN.fullmatch(part) else f"`{part.replace('`', '``')}`" for part in column)
