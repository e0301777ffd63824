"""Errors raised by the merge job: one root, typed subclasses, classified by type only."""

from __future__ import annotations

import re
from typing import ClassVar, TypeVar

__all__ = [
    "DETERMINISTIC_ERRORS",
    "CastFailureError",
    "ConcurrentModificationError",
    "ConstraintViolationError",
    "ExpectationFailedError",
    "MergeAnalysisError",
    "MergeExecutionError",
    "MergeJobError",
    "MergeSpecError",
    "MultipleSourceRowMatchesError",
    "StorageAuthenticationError",
    "StorageContainerNotFoundError",
    "StorageNetworkError",
    "StoragePermissionError",
    "StorageThrottledError",
    "TableStorageError",
    "UnsupportedTableFeatureError",
    "spark_failure",
]

_E = TypeVar("_E", bound="MergeJobError")
# "[ERROR_CLASS] message", as Delta's and Spark's messages start (subclasses are "CLASS.SUB").
_CLASS_PREFIX = re.compile(r"\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\] ?")


class MergeJobError(Exception):
    """Root of every error the merge job raises on purpose.

    :param error_class: Delta's (or Spark's) error class for the condition, e.g.
        ``DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE``, so that users can search for it. The
        message then starts with ``[ERROR_CLASS]`` as Delta's and Spark's messages do.

    ``retryable`` says whether running the same merge again may succeed: False when the spec, the schemas,
    the table's features or the data decide the failure, so a retry fails the same way. The Airflow
    provider fails the task without its retries for those (see :data:`DETERMINISTIC_ERRORS`).
    """

    retryable: ClassVar[bool] = True

    def __init__(self, message: str, *, error_class: str | None = None) -> None:
        self.error_class = error_class
        self.bare_message = message
        super().__init__(f"[{error_class}] {message}" if error_class else message)

    @classmethod
    def from_text(cls: type[_E], text: str) -> _E:
        """The error for ``text``, taking its error class from a leading ``[ERROR_CLASS]`` if it has one."""
        match = _CLASS_PREFIX.match(text)
        if match is None:
            return cls(text)
        return cls(text[match.end() :], error_class=match.group(1))

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only error_class survives pickling (Spark ships exceptions between processes).
        return (_rebuild, (type(self), self.bare_message, self.error_class))


def _rebuild(kind: type[MergeJobError], message: str, error_class: str | None) -> MergeJobError:
    return kind(message, error_class=error_class)


class MergeSpecError(MergeJobError, ValueError):
    """The merge spec is malformed: raised before any data is read.

    The message names the field, what was expected and what was found.
    """

    retryable = False


class MergeAnalysisError(MergeJobError):
    """The merge does not fit the target and source schemas (raised before anything is written)."""

    retryable = False


class MultipleSourceRowMatchesError(MergeJobError):
    """Two or more source rows matched the same target row."""

    retryable = False


class UnsupportedTableFeatureError(MergeJobError):
    """The target table uses a Delta feature this job cannot write correctly."""

    retryable = False


class ConstraintViolationError(MergeJobError):
    """A row the merge would write violates a CHECK, NOT NULL or generated-column constraint.

    The message is Delta's, naming the constraint and the values of a sample offending row; nothing
    was committed.
    """

    retryable = False


class CastFailureError(MergeJobError):
    """A value the merge computes or writes is invalid for its type: invalid input for a cast, an overflow,
    a division by zero (Spark's data exceptions, SQLSTATE class 22) or ``raise_error``.

    Raised before commit with Spark's (or Delta's) error class; the data decides it, so a retry fails the
    same way.
    """

    retryable = False


class MergeExecutionError(MergeJobError):
    """The merge failed while computing or writing its output; nothing was committed."""


class ConcurrentModificationError(MergeJobError):
    """A concurrent commit conflicts with this merge under Delta's isolation rules."""


class TableStorageError(MergeJobError):
    """A request to the table's store failed or was refused. The message names the table, the operation,
    what the store answered, where the credentials came from and what to check; never a secret.

    The subclasses say which failure it was; this class itself is a failure of no known kind (retried)."""


class StorageAuthenticationError(TableStorageError):
    """The store did not accept the credentials (a wrong, unknown or malformed key or signature)."""

    retryable = False


class StoragePermissionError(TableStorageError):
    """The store refused the request: the credentials may not read or write the table."""

    retryable = False


class StorageContainerNotFoundError(TableStorageError):
    """The table's bucket (S3, GCS) or container (Azure) does not exist."""

    retryable = False


class StorageThrottledError(TableStorageError):
    """The store kept throttling requests (429, 503 SlowDown, ServerBusy) after the client's retries."""


class StorageNetworkError(TableStorageError):
    """The store could not be reached (connection refused, DNS, timeouts) or answered with a server error,
    after the client's retries."""


class ExpectationFailedError(MergeJobError):
    """One or more expected metrics did not hold; nothing was committed."""

    retryable = False


# The one list the Airflow side classifies by: names of the job's errors a retry cannot fix.
DETERMINISTIC_ERRORS: frozenset[str] = frozenset(
    name for name, kind in list(globals().items())
    if isinstance(kind, type) and issubclass(kind, MergeJobError) and not kind.retryable
)

_DATA_EXCEPTION = "22"  # SQLSTATE class "data exception": CAST_INVALID_INPUT, ARITHMETIC_OVERFLOW, ...
_USER_RAISED = "P0001"  # raise_error()
_SYNTAX_OR_ACCESS_RULE = "42"  # analysis errors: UNRESOLVED_COLUMN, DATATYPE_MISMATCH, ...


def spark_failure(exc: BaseException) -> MergeJobError | None:
    """The job's error for a Spark failure the data or the statement decides, or None for any other.

    Spark's data exceptions (SQLSTATE class 22) and ``raise_error`` become :class:`CastFailureError`,
    analysis errors (SQLSTATE class 42) :class:`MergeAnalysisError`, each with
    Spark's error class and message. A ``raise_error`` message that starts with ``[ERROR_CLASS]`` gives
    that class (the job raises Delta's DELTA_CAST_OVERFLOW_IN_TABLE_WRITE this way).
    """
    get_state = getattr(exc, "getSqlState", None)
    get_condition = getattr(exc, "getCondition", None)
    if get_state is None or get_condition is None:
        return None
    try:
        state, condition = get_state(), get_condition()
    except Exception:  # the JVM is gone: nothing to classify by
        return None
    state = str(state or "")
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    message = re.sub(r"\s*SQLSTATE: \w+\s*$", "", _CLASS_PREFIX.sub("", lines[0], count=1))
    if state == _USER_RAISED:
        inner = _CLASS_PREFIX.match(message)
        if inner is not None:
            condition, message = inner.group(1), message[inner.end() :]
    if state.startswith(_DATA_EXCEPTION) or state == _USER_RAISED:
        return CastFailureError(
            f"{message} Nothing was committed; fix the source data or the merge's expressions (a retry "
            "fails the same way).",
            error_class=str(condition) if condition else None,
        )
    if state.startswith(_SYNTAX_OR_ACCESS_RULE):
        return MergeAnalysisError(message, error_class=str(condition) if condition else None)
    return None
