"""Unknown keyword arguments to an operator, refused with the name that was probably meant."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["reject_unknown_arguments"]

_CUTOFF = 0.75  # difflib's similarity ratio below which no name is suggested
_PARAMETERS: dict[type[Any], frozenset[str]] = {}  # by operator class


def reject_unknown_arguments(
    operator: type[Any], given: Mapping[str, Any], *, options: Callable[[], Iterable[str]] | None = None
) -> None:
    """Raise for keyword arguments that no ``__init__`` along ``operator``'s MRO takes (BaseOperator's
    included), naming the closest parameter, or the closest key of the ``options`` dict (loaded only when
    needed), e.g. ``did you mean options={'schema_evolution': ...}?``.

    Airflow's BaseOperator refuses them too, but lists them without a suggestion.

    :raises TypeError: as Python and Airflow do for an unexpected keyword argument.
    """
    known = _parameters(operator)
    # Airflow passes itself arguments such as _airflow_mapped_validation_only.
    unknown = [name for name in given if name not in known and not name.startswith("_airflow")]
    if not unknown:
        return
    option_names = sorted(options()) if options is not None else []
    hints = {name: _hint(name, given[name], known, option_names) for name in unknown}
    if len(hints) == 1:
        ((name, hint),) = hints.items()
        message = f"unknown argument {name!r}" + (f"; {hint}" if hint else "")
    else:
        message = "unknown arguments " + ", ".join(
            f"{name!r}" + (f" ({hint})" if hint else "") for name, hint in hints.items()
        )
    raise TypeError(f"{operator.__name__}: {message}")


def _hint(name: str, value: Any, known: frozenset[str], option_names: list[str]) -> str:
    if name in option_names:
        return f"it is an option: pass options={{{name!r}: {value!r}}}"
    # Ties go to the parameter: (ratio, is a parameter, name).
    scored = [(difflib.SequenceMatcher(None, name, candidate).ratio(), not is_option, candidate)
              for candidates, is_option in ((sorted(known), False), (option_names, True))
              for candidate in candidates]  # fmt: skip
    ratio, is_parameter, candidate = max(scored, default=(0.0, True, ""))
    if ratio < _CUTOFF:
        return ""
    return f"did you mean {candidate!r}?" if is_parameter else f"did you mean options={{{candidate!r}: ...}}?"


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
