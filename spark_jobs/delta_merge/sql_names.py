"""Column and alias names as Spark SQL identifiers: every name Delta allows (backticks, dots, spaces,
unicode) quoted so that Spark's parser reads it back as the one name it is."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["quoted_name", "quoted_path"]


def quoted_name(name: str) -> str:
    """``name`` as one quoted identifier: in backticks, each backtick in it doubled."""
    return "`" + name.replace("`", "``") + "`"


def quoted_path(parts: Iterable[str]) -> str:
    """A qualified name (``alias``, ``column``, nested fields) as quoted identifiers joined by dots."""
    return ".".join(quoted_name(part) for part in parts)
