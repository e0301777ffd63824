"""Unknown keyword arguments to an operator, refused with the name that was probably meant: by meaning
(the names other operators give the same setting: ``spark_conn_id``, ``target_table``, ``sql``, ...),
then by spelling (difflib)."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["reject_unknown_arguments"]

_CUTOFF = 0.75  # difflib's similarity ratio below which no name is suggested
_PARAMETERS: dict[type[Any], frozenset[str]] = {}  # by operator class


def reject_unknown_arguments(
    operator: type[Any],
    given: Mapping[str, Any],
    *,
    options: Callable[[], Iterable[str]] | None = None,
    meanings: Mapping[str, str] | None = None,
    required: Mapping[str, Any] | None = None,
) -> None:
    """Raise for keyword arguments that no ``__init__`` along ``operator``'s MRO takes (BaseOperator's
    included), naming what was probably meant.

    ``meanings`` maps names other operators use (``spark_conn_id``) to this operator's parameter
    (``conn_id``) or to a sentence saying where that setting lives; they are matched ignoring case and
    underscores, and by spelling too. Otherwise the hint is the closest parameter, or the closest key of
    the ``options`` dict (loaded only when needed), e.g. ``did you mean options={'schema_evolution': ...}?``.

    Airflow's BaseOperator refuses them too, but lists them without a suggestion.

    ``required`` holds the values of the parameters that must be given, which the operator declares
    with a None default so that this check runs first: Airflow refuses a missing argument before
    ``__init__`` starts, and ``target_table=`` would then get "missing keyword argument 'target'" rather
    than "did you mean 'target'?".

    :raises TypeError: as Python and Airflow do for an unexpected or a missing keyword argument.
    """
    known = _parameters(operator)
    # Airflow passes itself arguments such as _airflow_mapped_validation_only.
    unknown = [name for name in given if name not in known and not name.startswith("_airflow")]
    missing = [name for name, value in (required or {}).items() if value is None]
    if not unknown:
        if missing:
            names = ", ".join(repr(name) for name in missing)
            raise TypeError(f"{operator.__name__}: missing keyword argument{'s' if len(missing) > 1 else ''} "
                            f"{names}")
        return
    option_names = sorted(options()) if options is not None else []
    hints = {name: _hint(name, given[name], known, option_names, meanings or {}) for name in unknown}
    if len(hints) == 1:
        ((name, hint),) = hints.items()
        message = f"unknown argument {name!r}" + (f"; {hint}" if hint else "")
    else:
        message = "unknown arguments " + ", ".join(
            f"{name!r}" + (f" ({hint})" if hint else "") for name, hint in hints.items()
        )
    raise TypeError(f"{operator.__name__}: {message}")


def _hint(
    name: str, value: Any, known: frozenset[str], option_names: list[str], meanings: Mapping[str, str]
) -> str:
    if name in option_names:
        return f"it is an option: pass options={{{name!r}: {value!r}}}"
    by_key = {_key(alias): meant for alias, meant in meanings.items()}
    if _key(name) in by_key:
        return _meaning_hint(by_key[_key(name)], known)
    # Ties go to the parameter, then to an option: (ratio, rank, name, hint).
    scored = [
        (difflib.SequenceMatcher(None, name, candidate).ratio(), rank, candidate, hint)
        for rank, pairs in (
            (2, [(p, f"did you mean {p!r}?") for p in sorted(known)]),
            (1, [(o, f"did you mean options={{{o!r}: ...}}?") for o in option_names]),
            (0, [(alias, _meaning_hint(meant, known)) for alias, meant in sorted(meanings.items())]),
        )
        for candidate, hint in pairs
    ]
    ratio, _, _, hint = max(scored, default=(0.0, 0, "", ""))
    return hint if ratio >= _CUTOFF else ""


def _key(name: str) -> str:
    """A name as the meanings are matched: ``targetTable``, ``target_table`` and ``TARGET_TABLE`` alike."""
    return name.replace("_", "").lower()


def _meaning_hint(meant: str, known: frozenset[str]) -> str:
    return f"did you mean {meant!r}?" if meant in known else meant


def _parameters(operator: type[Any]) -> frozenset[str]:
    if operator in _PARAMETERS:
        return _PARAMETERS[operator]
    names: set[str] = set()
    for cls in operator.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None or cls is object:
            continue
        for parameter in inspect.signature(init).parameters.values():
            if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD):
                names.add(parameter.name)
    names.discard("self")
    _PARAMETERS[operator] = frozenset(names)
    return _PARAMETERS[operator]
