"""The error classes a module of the project names, found by reading its source (no import)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

__all__ = ["error_classes_named_in"]

_CLASS = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+(?:\.[A-Z0-9_]+)*$")
_BRACKETED = re.compile(r"\[(DELTA_[A-Z0-9_]+(?:\.[A-Z0-9_]+)*)\]")


def _strings(node: ast.AST) -> Iterator[str]:
    return (n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def error_classes_named_in(source: str | ast.Module) -> set[str]:
    """The error classes a module names: ``error_class=`` arguments (literals, or the strings the names
    they use are bound to in the module), ``"DELTA_..."`` literals, and ``[DELTA_...]`` inside strings.
    Docstrings and ``__all__`` are not looked at."""
    tree = ast.parse(source) if isinstance(source, str) else source
    skipped: set[int] = set()
    bound: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skipped.add(id(body[0].value))  # a docstring
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(node.value)
                    if target.id == "__all__":
                        skipped.update(id(n) for n in ast.walk(node.value))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            if node.value.startswith("DELTA_") and _CLASS.match(node.value):
                found.add(node.value)
            found.update(_BRACKETED.findall(node.value))
        if isinstance(node, ast.keyword) and node.arg == "error_class":
            names = [n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)]
            values = [node.value, *(value for name in names for value in bound.get(name, []))]
            found.update(s for value in values for s in _strings(value) if _CLASS.match(s))
    return found

