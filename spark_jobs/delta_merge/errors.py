"""Errors raised by the merge job: one root, typed subclasses, classified by type only."""

from __future__ import annotations

__all__ = [
    "CastFailureError",
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
    """Root of every error the merge job raises on purpose.

    :param error_class: Delta's (or Spark's) error class for the condition, e.g.
        ``DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE``, so that users can search for it. The
        message then starts with ``[ERROR_CLASS]`` as Delta's and Spark's messages do.
    """

    def __init__(self, message: str, *, error_class: str | None = None) -> None:
        self.error_class = error_class
        self.bare_message = message
        super().__init__(f"[{error_class}] {message}" if error_class else message)

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only error_class survives pickling (Spark ships exceptions between processes).
        return (_rebuild, (type(self), self.bare_message, self.error_class))


def _rebuild(kind: type[MergeJobError], message: str, error_class: str | None) -> MergeJobError:
    return kind(message, error_class=error_class)


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


class CastFailureError(MergeJobError):
    """A value the merge would write cannot be stored in its column (invalid input for the cast, overflow).

    Raised before commit; the message names the column. The data decides it, so a retry fails the same way.
    """


class MergeExecutionError(MergeJobError):
    """The merge failed while computing or writing its output; nothing was committed."""


class ConcurrentModificationError(MergeJobError):
    """A concurrent commit conflicts with this merge under Delta's isolation rules."""


class ExpectationFailedError(MergeJobError):
    """One or more expected metrics did not hold; nothing was committed."""
