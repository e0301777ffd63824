"""Errors raised by the provider: one root, typed subclasses, classified by type only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from spark_jobs.delta_merge.contract import is_deterministic

__all__ = [
    "MergeArgumentError",
    "MergeJobFailedError",
    "MergeJobRejectedError",
    "MergeMetricsNotFoundError",
    "MergeProviderError",
    "MergeSpecInvalidError",
    "StorageRefusedError",
    "TargetTableNotFoundError",
    "job_failed_error",
    "one_clear_message",
]


class MergeProviderError(AirflowException):
    """Root of every error the provider raises on purpose."""


class MergeArgumentError(MergeProviderError, AirflowFailException):
    """A rendered argument is invalid: raised before anything is launched, never retried."""


class MergeSpecInvalidError(MergeArgumentError):
    """The rendered merge spec is invalid (the message names the field, what was expected and found)."""


class TargetTableNotFoundError(MergeProviderError, AirflowFailException):
    """The target is not a Delta table (no ``_delta_log``): a retry would not change that."""


class StorageRefusedError(MergeProviderError, AirflowFailException):
    """Reading the table's log, the store refused the credentials or the request, or the bucket (or
    container) is missing: not retried, as a retry fails the same way until someone changes them."""


class MergeJobFailedError(MergeProviderError):
    """spark-submit failed and the merge did not commit; retried as Airflow's ``retries`` say.

    :param error_type: the job's error class name from its last stderr line (``MergeExecutionError``,
        ``ConcurrentModificationError``, ...), or None when the job did not report one.
    """

    def __init__(self, message: str, *, error_type: str | None = None) -> None:
        super().__init__(message)
        self.error_type = error_type


class MergeJobRejectedError(MergeJobFailedError, AirflowFailException):
    """The job refused the merge for a reason a retry cannot change: the spec, the schemas, the table's
    features, or the data (casts, overflow, constraint violations, multiple matches, expectations)."""


class MergeMetricsNotFoundError(MergeProviderError):
    """spark-submit succeeded but neither its output nor the Delta log gave the merge's metrics."""


def job_failed_error(target: str, kind: str | None, message: str | None) -> MergeJobFailedError:
    """The error for a failed job whose merge did not commit, classified by the error type name the job
    reported (if any); its message ends with what happens next.

    Deterministic errors (the job's contract lists them) fail the task without its retries; infrastructure
    failures, conflicts with concurrent commits and a job that died without a failure line are retried.
    """
    if kind is None:
        return MergeJobFailedError(
            f"MERGE into {target} failed: spark-submit exited non-zero before the job reported a failure "
            "(Spark could not start, or the driver died); nothing was committed. The last lines of its "
            "output are in the task log above. A retry (the task's retries, or clearing it) runs the merge "
            "again."
        )
    text = f"MERGE into {target} failed: {kind}: {message or ''}".rstrip()
    text += "" if text.endswith((".", "!", "?")) else "."
    if is_deterministic(kind):
        # The job's storage refusals (credentials, permissions, a missing bucket) are Storage*Error.
        causes = "credentials, their permissions or the bucket" if kind.startswith("Storage") else (
            "statement, the table or the data")  # fmt: skip
        return MergeJobRejectedError(
            f"{text} Not retried: nothing was committed, and the same merge fails the same way until the "
            f"{causes} change.",
            error_type=kind,
        )
    return MergeJobFailedError(
        f"{text} Nothing was committed; a retry (the task's retries, or clearing it) runs the merge again.",
        error_type=kind,
    )


@contextmanager
def one_clear_message(log: Any) -> Iterator[None]:
    """A provider error leaving the block is logged first, as one line (unless it is a failure the job
    reported, whose line is logged already), and re-raised with its causes as notes below its message, each
    once, instead of a chain of tracebacks that ends with it.

    Without this, Python prints the chain cause first: deltalake's error, then the job's, then ours (the
    one that says what to do), each with its traceback. The causes' first lines become notes (PEP 678),
    skipping one whose text an earlier line already holds; on Python 3.10, which has no notes, the chain
    is left as it is.
    """
    try:
        yield
    except MergeProviderError as error:
        # A failure the job reported has its line in the log already (``MERGE failed: <Type>: ...``).
        if not (isinstance(error, MergeJobFailedError) and error.error_type is not None):
            log.error("%s", error)  # the operator's logger: Airflow's structlog one, or logging's
        if not hasattr(error, "add_note") or (error.__cause__ is None and error.__context__ is None):
            raise
        shown = [str(error)]
        cause: BaseException | None = error.__cause__ or error.__context__
        while cause is not None:
            first = (str(cause).strip().splitlines() or [""])[0].strip()
            if first and not any(first in line for line in shown):
                error.add_note(f"Caused by {type(cause).__name__}: {first}")
                shown.append(first)
            cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
        raise error from None
