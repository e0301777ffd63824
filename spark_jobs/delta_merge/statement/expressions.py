"""Merge expressions as SQL trees: conjuncts, column references, and qualifying names to one side."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

__all__ = [
    "ColumnRef",
    "column_refs",
    "parse_expression",
    "qualify_to_side",
    "render",
    "split_conjuncts",
]

DIALECT = "spark"


@dataclass(frozen=True)
class ColumnRef:
    """A column reference as written: its dotted parts, e.g. ``("t", "addr", "city")``."""

    parts: tuple[str, ...]
    node: exp.Column


def parse_expression(sql: str) -> exp.Expr:
    """Parse one Spark SQL expression."""
    return sqlglot.parse_one(sql, dialect=DIALECT)


def render(node: exp.Expr) -> str:
    """Spark SQL text of a tree."""
    return node.sql(dialect=DIALECT)


def split_conjuncts(sql: str) -> list[str]:
    """``a AND (b AND c)`` -> ``[a, b, c]``, as Spark's splitConjunctivePredicates does."""
    node = parse_expression(sql)
    out: list[exp.Expr] = []

    def walk(n: exp.Expr) -> None:
        while isinstance(n, exp.Paren):
            n = n.this
        if isinstance(n, exp.And):
            walk(n.this)
            walk(n.expression)
        else:
            out.append(n)

    walk(node)
    return [render(n) for n in out]


def _column_parts(col: exp.Column) -> tuple[str, ...]:
    parts = [part.name for part in col.parts]
    # Paths deeper than catalog.db.table.column continue as Dot nodes around the Column.
    node: exp.Expr = col
    while isinstance(node.parent, exp.Dot) and node.parent.this is node:
        parts.append(node.parent.expression.name)
        node = node.parent
    return tuple(parts)


def _lambda_params(node: exp.Expr) -> set[str]:
    names: set[str] = set()
    parent = node.parent
    while parent is not None:
        if isinstance(parent, exp.Lambda):
            names.update(p.name.lower() for p in parent.expressions)
        parent = parent.parent
    return names


def _columns(node: exp.Expr) -> Iterator[exp.Column]:
    for col in node.find_all(exp.Column):
        parts = _column_parts(col)
        # Lambda variables (`x` in `transform(a, x -> x + 1)`) are not columns.
        if parts and parts[0].lower() in _lambda_params(col):
            continue
        yield col


def column_refs(sql: str) -> list[ColumnRef]:
    """Every column reference of an expression, lambda variables excluded."""
    node = parse_expression(sql)
    return [ColumnRef(_column_parts(c), c) for c in _columns(node)]


def qualify_to_side(
    sql: str, *, alias: str, other_alias: str, other_columns: Sequence[str]
) -> tuple[str, list[str]]:
    """Prefix unqualified references with ``alias``: for clauses that see only one side.

    INSERT clauses see only the source and NOT MATCHED BY SOURCE clauses only the target, so an
    unqualified name there means that side even when the other side has the same column.
    Returns the rewritten SQL and the references that name the other side (to report as unresolvable).
    """
    node = parse_expression(sql)
    foreign: list[str] = []
    other_names = {c.lower() for c in other_columns}
    for col in list(_columns(node)):
        parts = _column_parts(col)
        first = parts[0].lower()
        if first == alias.lower() and len(parts) > 1:
            continue
        if first == other_alias.lower() and len(parts) > 1 and first not in other_names:
            foreign.append(".".join(parts))
            continue
        qualified = _build_column((alias, *(p.name for p in col.parts)))
        if col is node:
            node = qualified
        else:
            col.replace(qualified)
    return render(node), foreign


def _build_column(parts: Sequence[str]) -> exp.Expr:
    identifiers = [exp.to_identifier(p, quoted=True) for p in parts]
    if len(identifiers) <= 4:
        names = ["this", "table", "db", "catalog"]
        kwargs = {names[i]: ident for i, ident in enumerate(reversed(identifiers))}
        return exp.Column(**kwargs)
    # Deeper paths: a column of the first four parts, then field accesses.
    base: exp.Expr = _build_column(parts[:4])
    for part in parts[4:]:
        base = exp.Dot(this=base, expression=exp.to_identifier(part, quoted=True))
    return base
