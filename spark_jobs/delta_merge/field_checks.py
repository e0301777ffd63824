"""Checks of the contract's JSON fields, with messages that name the field, what was expected and found."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spark_jobs.delta_merge.errors import MergeSpecError

__all__ = ["check_choice", "check_str", "fail", "found", "keys_of"]


def found(value: object) -> str:
    """A value as an error message shows it: its repr (cut at 80 characters) and its type."""
    text = repr(value)
    return f"{text[:80]}{'...' if len(text) > 80 else ''} ({type(value).__name__})"


def fail(field: str, expected: str, value: object) -> MergeSpecError:
    """``<field>: expected <expected>, found <value>``."""
    return MergeSpecError(f"{field}: expected {expected}, found {found(value)}")


def keys_of(
    data: object, field: str, *, allowed: Sequence[str], required: Sequence[str] = ()
) -> Mapping[str, Any]:
    """``data`` as a mapping, refusing unknown and missing keys."""
    if not isinstance(data, Mapping):
        raise fail(field, "a JSON object", data)
    unknown = [key for key in data if key not in allowed]
    if unknown:
        listed = ", ".join(map(repr, unknown))
        raise MergeSpecError(f"{field}: expected keys among {', '.join(allowed)}, found unknown key {listed}")
    missing = [key for key in required if key not in data]
    if missing:
        raise MergeSpecError(f"{field}: expected key(s) {', '.join(missing)}, found them missing")
    return data


def check_str(value: object, field: str, expected: str) -> None:
    """A non-blank string."""
    if not isinstance(value, str) or not value.strip():
        raise fail(field, expected, value)


def check_choice(value: object, field: str, choices: Sequence[str]) -> None:
    """One of ``choices``."""
    if value not in choices:
        raise fail(field, f"one of {', '.join(choices)}", value)
