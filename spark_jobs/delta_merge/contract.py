"""What the Airflow provider may know of the merge job: spec, metrics, error names and the job's output lines.

The provider imports ``spark_jobs`` through this module only. Importing it loads no pyspark, deltalake,
pyarrow or Airflow (nor the SQL parser, until ``MergeSpec`` is first used); the functions that need the
job's heavier modules import them when called.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_jobs.delta_merge.errors import (
    DETERMINISTIC_ERRORS,
    MergeJobError,
    MergeSpecError,
    TableStorageError,
    spark_failure,
)
from spark_jobs.delta_merge.expectations import failed_expectations
from spark_jobs.delta_merge.metrics import DELTA_METRIC_NAMES, MergeMetrics, stage_times
from spark_jobs.delta_merge.protocol.commit_info import MERGE_ENGINE, MERGE_OPERATION
from spark_jobs.delta_merge.storage.azure_options import AZURE_SCHEMES
from spark_jobs.delta_merge.storage.storage_errors import credentials_named
from spark_jobs.delta_merge.storage.storage_secrets import is_secret_option

if TYPE_CHECKING:
    from spark_jobs.delta_merge.pipeline import run_merge
    from spark_jobs.delta_merge.spec import ENGINES, NATIVE_ONLY_OPTIONS, MergeSpec, SourceSpec, TargetSpec

__all__ = [
    "AZURE_SCHEMES",
    "DELTA_METRIC_NAMES",
    "DETERMINISTIC_ERRORS",
    "ENGINES",
    "FAILURE_PREFIX",
    "MERGE_ENGINE",
    "MERGE_OPERATION",
    "METRICS_PREFIX",
    "NATIVE_ONLY_OPTIONS",
    "PROGRESS_PREFIX",
    "JobFailure",
    "MergeJobError",
    "MergeMetrics",
    "MergeSpec",
    "MergeSpecError",
    "SourceSpec",
    "TableStorageError",
    "TargetSpec",
    "app_transaction_version",
    "application_line",
    "check_merge_sql",
    "credentials_named",
    "failed_expectations",
    "failure_line",
    "find_app_transaction_commit",
    "first_merge_commit_after",
    "is_deterministic",
    "is_secret_option",
    "metrics_line",
    "parse_application_line",
    "parse_failure_line",
    "parse_metrics_line",
    "read_commit_actions",
    "run_merge",
    "spark_failure",
    "stage_times",
]

# The driver prints the metrics as one stdout line: METRICS_PREFIX + JSON.
METRICS_PREFIX = "MERGE_METRICS_JSON="
# ... or, on failure, one last stderr line: "MERGE failed: <ErrorType>: <message>".
FAILURE_PREFIX = "MERGE failed: "
# Every line of the job's own log (its stages, on stderr) starts with this.
PROGRESS_PREFIX = "[delta-merge] "

# ... and, once its SparkContext runs, one progress line naming its application and the live UI: the job
# starts its context at log level WARN, below Spark's own INFO lines that say where the UI listens.
_APPLICATION = re.compile(
    re.escape(PROGRESS_PREFIX) + r"Spark application (?P<id>\S+), its UI at (?P<ui>\S+)"
)
_FAILURE = re.compile(re.escape(FAILURE_PREFIX) + r"(?P<kind>[A-Za-z_][A-Za-z0-9_]*): ?(?P<message>.*)$")
# spark-submit's own failure before any application runs: Ivy could not fetch a --packages artifact.
_PACKAGES_UNRESOLVED = re.compile(
    r"RuntimeException: \[(?:unresolved dependency|download failed): (?P<artifact>[^,\]]+)"
)
# Py4J's first line for a Java exception; the Java exception's own "<class>: <message>" follows it.
_PY4J_CALL = re.compile(r"An error occurred while calling [\w.$]+\.?")


@dataclass(frozen=True)
class JobFailure:
    """The failure the job reported: its error type's name and its message (one line)."""

    kind: str
    message: str

    @property
    def deterministic(self) -> bool:
        """A retry of the same merge fails the same way (see :func:`is_deterministic`)."""
        return is_deterministic(self.kind)


def is_deterministic(kind: str | None) -> bool:
    """Whether the job's error type ``kind`` is one a retry cannot fix (spec, analysis, table features,
    data: casts, overflow, constraints, multiple matches, expectations). Unknown names are not."""
    return kind in DETERMINISTIC_ERRORS


def application_line(app_id: str, ui_url: str | None) -> str:
    """The job's line naming its Spark application and its driver's web UI (``none`` when disabled)."""
    return f"{PROGRESS_PREFIX}Spark application {app_id}, its UI at {ui_url or 'none'}"


def parse_application_line(line: str) -> tuple[str, str | None] | None:
    """(application id, UI address or None) from :func:`application_line`'s line; None for other lines."""
    match = _APPLICATION.search(line)
    if match is None:
        return None
    return match["id"], None if match["ui"] == "none" else match["ui"]


def failure_line(error: BaseException) -> str:
    """The job's failure line for ``error``, whitespace collapsed to one line.

    A :class:`MergeJobError` keeps its whole message (``[ERROR_CLASS] ...``); any other error its first line,
    or for a Java exception raised through Py4J (whose first line only names the call) the Java exception's
    class and message, never its stack trace.
    """
    if isinstance(error, MergeJobError):
        text = str(error)
    else:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
        text = lines[0]
        if _PY4J_CALL.fullmatch(text) and len(lines) > 1:
            text = lines[1].removeprefix(":").strip()
    return " ".join(f"{FAILURE_PREFIX}{type(error).__name__}: {text}".split())


def parse_failure_line(line: str) -> JobFailure | None:
    """The failure a line of the job's output reports, or None (also for a line that only mentions it).

    spark-submit's own line for ``--packages`` it could not fetch counts too (``SparkPackagesUnresolved``):
    the job never started, and the line says why better than the driver's silence.
    """
    match = _FAILURE.search(line)
    if match is not None:
        return JobFailure(match["kind"], match["message"])
    unresolved = _PACKAGES_UNRESOLVED.search(line)
    if unresolved is None:
        return None
    artifact = unresolved["artifact"].strip().removesuffix(": not found")
    return JobFailure("SparkPackagesUnresolved", (
        f"spark-submit could not fetch its --packages (first missing: {artifact}): "
        "Ivy found them in none of its repositories (Maven Central by default, then ~/.m2, where a POM "
        "without its jar also stops it; spark.jars.ivySettings in the cluster's spark-defaults.conf names "
        "others). For engine='delta', make a repository reachable, or set the Spark connection's extra "
        "delta_package to a coordinate your repository serves, or to 'cluster' when the cluster loads Delta "
        "itself"
    ))  # fmt: skip


def metrics_line(metrics: Mapping[str, Any]) -> str:
    """The job's metrics line: :data:`METRICS_PREFIX` and the metrics as one line of JSON, sorted by name;
    ``stageTimesMs`` is a list: the stages in the order they ran."""
    return METRICS_PREFIX + json.dumps(dict(sorted(metrics.items())))


def parse_metrics_line(line: str) -> dict[str, Any] | None:
    """The metrics of a metrics line, or None for any other line. The prefix may follow other text (a JVM
    log line can share the pipe).

    :raises ValueError: the line has the prefix but no JSON object after it.
    """
    at = line.find(METRICS_PREFIX)
    if at < 0:
        return None
    value = json.loads(line[at + len(METRICS_PREFIX) :])
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object after {METRICS_PREFIX}, found {type(value).__name__}")
    return value


def find_app_transaction_commit(
    uri: str, app_id: str, app_version: int, *, storage_options: Mapping[str, str] | None = None
) -> tuple[int, dict[str, Any]] | None:
    """The version and commitInfo of the commit that recorded app transaction ``(app_id, app_version)``,
    or None when the table has not recorded that version (imports deltalake when called).

    :raises MergeJobError: the table cannot be read.
    """
    from spark_jobs.delta_merge.protocol.delta_log import find_app_transaction_commit as find

    return find(uri, app_id, app_version, storage_options=storage_options)


def read_commit_actions(
    uri: str, version: int, *, storage_options: Mapping[str, str] | None = None
) -> list[dict[str, Any]] | None:
    """The actions of one commit file of the table, or None when it does not exist (imports obstore when
    called): the job's own log reader, so both sides read commits alike."""
    from spark_jobs.delta_merge.protocol.delta_log import read_commit_actions as read

    return read(uri, version, storage_options=storage_options)


def app_transaction_version(
    uri: str, app_id: str, *, storage_options: Mapping[str, str] | None = None
) -> int | None:
    """The highest version of app transaction ``app_id`` the table records, or None (imports deltalake
    when called).

    :raises MergeJobError: the table cannot be read.
    """
    from spark_jobs.delta_merge.protocol.delta_log import app_transaction_version as recorded

    return recorded(uri, app_id, storage_options=storage_options)


def first_merge_commit_after(
    uri: str, after_version: int, *, storage_options: Mapping[str, str] | None = None
) -> tuple[int, dict[str, Any], str | None, int | None] | None:
    """(version, commitInfo, app id, app version) of the oldest merge commit of this job above
    ``after_version``, or None (imports deltalake when called).

    :raises MergeJobError: the table cannot be read.
    """
    from spark_jobs.delta_merge.protocol.delta_log import first_merge_commit_after as first

    return first(uri, after_version, storage_options=storage_options)


def check_merge_sql(merge_sql: str) -> None:
    """Parse a ``MERGE INTO`` statement and check Delta's MERGE rules and the expression guard on it, as
    ``MergeSpec.validate`` does, without the rest of a spec (for a statement known when a DAG is parsed).

    :raises MergeSpecError: naming ``merge_sql`` and, for a syntax error, its line and column.
    """
    from spark_jobs.delta_merge.statement.merge_rules import check_parsed_merge
    from spark_jobs.delta_merge.statement.merge_sql import parse_merge_sql

    check_parsed_merge(parse_merge_sql(merge_sql), sql_form=True)


def __getattr__(name: str) -> Any:
    # MergeSpec loads the SQL parser (sqlglot): only when the provider first builds or reads a spec.
    if name in ("MergeSpec", "SourceSpec", "TargetSpec", "NATIVE_ONLY_OPTIONS", "ENGINES"):
        from spark_jobs.delta_merge import spec

        return getattr(spec, name)
    # The merge itself (pyspark, deltalake): only when a task merges on Spark Connect.
    if name == "run_merge":
        from spark_jobs.delta_merge.pipeline import run_merge

        return run_merge
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
