"""The provider contract: the job's output lines, its deterministic errors, the provider's one way in."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
from pathlib import Path

import pytest

import spark_jobs.delta_merge as package
from spark_jobs.delta_merge import contract
from spark_jobs.delta_merge.contract import (
    DETERMINISTIC_ERRORS,
    METRICS_PREFIX,
    JobFailure,
    failure_line,
    is_deterministic,
    metrics_line,
    parse_failure_line,
    parse_metrics_line,
)
from spark_jobs.delta_merge.errors import (
    CastFailureError,
    ConcurrentModificationError,
    MergeAnalysisError,
    MergeExecutionError,
    MergeJobError,
    spark_failure,
)

ROOT = Path(__file__).resolve().parents[3]
# Where code that runs on Airflow workers lives: it must reach the job through the contract only.
AIRFLOW_SIDE = ("airflow_merge_provider", "dags_examples")


def test_the_failure_line_is_one_line_and_parses_back() -> None:
    error = CastFailureError("The value 'abc' ... cannot be cast to \"INT\".\nNothing was committed.",
                             error_class="CAST_INVALID_INPUT")

    line = failure_line(error)

    assert line == ("MERGE failed: CastFailureError: [CAST_INVALID_INPUT] The value 'abc' ... cannot be cast "
                    "to \"INT\". Nothing was committed.")
    assert parse_failure_line(f"26/01/01 ERROR x: {line}") == JobFailure(
        "CastFailureError", "[CAST_INVALID_INPUT] The value 'abc' ... cannot be cast to \"INT\". Nothing was "
        "committed.")
    assert parse_failure_line("26/01/01 INFO SparkContext: Running Spark version 4.2.0") is None


@pytest.mark.parametrize("failed", [
    "unresolved dependency: io.delta#delta-spark_4.2_2.13;9.9.9: not found",
    "download failed: org.slf4j#slf4j-api;2.0.13!slf4j-api.jar, download failed: org.x#y;1!y.jar",
])  # fmt: skip
def test_spark_submit_s_own_line_for_packages_it_could_not_fetch_is_a_failure(failed: str) -> None:
    line = f'Exception in thread "main" java.lang.RuntimeException: [{failed}]'

    failure = parse_failure_line(line)

    assert failure is not None
    assert (failure.kind, failure.deterministic) == ("SparkPackagesUnresolved", False)  # retried
    first = failed.split(": ", 1)[1].split(",")[0].removesuffix(": not found")
    assert failure.message.startswith(f"spark-submit could not fetch its --packages (first missing: {first}")
    assert "delta_package" in failure.message
    assert parse_failure_line("\t\tunresolved dependency in a resolution report line") is None


def test_an_unexpected_error_keeps_its_first_line() -> None:
    line = failure_line(RuntimeError("the driver died\n\tat org.apache.spark.Foo"))
    assert line == "MERGE failed: RuntimeError: the driver died"
    failure = parse_failure_line(line)
    assert failure is not None
    assert (failure.kind, failure.deterministic) == ("RuntimeError", False)


def test_a_java_error_through_py4j_keeps_the_java_exception_not_the_call_or_its_stack() -> None:
    class Py4JJavaError(Exception):  # py4j's text: the call, then the Java exception and its stack trace
        pass

    error = Py4JJavaError(
        "An error occurred while calling o123.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2856)"
    )

    assert failure_line(error) == (
        "MERGE failed: Py4JJavaError: org.apache.spark.SparkException: Job aborted due to stage failure: "
        "Task 0 in stage 3.0 failed"
    )


def test_the_metrics_line_round_trips_and_may_follow_other_text() -> None:
    line = metrics_line({"numTargetRowsInserted": 2, "materializeSourceReason": "NONE"})
    assert line == METRICS_PREFIX + '{"materializeSourceReason": "NONE", "numTargetRowsInserted": 2}'
    stages = [{"stage": "MERGE operation - scanning files for matches", "ms": 2},
              {"stage": "MERGE operation - committing", "ms": 1}]  # fmt: skip
    parsed = parse_metrics_line(metrics_line({"stageTimesMs": stages}))
    assert parsed is not None
    assert parsed["stageTimesMs"] == stages  # in the order they ran, not sorted
    assert parse_metrics_line(f"stdout noise {line}") == json.loads(line[len(METRICS_PREFIX):])
    assert parse_metrics_line("MERGE failed: X: y") is None
    with pytest.raises(ValueError, match="Expecting property name"):
        parse_metrics_line(METRICS_PREFIX + "{not json")
    with pytest.raises(ValueError, match="expected a JSON object"):
        parse_metrics_line(METRICS_PREFIX + "[1]")


def test_deterministic_errors_are_the_ones_a_retry_cannot_fix() -> None:
    assert set(DETERMINISTIC_ERRORS) == {
        "MergeSpecError", "MergeAnalysisError", "MultipleSourceRowMatchesError",
        "UnsupportedTableFeatureError", "ConstraintViolationError", "CastFailureError",
        "ExpectationFailedError", "StorageAuthenticationError", "StoragePermissionError",
        "StorageContainerNotFoundError",
    }
    assert not is_deterministic("MergeExecutionError")
    assert not is_deterministic("StorageNetworkError")
    assert not is_deterministic("ConcurrentModificationError")
    assert not is_deterministic(None)


def _job_error_types() -> list[type[MergeJobError]]:
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
    found: list[type[MergeJobError]] = []
    pending: list[type[MergeJobError]] = [MergeJobError]
    while pending:
        kind = pending.pop()
        found.append(kind)
        pending.extend(kind.__subclasses__())
    return found


def test_every_job_error_type_is_classified_as_its_retryable_flag_says() -> None:
    # Error types defined anywhere in the job (not only errors.py) report their own name: the contract's
    # set must agree with each type's flag, or a deterministic failure would be retried (or the reverse).
    kinds = _job_error_types()
    assert {"MaterializedSourceLostError", "CastFailureError"} <= {k.__name__ for k in kinds}
    disagree = [k.__name__ for k in kinds if is_deterministic(k.__name__) is k.retryable]
    assert disagree == []


class _CapturedLike(Exception):
    """What pyspark's captured exceptions offer: the SQLSTATE and the error condition."""

    def __init__(self, message: str, state: str, condition: str) -> None:
        super().__init__(message)
        self._state, self._condition = state, condition

    def getSqlState(self) -> str:
        return self._state

    def getCondition(self) -> str:
        return self._condition


@pytest.mark.parametrize(
    ("raised", "kind", "error_class", "message"),
    [
        (_CapturedLike("[DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012\n== SQL ==", "22012",
                       "DIVIDE_BY_ZERO"),
         CastFailureError, "DIVIDE_BY_ZERO", "Division by zero."),
        (_CapturedLike("[USER_RAISED_EXCEPTION] [DELTA_CAST_OVERFLOW_IN_TABLE_WRITE] Failed to write a value "
                       "... due to an overflow. SQLSTATE: P0001", "P0001", "USER_RAISED_EXCEPTION"),
         CastFailureError, "DELTA_CAST_OVERFLOW_IN_TABLE_WRITE", "Failed to write a value ... due to an "),
        (_CapturedLike("[USER_RAISED_EXCEPTION] stop SQLSTATE: P0001", "P0001", "USER_RAISED_EXCEPTION"),
         CastFailureError, "USER_RAISED_EXCEPTION", "stop"),
        (_CapturedLike("[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column `x` cannot be resolved. SQLSTATE: 42703",
                       "42703", "UNRESOLVED_COLUMN.WITH_SUGGESTION"),
         MergeAnalysisError, "UNRESOLVED_COLUMN.WITH_SUGGESTION", "A column `x` cannot be resolved."),
    ],
)
def test_spark_failures_the_data_or_statement_decide_become_job_errors(
    raised: Exception, kind: type[MergeJobError], error_class: str, message: str
) -> None:
    error = spark_failure(raised)
    assert isinstance(error, kind)
    assert error.error_class == error_class
    assert error.bare_message.startswith(message)
    assert not error.retryable


@pytest.mark.parametrize(
    "raised",
    [
        RuntimeError("no SQLSTATE"),
        _CapturedLike("[TASK_WRITE_FAILED] Task failed while writing rows. SQLSTATE: 58030", "58030",
                      "TASK_WRITE_FAILED"),
        MergeExecutionError("already the job's"),
        ConcurrentModificationError("a conflict"),
    ],
)
def test_other_failures_are_left_as_they_are(raised: Exception) -> None:
    assert spark_failure(raised) is None


def test_merge_spec_loads_lazily_through_the_contract() -> None:
    from spark_jobs.delta_merge.spec import MergeSpec

    assert contract.MergeSpec is MergeSpec
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        contract.Nope  # noqa: B018


def _spark_jobs_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a spark_jobs module in a file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "spark_jobs.delta_merge" else [
                f"{node.module}.{alias.name}" for alias in node.names]
            found += [(node.lineno, name) for name in names if name.split(".")[0] == "spark_jobs"]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "spark_jobs"]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module", "__import__"
        ):
            found += [(node.lineno, arg.value) for arg in node.args[:1]
                      if isinstance(arg, ast.Constant) and str(arg.value).startswith("spark_jobs")]
    return found


def test_the_airflow_side_imports_the_job_only_through_the_contract() -> None:
    files = [p for side in AIRFLOW_SIDE for p in sorted((ROOT / side).rglob("*.py"))]
    imports = {
        f"{p.relative_to(ROOT)}:{line}": module for p in files for line, module in _spark_jobs_imports(p)
    }
    assert imports, "the provider does use the job (spec, metrics, errors)"
    assert {where: m for where, m in imports.items() if m != "spark_jobs.delta_merge.contract"} == {}


def test_the_import_scan_sees_every_form(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import spark_jobs.delta_merge.spec\n"
        "from spark_jobs.delta_merge import contract, pipeline\n"
        "def f():\n"
        "    from spark_jobs.delta_merge.commit import MERGE_ENGINE\n"
        "    importlib.import_module('spark_jobs.delta_merge.protocol.snapshot')\n",
        encoding="utf-8",
    )
    assert sorted(m for _, m in _spark_jobs_imports(probe)) == [
        "spark_jobs.delta_merge.commit", "spark_jobs.delta_merge.contract", "spark_jobs.delta_merge.pipeline",
        "spark_jobs.delta_merge.protocol.snapshot", "spark_jobs.delta_merge.spec",
    ]
