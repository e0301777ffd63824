"""MergeSubmitHook's task log: the job's lines at INFO, its failure at ERROR, the command line and Spark's
own log at DEBUG; a failed spark-submit raises the job's failure, not the command line and an exit code.

spark-submit is a small script that prints given lines and exits with a given code (no JVM).
"""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from airflow.sdk.exceptions import AirflowException

from airflow_merge_provider.hooks.merge_into import MergeSubmitHook, SubmitOutputLevels
from spark_jobs.delta_merge.contract import failure_line, metrics_line
from spark_jobs.delta_merge.errors import MergeAnalysisError

# What a real client-mode run prints (stdout and stderr merged), in order.
BANNER = [
    "WARNING: Using incubator modules: jdk.incubator.vector",
    "Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties",
    "26/11/26 15:52:22 WARN Utils: Your hostname, vm, resolves to a loopback address: 127.0.0.1",
    "26/11/26 15:52:25 INFO SparkContext: Running Spark version 4.2.0",
    "26/11/26 15:52:26 INFO Utils: Successfully started service 'SparkUI' on port 4040.",
    "[delta-merge] MERGE operation - loading the target's snapshot",
    "[delta-merge] MERGE into /data/t at version 0 (1 files)",
]
JAVA_ERROR = [
    "26/11/26 15:52:33 ERROR Executor: Exception in task 0.0 in stage 3.0 (TID 3)",
    "org.apache.spark.SparkRuntimeException: [CAST_INVALID_INPUT] The value 'x' cannot be cast to \"INT\".",
    "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.invalidInputInCastToNumberError(Errors.scala:1)",
    "\t... 19 more",
    "26/11/26 15:52:33 WARN TaskSetManager: Lost task 0.0 in stage 3.0 (TID 3) (192.0.2.2 executor driver)",
]
FAILURE = failure_line(MergeAnalysisError("cannot resolve `s`.`nope`. Check the column name.",
                                          error_class="DELTA_MERGE_UNRESOLVED_EXPRESSION"))  # fmt: skip

_SCRIPT = """
import json, os, sys
for line in json.loads(os.environ["SUBMIT_LINES"]):
    print(line, flush=True)
sys.exit(int(os.environ["SUBMIT_EXIT"]))
"""


@pytest.fixture
def spark_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make a spark-submit that prints ``lines`` and exits with ``code``; return its path."""
    binary = tmp_path / "spark-submit"
    binary.write_text(f"#!{sys.executable}\n" + textwrap.dedent(_SCRIPT), encoding="utf-8")
    binary.chmod(0o755)

    def make(lines: list[str], code: int = 0) -> str:
        monkeypatch.setenv("SUBMIT_LINES", json.dumps(lines))
        monkeypatch.setenv("SUBMIT_EXIT", str(code))
        return str(binary)

    return make


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    """Every event logged, DEBUG included, as ``{"event", "log_level"}``."""
    wrapper = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with structlog.testing.capture_logs() as captured:
            yield captured
    finally:
        structlog.configure(wrapper_class=wrapper)


def _levels(logs: list[dict[str, Any]], text: str) -> list[str]:
    return [entry["log_level"] for entry in logs if text in str(entry["event"])]


def _submit(binary: str, spark_local: str) -> MergeSubmitHook:
    hook = MergeSubmitHook.for_merge(conn_id=spark_local, name="merge", spark_binary=binary)
    hook.submit_job("app.py", ["--spec-json", json.dumps({"target": {"uri": "/data/t"}})])
    return hook


def test_levels_of_a_run_s_output() -> None:
    levels = SubmitOutputLevels()
    lines = [*BANNER, *JAVA_ERROR, "[delta-merge] MERGE operation - committing", metrics_line({"a": 1}),
             "/venv/pandas/core/frame.py:12: FutureWarning: x is deprecated", "  warnings.warn(",
             FAILURE]  # fmt: skip

    got = [logging.getLevelName(levels(line)) for line in lines]

    assert got == [
        "DEBUG", "DEBUG", "DEBUG", "DEBUG", "DEBUG", "INFO", "INFO",  # banner, Spark's INFO/WARN, stages
        "WARNING", "DEBUG", "DEBUG", "DEBUG", "DEBUG",  # a Spark ERROR record: its first line only, then WARN
        "INFO", "INFO",  # a stage line; the metrics line
        "WARNING", "WARNING",  # a Python warning and its source line
        "ERROR",  # the job's failure line
    ]  # fmt: skip


def test_spark_s_structured_json_log_and_an_uncaught_java_exception() -> None:
    levels = SubmitOutputLevels()
    lines = ['{"ts":"2026-11-26T15:52:25.678Z","level":"INFO","msg":"Running Spark version 4.2.0"}',
             '{"ts":"2026-11-26T15:52:25.679Z","level":"ERROR","msg":"Uncaught exception"}',
             'Exception in thread "main" java.lang.OutOfMemoryError: Java heap space',
             "\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)",
             "Traceback (most recent call last):", '  File "main.py", line 1, in <module>']  # fmt: skip

    got = [logging.getLevelName(levels(line)) for line in lines]

    assert got == ["DEBUG", "WARNING", "WARNING", "DEBUG", "INFO", "INFO"]


def test_a_run_logs_the_job_s_lines_at_info_and_the_command_and_spark_s_log_at_debug(
    spark_submit: Any, spark_local: str, logs: list[dict[str, Any]]
) -> None:
    binary = spark_submit([*BANNER, "[delta-merge] MERGE committed version 1", metrics_line({"a": 1})])

    hook = _submit(binary, spark_local)

    assert hook.metrics == {"a": 1}
    assert _levels(logs, "Spark-Submit cmd:") == ["debug"]
    assert _levels(logs, "--spec-json") == ["debug"]  # the spec travels on the command line only
    assert _levels(logs, "Running the merge job with spark-submit (master local[2], client deploy mode") == [
        "info"
    ]
    assert _levels(logs, "INFO SparkContext: Running Spark version") == ["debug"]
    assert _levels(logs, "WARN Utils: Your hostname") == ["debug"]
    assert _levels(logs, "[delta-merge] ") == ["info", "info", "info"]
    assert _levels(logs, "MERGE_METRICS_JSON=") == ["info"]
    info = [entry["event"] for entry in logs if entry["log_level"] != "debug"]
    assert not any("WARN" in str(event) or "INFO " in str(event) for event in info), info


def test_a_failed_job_raises_its_failure_not_the_command_line(
    spark_submit: Any, spark_local: str, logs: list[dict[str, Any]]
) -> None:
    binary = spark_submit([*BANNER, *JAVA_ERROR, FAILURE], code=1)

    with pytest.raises(AirflowException) as raised:
        _submit(binary, spark_local)

    assert str(raised.value) == (
        "spark-submit exited with code 1: the merge job failed with MergeAnalysisError: "
        "[DELTA_MERGE_UNRESOLVED_EXPRESSION] cannot resolve `s`.`nope`. Check the column name."
    )
    # The parent's error (the whole command line, spec included, and the output's tail) is at DEBUG only.
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__
    assert _levels(logs, "Cannot execute:") == ["debug"]
    lines = {str(entry["event"]): entry["log_level"] for entry in logs}
    assert lines[FAILURE] == "error"
    assert [lines[line.strip()] for line in JAVA_ERROR] == ["warning", "debug", "debug", "debug", "debug"]


def test_a_driver_that_died_without_its_failure_line_leaves_the_last_lines_of_its_output(
    spark_submit: Any, spark_local: str, logs: list[dict[str, Any]]
) -> None:
    crash = ['Exception in thread "main" java.lang.OutOfMemoryError: Java heap space',
             "\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)"]  # fmt: skip
    binary = spark_submit([*BANNER, *crash], code=52)

    with pytest.raises(AirflowException) as raised:
        _submit(binary, spark_local)

    assert str(raised.value) == (
        "spark-submit exited with code 52 before the merge job reported a failure (Spark could not start, "
        "or the driver died). Its last lines are logged above."
    )
    (tail,) = [entry for entry in logs if "ended without the merge job's metrics" in entry["event"]]
    assert tail["log_level"] == "warning"
    # The parent's tail starts at the uncaught exception (its lines stripped).
    assert str(tail["event"]).endswith(
        "Last spark-submit output:\n" + "\n".join(line.strip() for line in crash)
    )
