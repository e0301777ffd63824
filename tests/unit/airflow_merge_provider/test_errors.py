"""A failed job is retried only when a retry can help: classified by the error type the job reports.

The failure lines come from the job's own formatting code (``contract.failure_line``) and are read by the
hook's own output processing, as in a real spark-submit.
"""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_merge_provider.errors import MergeJobFailedError, MergeJobRejectedError, job_failed_error
from airflow_merge_provider.hooks.merge_into import MergeSubmitHook
from spark_jobs.delta_merge.contract import DETERMINISTIC_ERRORS, failure_line
from spark_jobs.delta_merge.errors import (
    CastFailureError,
    ConcurrentModificationError,
    ConstraintViolationError,
    ExpectationFailedError,
    MergeAnalysisError,
    MergeExecutionError,
    MergeJobError,
    MergeSpecError,
    MultipleSourceRowMatchesError,
    StorageAuthenticationError,
    StorageContainerNotFoundError,
    StorageNetworkError,
    StoragePermissionError,
    StorageThrottledError,
    TableStorageError,
    UnsupportedTableFeatureError,
    spark_failure,
)

# (what the job raised, whether Airflow's retries may run it again)
JOB_ERRORS: list[tuple[MergeJobError, bool]] = [
    (MergeSpecError("merge_sql: There must be at least one WHEN clause in a MERGE statement.",
                    error_class="DELTA_MERGE_MISSING_WHEN"), False),
    (MergeAnalysisError("cannot resolve `s`.`x`", error_class="DELTA_MERGE_UNRESOLVED_EXPRESSION"), False),
    (UnsupportedTableFeatureError("Unsupported Delta write feature: ...",
                                  error_class="DELTA_UNSUPPORTED_FEATURES_FOR_WRITE"), False),
    (MultipleSourceRowMatchesError(
        "Cannot perform Merge as multiple source rows matched ...",
        error_class="DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE"), False),
    (CastFailureError("The value 'abc' of the type \"STRING\" cannot be cast to \"INT\"",
                      error_class="CAST_INVALID_INPUT"), False),
    (CastFailureError("overflow.", error_class="ARITHMETIC_OVERFLOW"), False),
    (ConstraintViolationError("CHECK constraint n_small n < 25 violated by row with values:\n - n : 30",
                              error_class="DELTA_VIOLATE_CONSTRAINT_WITH_VALUES"), False),
    (ConstraintViolationError("NOT NULL constraint violated for column: n.",
                              error_class="DELTA_NOT_NULL_CONSTRAINT_VIOLATED"), False),
    (ExpectationFailedError("1 expected metric check(s) failed, nothing was committed"), False),
    (MergeExecutionError("Writing the merge output under /t failed; ... Cause: executor lost"), True),
    (ConcurrentModificationError("ConcurrentAppendException: Files were added ...",
                                 error_class="DELTA_CONCURRENT_APPEND"), True),
    (StorageAuthenticationError("Reading the Delta log of table s3://b/t failed: the store did not accept "
                                "the credentials (403 Forbidden, SignatureDoesNotMatch). ..."), False),
    (StoragePermissionError("Writing commit 1 of table s3://b/t failed: the store refused the request "
                            "(403 Forbidden, AccessDenied) ..."), False),
    (StorageContainerNotFoundError("... the bucket 'b' does not exist (404 Not Found, NoSuchBucket)"), False),
    (StorageThrottledError("... the store is throttling requests (503 Service Unavailable, SlowDown)"), True),
    (StorageNetworkError("... the store could not be reached or failed (connection refused) ..."), True),
    (TableStorageError("Reading commit 7 of table s3://b/t failed. ... Cause: ..."), True),
]
IDS = [f"{type(error).__name__}-{error.error_class}" for error, _ in JOB_ERRORS]


def test_a_storage_refusal_says_what_must_change_before_a_rerun() -> None:
    raised = job_failed_error("s3://b/t", "StoragePermissionError", "Writing commit 1 of s3://b/t failed")
    assert str(raised).endswith(
        "Not retried: nothing was committed, and the same merge fails the same way until the credentials, "
        "their permissions or the bucket change."
    )


def _hook_reads(line: str, spark_local: str) -> Any:
    """The failure the hook keeps from one line of spark-submit's output."""
    hook = MergeSubmitHook(conn_id=spark_local, name="merge")
    hook._process_spark_submit_log(iter(["26/01/01 INFO SparkContext: Running Spark\n", f"{line}\n"]))
    return hook.failure


@pytest.mark.parametrize(("error", "retried"), JOB_ERRORS, ids=IDS)
def test_the_job_s_failure_line_decides_retry_or_fail(
    error: MergeJobError, retried: bool, spark_local: str
) -> None:
    failure = _hook_reads(failure_line(error), spark_local)

    assert failure is not None
    assert failure.kind == type(error).__name__
    assert failure.message == " ".join(str(error).split())
    assert failure.deterministic is not retried
    raised = job_failed_error("/data/t", failure.kind, failure.message)
    assert raised.error_type == type(error).__name__
    assert isinstance(raised, MergeJobRejectedError) is not retried
    assert isinstance(raised, AirflowFailException) is not retried
    assert str(raised).startswith(f"MERGE into /data/t failed: {type(error).__name__}: ")
    # What happens next ends the message: the task log's last line.
    next_step = "Not retried: nothing was committed" if not retried else "Nothing was committed; a retry"
    assert next_step in str(raised)


def test_a_job_that_died_without_its_failure_line_is_retried() -> None:
    raised = job_failed_error("/data/t", None, None)
    assert type(raised) is MergeJobFailedError
    assert not isinstance(raised, AirflowFailException)
    assert "before the job reported a failure" in str(raised)
    assert str(raised).endswith("A retry (the task's retries, or clearing it) runs the merge again.")


@pytest.mark.parametrize("kind", ["Py4JJavaError", "RuntimeError", "SparkException"])
def test_errors_the_job_did_not_classify_are_retried(kind: str) -> None:
    raised = job_failed_error("/data/t", kind, "the driver failed")
    assert type(raised) is MergeJobFailedError
    assert raised.error_type == kind


def test_the_provider_rejects_exactly_the_job_s_deterministic_errors() -> None:
    rejected = {type(error).__name__ for error, retried in JOB_ERRORS if not retried}
    assert rejected == DETERMINISTIC_ERRORS
def test_a_spark_data_error_on_the_driver_fails_the_task_without_retries(
    spark: Any, spark_local: str
) -> None:
    # What __main__ does with an exception no stage classified (a division by zero in a join condition).
    from pyspark.errors import ArithmeticException

    previous = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "true")
    try:
        with pytest.raises(ArithmeticException) as raised:
            spark.sql("SELECT id DIV (id - id) FROM range(3)").collect()
    finally:
        spark.conf.set("spark.sql.ansi.enabled", previous)
    classified = spark_failure(raised.value)
    assert isinstance(classified, CastFailureError)
    assert classified.error_class == "DIVIDE_BY_ZERO"

    failure = _hook_reads(failure_line(classified), spark_local)

    assert failure is not None
    assert (failure.kind, failure.deterministic) == ("CastFailureError", True)
    assert failure.message.startswith("[DIVIDE_BY_ZERO] Division by zero.")
    assert isinstance(job_failed_error("/data/t", failure.kind, failure.message), MergeJobRejectedError)


class _Log:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def error(self, text: str, *args: object) -> None:
        self.errors.append(text % args)


def test_a_provider_error_is_logged_once_first_and_keeps_each_distinct_cause_once_below_it() -> None:
    import sys

    from airflow_merge_provider.errors import MergeProviderError, one_clear_message

    def merge() -> None:
        try:
            try:
                raise OSError("disk says no")
            except OSError as low:
                raise ValueError("reading /t failed: disk says no") from low
        except ValueError as middle:
            raise MergeProviderError("Cannot merge into /t: check the disk") from middle

    log = _Log()
    with pytest.raises(MergeProviderError) as raised, one_clear_message(log):
        merge()

    assert log.errors == ["Cannot merge into /t: check the disk"]
    assert raised.value.__cause__ is None
    if sys.version_info >= (3, 11):
        # The OSError's text is inside the ValueError's line: shown once.
        assert raised.value.__notes__ == ["Caused by ValueError: reading /t failed: disk says no"]


def test_a_failure_the_job_reported_is_not_logged_again() -> None:
    from airflow_merge_provider.errors import MergeJobRejectedError, job_failed_error, one_clear_message

    log = _Log()
    with pytest.raises(MergeJobRejectedError), one_clear_message(log):
        raise job_failed_error("/t", "MergeAnalysisError", "cannot resolve s.nope")
    assert log.errors == []
