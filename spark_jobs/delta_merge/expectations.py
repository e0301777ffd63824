"""Expected metrics, checked before the commit so that a bad merge is refused before anyone sees it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_jobs.delta_merge.errors import ExpectationFailedError
from spark_jobs.delta_merge.field_checks import did_you_mean

__all__ = ["COMPARATORS", "check_expectations", "failed_expectations"]

# common-sql's check operators use these names (tolerance qualifies equal_to).
COMPARATORS = ("equal_to", "greater_than", "less_than", "geq_to", "leq_to", "tolerance")


def _holds(comparator: str, actual: float, expected: float, tolerance: float | None) -> bool:
    if comparator == "equal_to":
        if tolerance is None:
            return actual == expected
        return abs(actual - expected) <= abs(expected) * tolerance
    if comparator == "greater_than":
        return actual > expected
    if comparator == "less_than":
        return actual < expected
    if comparator == "geq_to":
        return actual >= expected
    if comparator == "leq_to":
        return actual <= expected
    raise ValueError(comparator)


def failed_expectations(
    metrics: Mapping[str, Any], expected: Mapping[str, Mapping[str, float]]
) -> list[str]:
    """One line per check that does not hold, naming the metric, the check and the actual value."""
    failures: list[str] = []
    for metric, checks in expected.items():
        if metric not in metrics:
            failures.append(f"{metric}: no such metric{did_you_mean(metric, sorted(metrics))}")
            continue
        actual = float(metrics[metric])
        tolerance = checks.get("tolerance")
        for comparator, value in checks.items():
            if comparator == "tolerance":
                continue
            within = tolerance if comparator == "equal_to" else None
            if not _holds(comparator, actual, float(value), within):
                bound = f" (tolerance {within})" if within is not None else ""
                failures.append(f"{metric} {comparator} {value}{bound}: actual {metrics[metric]}")
    return failures


def check_expectations(metrics: Mapping[str, Any], expected: Mapping[str, Mapping[str, float]]) -> None:
    """Raise :class:`ExpectationFailedError` listing every failed check; nothing is committed then."""
    failures = failed_expectations(metrics, expected)
    if failures:
        raise ExpectationFailedError(
            f"{len(failures)} expected metric check(s) failed, nothing was committed: " + "; ".join(failures)
        )
