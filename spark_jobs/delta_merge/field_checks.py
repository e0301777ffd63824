"""Checks of the contract's JSON fields, with messages that name the field, what was expected and found."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from spark_jobs.delta_merge.errors import MergeSpecError

__all__ = ["check_choice", "check_str", "closest", "did_you_mean", "fail", "found", "keys_of"]


def found(value: object) -> str:
    """A value as an error message shows it: its repr (cut at 80 characters) and its type."""
    text = repr(value)
    return f"{text[:80]}{'...' if len(text) > 80 else ''} ({type(value).__name__})"


def fail(field: str, expected: str, value: object) -> MergeSpecError:
    """``<field>: expected <expected>, found <value>``."""
    return MergeSpecError(f"{field}: expected {expected}, found {found(value)}")


def closest(value: object, choices: Sequence[str]) -> str | None:
    """The choice ``value`` was most likely meant to be, ignoring case, or None: one it begins (``leq`` ->
    ``leq_to``), else the closest spelling by difflib."""
    if not isinstance(value, str) or not value:
        return None
    by_lower = {choice.lower(): choice for choice in choices}
    typed = value.lower()
    begun = [choice for choice in by_lower if choice.startswith(typed)]
    if begun:
        return by_lower[difflib.get_close_matches(typed, begun, n=1, cutoff=0.0)[0]]
    # 0.75: a typo or two in a name ('schema_evoluton'), not another word ('more_than' for 'less_than').
    matches = difflib.get_close_matches(typed, list(by_lower), n=1, cutoff=0.75)
    return by_lower[matches[0]] if matches else None


def did_you_mean(value: object, choices: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest choice, or ``""``."""
    match = closest(value, choices)
    return "" if match is None else f"; did you mean {match!r}?"


def keys_of(
    data: object, field: str, *, allowed: Sequence[str], required: Sequence[str] = (), what: str = "key"
) -> Mapping[str, Any]:
    """``data`` as a mapping, refusing unknown and missing keys.

    :param what: what a key is called in messages (``"option"``: "unknown option 'x'; did you mean ...").
    """
    if not isinstance(data, Mapping):
        raise fail(field, "a JSON object", data)
    for key in data:
        if key not in allowed:
            # A near miss names the one meant; otherwise every valid name is listed.
            hint = did_you_mean(key, allowed) or f"; expected {what}s among {', '.join(allowed)}"
            raise MergeSpecError(f"{field}: unknown {what} {key!r}{hint}")
    missing = [key for key in required if key not in data]
    if missing:
        raise MergeSpecError(f"{field}: expected key(s) {', '.join(missing)}, found them missing")
    return data


def check_str(value: object, field: str, expected: str) -> None:
    """A non-blank string."""
    if not isinstance(value, str) or not value.strip():
        raise fail(field, expected, value)


def check_choice(value: object, field: str, choices: Sequence[str]) -> None:
    """One of ``choices``; a near miss names the closest."""
    if value not in choices:
        hint = did_you_mean(value, choices)
        raise MergeSpecError(f"{field}: expected one of {', '.join(choices)}, found {found(value)}{hint}")
