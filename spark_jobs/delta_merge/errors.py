"""Errors raised by the merge job: one root, typed subclasses, classified by type only."""

from __future__ import annotations

__all__ = [
    "ConcurrentModificationError",
    "ConstraintViolationError",
    "ExpectationFailedError",
    "MergeAnalysisError",
    "MergeExecutionError",
    "MergeJobError",
    "MergeSpecError",
    "MultipleSourceRowMatchesError",
    "UnsupportedTableFeatureError",
]


class MergeJobError(Exception):
    """Root of every error the merge job raises on purpose."""


class MergeSpecError(MergeJobError, ValueError):
    """The merge spec is malformed: raised before any data is read.

    The message names the field, what was expected and what was found.
    """


class MergeAnalysisError(MergeJobError):
    """The merge does not fit the target and source schemas (raised before anything is written)."""


class MultipleSourceRowMatchesError(MergeJobError):
    """Two or more source rows matched the same target row."""


class UnsupportedTableFeatureError(MergeJobError):
    """The target table uses a Delta feature this job cannot write correctly."""


class ConstraintViolationError(MergeJobError):
    """A row the merge would write violates a CHECK, NOT NULL or generated-column constraint.

    The message is Delta's, naming the constraint and the values of a sample offending row; nothing
    was committed.
    """


class MergeExecutionError(MergeJobError):
    """The merge failed while computing or writing its output; nothing was committed."""


class ConcurrentModificationError(MergeJobError):
    """A concurrent commit conflicts with this merge under Delta's isolation rules."""


class ExpectationFailedError(MergeJobError):
    """One or more expected metrics did not hold; nothing was committed."""
