"""The ``delta`` engine: the same spec merged by Delta's own ``MERGE INTO`` (delta-spark in the session).

The native pipeline (:mod:`spark_jobs.delta_merge.pipeline`) does Delta's work itself; this engine hands the
statement to Delta on a session that has Delta's SQL extension and catalog, and keeps the job's contract
around it: the spec's source (read and, for a USING query, named as the native job names it), its options
as Delta's session confs, the idempotency key as Delta's ``txnAppId``/``txnVersion`` (Delta 4.4 skips a
MERGE whose app transaction is in the log, and records the key even in an otherwise empty commit), and the
metrics read back from the ``operationMetrics`` of the commit that holds the key.

The statement Delta runs is rendered here from the parsed merge (:class:`ParsedMerge`), with every name
quoted, so the target is the spec's path and the source the spec's source, whatever names the user's
statement gave them.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from spark_jobs.delta_merge.commit.conflicts import CONFLICT_CLASSES
from spark_jobs.delta_merge.commit.idempotency import applied_metrics
from spark_jobs.delta_merge.errors import (
    CastFailureError,
    ConcurrentModificationError,
    ConstraintViolationError,
    MergeAnalysisError,
    MergeExecutionError,
    MergeJobError,
    MergeSpecError,
    MultipleSourceRowMatchesError,
)
from spark_jobs.delta_merge.metrics import MergeMetrics
from spark_jobs.delta_merge.protocol.delta_log import find_app_transaction_commit
from spark_jobs.delta_merge.source.materialize import read_source, statement_source
from spark_jobs.delta_merge.spark_confs import session_confs
from spark_jobs.delta_merge.spec import MergeSpec, ParsedMerge
from spark_jobs.delta_merge.sql_names import quoted_name, quoted_path
from spark_jobs.delta_merge.statement.parsed_merge import MergeClause

__all__ = ["delta_failure", "delta_merge_confs", "delta_merge_statement", "run_delta_merge"]

log = logging.getLogger("delta_merge")

_DELTA_ERROR_TYPES: dict[str, type[MergeJobError]] = {
    "DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE": MultipleSourceRowMatchesError,
    "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES": ConstraintViolationError,
    "DELTA_NOT_NULL_CONSTRAINT_VIOLATED": ConstraintViolationError,
    **dict.fromkeys(CONFLICT_CLASSES, ConcurrentModificationError),
}
_DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"


def delta_merge_statement(parsed: ParsedMerge, *, target_uri: str, source_view: str) -> str:
    """The ``MERGE INTO delta.`<uri>` ...`` statement Delta runs for ``parsed``, its source the view
    ``source_view``; every name quoted, the expressions as the parser normalized them."""
    target, source = quoted_name(parsed.target_alias), quoted_name(parsed.source_alias)
    evolution = " WITH SCHEMA EVOLUTION" if parsed.schema_evolution else ""
    lines = [
        f"MERGE{evolution} INTO delta.{quoted_name(target_uri)} AS {target}",
        f"USING {quoted_name(source_view)} AS {source}",
        f"ON {parsed.condition}",
    ]
    lines += [_clause(clause, target) for clause in parsed.clauses]
    return "\n".join(lines)


def _clause(clause: MergeClause, target: str) -> str:
    when = {
        "matched": "WHEN MATCHED",
        "not_matched": "WHEN NOT MATCHED",
        "not_matched_by_source": "WHEN NOT MATCHED BY SOURCE",
    }[clause.when]
    condition = "" if clause.condition is None else f" AND {clause.condition}"
    if clause.action == "delete":
        action = "DELETE"
    elif clause.action == "update_all":
        action = "UPDATE SET *"
    elif clause.action == "insert_all":
        action = "INSERT *"
    elif clause.action == "update":
        pairs = (f"{target}.{quoted_path(a.column)} = {a.value}" for a in clause.assignments)
        action = "UPDATE SET " + ", ".join(pairs)
    else:
        columns = ", ".join(quoted_path(a.column) for a in clause.assignments)
        values = ", ".join(a.value for a in clause.assignments)
        action = f"INSERT ({columns}) VALUES ({values})"
    return f"{when}{condition} THEN {action}"


def run_delta_merge(spark: SparkSession, spec: MergeSpec, parsed: ParsedMerge) -> MergeMetrics:
    """Merge ``spec`` with Delta's own MERGE INTO and return the metrics of its commit.

    The spec is validated (:meth:`MergeSpec.validate` refuses what Delta's MERGE cannot honour).

    :raises MergeSpecError: the session has no Delta.
    :raises MergeJobError: Delta's failure, as the job's error type with Delta's error class.
    """
    _check_session_has_delta(spark)
    applied = applied_metrics(spec)
    if applied is not None:
        log.info("MERGE skipped: app transaction %s v%s is already in the log (version %d)",
                 spec.run.app_id, spec.run.app_version, applied.tableVersion)  # fmt: skip
        return applied
    started = time.monotonic()
    view = f"delta_merge_source_{uuid.uuid4().hex}"
    with ExitStack() as stack:
        source = read_source(spark, spec.source)
        if parsed.source_query is not None:
            source = stack.enter_context(statement_source(spark, source, parsed.source_query))
        stack.enter_context(_temp_view(spark, source.df, view))
        stack.enter_context(session_confs(spark, delta_merge_confs(spec)))
        statement = delta_merge_statement(parsed, target_uri=spec.target.uri, source_view=view)
        log.info("MERGE into %s with Delta's MERGE INTO (app transaction %s v%s)", spec.target.uri,
                 spec.run.app_id, spec.run.app_version)  # fmt: skip
        try:
            spark.sql(statement).collect()
        except Exception as error:
            raise delta_failure(error) from None
    return _committed_metrics(spec, started=started)


def delta_merge_confs(spec: MergeSpec) -> dict[str, str]:
    """The spec's options, idempotency key and commit metadata as Delta's (and Spark's) session confs."""
    options = spec.options
    confs = {
        "spark.sql.ansi.enabled": "false" if options.store_assignment_policy == "LEGACY" else "true",
        "spark.sql.storeAssignmentPolicy": options.store_assignment_policy,
        "spark.databricks.delta.merge.materializeSource": options.materialize_source,
        "spark.databricks.delta.merge.materializeSource.rddStorageLevel": options.materialize_storage_level,
        "spark.databricks.delta.schema.autoMerge.enabled": str(options.schema_evolution).lower(),
        "spark.databricks.delta.resolveMergeUpdateStructsByName.enabled":
            str(options.resolve_structs_by_name).lower(),
        "spark.databricks.delta.write.txnAppId": str(spec.run.app_id),
        "spark.databricks.delta.write.txnVersion": str(spec.run.app_version),
    }
    if options.shuffle_partitions is not None:
        confs["spark.sql.shuffle.partitions"] = str(options.shuffle_partitions)
    if spec.run.commit_metadata:
        # Delta records one free-form string per commit: the metadata as its JSON.
        confs["spark.databricks.delta.commitInfo.userMetadata"] = json.dumps(
            dict(spec.run.commit_metadata), sort_keys=True, allow_nan=False
        )
    return confs


def delta_failure(error: BaseException) -> MergeJobError:
    """Delta's (or Spark's) failure of the MERGE as the job's error type, with Delta's error class."""
    if isinstance(error, MergeJobError):
        return error
    thrown = _spark_throwable(error)
    if thrown is None:
        return MergeExecutionError(f"Delta's MERGE failed: {_first_line(str(error))}")
    condition, state, message = thrown
    kind = _DELTA_ERROR_TYPES.get(condition)
    if kind is not None:
        return kind(message, error_class=condition)
    if state.startswith(("22", "P0001")):
        return CastFailureError(
            f"{message} Nothing was committed; fix the source data or the merge's expressions (a retry fails "
            "the same way).",
            error_class=condition,
        )
    if state.startswith("42"):
        return MergeAnalysisError(message, error_class=condition)
    return MergeExecutionError(f"Delta's MERGE failed: {message}", error_class=condition)


def _spark_throwable(error: BaseException) -> tuple[str, str, str] | None:
    """(error class, SQLSTATE, message) of the Spark or Delta exception behind ``error``.

    PySpark renders a JVM exception's message from Spark's own registry of error classes, which lacks
    Delta's: for those its conversion fails ("Cannot find main error class 'DELTA_...'") and the failure
    carries the original Java exception as its context, whose own ``getMessage`` Delta renders.
    """
    seen: BaseException | None = error
    while seen is not None:
        java = getattr(seen, "java_exception", None)
        if java is not None and _is_delta_or_spark_throwable(java):
            return str(java.getErrorClass()), str(java.getSqlState() or ""), _message(str(java.getMessage()))
        if isinstance(seen, PySparkException):
            condition = seen.getCondition()
            if condition and condition != "INTERNAL_ERROR":
                return str(condition), str(seen.getSqlState() or ""), _message(str(seen))
        seen = seen.__cause__ or seen.__context__
    return None


def _is_delta_or_spark_throwable(java: Any) -> bool:
    try:
        return bool(java.getErrorClass()) and java.getErrorClass() != "INTERNAL_ERROR"
    except Exception:  # not a SparkThrowable, or the JVM is gone
        return False


def _message(text: str) -> str:
    """The first line of a Spark message without its ``[CLASS]`` prefix and SQLSTATE suffix."""
    line = _first_line(text)
    line = re.sub(r"^\[[A-Z][A-Z0-9_.]*\]\s*", "", line)
    return re.sub(r"\s*SQLSTATE: \w+\s*$", "", line)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()] or [""]
    return lines[0]


def _committed_metrics(spec: MergeSpec, *, started: float) -> MergeMetrics:
    """The metrics of the commit holding the spec's app transaction (Delta's operationMetrics)."""
    app_id, app_version = str(spec.run.app_id), int(spec.run.app_version or 0)
    options = dict(spec.target.storage_options)
    found = find_app_transaction_commit(spec.target.uri, app_id, app_version, storage_options=options)
    if found is None:
        # Delta skipped the MERGE: another run committed the same app transaction since the check above.
        applied = applied_metrics(spec)
        if applied is None:
            raise MergeExecutionError(
                f"Delta's MERGE into {spec.target.uri} returned, but no commit holds its app transaction "
                f"{app_id} v{app_version}: check the table's history (DESCRIBE HISTORY) before a retry"
            )
        return applied
    metrics = MergeMetrics.from_commit(*found)
    if not metrics.executionTimeMs:
        metrics = metrics.with_values(executionTimeMs=int((time.monotonic() - started) * 1000))
    return metrics


def _check_session_has_delta(spark: SparkSession) -> None:
    extensions = spark.conf.get("spark.sql.extensions", None) or ""
    if _DELTA_EXTENSION not in extensions:
        raise MergeSpecError(
            "options.engine 'delta' needs Delta Lake in the Spark session: spark.sql.extensions must name "
            f"{_DELTA_EXTENSION} (found {extensions or 'none'}), with Delta's jars on the class path "
            "(spark.jars.packages io.delta:delta-spark_4.2_2.13:4.4.0 for Spark 4.2). The operator adds both "
            "for a spark connection unless its extra delta_package says 'cluster'; on Spark Connect, the "
            "server must be started with them."
        )


@contextmanager
def _temp_view(spark: SparkSession, df: DataFrame, name: str) -> Iterator[None]:
    df.createOrReplaceTempView(name)
    try:
        yield
    finally:
        spark.catalog.dropTempView(name)
